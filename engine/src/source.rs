//! What a user names as a dataset, parsed where the user speaks (a command's arguments, the
//! daemon's `--dataset NAME=SPEC`), and what it opens as.
//!
//! A spec is paths (files, directories, globs: a [`Dataset`]) or one weighted mixture
//! `mix:NAME=PATH*WEIGHT,...[;size=N]` ([`crate::mix`]). Only here does `mix:` mean a
//! mixture: below, a dataset is paths, so a file whose name begins `mix:` is a file when it
//! is given as a path (on the command line, `./mix:...`). An opened spec is a [`Source`],
//! which reads itself: a dataset through the modes, a mixture as its epochs' views handed
//! to the modes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dataset::{Dataset, OpenOptions};
use crate::mix::{MixSpec, Mixture};
use crate::modes::{BatchStream, ReadOptions};
use crate::{Error, Result};

/// A dataset as the user named it.
#[derive(Clone, Debug, PartialEq)]
pub enum DatasetSpec {
    /// Files, directories and globs, read as one dataset.
    Paths(Vec<PathBuf>),
    /// A weighted mixture of datasets.
    Mixture(MixSpec),
}

impl DatasetSpec {
    /// The spec the words `args` give: a single `mix:...` is a mixture, anything else
    /// paths. A mixture is given alone.
    pub fn parse<P: AsRef<Path>>(args: &[P]) -> Result<DatasetSpec> {
        let mix = |p: &P| p.as_ref().to_str().and_then(MixSpec::parse);
        match args {
            [one] => match mix(one) {
                Some(spec) => Ok(DatasetSpec::Mixture(spec.map_err(Error::Invalid)?)),
                None => Ok(DatasetSpec::Paths(vec![one.as_ref().into()])),
            },
            _ => match args.iter().find(|p| mix(p).is_some()) {
                Some(p) => Err(Error::Invalid(format!(
                    "'{}': a mixture is given alone, not beside other paths",
                    p.as_ref().display()
                ))),
                None => Ok(DatasetSpec::Paths(
                    args.iter().map(|p| p.as_ref().into()).collect(),
                )),
            },
        }
    }

    /// Whether this is a mixture.
    pub fn is_mixture(&self) -> bool {
        matches!(self, DatasetSpec::Mixture(_))
    }

    /// Opens the dataset or every source of the mixture; `progress` sees a dataset's index
    /// builds (not a mixture's).
    pub fn open(
        &self,
        opts: &OpenOptions,
        progress: &mut dyn FnMut(&Path, u64, u64),
    ) -> Result<Source> {
        Ok(match self {
            DatasetSpec::Paths(p) => {
                // An `s3://` URL past `--cache-limit` is streamed; others are staged into
                // the local cache first (`remote`).
                if let Some(ds) = crate::remote::open_within(p, opts)? {
                    return Ok(Source::Dataset(Arc::new(ds)));
                }
                let (local, staged) = crate::remote::resolve_counted(p)?;
                let o = crate::remote::staged_options(p, staged, opts);
                let ds = Dataset::open(&local, &o, progress)?;
                Source::Dataset(Arc::new(ds.staged_within(o.staged_room())))
            }
            DatasetSpec::Mixture(m) => Source::Mixture(Arc::new(crate::mix::open(m, opts)?)),
        })
    }
}

/// A dataset named by one word, `PATH[:FORMAT]` (as `riffle serve --dataset NAME=PATH[:FORMAT]`
/// and an OPEN of a daemon that opens paths give it): the format is the part after the
/// first colon that parses as one (formats themselves hold colons: `fixed:4K:16`, and so
/// may paths), and `mix:...` is a mixture.
#[derive(Clone, Debug)]
pub struct PathSpec {
    /// Where the dataset is (a mixture's whole word).
    pub path: PathBuf,
    /// The format given, if any.
    pub format: Option<crate::format::Format>,
    /// What the path names: paths, or a mixture.
    pub spec: DatasetSpec,
}

impl PathSpec {
    /// Parses `PATH[:FORMAT]` (or a mixture); errors say what was expected.
    pub fn parse(word: &str) -> std::result::Result<PathSpec, String> {
        if word.is_empty() {
            return Err("an empty dataset path".into());
        }
        let spec_of = |p: &str| DatasetSpec::parse(&[p]).map_err(|e| e.to_string());
        for (i, _) in word.match_indices(':').filter(|(i, _)| *i > 0) {
            if let Ok(f) = word[i + 1..].parse::<crate::format::Format>() {
                return Ok(PathSpec {
                    path: word[..i].into(),
                    format: Some(f),
                    spec: spec_of(&word[..i])?,
                });
            }
        }
        Ok(PathSpec {
            path: word.into(),
            format: None,
            spec: spec_of(word)?,
        })
    }

    /// Every path the spec names (a mixture's sources').
    pub fn paths(&self) -> Vec<&Path> {
        match &self.spec {
            DatasetSpec::Paths(p) => p.iter().map(PathBuf::as_path).collect(),
            DatasetSpec::Mixture(m) => m.sources.iter().map(|s| s.path.as_path()).collect(),
        }
    }
}

