//! Stall telemetry: per stream, the time the daemon waited for the engine while its client
//! had room for another batch (the data stall a training step pays, as the daemon sees it)
//! and the time the engine's batches waited for the client (back-pressure: no credit or no
//! ring space until the client acknowledged); totals and percentiles, per stream and per
//! job, in the daemon's stats.
//!
//! A wait in progress counts as it goes (its time so far is in the totals and the largest
//! wait, and shown as `*_wait_now_s`), so a stall shows while it lasts. A job's waits stay
//! in the stats after its streams leave: the streams that left are added to their job's
//! figures, and the last [`ENDED_JOBS`] jobs that ended are listed with `"live": false`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// One stream's waits.
pub(super) struct Waits {
    pub(super) batches: u64,
    engine: Histogram<u64>,
    engine_total: Duration,
    client: Histogram<u64>,
    client_total: Duration,
    /// Since when the stream waits on the engine (with room for a batch), if it does now.
    engine_since: Option<Instant>,
    /// Since when the stream waits on its client, if it does now.
    client_since: Option<Instant>,
}

impl Default for Waits {
    fn default() -> Self {
        let h = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
        Waits {
            batches: 0,
            engine: h(),
            engine_total: Duration::ZERO,
            client: h(),
            client_total: Duration::ZERO,
            engine_since: None,
            client_since: None,
        }
    }
}

impl Waits {
    /// A batch came from the engine, after the stream waited `waited` for it with room
    /// for it (`None`: it did not wait on the engine, its client had no room).
    pub(super) fn announced(&mut self, waited: Option<Duration>) {
        self.batches += 1;
        self.engine_since = None;
        if let Some(d) = waited {
            self.engine.saturating_record(micros(d));
            self.engine_total += d;
        }
    }

    /// The stream waits on the engine since `since` (`None`: it stopped waiting on it
    /// without a batch: it waits on its client now).
    pub(super) fn engine_waiting(&mut self, since: Option<Instant>) {
        self.engine_since = since;
    }

    /// The stream waits on its client (credits or ring space) from now on.
    pub(super) fn client_waiting(&mut self, since: Instant) {
        self.engine_since = None;
        self.client_since = Some(since);
    }

    /// The stream waited `d` on its client (credits or ring space).
    pub(super) fn client_wait(&mut self, d: Duration) {
        self.client_since = None;
        self.client.saturating_record(micros(d));
        self.client_total += d;
    }

    /// Adds the waits that ended of `o` (a wait in progress adds with [`Waits::add_closed`]).
    fn add(&mut self, o: &Waits) {
        self.batches += o.batches;
        let _ = self.engine.add(&o.engine);
        let _ = self.client.add(&o.client);
        self.engine_total += o.engine_total;
        self.client_total += o.client_total;
    }

    /// The waits as of `now`, a wait in progress counted so far (in the total, the
    /// largest wait and `*_wait_now_s`); percentiles are of the waits that ended.
    fn json(&self, now: Instant) -> Value {
        let so_far = |since: Option<Instant>| {
            since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
        };
        let (engine_now, client_now) = (so_far(self.engine_since), so_far(self.client_since));
        let pct = |h: &Histogram<u64>, ongoing: Duration| {
            let max = h.max().max(if ongoing.is_zero() {
                0
            } else {
                micros(ongoing)
            });
            json!({"p50": h.value_at_quantile(0.5), "p99": h.value_at_quantile(0.99), "max": max})
        };
        json!({
            "batches": self.batches,
            "engine_wait_s": (self.engine_total + engine_now).as_secs_f64(),
            "engine_wait_now_s": engine_now.as_secs_f64(),
            "engine_wait_us": pct(&self.engine, engine_now),
            "client_wait_s": (self.client_total + client_now).as_secs_f64(),
            "client_wait_now_s": client_now.as_secs_f64(),
            "client_wait_us": pct(&self.client, client_now),
        })
    }

    /// Adds `o`'s waits to these, with every wait of `o` in progress counted as ended
    /// `now` (a stream that leaves, or a live one in its job's figures).
    fn add_closed(&mut self, o: &Waits, now: Instant) {
        self.add(o);
        if let Some(s) = o.engine_since {
            let d = now.saturating_duration_since(s);
            self.engine.saturating_record(micros(d));
            self.engine_total += d;
        }
        if let Some(s) = o.client_since {
            let d = now.saturating_duration_since(s);
            self.client.saturating_record(micros(d));
            self.client_total += d;
        }
    }
}

