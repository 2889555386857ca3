//! Sequential file writing at a queue depth, through either backend.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::{completion_error, open_backend, BackendKind, DataFile, IoConfig, Op, OpKind};
use crate::{Error, Result};

/// What a [`write_file`] did.
#[derive(Clone, Debug)]
pub struct WriteReport {
    /// Bytes in the file.
    pub bytes: u64,
    /// Wall time including the final fdatasync.
    pub seconds: f64,
    /// Write requests completed.
    pub ops: u64,
    /// The backend used.
    pub backend: BackendKind,
    /// Whether the writes bypassed the page cache.
    pub direct: bool,
}

/// Writes a new `path` of `size` bytes in slot-sized sequential requests, `cfg.depth` in
/// flight: under a private temporary name beside it ([`crate::scratch::TempFile`]),
/// synced, then renamed over `path`. `fill(offset, buf)` fills each piece before it is
/// written. On any error nothing is left behind and `path` is untouched.
pub fn write_file<F>(path: &Path, size: u64, cfg: &IoConfig, fill: F) -> Result<WriteReport>
where
    F: FnMut(u64, &mut [u8]),
{
    let temp = crate::scratch::TempFile::beside(path)?;
    let report = write_temp(&temp, size, cfg, fill)?;
    temp.commit(path)?;
    Ok(report)
}

/// Writes `size` bytes into a temporary file as [`write_file`] does, and syncs; the file
/// stays temporary (removed when `temp` is dropped) unless the caller commits it.
pub fn write_temp<F>(
    temp: &crate::scratch::TempFile,
    size: u64,
    cfg: &IoConfig,
    fill: F,
) -> Result<WriteReport>
where
    F: FnMut(u64, &mut [u8]),
{
    let file = DataFile::create(temp.handle()?, temp.path(), cfg.direct)?;
    write_into(Arc::new(file), size, cfg, fill)
}

fn write_into<F>(file: Arc<DataFile>, size: u64, cfg: &IoConfig, mut fill: F) -> Result<WriteReport>
where
    F: FnMut(u64, &mut [u8]),
{
    let unit = file.alignment().unit().max(512);
    let cfg = IoConfig {
        backend: crate::emulate::write_backend(cfg.backend),
        ..cfg.clone()
    };
    let mut backend = open_backend(&cfg, unit)?;
    let key = backend.add_file(file.clone())?;
    let slot_size = backend.slot_size() as u64;
    let depth = backend.depth();
    let started = Instant::now();
    let mut next = 0u64;
    let mut ops = 0u64;
    let mut completions = Vec::with_capacity(depth);
    // Short writes in a row without progress, per slot.
    let mut stalled = vec![0u32; depth];
    let padded = size.div_ceil(unit as u64) * unit as u64;
    while next < padded || backend.in_flight() > 0 {
        while next < padded && backend.in_flight() < depth {
            let slot = backend.acquire().expect("a free slot below depth");
            stalled[slot.index()] = 0;
            let len = (padded - next).min(slot_size) as usize;
            let buf = &mut backend.slot_mut(slot)[..len];
            let real = ((size - next.min(size)) as usize).min(len);
            fill(next, &mut buf[..real]);
            buf[real..].fill(0);
            backend.push(Op {
                slot,
                file: key,
                offset: next,
                len,
                at: 0,
                kind: OpKind::Write,
                tag: 0,
            })?;
            next += len as u64;
        }
        backend.wait(1, &mut completions)?;
        for c in completions.drain(..) {
            match c.result {
                Ok(n) if n == c.op.len => {
                    ops += 1;
                    backend.release(c.op.slot);
                }
                Ok(n) => {
                    // A short write: write the rest where it stopped (rounded down to the
                    // alignment); writes that make no progress, again and again, mean the
                    // device is out of space.
                    ops += 1;
                    let keep = (c.op.at + n) / unit * unit;
                    let stall = &mut stalled[c.op.slot.index()];
                    *stall = if keep > c.op.at { 0 } else { *stall + 1 };
                    if *stall > 8 {
                        return Err(Error::io(
                            file.path(),
                            "write",
                            Some(c.op.offset + n as u64),
                            std::io::Error::from_raw_os_error(libc::ENOSPC),
                        ));
                    }
                    backend.push(c.op.advance(keep - c.op.at))?;
                }
                Err(errno) => return Err(completion_error(&file, &c.op, errno)),
            }
        }
    }
    let kind = backend.kind();
    drop(backend);
    if padded != size {
        // The last direct write was padded to the alignment; cut the padding off.
        file.file()
            .set_len(size)
            .map_err(|e| Error::io(file.path(), "truncate", Some(size), e))?;
    }
    file.sync_data()?;
    Ok(WriteReport {
        bytes: size,
        seconds: started.elapsed().as_secs_f64(),
        ops,
        backend: kind,
        direct: file.direct(),
    })
}

/// A filler for [`write_file`] that writes incompressible bytes that differ in every 4 KiB
/// block (the block's offset is stamped at its start), so no layer below can compress or
/// deduplicate them. Cheap: one random 1 MiB pattern is copied and stamped.
pub fn pattern_filler(seed: u64) -> impl FnMut(u64, &mut [u8]) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut pattern = vec![0u8; 1 << 20];
    rng.fill_bytes(&mut pattern);
    move |offset, buf| {
        for (i, piece) in buf.chunks_mut(pattern.len()).enumerate() {
            piece.copy_from_slice(&pattern[..piece.len()]);
            let base = offset + (i * pattern.len()) as u64;
            for (j, block) in piece.chunks_mut(4096).enumerate() {
                let tag = (base + (j as u64) * 4096).to_le_bytes();
                let n = tag.len().min(block.len());
                block[..n].copy_from_slice(&tag[..n]);
            }
        }
    }
}
