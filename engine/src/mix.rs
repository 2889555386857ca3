//! Weighted mixtures of datasets: several named sources read as one job, each epoch made
//! of an exact number of records from each source.
//!
//! A spec is `mix:NAME=PATH*WEIGHT,NAME=PATH*WEIGHT,...[;size=N]` (one format for all
//! sources). An epoch holds `size` records (default: the sources' records together); a
//! source's count is its share of the weights, rounded by largest remainder so the counts
//! add up to `size` exactly. A source whose count fits it is sampled without replacement;
//! one whose count is larger is repeated: every record `count / records` times, and the
//! remainder sampled without replacement. The sample depends only on (seed, epoch, source):
//! each source's records are ranked by a keyed hash and the lowest taken. The epoch is then
//! a view of the sources side by side ([`Dataset::with_draws`]), handed to a mode and
//! shuffled by the order contract like any dataset, so lirs and two-pass deliver the same
//! batches. Batches carry each record's source ([`crate::modes::Batch::sources`]) and its
//! id in the sources side by side. The modes know nothing of mixtures: the dependency goes
//! from here to them. A spec is parsed where the user speaks ([`crate::source`]); datasets
//! never see one.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use crate::dataset::{Dataset, OpenOptions};
use crate::modes::{BatchStream, ReadOptions, ReadReport};
use crate::order::{EpochKey, Grouping};
use crate::resources::MemoryFrom;
use crate::{Error, Result};

/// One source of a mixture.
#[derive(Clone, Debug, PartialEq)]
pub struct MixSource {
    /// Its name.
    pub name: String,
    /// Its dataset (a file, a directory or a glob).
    pub path: PathBuf,
    /// Its weight (positive).
    pub weight: f64,
}

/// A mixture as given.
#[derive(Clone, Debug, PartialEq)]
pub struct MixSpec {
    /// The sources, in order.
    pub sources: Vec<MixSource>,
    /// Records per epoch (default: the sources' records together).
    pub size: Option<u64>,
}

impl MixSpec {
    /// Parses `mix:NAME=PATH*WEIGHT,...[;size=N]`; `None` when `s` is not a mixture.
    pub fn parse(s: &str) -> Option<std::result::Result<MixSpec, String>> {
        let body = s.strip_prefix("mix:")?;
        Some((|| {
            let (list, size) = match body.rsplit_once(";size=") {
                Some((l, n)) => (
                    l,
                    Some(
                        n.parse::<u64>()
                            .map_err(|_| format!("'{s}': size '{n}' is not a number"))?,
                    ),
                ),
                None => (body, None),
            };
            if list.contains(";size=") {
                return Err(format!(
                    "'{s}': size is given more than once (a mixture ends with one ';size=N')"
                ));
            }
            let mut sources = Vec::new();
            for part in list.split(',') {
                let (name, rest) = part.split_once('=').ok_or_else(|| {
                    format!("'{part}': a source is NAME=PATH*WEIGHT, like web=data/web.npy*0.7")
                })?;
                let (path, w) = rest.rsplit_once('*').ok_or_else(|| {
                    format!("'{part}': a source is NAME=PATH*WEIGHT, like web=data/web.npy*0.7")
                })?;
                let weight: f64 = w
                    .parse()
                    .map_err(|_| format!("'{part}': weight '{w}' is not a number"))?;
                if !(weight.is_finite() && weight > 0.0) {
                    return Err(format!("'{part}': a weight must be above 0"));
                }
                // One level: a source is a dataset. A spec nested in a source (5,000 deep
                // overflowed the stack) is refused here, before any path is looked at.
                if path.starts_with("mix:") {
                    return Err(format!(
                        "'{}...': a mixture's source is a dataset, not another mixture \
                         (mixtures do not nest: list every source in one mix:)",
                        part.chars().take(40).collect::<String>()
                    ));
                }
                if name.is_empty() || sources.iter().any(|x: &MixSource| x.name == name) {
                    return Err(format!("'{part}': each source needs a name of its own"));
                }
                sources.push(MixSource {
                    name: name.into(),
                    path: path.into(),
                    weight,
                });
            }
            if size == Some(0) {
                return Err(format!("'{s}': an epoch of no records"));
            }
            Ok(MixSpec { sources, size })
        })())
    }
}

/// The most records a mixture epoch holds (its draws are in memory, 8 bytes each).
const MAX_EPOCH: u64 = 1 << 32;

/// An opened mixture: its sources side by side, their names, where each starts, and the
/// records each gives every epoch.
#[derive(Debug)]
pub struct Mixture {
    /// The sources' records side by side (one format): a mixture's ids are ids of these.
    pub sources: Arc<Dataset>,
    /// Source names.
    pub names: Vec<String>,
    /// First id of each source, and the total.
    pub starts: Vec<u64>,
    /// Records each source gives every epoch (they add up to the epoch's size).
    pub counts: Vec<u64>,
    /// The epochs' views in use now, by (seed, epoch): an OPEN's first view and its pass's,
    /// or the ranks of a job, share one rather than each holding its draws.
    live: Mutex<Vec<LiveView>>,
}

