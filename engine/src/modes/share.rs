//! One engine pass shared by the ranks of a job.
//!
//! The ranks of a job (same dataset, seed, epochs, batch size, grouping, world, tail and
//! resume point) read disjoint batches of one epoch sequence: rank `r` of `W` takes global
//! batches `r, r + W, ...`. A [`SharedPass`] runs the job's engine pass once, over every
//! rank's batches in global order ([`ReadOptions::ranks`]), and hands each batch to the
//! stream of its rank. Only the batches of ranks that have joined are read (LIRS) or
//! assembled (two-pass, whose scatter and pile pass read everything anyway).
//!
//! Joining is decided per rank: a rank may join while the pass has not yet decided its
//! first batch (whether to read it or skip it), which in LIRS means before the pass starts
//! (it waits up to a join window for the whole world) and in two-pass any time during the
//! first epoch's scatter. A rank that comes later, or twice, is refused by
//! [`SharedPass::join`]; the caller then runs a pass of its own for it.
//!
//! A job may say how many of its streams to expect ([`Joining::streams`]: those one node
//! will open). Then the pass holds its first decision until that many ranks have joined,
//! or the whole world, or every rank that joined has left, or [`Joining::deadline`] from
//! the pass's start: LIRS before it starts, two-pass (and a two-pass led by LIRS) at its
//! first batch, its scatter running meanwhile. The wait is on the ranks' own condition
//! variable, so joins and leaves (and the stop when every stream has gone) end it at once.
//!
//! Back-pressure: each rank's stream holds at most a few batches; the pass waits on the
//! slowest stream that is still there. A stream that goes away (dropped) leaves the job at
//! once: its batches are no longer read, and when every rank has left the pass stops.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{SendTimeoutError, Sender};

use super::{Batch, BatchStream, Lender, Lent, PayloadLender, ReadOptions, ReadReport};
use crate::{Error, Result};

/// Which ranks of a shared pass want their batches (see the module docs).
#[derive(Debug)]
pub struct Ranks {
    world: u64,
    first_epoch: u64,
    /// Where the wait for the expected streams ends at the latest.
    until: Instant,
    /// The first epoch's global batch where the job starts (a resume point's batch times
    /// the world).
    start: u64,
    state: Mutex<RanksState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct RanksState {
    joined: BTreeSet<u64>,
    /// Global batches of the first epoch decided (read or skipped) so far.
    decided: u64,
    /// The pass is past its first epoch: no rank may join any more.
    closed: bool,
    /// Some rank joined at some point.
    ever: bool,
    /// Every rank that has joined at some point (the streams that came).
    seen: BTreeSet<u64>,
    /// Streams the job expects (the most any of its OPENs said; 0: none said).
    expected: u64,
    /// The ranks the pass reads for, fixed before any batch is decided (a streamed
    /// two-pass read's piles hold only theirs): no rank joins once this is set.
    frozen: Option<BTreeSet<u64>>,
    /// The first decision's wait for the expected streams is over (or was never needed).
    waited: bool,
}

/// Why a rank cannot join a shared pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The pass has decided the rank's first batch: the stream came after emission began.
    Late,
    /// The rank is in the pass already (the job was started again), or outside the world.
    Taken,
    /// The pass is over.
    Ended,
}

/// How a shared pass waits for its streams (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Joining {
    /// A LIRS pass without [`Joining::streams`] waits this long for the whole world
    /// before it starts (zero: it starts at once).
    pub window: Duration,
    /// The streams the job expects on this node, if its OPEN said.
    pub streams: Option<u64>,
    /// With [`Joining::streams`]: the longest the pass waits for them, from its start.
    pub deadline: Duration,
    /// With [`Joining::streams`]: the wait is before the pass starts (LIRS), not at its
    /// first decision (two-pass, whose scatter runs meanwhile).
    pub before_start: bool,
}

