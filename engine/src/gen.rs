//! Synthetic datasets for tests and benchmarks: every record carries its id and a label, so
//! order and shuffle quality can be checked from the payload alone.
//!
//! Binary records (`fixed`, `npy`, `tfrecord`, `files`) start with the id (u64, little
//! endian) and the label (u32, little endian), then filler. `files` writes a directory tree
//! in ImageFolder's layout, `OUT/LABEL/ID.bin` (zero-padded so names sort as numbers), one
//! file per record; its labels are always ascending with the id (as `--sorted`), so the
//! tree's record order (class by class) is the id order. Lines are JSON objects
//! `{"id":ID,"label":L,"pad":"..."}` padded to the requested length (newline excluded).

use std::path::Path;
use std::time::Instant;

use crate::format::{npy, tar, tfrecord};
use crate::io::{self, IoConfig};
use crate::{Error, Result};

/// Which format to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenFormat {
    /// Fixed-size raw records.
    Fixed,
    /// A `|u1` array of shape (records, record size).
    Npy,
    /// JSON lines.
    Lines,
    /// TFRecord frames.
    TfRecord,
    /// A directory tree of one file per record, in class directories.
    Files,
    /// A MosaicML Streaming MDS directory (`index.json`, `shard.NNNNN.mds` of up to 64 MiB)
    /// of one column `x` holding the binary record: `ndarray:uint8:SIZE` (a sample is then
    /// exactly the record), or `bytes` with `--size-jitter`.
    Mds,
    /// A WebDataset shard: a tar of samples `ID.bin` (the binary record), `ID.cls` (the
    /// label as text) and `ID.json` (`{"id":ID,"label":L}`).
    Tar,
}