/// An epoch's view in use: its (seed, epoch), and the view while someone holds it.
type LiveView = ((u64, u64), Weak<Dataset>);

/// Opens every source (one format) and puts them side by side: a read of the mixture
/// reads each epoch's draws ([`read`]).
pub fn open(spec: &MixSpec, opts: &OpenOptions) -> Result<Mixture> {
    // `s3://` sources are staged (a mixture's draws are read at random, never streamed),
    // all of them within --cache-limit together, before any is fetched.
    let paths: Vec<PathBuf> = spec.sources.iter().map(|s| s.path.clone()).collect();
    crate::remote::check_fits(
        &paths,
        opts.cache_limit,
        "a mixture's sources are read at random, from staged copies; raise --cache-limit",
    )?;
    let (mut local, mut staged) = (Vec::new(), 0);
    for p in &paths {
        let (l, s) = crate::remote::resolve_counted(std::slice::from_ref(p))?;
        local.push(l);
        staged += s;
    }
    // The staged copies' index sidecars take what --cache-limit leaves beside them all.
    let o = crate::remote::staged_options(&paths, staged, opts);
    let mut parts = Vec::new();
    for l in &local {
        parts.push(Dataset::open(l, &o, &mut |_, _, _| {})?);
    }
    // Staged copies leave piles only the rest of --cache-limit.
    let ds = Dataset::concat(parts)?.staged_within(o.staged_room());
    let starts = ds.parts().expect("datasets side by side").to_vec();
    let total = spec.size.unwrap_or_else(|| ds.records());
    // An epoch's draws are held in memory, 8 bytes a record (and a source's sample ranks
    // 16 bytes a record of it while it is drawn).
    let draws_bytes = total.saturating_mul(8);
    // Within --memory, or the machine's budget without it (`size=1000000000` with no
    // --memory allocated 8 GB).
    let budget = match opts.max_record {
        Some(m) => Some((m, MemoryFrom::Flag)),
        None => crate::resources::memory::here().map(|m| (m.bytes, m.from)),
    };
    let over = budget.filter(|&(m, _)| draws_bytes > m);
    if total > MAX_EPOCH || over.is_some() {
        return Err(Error::OverBudget(format!(
            "a mixture epoch of {total} records: its draws take {} in memory, more than {}",
            crate::size::human_bytes(draws_bytes as f64),
            match over {
                Some((m, from)) => from.words(m),
                None => format!("the {MAX_EPOCH} records a mixture epoch may hold"),
            }
        )));
    }
    let weights: Vec<f64> = spec.sources.iter().map(|s| s.weight).collect();
    Ok(Mixture {
        sources: Arc::new(ds),
        names: spec.sources.iter().map(|s| s.name.clone()).collect(),
        starts,
        counts: counts(&weights, total),
        live: Mutex::new(Vec::new()),
    })
}

impl Mixture {
    /// Records in an epoch.
    pub fn size(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The source of id `id` (of the sources side by side).
    pub fn source_of(&self, id: u64) -> usize {
        self.starts.partition_point(|&s| s <= id) - 1
    }

    /// Epoch `epoch`'s records (ids of the sources side by side, ascending, a record as
    /// many times as it is drawn).
    pub fn draws(&self, seed: u64, epoch: u64) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.size() as usize);
        for (i, &c) in self.counts.iter().enumerate() {
            let (first, n) = (self.starts[i], self.starts[i + 1] - self.starts[i]);
            let (copies, rest) = (c / n, (c % n) as usize);
            // The sample without replacement: the `rest` records of lowest keyed hash.
            let key = EpochKey::new(seed ^ 0x6d69_7873_6f75_7263 ^ (i as u64) << 48, epoch);
            let mut chosen = vec![false; n as usize];
            if rest > 0 {
                let mut ranked: Vec<(u64, u64)> = (0..n).map(|id| (key.key(id), id)).collect();
                ranked.select_nth_unstable(rest - 1);
                for &(_, id) in &ranked[..rest] {
                    chosen[id as usize] = true;
                }
            }
            for id in 0..n {
                let times = copies + chosen[id as usize] as u64;
                for _ in 0..times {
                    out.push(first + id);
                }
            }
        }
        out
    }

    /// Epoch `epoch`'s view: the sources side by side, their records `draws(seed, epoch)`.
    /// What a mode reads for that epoch, and what planners size a read of the mixture by.
    pub fn view(&self, seed: u64, epoch: u64) -> Result<Dataset> {
        self.sources.with_draws(self.draws(seed, epoch))
    }

    /// [`Mixture::view`], shared with whoever holds that epoch's view now: its draws are
    /// 8 bytes a record (160 MB for an epoch of 20 million), and an OPEN sizing its read
    /// by the first epoch, its pass reading it, and the other ranks of its job each held a
    /// copy.
    pub fn shared_view(&self, seed: u64, epoch: u64) -> Result<Arc<Dataset>> {
        let live = || self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = live()
            .iter()
            .find(|(k, _)| *k == (seed, epoch))
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(v);
        }
        let v = Arc::new(self.view(seed, epoch)?);
        let mut l = live();
        l.retain(|(_, w)| w.strong_count() > 0);
        l.push(((seed, epoch), Arc::downgrade(&v)));
        Ok(v)
    }
}