/// An opened [`DatasetSpec`].
#[derive(Clone, Debug)]
pub enum Source {
    /// One dataset.
    Dataset(Arc<Dataset>),
    /// A weighted mixture: each epoch a view of its sources' drawn records.
    Mixture(Arc<Mixture>),
}

impl Source {
    /// The records: the dataset, or the mixture's sources side by side (whose ids a
    /// mixture's batches carry). Its files, format, labels and indexes are the source's.
    pub fn dataset(&self) -> &Arc<Dataset> {
        match self {
            Source::Dataset(d) => d,
            Source::Mixture(m) => &m.sources,
        }
    }

    /// The mixture, when this is one.
    pub fn mixture(&self) -> Option<&Arc<Mixture>> {
        match self {
            Source::Dataset(_) => None,
            Source::Mixture(m) => Some(m),
        }
    }

    /// Records in an epoch: the dataset's, or the mixture's epoch size.
    pub fn len(&self) -> u64 {
        match self {
            Source::Dataset(d) => d.len(),
            Source::Mixture(m) => m.size(),
        }
    }

    /// Whether an epoch has no records (never true for an opened source).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What epoch `epoch` of a read with `seed` reads: the dataset itself, or the mixture's
    /// view of that epoch's draws. Planners and budgets size a read by it.
    pub fn epoch_view(&self, seed: u64, epoch: u64) -> Result<Arc<Dataset>> {
        match self {
            Source::Dataset(d) => Ok(d.clone()),
            Source::Mixture(m) => m.shared_view(seed, epoch),
        }
    }

    /// Reads it with `opts`: by lirs (or a baseline), or by two-pass with piles in
    /// `scratch` when one is given. A mixture is read by lirs or two-pass with record
    /// grouping ([`crate::mix::read`]).
    pub fn read(&self, opts: ReadOptions, scratch: Option<PathBuf>) -> Result<BatchStream> {
        match (self, scratch) {
            (Source::Dataset(d), None) => crate::modes::read(d.clone(), opts),
            (Source::Dataset(d), Some(s)) => crate::modes::read_two_pass(d.clone(), opts, s),
            (Source::Mixture(m), scratch) => crate::mix::read(m.clone(), opts, scratch),
        }
    }

    /// Reads the source with the dataset held in memory ([`crate::modes::read_resident`]);
    /// a mixture (a new view of its sources each epoch) is not read this way.
    /// `scratch` is where a partly resident read may put piles for the part it does not
    /// hold ([`crate::modes::read_resident_in`]).
    pub fn read_resident(
        &self,
        opts: ReadOptions,
        scratch: Option<std::path::PathBuf>,
    ) -> Result<BatchStream> {
        match self {
            Source::Dataset(d) => crate::modes::read_resident_in(d.clone(), opts, scratch),
            Source::Mixture(_) => Err(crate::Error::Invalid(
                "a mixture is read by lirs or two-pass (--mode resident)".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_mix_word_is_a_mixture_and_anything_else_paths() {
        let spec = DatasetSpec::parse(&["mix:a=x.npy*1,b=y.npy*2"]).unwrap();
        assert!(spec.is_mixture());
        assert_eq!(
            DatasetSpec::parse(&["./mix:a=x.npy*1"]).unwrap(),
            DatasetSpec::Paths(vec!["./mix:a=x.npy*1".into()])
        );
        assert_eq!(
            DatasetSpec::parse(&["a.npy", "b/"]).unwrap(),
            DatasetSpec::Paths(vec!["a.npy".into(), "b/".into()])
        );
        assert!(DatasetSpec::parse(&["mix:a=x"]).is_err(), "a bad mixture");
        let e = DatasetSpec::parse(&["a.npy", "mix:a=x*1"]).unwrap_err();
        assert!(e.to_string().contains("given alone"), "{e}");
    }

    /// Issue 28: `dataset/` no longer knows mixtures, so a file literally named `mix:...`
    /// opens as a file when given as a path (before, `Dataset::open` took it for a spec).
    #[test]
    fn a_file_named_like_a_mixture_opens_as_a_file_when_given_as_a_path() {
        // The path must begin `mix:`, so the file is in the working directory (the
        // package's, under cargo); a guard removes it.
        struct Remove(PathBuf);
        impl Drop for Remove {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let name = PathBuf::from(format!("mix:a=riffle-{}.npy", std::process::id()));
        let _guard = Remove(name.clone());
        let mut npy = crate::format::npy::write_header("<u4", &[10]);
        npy.extend((0..10u32).flat_map(|i| i.to_le_bytes()));
        std::fs::write(&name, npy).unwrap();
        let ds = Dataset::open(&[&name], &OpenOptions::default(), &mut |_, _, _| {}).unwrap();
        assert_eq!(
            (ds.len(), ds.files()[0].path.as_path()),
            (10, name.as_path())
        );
        let src = DatasetSpec::Paths(vec![name.clone()])
            .open(&OpenOptions::default(), &mut |_, _, _| {})
            .unwrap();
        assert!(src.mixture().is_none());
        assert_eq!(src.len(), 10);
    }
}
