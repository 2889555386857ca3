//! Stall telemetry: per stream, the time the daemon waited for the engine while its client
//! had room for another batch (the data stall a training step pays, as the daemon sees it)
//! and the time the engine's batches waited for the client (back-pressure: no credit or no
//! ring space until the client acknowledged); totals and percentiles, per stream and per
//! job, in the daemon's stats.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// One stream's waits.
pub(super) struct Waits {
    pub(super) batches: u64,
    engine: Histogram<u64>,
    engine_total: Duration,
    client: Histogram<u64>,
    client_total: Duration,
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
        }
    }
}

impl Waits {
    /// A batch came from the engine, after the stream waited `waited` for it with room
    /// for it (`None`: it did not wait on the engine, its client had no room).
    pub(super) fn announced(&mut self, waited: Option<Duration>) {
        self.batches += 1;
        if let Some(d) = waited {
            self.engine.saturating_record(micros(d));
            self.engine_total += d;
        }
    }

    /// The stream waited `d` on its client (credits or ring space).
    pub(super) fn client_wait(&mut self, d: Duration) {
        self.client.saturating_record(micros(d));
        self.client_total += d;
    }

    fn add(&mut self, o: &Waits) {
        self.batches += o.batches;
        let _ = self.engine.add(&o.engine);
        let _ = self.client.add(&o.client);
        self.engine_total += o.engine_total;
        self.client_total += o.client_total;
    }

    fn json(&self) -> Value {
        let pct = |h: &Histogram<u64>| json!({"p50": h.value_at_quantile(0.5), "p99": h.value_at_quantile(0.99), "max": h.max()});
        json!({
            "batches": self.batches,
            "engine_wait_s": self.engine_total.as_secs_f64(),
            "engine_wait_us": pct(&self.engine),
            "client_wait_s": self.client_total.as_secs_f64(),
            "client_wait_us": pct(&self.client),
        })
    }
}

/// A live stream's job (if shared) and waits.
type Live = (Option<u64>, Arc<Mutex<Waits>>);

/// The live streams' waits, by stream id, with their job.
#[derive(Default)]
pub(super) struct Telemetry {
    live: Mutex<HashMap<u64, Live>>,
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

    pub(super) fn remove(&self, id: u64) {
        lock(&self.live).remove(&id);
    }

    /// Every live stream's waits, and every live job's (its streams' together).
    pub(super) fn json(&self) -> (Vec<Value>, Vec<Value>) {
        let live = lock(&self.live);
        let mut streams = Vec::new();
        let mut jobs: HashMap<u64, Waits> = HashMap::new();
        let mut ids: Vec<_> = live.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let (job, w) = &live[&id];
            let w = lock(w);
            let mut v = w.json();
            v["stream"] = json!(id);
            v["job"] = json!(job);
            streams.push(v);
            if let Some(j) = job {
                jobs.entry(*j).or_default().add(&w);
            }
        }
        let mut jobs: Vec<_> = jobs
            .into_iter()
            .map(|(j, w)| {
                let mut v = w.json();
                v["job"] = json!(j);
                v
            })
            .collect();
        jobs.sort_by_key(|v| v["job"].as_u64());
        (streams, jobs)
    }
}

/// Adds `d` to stream waits `w`, through its lock.
pub(super) fn record(w: &Mutex<Waits>, f: impl FnOnce(&mut Waits)) {
    f(&mut lock(w));
}