/// Counts proportional to `weights` adding up to `total` exactly (largest remainder;
/// ties to the earlier source).
fn counts(weights: &[f64], total: u64) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| w / sum * total as f64).collect();
    let mut out: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let mut left = total - out.iter().sum::<u64>().min(total);
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        fb.partial_cmp(&fa)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// Reads mixture `mix` (from [`open`]) with `opts` (record grouping, no baseline): each
/// epoch a view of its draws handed to lirs, or to two-pass (`scratch` given, one epoch at
/// a time: the membership changes, so nothing rolls over). The views' batches carry the ids
/// of the sources side by side and each record's source.
pub fn read(mix: Arc<Mixture>, opts: ReadOptions, scratch: Option<PathBuf>) -> Result<BatchStream> {
    if opts.grouping != Grouping::Record || opts.baseline.is_some() {
        return Err(Error::Invalid(
            "a mixture is read with record grouping by lirs or two-pass".into(),
        ));
    }
    let epochs = opts.epoch_range()?;
    BatchStream::spawn("riffle-mix", 1, move |tx, stop, report| {
        let started = std::time::Instant::now();
        for epoch in epochs {
            if stop.is_set() {
                break;
            }
            let view = mix.shared_view(opts.seed, epoch)?;
            let mut o = opts.clone();
            o.first_epoch = epoch;
            o.epochs = 1;
            if o.resume.is_some_and(|c| c.epoch != epoch) {
                o.resume = None;
                o.resume_start = None;
            }
            let mut stream = match &scratch {
                Some(s) => crate::modes::read_two_pass(view, o, s.clone())?,
                None => crate::modes::read(view, o)?,
            };
            for b in stream.by_ref() {
                let b = b?;
                if stop.is_set() || tx.send(Ok(b)).is_err() {
                    return Ok(());
                }
            }
            absorb(report, &stream.report());
        }
        report.seconds = started.elapsed().as_secs_f64();
        Ok(())
    })
}

/// Adds an epoch's report to the read's.
fn absorb(t: &mut ReadReport, r: &ReadReport) {
    if t.mode.is_empty() {
        *t = r.clone();
        t.epoch_seconds = vec![r.seconds];
        return;
    }
    t.records += r.records;
    t.batches += r.batches;
    t.bytes += r.bytes;
    t.read_ops += r.read_ops;
    t.device_bytes += r.device_bytes;
    t.piles = t.piles.max(r.piles);
    t.pile_loads += r.pile_loads;
    t.scratch_bytes = t.scratch_bytes.max(r.scratch_bytes);
    t.memory_bytes = t.memory_bytes.max(r.memory_bytes);
    t.epoch_seconds.push(r.seconds);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let s = MixSpec::parse("mix:a=x.npy*0.7,b=dir/*2;size=10")
            .unwrap()
            .unwrap();
        assert_eq!(s.sources.len(), 2);
        assert_eq!(
            (s.sources[1].path.to_str(), s.sources[1].weight),
            (Some("dir/"), 2.0)
        );
        assert_eq!(s.size, Some(10));
        assert!(MixSpec::parse("x.npy").is_none(), "not a mixture");
        for bad in [
            "mix:a=x",
            "mix:a=x*0",
            "mix:a=x*-1",
            "mix:a=x*w",
            "mix:=x*1",
            "mix:a=x*1,a=y*1",
            "mix:a=x*1;size=0",
            "mix:a=x*1;size=q",
        ] {
            assert!(MixSpec::parse(bad).unwrap().is_err(), "{bad}");
        }
        // Said as what it is, not as a weight that is not a number (issue 30 D36).
        let twice = MixSpec::parse("mix:a=x*1;size=10;size=20")
            .unwrap()
            .unwrap_err();
        assert!(twice.contains("size is given more than once"), "{twice}");
    }

    /// Issue 30 D33: a mixture nested in a source, however deep, is refused at once with
    /// a short message (not looked up as a path, nor echoed whole).
    #[test]
    fn nested_mixtures_are_refused() {
        let mut spec = "x.npy".to_owned();
        for i in 0..5000 {
            spec = format!("mix:a{i}={spec}*1");
        }
        for s in [
            spec.as_str(),
            "mix:a=mix:b=x*1*1",
            "mix:a=y*1,b=mix:c=x*1*2",
        ] {
            let e = MixSpec::parse(s).unwrap().unwrap_err();
            assert!(e.contains("do not nest") && e.len() < 300, "{e}");
        }
    }

    #[test]
    fn counts_follow_the_weights_and_add_up_exactly() {
        assert_eq!(counts(&[0.7, 0.2, 0.1], 3000), [2100, 600, 300]);
        assert_eq!(counts(&[1.0, 1.0, 1.0], 10), [4, 3, 3]);
        assert_eq!(counts(&[1.0], 7), [7]);
        for total in [1u64, 2, 99, 1000, 12_345] {
            let c = counts(&[0.5, 0.3, 0.15, 0.05], total);
            assert_eq!(c.iter().sum::<u64>(), total);
        }
    }
}
