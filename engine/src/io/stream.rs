//! Streaming sequential writes through a backend: bytes are gathered into aligned slots,
//! each full slot written with one direct write while the next fills (a short write goes
//! on where it stopped), and the tail padded to the alignment and cut off at the end. No
//! page-cache copy when O_DIRECT is allowed.

use std::path::Path;
use std::sync::Arc;

use super::{
    completion_error, open_backend, Access, Backend, DataFile, FileKey, IoConfig, Op, OpKind,
    SlotId,
};
use crate::{Error, Result};

/// A file written front to back.
pub struct StreamWriter {
    backend: Box<dyn Backend>,
    file: Arc<DataFile>,
    key: FileKey,
    unit: usize,
    current: Option<SlotId>,
    fill: usize,
    /// File offset of the current slot.
    offset: u64,
    done: Vec<super::Completion>,
    /// Short writes in a row without progress, per slot.
    stalled: Vec<u32>,
    /// Write requests completed (a short write's rest counts again).
    ops: u64,
}

impl StreamWriter {
    /// Creates the new file `path` (it must not exist: scratch in a private directory);
    /// `cfg.depth` writes of `cfg.slot_size` bytes in flight.
    pub fn create(path: &Path, cfg: &IoConfig) -> Result<StreamWriter> {
        Self::over(DataFile::open(path, Access::Write, cfg.direct)?, cfg)
    }

    /// Writes into a temporary file (which the caller commits once [`finish`] returned).
    ///
    /// [`finish`]: Self::finish
    pub fn for_temp(temp: &crate::scratch::TempFile, cfg: &IoConfig) -> Result<StreamWriter> {
        Self::over(
            DataFile::create(temp.handle()?, temp.path(), cfg.direct)?,
            cfg,
        )
    }

    fn over(file: DataFile, cfg: &IoConfig) -> Result<StreamWriter> {
        let file = Arc::new(file);
        let unit = file.alignment().io_unit();
        let cfg = IoConfig {
            backend: cfg.write_backend(),
            ..cfg.clone()
        };
        let mut backend = open_backend(&cfg, unit)?;
        let key = backend.add_file(file.clone())?;
        Ok(StreamWriter {
            stalled: vec![0; backend.depth()],
            backend,
            file,
            key,
            unit,
            current: None,
            fill: 0,
            offset: 0,
            done: Vec::new(),
            ops: 0,
        })
    }

    /// Bytes accepted so far.
    pub fn position(&self) -> u64 {
        self.offset + self.fill as u64
    }

    /// Appends `bytes`.
    pub fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        self.write_with(bytes.len() as u64, &mut |_, buf: &mut [u8]| {
            let (now, rest) = bytes.split_at(buf.len());
            buf.copy_from_slice(now);
            bytes = rest;
        })
    }

    /// Appends `len` bytes that `fill(offset, buf)` writes straight into the slots, piece
    /// by piece (`offset` is the piece's position in the file): no copy.
    pub fn write_with<F>(&mut self, mut len: u64, fill: &mut F) -> Result<()>
    where
        F: FnMut(u64, &mut [u8]),
    {
        while len > 0 {
            let slot = match self.current {
                Some(s) => s,
                None => {
                    let s = self.free_slot()?;
                    self.current = Some(s);
                    self.fill = 0;
                    s
                }
            };
            let size = self.backend.slot_size();
            let room = size - self.fill;
            let n = usize::try_from(len).map_or(room, |len| len.min(room));
            let at = self.position();
            fill(
                at,
                &mut self.backend.slot_mut(slot)[self.fill..self.fill + n],
            );
            self.fill += n;
            len -= n as u64;
            if self.fill == size {
                self.submit(size)?;
            }
        }
        Ok(())
    }

    /// Writes what is left, waits for every write, cuts the padding off and syncs.
    /// Returns the file's length.
    pub fn finish(self) -> Result<u64> {
        self.close(true).map(|(len, _, _)| len)
    }

    /// [`finish`](Self::finish) without the sync: for scratch files read back by this
    /// process and deleted, which need no durability.
    pub fn finish_scratch(self) -> Result<u64> {
        self.close(false).map(|(len, _, _)| len)
    }

    /// [`finish`](Self::finish), and what the writer did: (length, write requests
    /// completed, backend, whether the writes bypassed the page cache).
    pub fn finish_counted(self) -> Result<(u64, u64, super::BackendKind, bool)> {
        let direct = self.file.direct();
        self.close(true)
            .map(|(len, ops, kind)| (len, ops, kind, direct))
    }

    fn close(mut self, sync: bool) -> Result<(u64, u64, super::BackendKind)> {
        let len = self.position();
        if self.fill > 0 {
            let padded = self.fill.div_ceil(self.unit) * self.unit;
            let slot = self.current.expect("a slot being filled");
            self.backend.slot_mut(slot)[self.fill..padded].fill(0);
            self.submit(padded)?;
        }
        while self.backend.in_flight() > 0 {
            self.reap(self.backend.in_flight())?;
        }
        self.file
            .file()
            .set_len(len)
            .map_err(|e| Error::io(self.file.path(), "truncate", Some(len), e))?;
        let kind = self.backend.kind();
        if sync {
            self.file.sync_data()?;
        }
        Ok((len, self.ops, kind))
    }

    fn submit(&mut self, len: usize) -> Result<()> {
        let slot = self.current.take().expect("a slot being filled");
        let op = Op {
            slot,
            file: self.key,
            offset: self.offset,
            len,
            at: 0,
            kind: OpKind::Write,
            tag: 0,
        };
        self.offset += self.fill as u64;
        self.fill = 0;
        self.backend
            .push(op)
            .inspect_err(|_| self.backend.release(slot))
    }

    fn free_slot(&mut self) -> Result<SlotId> {
        loop {
            if let Some(s) = self.backend.acquire() {
                return Ok(s);
            }
            self.reap(1)?;
        }
    }

    /// Waits for at least `min` completions. A short write goes on where it stopped
    /// (rounded down to the alignment; its slot stays in flight); eight in a row that write
    /// nothing new mean the device is full.
    fn reap(&mut self, min: usize) -> Result<()> {
        let file = &self.file;
        let (handled, outcome) = reap_writes(
            self.backend.as_mut(),
            min,
            &mut self.done,
            &mut self.stalled,
            self.unit,
            |_| file,
        );
        self.ops += handled;
        outcome
    }
}