impl Ranks {
    /// The ranks of a world of `world`, none joined, for a pass that starts at global
    /// batch `start` of `first_epoch`; expected streams are waited for until `until`.
    pub fn new(world: u64, first_epoch: u64, start: u64, until: Instant) -> Ranks {
        Ranks {
            world,
            first_epoch,
            until,
            start,
            state: Mutex::new(RanksState::default()),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RanksState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides global batch `g` of `epoch`: whether its rank is in the job (then it is read
    /// and sent). Called by the engine in batch order, once per batch.
    pub(crate) fn wanted(&self, epoch: u64, g: u64) -> bool {
        let mut s = self.lock();
        if !s.waited {
            // The first decision: the expected streams first (see the module docs).
            s = self.wait_expected(s);
        }
        if epoch == self.first_epoch {
            s.decided = s.decided.max(g.saturating_add(1));
        } else {
            s.closed = true;
        }
        s.joined.contains(&(g % self.world))
    }

    /// Adds `rank` to the job, and raises the streams the job expects to `streams` if
    /// it says more; refused when the rank is already in or outside the world, or the
    /// pass has already decided its first batch.
    fn join(&self, rank: u64, streams: Option<u64>) -> std::result::Result<(), Refused> {
        let mut s = self.lock();
        let first = self.start.saturating_add(rank);
        if rank >= self.world || s.joined.contains(&rank) {
            return Err(Refused::Taken);
        }
        if s.closed || s.frozen.is_some() || s.decided > first {
            return Err(Refused::Late);
        }
        s.joined.insert(rank);
        s.seen.insert(rank);
        s.ever = true;
        s.expected = s.expected.max(streams.unwrap_or(0));
        self.changed.notify_all();
        Ok(())
    }

    /// Waits (in `s`'s lock, released while waiting) until the streams the job expects
    /// have joined (at most the world), every rank that joined has left, or the deadline;
    /// at once when the job expects none. Once per pass.
    fn wait_expected<'a>(
        &'a self,
        mut s: MutexGuard<'a, RanksState>,
    ) -> MutexGuard<'a, RanksState> {
        loop {
            // A stream that joins meanwhile may say more. A pass is started for a stream
            // that joins it next, and its first decision waits for that one at least: on
            // a loaded machine the pass's thread ran first and decided (or froze) with no
            // rank in, and its own stream was refused as late.
            let target = s.expected.max(1).min(self.world);
            let now = Instant::now();
            if (s.seen.len() as u64) >= target
                || (s.ever && s.joined.is_empty())
                || now >= self.until
            {
                s.waited = true;
                return s;
            }
            s = self
                .changed
                .wait_timeout(s, self.until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Fixes the ranks the pass reads for: waits for the streams the job expects (as the
    /// first decision does), then refuses any later join (`Refused::Late`). Returns the
    /// world and those ranks.
    pub(crate) fn freeze(&self) -> (u64, BTreeSet<u64>) {
        let mut s = self.lock();
        if !s.waited {
            s = self.wait_expected(s);
        }
        let joined = s.joined.clone();
        let set = s.frozen.get_or_insert(joined).clone();
        (self.world, set)
    }

    /// Whether global batch `g` is one of the frozen ranks' ([`Ranks::freeze`]); every
    /// batch is while the ranks are not frozen. No decision is made.
    pub(crate) fn in_frozen(&self, g: u64) -> bool {
        let s = self.lock();
        s.frozen
            .as_ref()
            .is_none_or(|set| set.contains(&(g % self.world)))
    }

    fn leave(&self, rank: u64) {
        let mut s = self.lock();
        s.joined.remove(&rank);
        self.changed.notify_all();
    }

    /// Every rank that joined has left.
    fn deserted(&self) -> bool {
        let s = self.lock();
        s.ever && s.joined.is_empty()
    }

    /// Ranks in the job now.
    pub fn joined(&self) -> u64 {
        self.lock().joined.len() as u64
    }

    /// Whether `rank` has joined the job at some point.
    pub fn has_seen(&self, rank: u64) -> bool {
        self.lock().seen.contains(&rank)
    }

    /// The streams the job expects (0: none said), and the ranks that have joined it at
    /// some point.
    pub fn streams(&self) -> (u64, u64) {
        let s = self.lock();
        (s.expected, s.seen.len() as u64)
    }

    /// Waits until every rank of the world has joined, every rank that joined has left,
    /// or `until`.
    fn wait_for_world(&self, until: Instant) {
        let mut s = self.lock();
        loop {
            let now = Instant::now();
            if (s.joined.len() as u64) >= self.world
                || (s.ever && s.joined.is_empty())
                || now >= until
            {
                return;
            }
            s = self
                .changed
                .wait_timeout(s, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// How a shared pass is started, and told it ended.
pub type StartPass = Box<dyn FnOnce(ReadOptions) -> Result<BatchStream> + Send>;
/// Called once with what the pass did, when it has ended (or was stopped).
pub type PassEnded = Box<dyn FnOnce(ReadReport) + Send>;

/// Lends each batch the memory its rank's stream lends, if it lends any (a daemon's ring):
/// batch `g` is rank `g % world`'s.
struct Routing {
    world: u64,
    lenders: Mutex<HashMap<u64, PayloadLender>>,
}

impl Routing {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, PayloadLender>> {
        self.lenders.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Lender for Routing {
    fn lend(&self, index: u64, records: usize, bytes: usize) -> Option<Box<dyn Lent>> {
        let l = self.lock().get(&(index % self.world)).cloned()?;
        l.0.lend(index / self.world, records, bytes)
    }

    /// Offers batch `g` to rank `g % W`'s lender as its batch `g / W` (a daemon announces
    /// it to the rank's client from the engine's thread, with no hop through the fan-out
    /// and the connection); given back as batch `g` when the lender declines it.
    fn ready(&self, mut batch: Batch) -> Option<Batch> {
        let rank = batch.index % self.world;
        let Some(l) = self.lock().get(&rank).cloned() else {
            return Some(batch);
        };
        batch.index /= self.world;
        let mut back = l.0.ready(batch)?;
        back.index = back.index * self.world + rank;
        Some(back)
    }
}

/// One engine pass fanned out to the streams of its ranks (see the module docs).
pub struct SharedPass {
    ranks: Arc<Ranks>,
    /// The joined ranks' lenders.
    routing: Arc<Routing>,
    /// Each joined rank's stream.
    subs: Mutex<Subs>,
    /// Batches a rank's stream holds before the pass waits for it.
    capacity: usize,
}

#[derive(Default)]
struct Subs {
    streams: HashMap<u64, Sender<Result<Batch>>>,
    /// The pass is over: nobody joins any more.
    ended: bool,
}

/// How long the fan-out waits on one stream before it looks again whether that stream
/// (or the whole job) has gone.
const SEND_WAIT: Duration = Duration::from_millis(20);

impl SharedPass {
    /// Starts the pass of the job `opts` (the options of any one of its ranks; `resume` in
    /// that rank's batches): a thread waits for the job's streams as `joining` says, then
    /// runs `start` with options for every rank's batches and hands each batch to its
    /// rank's stream (`capacity` batches each). `ended` gets the pass's report.
    pub fn spawn(
        opts: &ReadOptions,
        joining: Joining,
        capacity: usize,
        start: StartPass,
        ended: PassEnded,
    ) -> Result<Arc<SharedPass>> {
        let world = opts.world;
        let first_epoch = opts.resume.map_or(opts.first_epoch, |c| c.epoch);
        let mut all = opts.clone();
        all.resume = match opts.resume {
            Some(mut c) => {
                c.batch = c.batch.checked_mul(world).ok_or_else(|| {
                    Error::Invalid(format!(
                        "resume batch {} times a world of {world} overflows",
                        c.batch
                    ))
                })?;
                Some(c)
            }
            None => None,
        };
        let start_at = all.resume.map_or(0, |c| c.batch);
        let now = Instant::now();
        let until = now.checked_add(joining.deadline).unwrap_or(now);
        let ranks = Arc::new(Ranks::new(world, first_epoch, start_at, until));
        ranks.lock().expected = joining.streams.unwrap_or(0);
        all.ranks = Some(ranks.clone());
        let routing = Arc::new(Routing {
            world,
            lenders: Mutex::new(HashMap::new()),
        });
        all.lender = Some(PayloadLender(routing.clone()));
        let pass = Arc::new(SharedPass {
            ranks,
            routing,
            subs: Mutex::new(Subs::default()),
            capacity: capacity.max(1),
        });
        let me = pass.clone();
        let window = now.checked_add(joining.window).unwrap_or(now);
        let expected = joining.streams.is_some();
        // Before it starts, a pass waits for the world (a LIRS window) or, when the job
        // said its streams, for those (LIRS); two-pass waits at its first decision.
        let before = match (expected, joining.before_start) {
            (false, _) => Before::World(window),
            (true, true) => Before::Streams,
            (true, false) => Before::Nothing,
        };
        std::thread::Builder::new()
            .name("riffle-job".into())
            .spawn(move || me.run(all, before, start, ended))
            .map_err(|e| Error::os("cannot start a job's thread", e))?;
        Ok(pass)
    }

    fn subs(&self) -> MutexGuard<'_, Subs> {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The batches of `rank`, as a stream of its own, or why the rank cannot join
    /// (already in, the pass has gone past its first batch, or is over). Its batches are
    /// assembled in memory `lender` lends, when it can (as [`ReadOptions::lender`]: a
    /// batch its `ready` takes over as it completes never comes out of the stream).
    /// `streams`: how many streams of the job its node says it will open.
    pub fn join(
        self: &Arc<Self>,
        rank: u64,
        lender: Option<PayloadLender>,
        streams: Option<u64>,
    ) -> std::result::Result<BatchStream, Refused> {
        let (tx, rx) = crossbeam_channel::bounded(self.capacity);
        let mut subs = self.subs();
        if subs.ended {
            return Err(Refused::Ended);
        }
        if subs.streams.contains_key(&rank) {
            return Err(Refused::Taken);
        }
        // The sender is in place before the rank is: a batch decided for it finds it.
        subs.streams.insert(rank, tx);
        if let Some(l) = lender {
            self.routing.lock().insert(rank, l);
        }
        if let Err(why) = self.ranks.join(rank, streams) {
            subs.streams.remove(&rank);
            self.routing.lock().remove(&rank);
            return Err(why);
        }
        drop(subs);
        let leave = Leave {
            pass: self.clone(),
            rank,
        };
        Ok(BatchStream::fed(rx, Box::new(leave)))
    }

    /// The ranks in the job now.
    pub fn ranks(&self) -> &Ranks {
        &self.ranks
    }

    /// The job's ranks, kept after the pass has gone (who joined it).
    pub fn ranks_handle(&self) -> Arc<Ranks> {
        self.ranks.clone()
    }

    fn run(&self, all: ReadOptions, before: Before, start: StartPass, ended: PassEnded) {
        match before {
            Before::World(until) => self.ranks.wait_for_world(until),
            Before::Streams => drop(self.ranks.wait_expected(self.ranks.lock())),
            Before::Nothing => {}
        }
        let report = if self.ranks.deserted() {
            ReadReport::default()
        } else {
            match start(all) {
                Ok(stream) => self.fan_out(stream),
                Err(e) => {
                    self.broadcast(&e);
                    ReadReport::default()
                }
            }
        };
        // Every stream sees its end once it has taken what was sent to it.
        let mut subs = self.subs();
        subs.ended = true;
        subs.streams.clear();
        drop(subs);
        ended(report);
    }

    fn broadcast(&self, e: &Error) {
        let subs: Vec<_> = self.subs().streams.values().cloned().collect();
        for tx in subs {
            let _ = tx.send_timeout(Err(e.duplicate()), SEND_WAIT);
        }
    }

    /// Hands every batch of `stream` to its rank's stream, in order, until the pass ends
    /// or every rank has left; returns the pass's report.
    fn fan_out(&self, mut stream: BatchStream) -> ReadReport {
        let world = self.ranks.world;
        loop {
            if self.ranks.deserted() {
                break;
            }
            if !stream.ready_within(SEND_WAIT) {
                continue;
            }
            let mut b = match stream.next() {
                None => break,
                Some(Err(e)) => {
                    self.broadcast(&e);
                    break;
                }
                Some(Ok(b)) => b,
            };
            let rank = b.index % world;
            b.index /= world;
            let Some(tx) = self.subs().streams.get(&rank).cloned() else {
                // Its rank left after the batch was decided.
                continue;
            };
            let mut item = Ok(b);
            loop {
                match tx.send_timeout(item, SEND_WAIT) {
                    Ok(()) | Err(SendTimeoutError::Disconnected(_)) => break,
                    Err(SendTimeoutError::Timeout(back)) => {
                        if self.ranks.deserted() {
                            break;
                        }
                        item = back;
                    }
                }
            }
        }
        stream.finish()
    }
}

/// What a pass waits for before it starts.
enum Before {
    /// The whole world, until then.
    World(Instant),
    /// The streams the job expects, until the deadline.
    Streams,
    /// Nothing: it waits at its first decision, if at all.
    Nothing,
}

/// Takes a rank out of its job when its stream is dropped.
struct Leave {
    pass: Arc<SharedPass>,
    rank: u64,
}

impl Drop for Leave {
    fn drop(&mut self) {
        self.pass.subs().streams.remove(&self.rank);
        self.pass.routing.lock().remove(&self.rank);
        self.pass.ranks.leave(self.rank);
    }
}
