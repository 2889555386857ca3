//! How the threads of a run cooperate: [`Stop`], the flag that winds every one of them
//! down, and [`pipelined`], a two-stage pipeline where a helper thread prepares the next
//! item while the caller consumes the current one (the double buffering of pile passes).

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::Result;

/// A run's stop flag, shared by its threads (clones share it). It is set by the consumer
/// of a stream that stops it (`BatchStream` drop or `finish`: a daemon's CLOSE or shutdown
/// comes to that), or by a thread of the run that failed, so that the others stop at once
/// rather than at their next hand-over; that thread's error still travels the ordinary way
/// and is what the run returns. Loops check it between pieces of work (a range, a chunk,
/// a batch, a megabyte of a pile), never per byte: a relaxed load of a line nobody writes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stop(Arc<AtomicBool>);

impl Stop {
    /// Asks every loop of the run to stop.
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the run is to stop.
    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `Err` once the run is to stop: for callbacks (a scan's) that end their loop by
    /// failing. Nobody sees this error: whoever stopped the run has stopped listening, or
    /// returns its own.
    pub(crate) fn check(&self) -> Result<()> {
        if self.is_set() {
            Err(crate::Error::Cancelled {
                reason: "the run was stopped",
            })
        } else {
            Ok(())
        }
    }
}

/// Runs `produce` on each job, in order, on a helper thread, and hands each result to
/// `consume` on this thread. The hand-over is a rendezvous, so at most two items exist at
/// once: the one being consumed and the one being produced. `consume` may give a spent item
/// back (`Continue(Some(item))`) for `produce` to reuse its memory, or stop early
/// (`Break`). The first error from either side ends the pipeline and is returned; the helper
/// never outlives this call.
///
/// `stop` ends it early too: no job starts once it is set, and the pipeline returns `Ok`
/// without consuming more (whoever set it wants no more items). When `consume` fails or
/// breaks, `stop` is set, so a `produce` that checks it inside a long job (a pile load)
/// gives up at once instead of finishing an item nobody takes.
pub(crate) fn pipelined<J, T, P, C>(
    jobs: Vec<J>,
    stop: &Stop,
    mut produce: P,
    mut consume: C,
) -> Result<()>
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
                    if stop.is_set() {
                        return;
                    }
                    let item = produce(job, back_rx.try_recv().ok());
                    let failed = item.is_err();
                    if tx.send(item).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| crate::Error::os("cannot start a loader thread", e))?;
        // `rx` lives in this closure: returning early drops it, so the helper's next send
        // fails and it stops instead of blocking the scope forever.
        for item in rx.iter() {
            if stop.is_set() {
                break;
            }
            let outcome = item.and_then(&mut consume);
            match outcome {
                Ok(ControlFlow::Continue(spent)) => {
                    if let Some(spent) = spent {
                        let _ = back_tx.try_send(spent);
                    }
                }
                Ok(ControlFlow::Break(())) => {
                    stop.set();
                    break;
                }
                Err(e) => {
                    stop.set();
                    return Err(e);
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
            &Stop::default(),
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
            &Stop::default(),
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
            &Stop::default(),
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
            &Stop::default(),
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

    /// A producer stuck in a long job (a pile load) hears the stop: set from outside (a
    /// consumer that went away) the pipeline ends with `Ok` and takes no more items; set by
    /// a failing `consume`, the producer gives up its job and the consumer's error is what
    /// comes back.
    #[test]
    fn a_stop_reaches_a_producer_mid_job() {
        // A job that runs until stopped (or 30 s, which fails the test).
        let started = std::time::Instant::now();
        let long_job = |stop: &Stop| -> Result<u32> {
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_secs(30) {
                stop.check()?;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(0)
        };
        let stop = Stop::default();
        let mut taken = 0;
        let outside = stop.clone();
        pipelined(
            (0..10u32).collect(),
            &stop,
            |j, _| if j == 0 { Ok(j) } else { long_job(&stop) },
            |_| {
                taken += 1;
                // The consumer of the stream goes away while job 1 is being produced.
                outside.set();
                Ok(ControlFlow::Continue(None))
            },
        )
        .unwrap();
        assert_eq!(taken, 1);

        let stop = Stop::default();
        let e = pipelined(
            (0..10u32).collect(),
            &stop,
            |j, _| if j == 0 { Ok(j) } else { long_job(&stop) },
            |_| Err(Error::Invalid("the output disk is full".into())),
        )
        .unwrap_err();
        assert!(e.to_string().contains("disk is full"), "{e}");
        assert!(stop.is_set());
        assert!(
            started.elapsed().as_secs() < 15,
            "a producer never heard the stop"
        );
    }
}
