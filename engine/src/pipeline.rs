//! A two-stage pipeline: a helper thread prepares the next item while the caller consumes
//! the current one (the double buffering of pile passes).

use std::ops::ControlFlow;

use crate::Result;

/// Runs `produce` on each job, in order, on a helper thread, and hands each result to
/// `consume` on this thread. The hand-over is a rendezvous, so at most two items exist at
/// once: the one being consumed and the one being produced. `consume` may give a spent item
/// back (`Continue(Some(item))`) for `produce` to reuse its memory, or stop early
/// (`Break`). The first error from either side ends the pipeline and is returned; the helper
/// never outlives this call.
pub fn pipelined<J, T, P, C>(jobs: Vec<J>, mut produce: P, mut consume: C) -> Result<()>
where
    J: Send,
    T: Send,
    P: FnMut(J, Option<T>) -> Result<T> + Send,
    C: FnMut(T) -> Result<ControlFlow<(), Option<T>>>,
{
    std::thread::scope(|scope| {
        let (tx, rx) = crossbeam_channel::bounded::<Result<T>>(0);
        let (back_tx, back_rx) = crossbeam_channel::bounded::<T>(1);
        std::thread::Builder::new()
            .name("riffle-loader".into())
            .spawn_scoped(scope, move || {
                for job in jobs {
                    let item = produce(job, back_rx.try_recv().ok());
                    let failed = item.is_err();
                    if tx.send(item).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| crate::Error::Invalid(format!("cannot start a loader thread: {e}")))?;
        // `rx` lives in this closure: returning early drops it, so the helper's next send
        // fails and it stops instead of blocking the scope forever.
        for item in rx.iter() {
            match consume(item?)? {
                ControlFlow::Break(()) => break,
                ControlFlow::Continue(spent) => {
                    if let Some(spent) = spent {
                        let _ = back_tx.try_send(spent);
                    }
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn in_order_with_reuse_and_early_stops() {
        let mut got = Vec::new();
        let mut reused = 0;
        pipelined(
            (0..100).collect(),
            |j: u32, spare: Option<Vec<u32>>| {
                reused += spare.is_some() as u32;
                let mut v = spare.unwrap_or_default();
                v.clear();
                v.push(j);
                Ok(v)
            },
            |v| {
                got.push(v[0]);
                Ok(ControlFlow::Continue(Some(v)))
            },
        )
        .unwrap();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        assert!(reused > 0);

        let mut seen = 0;
        pipelined(
            (0..100).collect(),
            |j: u32, _| Ok(j),
            |_| {
                seen += 1;
                Ok(if seen == 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(None)
                })
            },
        )
        .unwrap();
        assert_eq!(seen, 3);

        let e = pipelined(
            (0..100).collect(),
            |j: u32, _| Ok(j),
            |j| {
                if j == 5 {
                    Err(Error::Invalid("consumer failed".into()))
                } else {
                    Ok(ControlFlow::Continue(None))
                }
            },
        );
        assert!(e.is_err());
        let e = pipelined(
            (0..100).collect(),
            |j: u32, _| {
                if j == 7 {
                    Err(Error::Invalid("x".into()))
                } else {
                    Ok(j)
                }
            },
            |_| Ok(ControlFlow::Continue(None)),
        );
        assert!(e.is_err());
    }
}
