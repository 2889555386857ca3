//! Sequential file writing at a queue depth, through either backend.

use std::path::Path;
use std::time::Instant;

use super::{BackendKind, IoConfig};
use crate::Result;

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
/// stays temporary (removed when `temp` is dropped) unless the caller commits it. A thin
/// wrapper over [`StreamWriter`](super::StreamWriter), the one sequential writer: `fill`
/// writes straight into its slots.
pub fn write_temp<F>(
    temp: &crate::scratch::TempFile,
    size: u64,
    cfg: &IoConfig,
    mut fill: F,
) -> Result<WriteReport>
where
    F: FnMut(u64, &mut [u8]),
{
    let started = Instant::now();
    let mut writer = super::StreamWriter::for_temp(temp, cfg)?;
    writer.write_with(size, &mut fill)?;
    let (bytes, ops, backend, direct) = writer.finish_counted()?;
    Ok(WriteReport {
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        ops,
        backend,
        direct,
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