impl std::str::FromStr for GenFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fixed" => Ok(GenFormat::Fixed),
            "npy" => Ok(GenFormat::Npy),
            "lines" | "jsonl" => Ok(GenFormat::Lines),
            "tfrecord" => Ok(GenFormat::TfRecord),
            "files" | "imagefolder" => Ok(GenFormat::Files),
            "tar" | "webdataset" | "wds" => Ok(GenFormat::Tar),
            "mds" | "mosaic" => Ok(GenFormat::Mds),
            _ => Err(format!(
                "'{s}': expected npy, fixed, lines, tfrecord, tar, mds or files"
            )),
        }
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenSpec {
    /// The format.
    pub format: GenFormat,
    /// Number of records.
    pub records: u64,
    /// Record size (lines: without the newline).
    pub record_size: u64,
    /// Relative spread of record sizes: sizes are uniform in size x [1 - j, 1 + j].
    pub jitter: f64,
    /// Number of label classes.
    pub labels: u32,
    /// Labels ascending with the id (label-sorted data), instead of random.
    pub sorted: bool,
    /// Seed of sizes and labels.
    pub seed: u64,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct GenReport {
    /// Bytes written.
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

fn mix(mut z: u64) -> u64 {
    // splitmix64's finaliser: a good 64-bit hash of a counter.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const FILLER: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";

impl GenSpec {
    /// The label of record `id`.
    pub fn label(&self, id: u64) -> u32 {
        let c = self.labels.max(1) as u64;
        if self.sorted || self.format == GenFormat::Files {
            ((id as u128 * c as u128) / self.records.max(1) as u128) as u32
        } else {
            (mix(self.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % c) as u32
        }
    }

    /// The payload length of record `id` (lines: without the newline).
    pub fn payload_len(&self, id: u64) -> u64 {
        let base = self.record_size as f64;
        let len = if self.jitter > 0.0 {
            let u = (mix(self.seed.wrapping_add(0x51ed) ^ id.wrapping_mul(0xd6e8_feb8_6659_fd93))
                >> 11) as f64
                / (1u64 << 53) as f64;
            (base * (1.0 + self.jitter * (2.0 * u - 1.0))).round() as u64
        } else {
            self.record_size
        };
        match self.format {
            GenFormat::Lines => len.max(self.json_prefix(id).len() as u64 + 2),
            _ => len.max(12),
        }
    }

    fn json_prefix(&self, id: u64) -> String {
        format!("{{\"id\":{id},\"label\":{},\"pad\":\"", self.label(id))
    }

    /// The bytes of record `id`'s frame (the payload plus the format's framing).
    pub fn frame(&self, id: u64, out: &mut Vec<u8>) {
        out.clear();
        let len = self.payload_len(id) as usize;
        let fill = |out: &mut Vec<u8>, n: usize| {
            let start = (id % 64) as usize;
            while out.len() < n {
                let take = (n - out.len()).min(64 - start);
                out.extend_from_slice(&FILLER[start..start + take]);
            }
        };
        match self.format {
            GenFormat::Lines => {
                out.extend_from_slice(self.json_prefix(id).as_bytes());
                fill(out, len - 2);
                out.extend_from_slice(b"\"}\n");
            }
            GenFormat::Fixed
            | GenFormat::Npy
            | GenFormat::TfRecord
            | GenFormat::Files
            | GenFormat::Mds => {
                let mut payload = Vec::with_capacity(len);
                payload.extend_from_slice(&id.to_le_bytes());
                payload.extend_from_slice(&self.label(id).to_le_bytes());
                fill(&mut payload, len);
                if self.format == GenFormat::TfRecord {
                    tfrecord::encode(&payload, out);
                } else {
                    out.extend_from_slice(&payload);
                }
            }
            GenFormat::Tar => {
                let mut payload = Vec::with_capacity(len);
                payload.extend_from_slice(&id.to_le_bytes());
                payload.extend_from_slice(&self.label(id).to_le_bytes());
                fill(&mut payload, len);
                let (cls, json) = self.tar_meta(id);
                tar::append(out, format!("{id:010}.bin"), &payload);
                tar::append(out, format!("{id:010}.cls"), cls.as_bytes());
                tar::append(out, format!("{id:010}.json"), json.as_bytes());
            }
        }
    }

    /// A tar sample's `cls` and `json` members.
    fn tar_meta(&self, id: u64) -> (String, String) {
        let label = self.label(id);
        (
            label.to_string(),
            format!("{{\"id\":{id},\"label\":{label}}}"),
        )
    }

    fn frame_len(&self, id: u64) -> u64 {
        let p = self.payload_len(id);
        let member = |n: u64| tar::BLOCK + n.div_ceil(tar::BLOCK) * tar::BLOCK;
        match self.format {
            GenFormat::Lines => p + 1,
            GenFormat::TfRecord => p + 16,
            GenFormat::Tar => {
                let (cls, json) = self.tar_meta(id);
                member(p) + member(cls.len() as u64) + member(json.len() as u64)
            }
            _ => p,
        }
    }

    /// Bytes after the last record: a tar's end-of-archive blocks.
    fn trailer(&self) -> Vec<u8> {
        match self.format {
            GenFormat::Tar => vec![0; 2 * tar::BLOCK as usize],
            _ => Vec::new(),
        }
    }

    fn header(&self) -> Vec<u8> {
        match self.format {
            GenFormat::Npy => npy::write_header("|u1", &[self.records, self.record_size]),
            _ => Vec::new(),
        }
    }

    fn check(&self) -> Result<()> {
        if self.records == 0 {
            return Err(Error::Invalid("--records must be at least 1".into()));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(Error::Invalid("--size-jitter must be in [0, 1)".into()));
        }
        if matches!(
            self.format,
            GenFormat::Files | GenFormat::Tar | GenFormat::Mds
        ) && self.record_size < 12
        {
            return Err(Error::Invalid(
                "binary records need at least 12 bytes (id and label)".into(),
            ));
        }
        if matches!(self.format, GenFormat::Fixed | GenFormat::Npy) {
            if self.jitter > 0.0 {
                return Err(Error::Invalid(
                    "--size-jitter needs a variable-length format (lines or tfrecord)".into(),
                ));
            }
            if self.record_size < 12 {
                return Err(Error::Invalid(
                    "binary records need at least 12 bytes (id and label)".into(),
                ));
            }
        }
        // The largest a record can be (jitter, a TFRecord frame's 16 bytes) times the
        // records must be a file size, not a number that wraps.
        let largest = ((self.record_size as f64) * (1.0 + self.jitter)).ceil() as u64;
        largest
            .checked_add(16)
            .and_then(|f| f.checked_mul(self.records))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{} records of up to {largest} bytes are more than 2^64 bytes",
                    self.records
                ))
            })?;
        Ok(())
    }

    /// Bytes the file takes at least (every record at its smallest), without visiting
    /// every record.
    fn least_bytes(&self) -> u64 {
        let smallest = ((self.record_size as f64) * (1.0 - self.jitter)).floor() as u64;
        self.records.saturating_mul(smallest.max(1))
    }
}