/// A live stream's job (if shared) and waits.
type Live = (Option<u64>, Arc<Mutex<Waits>>);

/// Jobs that ended kept in the stats (with their waits), the newest last.
pub(super) const ENDED_JOBS: usize = 16;

/// The live streams' waits, by stream id, with their job; the waits of the streams that
/// left, by job; the jobs that ended.
#[derive(Default)]
pub(super) struct Telemetry {
    live: Mutex<HashMap<u64, Live>>,
    past: Mutex<Past>,
}

#[derive(Default)]
struct Past {
    /// Streams that left a job that still has live streams, their waits together.
    left: HashMap<u64, Waits>,
    /// Jobs with no live stream left, the newest last (at most [`ENDED_JOBS`]).
    ended: VecDeque<(u64, Waits)>,
}

/// `d` in whole microseconds for a histogram: at least 1, at most `u64::MAX`.
pub(super) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Telemetry {
    /// Lists stream `id` (of `job`, if shared) with its waits until
    /// [`Telemetry::remove`].
    pub(super) fn add(&self, id: u64, job: Option<u64>, waits: Arc<Mutex<Waits>>) {
        lock(&self.live).insert(id, (job, waits));
    }

    /// Stream `id` left: its waits go to its job's, which ends with its last stream.
    pub(super) fn remove(&self, id: u64) {
        let mut live = lock(&self.live);
        let Some((Some(job), waits)) = live.remove(&id) else {
            return;
        };
        let last = !live.values().any(|(j, _)| *j == Some(job));
        let mut past = lock(&self.past);
        past.left
            .entry(job)
            .or_default()
            .add_closed(&lock(&waits), Instant::now());
        if last {
            let w = past.left.remove(&job).unwrap_or_default();
            if past.ended.len() == ENDED_JOBS {
                past.ended.pop_front();
            }
            past.ended.push_back((job, w));
        }
    }

    /// Every live stream's waits, and every job's (its streams' together, those that left
    /// included): the live jobs, then the last jobs that ended.
    pub(super) fn json(&self) -> (Vec<Value>, Vec<Value>) {
        let now = Instant::now();
        let live = lock(&self.live);
        let past = lock(&self.past);
        let mut streams = Vec::new();
        // Per job: its streams' waits (those in progress counted so far) and its longest
        // waits in progress.
        let mut jobs: HashMap<u64, (Waits, Duration, Duration)> = HashMap::new();
        let mut ids: Vec<_> = live.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let (job, w) = &live[&id];
            let w = lock(w);
            let mut v = w.json(now);
            v["stream"] = json!(id);
            v["job"] = json!(job);
            streams.push(v);
            if let Some(j) = job {
                let (jw, engine_now, client_now) = jobs.entry(*j).or_insert_with(|| {
                    let mut t = Waits::default();
                    if let Some(left) = past.left.get(j) {
                        t.add(left);
                    }
                    (t, Duration::ZERO, Duration::ZERO)
                });
                jw.add_closed(&w, now);
                let so_far = |s: Option<Instant>| {
                    s.map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
                };
                *engine_now = (*engine_now).max(so_far(w.engine_since));
                *client_now = (*client_now).max(so_far(w.client_since));
            }
        }
        let mut out: Vec<_> = jobs
            .into_iter()
            .map(|(j, (w, engine_now, client_now))| {
                let mut v = w.json(now);
                v["job"] = json!(j);
                v["live"] = json!(true);
                v["engine_wait_now_s"] = json!(engine_now.as_secs_f64());
                v["client_wait_now_s"] = json!(client_now.as_secs_f64());
                v
            })
            .collect();
        out.sort_by_key(|v| v["job"].as_u64());
        out.extend(past.ended.iter().map(|(j, w)| {
            let mut v = w.json(now);
            v["job"] = json!(j);
            v["live"] = json!(false);
            v
        }));
        (streams, out)
    }
}

/// Adds `d` to stream waits `w`, through its lock.
pub(super) fn record(w: &Mutex<Waits>, f: impl FnOnce(&mut Waits)) {
    f(&mut lock(w));
}
