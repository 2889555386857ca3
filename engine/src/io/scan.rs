//! Whole-file sequential reads in file order: large direct reads kept in flight, handed to
//! the caller strictly in order (a short read goes on where it stopped). The index builder
//! (one sequential scan, the LIRS paper's location generator) and later the two-pass
//! scatter read through this.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::{completion_error, open_backend, BackendKind, DataFile, IoConfig, Op, OpKind, SlotId};
use crate::{Error, Result};

/// What a scan did.
#[derive(Clone, Copy, Debug)]
pub struct ScanReport {
    /// Bytes handed to the caller (the file's size).
    pub bytes: u64,
    /// Wall time, including the caller's work on each chunk.
    pub seconds: f64,
    /// The backend used.
    pub backend: BackendKind,
    /// Whether the reads bypassed the page cache.
    pub direct: bool,
    /// Read requests issued (re-reads of short pieces included).
    pub read_ops: u64,
    /// Bytes the device transferred (aligned lengths, re-reads included).
    pub device_bytes: u64,
}

/// The I/O configuration scans use unless told otherwise: 2 MiB requests (on huge pages),
/// 8 in flight (measured here on a 3.6 GiB JSONL index build, cold cache: 3.0 GiB/s, the
/// best of 4x4, 8x4, 8x2, 16x1 and 8x8 MiB).
pub fn scan_config() -> IoConfig {
    IoConfig {
        depth: 4,
        slot_size: 4 << 20,
        ..IoConfig::default()
    }
}

/// Reads `file` from start to end and calls `f(offset, bytes)` for consecutive chunks in
/// file order. Stops at the first error from the device or from `f`.
pub fn scan_file<F>(file: &Arc<DataFile>, cfg: &IoConfig, mut f: F) -> Result<ScanReport>
where
    F: FnMut(u64, &[u8]) -> Result<()>,
{
    let started = Instant::now();
    let size = file.size();
    let unit_bytes = file.alignment().io_unit();
    let unit = unit_bytes as u64;
    let mut backend = open_backend(cfg, unit_bytes)?;
    let key = backend.add_file(file.clone())?;
    let chunk = backend.slot_size() as u64;
    let depth = backend.depth();
    let chunks = size.div_ceil(chunk);
    let (mut next_submit, mut next_deliver) = (0u64, 0u64);
    let mut ready: HashMap<u64, (SlotId, usize)> = HashMap::new();
    // Short reads in a row without progress, per slot.
    let mut stalled = vec![0u32; depth];
    let (mut read_ops, mut device_bytes) = (0u64, 0u64);
    let mut completions = Vec::with_capacity(depth);
    while next_deliver < chunks {
        while next_submit < chunks && backend.in_flight() + ready.len() < depth {
            let slot = backend.acquire().expect("a free slot below depth");
            stalled[slot.index()] = 0;
            let offset = next_submit * chunk;
            let len = (size - offset).min(chunk).div_ceil(unit) * unit;
            let op = Op {
                slot,
                file: key,
                offset,
                len: super::usize_of(len),
                at: 0,
                kind: OpKind::Read,
                tag: next_submit,
            };
            backend.push(op)?;
            next_submit += 1;
        }
        if let Some((slot, n)) = ready.remove(&next_deliver) {
            let offset = next_deliver * chunk;
            let outcome = f(offset, &backend.slot(slot)[..n]);
            backend.release(slot);
            outcome?;
            next_deliver += 1;
            continue;
        }
        backend.wait(1, &mut completions)?;
        for c in completions.drain(..) {
            let start = c.op.tag * chunk;
            let want = super::usize_of((size - start).min(chunk));
            read_ops += 1;
            let n = match c.result {
                Ok(n) => n,
                Err(errno) => return Err(completion_error(file, &c.op, errno)),
            };
            device_bytes += n as u64;
            // The slot holds the chunk's first `got` bytes: earlier reads filled [0, at).
            let got = c.op.at + n;
            if got >= want {
                ready.insert(c.op.tag, (c.op.slot, want));
                continue;
            }
            // Short before the end we expect: go on where it stopped (rounded down to the
            // alignment). Eight reads in a row that bring nothing new mean the file shrank
            // while being read.
            let keep = got / unit_bytes * unit_bytes;
            let stall = &mut stalled[c.op.slot.index()];
            *stall = if keep > c.op.at { 0 } else { *stall + 1 };
            if *stall > 8 {
                return Err(Error::BadInput {
                    path: file.path().into(),
                    offset: Some(start + got as u64),
                    what: format!(
                        "file ended early (expected {size} bytes); was it changed while being read?"
                    ),
                });
            }
            backend.push(c.op.advance(keep - c.op.at))?;
        }
    }
    Ok(ScanReport {
        bytes: size,
        seconds: started.elapsed().as_secs_f64(),
        backend: backend.kind(),
        direct: file.direct(),
        read_ops,
        device_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{Access, BackendChoice};

    #[test]
    fn delivers_every_byte_in_order() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let path = dir.path().join("s.bin");
        let data: Vec<u8> = (0..3_000_123u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
        for backend in [BackendChoice::Uring, BackendChoice::Pread] {
            let cfg = IoConfig {
                depth: 3,
                slot_size: 256 << 10,
                backend,
                ..IoConfig::default()
            };
            let mut got = Vec::new();
            let rep = scan_file(&file, &cfg, |off, b| {
                assert_eq!(off, got.len() as u64);
                got.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
            assert_eq!(rep.bytes, data.len() as u64);
            assert!(got == data, "{backend:?}: scanned bytes differ");
        }
    }

    #[test]
    fn callback_errors_stop_the_scan() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let path = dir.path().join("e.bin");
        std::fs::write(&path, vec![1u8; 2 << 20]).unwrap();
        let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
        let cfg = IoConfig {
            depth: 4,
            slot_size: 64 << 10,
            ..IoConfig::default()
        };
        let mut calls = 0;
        let r = scan_file(&file, &cfg, |_, _| {
            calls += 1;
            if calls == 3 {
                Err(Error::Cancelled { reason: "stop" })
            } else {
                Ok(())
            }
        });
        assert!(r.is_err());
        assert_eq!(calls, 3);
    }
}
