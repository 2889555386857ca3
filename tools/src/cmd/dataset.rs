//! The dataset flags every command that opens a dataset shares.

use std::path::PathBuf;

use anyhow::Result;
use riffle::dataset::{OpenOptions, StalePolicy};
use riffle::format::Format;

/// A dataset as given on the command line.
#[derive(clap::Args, Clone, Debug)]
pub struct DatasetArgs {
    /// A file, a directory of files of one format, or globs; or objects in S3-compatible
    /// storage, 's3://BUCKET/KEY', 's3://BUCKET/PREFIX/' or 's3://BUCKET/PREFIX/*.tar',
    /// staged into a local cache (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION; RIFFLE_S3_CACHE; docs/object-storage.md). `riffle read` also takes a
    /// weighted mixture of datasets of one format:
    /// 'mix:NAME=PATH*WEIGHT,NAME=PATH*WEIGHT[;size=RECORDS_PER_EPOCH]' (a file whose name
    /// begins 'mix:' is given as './mix:...').
    #[arg(required = true)]
    pub dataset: Vec<PathBuf>,
    /// npy, lines, jsonl, csv (one header line), libsvm, tfrecord or fixed:SIZE[:HEADER];
    /// optional where the extension tells.
    #[arg(long)]
    pub format: Option<Format>,
    /// Lines: the separator byte (one ASCII character, or an escape: \t, \0, \r, \x1e).
    #[arg(long, value_parser = parse_sep)]
    pub sep: Option<u8>,
    /// Lines: header lines to skip at the top of each file (csv skips 1 by default).
    #[arg(long)]
    pub skip: Option<u64>,
    /// s3:// datasets: the local disk riffle may use for the dataset (1T, 500G, ...). When
    /// its objects fit, they are staged whole into the local cache and read like local
    /// files; when not, nothing is staged: two-pass reads the objects in order with ranged
    /// GETs and scatters their records into local piles kept within this limit (each
    /// object's layout is found once by fetching it alone, so the largest object must fit).
    /// Without it, s3:// datasets are staged whole.
    #[arg(long, value_parser = riffle::size::parse_size)]
    pub cache_limit: Option<u64>,
}

/// Parses a separator: one ASCII character or an escape.
pub fn parse_sep(s: &str) -> Result<u8, String> {
    match s {
        "\\n" => Ok(b'\n'),
        "\\t" => Ok(b'\t'),
        "\\0" => Ok(0),
        "\\r" => Ok(b'\r'),
        _ if s.starts_with("\\x") && s.len() == 4 => {
            u8::from_str_radix(&s[2..], 16).map_err(|_| format!("'{s}': bad hex escape"))
        }
        _ if s.len() == 1 && s.is_ascii() => Ok(s.as_bytes()[0]),
        _ => Err(format!(
            "'{s}': the separator must be one ASCII character or an escape like \\t"
        )),
    }
}

impl DatasetArgs {
    /// The dataset as named: paths, or one weighted mixture (`mix:...`).
    pub fn spec(&self) -> Result<riffle::source::DatasetSpec> {
        Ok(riffle::source::DatasetSpec::parse(&self.dataset)?)
    }

    /// How to open the dataset: the format (given, or told from the first file's extension
    /// when a flag has to adjust it), the stale-index policy and the record limit.
    pub fn options(
        &self,
        no_rebuild: bool,
        no_verify: bool,
        memory: Option<u64>,
    ) -> Result<OpenOptions> {
        let adjust = self.sep.is_some() || self.skip.is_some() || no_verify;
        let mut format = self.format.clone();
        if format.is_none() && adjust {
            let files = riffle::dataset::resolve(&self.dataset)?;
            format = Format::from_extension(&files[0]);
        }
        let format = match format {
            Some(Format::Lines { sep, skip }) => Some(Format::Lines {
                sep: self.sep.unwrap_or(sep),
                skip: self.skip.unwrap_or(skip),
            }),
            None if self.sep.is_some() || self.skip.is_some() => Some(Format::Lines {
                sep: self.sep.unwrap_or(b'\n'),
                skip: self.skip.unwrap_or(0),
            }),
            Some(other) if self.sep.is_some() || self.skip.is_some() => {
                anyhow::bail!(
                    "--sep and --skip apply to the lines format, not {}",
                    other.name()
                )
            }
            Some(Format::TfRecord { .. }) if no_verify => Some(Format::TfRecord { verify: false }),
            f => f,
        };
        Ok(OpenOptions {
            format,
            stale: if no_rebuild {
                StalePolicy::Refuse
            } else {
                StalePolicy::Rebuild
            },
            max_record: memory,
            cache_limit: self.cache_limit,
            ..OpenOptions::default()
        })
    }
}