/// Waits for at least `min` write completions and settles each: a whole write's slot is
/// released; a short one goes on where it stopped (rounded down to the alignment `unit`;
/// its slot stays in flight); a failed one, or eight short writes in a row on a slot that
/// write nothing new (a full device, counted in `stalled`), releases its slot and is the
/// error returned, after every completion was handled (also those a failed wait left in
/// `done`). Returns the completions handled, and the outcome. `file_of` names the file of a
/// key for errors.
pub(crate) fn reap_writes<'f>(
    backend: &mut dyn Backend,
    min: usize,
    done: &mut Vec<super::Completion>,
    stalled: &mut [u32],
    unit: usize,
    file_of: impl Fn(FileKey) -> &'f DataFile,
) -> (u64, Result<()>) {
    let waited = backend.wait(min, done);
    let mut first = waited.err();
    let mut handled = 0;
    for c in done.drain(..) {
        handled += 1;
        let stall = &mut stalled[c.op.slot.index()];
        let err = match settle_write(backend, &c, unit, stall, file_of(c.op.file)) {
            Ok(false) => continue,
            Ok(true) => None,
            Err(e) => Some(e),
        };
        stalled[c.op.slot.index()] = 0;
        backend.release(c.op.slot);
        if first.is_none() {
            first = err;
        }
    }
    (handled, first.map_or(Ok(()), Err))
}

/// Settles a write's completion: `Ok(true)` when the write is whole (the caller releases
/// the slot), `Ok(false)` when it stopped short and its rest was queued (the slot stays in
/// flight; rounded down to the alignment `unit`), an error when it failed or eight short
/// writes in a row wrote nothing new (a full device; the caller releases the slot).
/// `stall` counts those short writes for the slot.
fn settle_write(
    backend: &mut dyn Backend,
    c: &super::Completion,
    unit: usize,
    stall: &mut u32,
    file: &DataFile,
) -> Result<bool> {
    match c.result {
        Ok(n) if n == c.op.len => Ok(true),
        Ok(n) => {
            let keep = (c.op.at + n) / unit * unit;
            *stall = if keep > c.op.at { 0 } else { *stall + 1 };
            if *stall > 8 {
                return Err(Error::io(
                    file.path(),
                    "write",
                    Some(c.op.offset + n as u64),
                    std::io::Error::from_raw_os_error(libc::ENOSPC),
                ));
            }
            backend.push(c.op.advance(keep - c.op.at)).map(|()| false)
        }
        Err(errno) => Err(completion_error(file, &c.op, errno)),
    }
}

#[cfg(test)]
mod tests {
    // Test data is made with casts that are meant to wrap (byte patterns from counters).
    #![allow(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss
    )]
    use super::*;

    #[test]
    fn writes_exactly_the_bytes_given() {
        let dir = tempfile::tempdir_in(".").unwrap();
        for backend in [
            super::super::BackendChoice::Uring,
            super::super::BackendChoice::Pread,
        ] {
            let path = dir.path().join(format!("w-{backend:?}.bin"));
            let cfg = IoConfig {
                depth: 3,
                slot_size: 64 << 10,
                backend,
                ..IoConfig::default()
            };
            let mut w = StreamWriter::create(&path, &cfg).unwrap();
            let mut want = Vec::new();
            for i in 0..5000u32 {
                let piece: Vec<u8> = (0..(i % 97)).map(|j| (i + j) as u8).collect();
                w.write(&piece).unwrap();
                want.extend_from_slice(&piece);
            }
            assert_eq!(w.finish().unwrap(), want.len() as u64);
            assert_eq!(std::fs::read(&path).unwrap(), want, "{backend:?}");
        }
    }
}