/// Writes a `files` tree or an MDS directory to `out`: built in a scratch directory beside
/// it and renamed to `out` when complete, so an interrupted run leaves nothing at `out`.
/// `out` must not exist.
fn generate_tree(
    out: &Path,
    spec: &GenSpec,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<GenReport> {
    if std::fs::symlink_metadata(out).is_ok() {
        return Err(Error::Invalid(format!(
            "{}: already exists; a files tree is written to a new path",
            out.display()
        )));
    }
    let started = Instant::now();
    let parent = crate::scratch::parent_dir(out);
    let scratch = crate::scratch::ScratchDir::new_in(parent, "gen")?;
    let tree = scratch.path().join("tree");
    let mk = |p: &Path| std::fs::create_dir(p).map_err(|e| Error::io(p, "create", None, e));
    mk(&tree)?;
    let total = (0..spec.records).map(|i| spec.payload_len(i)).sum::<u64>();
    let bytes = if spec.format == GenFormat::Mds {
        crate::dataset::mds::write(
            &tree,
            spec.records,
            64 << 20,
            (spec.jitter == 0.0).then_some(spec.record_size.max(12)),
            &mut |id, out| spec.frame(id, out),
            &mut |id| progress(id * total / spec.records, total),
        )?
    } else {
        let classes = spec.labels.max(1);
        let cw = (classes - 1).to_string().len();
        let iw = (spec.records - 1).to_string().len();
        for c in 0..classes {
            mk(&tree.join(format!("{c:0cw$}")))?;
        }
        let mut done = 0u64;
        let mut frame = Vec::new();
        for id in 0..spec.records {
            // A signal removes the scratch directory on another thread: stop adding files
            // to it at once, or the removal chases this loop for as long as it runs.
            if crate::scratch::stopping() {
                return Err(Error::Cancelled {
                    reason: "interrupted: riffle is exiting",
                });
            }
            spec.frame(id, &mut frame);
            let p = tree
                .join(format!("{:0cw$}", spec.label(id)))
                .join(format!("{id:0iw$}.bin"));
            crate::door::write_new(&p, &frame)?;
            done += frame.len() as u64;
            if id % 1024 == 0 || id + 1 == spec.records {
                progress(done, total);
            }
        }
        total
    };
    std::fs::rename(&tree, out)
        .map_err(|e| Error::io(out, "rename the finished dataset to", None, e))?;
    crate::scratch::sync_dir(parent)?;
    scratch.close()?;
    Ok(GenReport {
        bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes the dataset into an open FIFO or character device, in order, through a buffer.
fn generate_stream(
    f: std::fs::File,
    out: &Path,
    spec: &GenSpec,
    total: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let put = |w: &mut std::io::BufWriter<std::fs::File>, b: &[u8]| {
        w.write_all(b).map_err(|e| Error::io(out, "write", None, e))
    };
    put(&mut w, &spec.header())?;
    let mut written = 0u64;
    let mut frame = Vec::new();
    for id in 0..spec.records {
        frame.clear();
        spec.frame(id, &mut frame);
        put(&mut w, &frame)?;
        written += frame.len() as u64;
        if id % 4096 == 0 {
            progress(written, total);
        }
    }
    put(&mut w, &spec.trailer())?;
    w.flush().map_err(|e| Error::io(out, "write", None, e))?;
    progress(total, total);
    Ok(())
}

/// Writes the dataset to `out` (through a temporary name, renamed when complete).
pub fn generate(
    out: &Path,
    spec: &GenSpec,
    cfg: &IoConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<GenReport> {
    spec.check()?;
    // Refused before the sizes are added up (a pass over every record) or anything is
    // written: a dataset that cannot fit (a tree and MDS shards included).
    let dir = crate::scratch::parent_dir(out);
    // A files tree is a file per record; MDS shards hold 64 MiB each.
    let files = match spec.format {
        GenFormat::Files => spec.records,
        GenFormat::Mds => spec.least_bytes().div_ceil(64 << 20) + 1,
        _ => 1,
    };
    let limits = crate::resources::Limits::here(Some(dir));
    match crate::resources::gen(spec.least_bytes(), files, cfg.depth, cfg.slot_size, &limits) {
        Err(Error::Exhausted {
            resource,
            asked,
            limit,
        }) if resource == crate::resources::SCRATCH_SPACE
            || resource == crate::resources::SCRATCH_INODES =>
        {
            let (what, has) = if resource == crate::resources::SCRATCH_INODES {
                (
                    format!("{asked} files"),
                    format!("room for {limit} more files"),
                )
            } else {
                (
                    format!("at least {}", crate::size::human_bytes(asked as f64)),
                    format!("{} free", crate::size::human_bytes(limit as f64)),
                )
            };
            return Err(Error::OverBudget(format!(
                "{}: {} records need {what}, and {} has {has}",
                out.display(),
                spec.records,
                dir.display(),
            )));
        }
        other => {
            other?;
        }
    }
    if matches!(spec.format, GenFormat::Files | GenFormat::Mds) {
        return generate_tree(out, spec, progress);
    }
    let started = Instant::now();
    let header = spec.header();
    let trailer = spec.trailer();
    let total = header.len() as u64
        + (0..spec.records).map(|i| spec.frame_len(i)).sum::<u64>()
        + trailer.len() as u64;
    // Through the door: a FIFO or character device (/dev/null) is written into, never
    // replaced by a file; a block device or directory is refused.
    if let crate::door::OutputTarget::Stream(f) = crate::door::output_target(out)? {
        generate_stream(f, out, spec, total, progress)?;
        return Ok(GenReport {
            bytes: total,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let mut next_id = 0u64;
    let mut frame: Vec<u8> = header;
    let mut pos = 0usize;
    io::write_file(out, total, cfg, |offset, buf| {
        let mut filled = 0;
        while filled < buf.len() {
            if pos == frame.len() {
                if next_id == spec.records {
                    frame.clear();
                    frame.extend_from_slice(&trailer);
                } else {
                    spec.frame(next_id, &mut frame);
                }
                next_id += 1;
                pos = 0;
            }
            let n = (frame.len() - pos).min(buf.len() - filled);
            buf[filled..filled + n].copy_from_slice(&frame[pos..pos + n]);
            filled += n;
            pos += n;
        }
        progress(offset + buf.len() as u64, total);
    })?;
    Ok(GenReport {
        bytes: total,
        seconds: started.elapsed().as_secs_f64(),
    })
}
