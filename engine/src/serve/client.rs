//! A Rust client of `riffle serve`.
//!
//! ```no_run
//! # fn main() -> riffle::Result<()> {
//! use riffle::serve::{Client, OpenRequest};
//!
//! let mut client = Client::connect("/run/riffle.sock")?;
//! let mut stream = client.open(OpenRequest::new("train", 256))?;
//! while let Some(batch) = stream.next_batch()? {
//!     let (ids, data) = (batch.ids(), batch.data()); // copied out of shared memory
//!     # let _ = (ids, data);
//! }
//! let resume_here = stream.cursor(); // pass as `resume` to a later open
//! # let _ = resume_here;
//! # Ok(())
//! # }
//! ```

use std::cell::OnceCell;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::proto::{self, BatchHeader, FrameBuf, Kind, OpenRequest, Opened, Transport, WireCursor};
use super::shm::{self, Mapping};
use crate::{Error, Result};

/// The daemon's answer was an `ERROR` frame, or the connection failed.
fn daemon_error(body: &[u8]) -> Error {
    match serde_json::from_slice::<proto::ErrorMsg>(body) {
        Ok(e) => Error::Daemon {
            code: e.code,
            message: e.message,
        },
        Err(_) => Error::Protocol("riffle serve sent an unreadable error".into()),
    }
}

fn gone(e: std::io::Error) -> Error {
    Error::os("the connection to riffle serve failed", e)
}

/// A connection to the daemon.
pub struct Client {
    sock: UnixStream,
    buf: FrameBuf,
    fds: Vec<OwnedFd>,
    /// The datasets the daemon serves.
    pub datasets: Vec<String>,
}

impl Client {
    /// Connects and says hello.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client> {
        let path = path.as_ref();
        let sock = UnixStream::connect(path).map_err(|e| Error::io(path, "connect", None, e))?;
        let mut c = Client {
            sock,
            buf: FrameBuf::default(),
            fds: Vec::new(),
            datasets: Vec::new(),
        };
        c.send(&proto::json_frame(
            Kind::Hello,
            &proto::Hello {
                version: proto::VERSION,
                agent: format!("riffle-rust {}", env!("CARGO_PKG_VERSION")),
                datasets: vec![],
                max_frame: 0,
            },
        ))?;
        let (k, body) = c.frame()?;
        match k {
            Kind::Hello => {
                let h: proto::Hello = serde_json::from_slice(&body)
                    .map_err(|e| Error::Protocol(format!("bad HELLO from the daemon: {e}")))?;
                c.datasets = h.datasets;
                Ok(c)
            }
            Kind::Error => Err(daemon_error(&body)),
            k => Err(Error::Protocol(format!("expected HELLO, got {k:?}"))),
        }
    }

    /// Gives up reads after `t` (`None`: wait for ever).
    pub fn set_read_timeout(&mut self, t: Option<std::time::Duration>) -> Result<()> {
        self.sock.set_read_timeout(t).map_err(gone)
    }

    /// Sends raw bytes (tests use it to misbehave). When the daemon has closed the
    /// connection, the error is what it said before closing (`busy`, `shutdown`, ...), if
    /// it said anything.
    pub fn send(&mut self, bytes: &[u8]) -> Result<()> {
        match self.sock.write_all(bytes) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.said_before_closing().unwrap_or_else(|| gone(e))),
        }
    }

    /// An `ERROR` frame the daemon sent before it closed. The daemon stops reading before
    /// it writes its last word (at shutdown), so this reads to the end of the connection,
    /// for 3 s at most (the daemon closes every connection within 2 s of a shutdown).
    fn said_before_closing(&mut self) -> Option<Error> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let old = self.sock.read_timeout().ok().flatten();
        let mut said = None;
        while said.is_none() {
            match self.buf.next(u32::MAX as usize) {
                Ok(Some((k, body))) => {
                    if Kind::from_u8(k) == Some(Kind::Error) {
                        said = Some(daemon_error(body));
                    }
                    continue;
                }
                Ok(None) => {}
                Err(_) => break,
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || self.sock.set_read_timeout(Some(left)).is_err() {
                break;
            }
            const CHUNK: usize = 64 * 1024;
            let spare = self.buf.spare(CHUNK);
            match shm::recv_with_fds(&self.sock, spare, &mut self.fds) {
                Ok(n) if n > 0 => self.buf.filled(CHUNK, n),
                _ => {
                    self.buf.filled(CHUNK, 0);
                    break;
                }
            }
        }
        let _ = self.sock.set_read_timeout(old);
        said
    }

    /// The next frame from the daemon.
    pub fn frame(&mut self) -> Result<(Kind, Vec<u8>)> {
        loop {
            match self.buf.next(u32::MAX as usize) {
                Ok(Some((k, body))) => {
                    let kind = Kind::from_u8(k)
                        .ok_or_else(|| Error::Protocol(format!("unknown frame kind {k}")))?;
                    return Ok((kind, body.to_vec()));
                }
                Ok(None) => {}
                Err(n) => return Err(Error::Protocol(format!("bad frame length {n}"))),
            }
            const CHUNK: usize = 64 * 1024;
            let spare = self.buf.spare(CHUNK);
            let got = shm::recv_with_fds(&self.sock, spare, &mut self.fds);
            let got = match got {
                Ok(n) => n,
                Err(e) => {
                    self.buf.filled(CHUNK, 0);
                    return Err(gone(e));
                }
            };
            self.buf.filled(CHUNK, got);
            if got == 0 {
                return Err(Error::Protocol("riffle serve closed the connection".into()));
            }
        }
    }

    /// The daemon's counters.
    pub fn stats(&mut self) -> Result<serde_json::Value> {
        self.send(&proto::json_frame(Kind::Stats, &serde_json::json!({})))?;
        loop {
            let (k, body) = self.frame()?;
            match k {
                Kind::StatsReply => {
                    return serde_json::from_slice(&body)
                        .map_err(|e| Error::Protocol(format!("bad stats: {e}")))
                }
                Kind::Error => return Err(daemon_error(&body)),
                _ => continue,
            }
        }
    }

    /// Opens a stream; batches are read from it until it ends or is dropped.
    pub fn open(&mut self, req: OpenRequest) -> Result<Stream<'_>> {
        self.fds.clear();
        self.send(&proto::json_frame(Kind::Open, &req))?;
        let (k, body) = self.frame()?;
        let opened: Opened = match k {
            Kind::Opened => serde_json::from_slice(&body)
                .map_err(|e| Error::Protocol(format!("bad OPENED: {e}")))?,
            Kind::Error => return Err(daemon_error(&body)),
            k => return Err(Error::Protocol(format!("expected OPENED, got {k:?}"))),
        };
        let map = match opened.transport {
            Transport::Shm => {
                let fd = self.fds.pop().ok_or_else(|| {
                    Error::Protocol("OPENED came without the ring's descriptor".into())
                })?;
                Some(Mapping::new(&fd, opened.ring_bytes)?)
            }
            Transport::Inline => None,
        };
        let first_epoch = req
            .resume
            .map(|c| c.epoch)
            .or(req.resume_global.map(|g| g.epoch))
            .unwrap_or(req.epoch);
        let cursor = req.resume.unwrap_or(WireCursor {
            epoch: first_epoch,
            batch: 0,
        });
        let global = super::proto::GlobalCursor {
            epoch: first_epoch,
            records: opened.start,
        };
        Ok(Stream {
            client: self,
            opened,
            map,
            cursor,
            global,
            first_epoch,
            held: None,
            inline: Vec::new(),
            ended: false,
            waits: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("histogram"),
            waited: std::time::Duration::ZERO,
        })
    }
}

/// An open stream. Batches are lent one at a time: the previous one is acknowledged when
/// the next is asked for.
pub struct Stream<'c> {
    client: &'c mut Client,
    /// What the daemon said about the stream.
    pub opened: Opened,
    map: Option<Mapping>,
    cursor: WireCursor,
    /// The global cursor after the last batch returned.
    global: super::proto::GlobalCursor,
    first_epoch: u64,
    held: Option<u32>,
    inline: Vec<u8>,
    ended: bool,
    /// How long `next_batch` waited for each batch (us): the data stall this client paid.
    waits: hdrhistogram::Histogram<u64>,
    waited: std::time::Duration,
}

/// What a stream waited for its batches, on the client's side.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamStats {
    /// The stream's id in the daemon's stats (`stream_waits`).
    pub stream: Option<u64>,
    /// Batches received.
    pub batches: u64,
    /// Time spent in `next_batch` waiting for them, in all.
    pub wait_s: f64,
    /// Median, 99th percentile and worst wait for one batch, us.
    pub wait_p50_us: u64,
    /// 99th percentile.
    pub wait_p99_us: u64,
    /// Worst.
    pub wait_max_us: u64,
}

/// A batch, borrowed from its [`Stream`].
///
/// Its arrays are copied out of the ring when it arrives; its payload is copied out the
/// first time [`BatchRef::data`] or [`BatchRef::record`] asks for it (the daemon's
/// process writes that memory, so it is never lent out as a `&[u8]`, see
/// [`Mapping`]). A client that only counts ids never copies a payload.
pub struct BatchRef<'s> {
    /// Its header: epoch, index, records, padding.
    pub header: BatchHeader,
    ids: Vec<u64>,
    offsets: Vec<u64>,
    labels: Vec<u32>,
    sources: Vec<u32>,
    data: Data<'s>,
}

/// Where a batch's payload is.
enum Data<'s> {
    /// In the frame (the inline transport).
    Inline(&'s [u8]),
    /// `len` bytes at `at` of the ring (checked to be inside it when the batch arrived),
    /// copied into `copy` when first asked for.
    Ring {
        map: &'s Mapping,
        at: u64,
        len: usize,
        copy: OnceCell<Vec<u8>>,
    },
}

/// A batch's arrays, read from the ring or from the inline frame.
struct Arrays {
    ids: Vec<u64>,
    offsets: Vec<u64>,
    labels: Vec<u32>,
    sources: Vec<u32>,
}

/// Reads the arrays of the batch `h` describes with `u64s(at, n)` and `u32s(at, n)` (which
/// check their range before they allocate): ids, offsets, then labels and sources when
/// its flags say so. `None` when any lies outside, or the offsets do not cut
/// `h.data_len` bytes into records (each at most the next, the last at most the length),
/// which is what [`BatchRef::record`] relies on.
fn read_arrays(
    h: &BatchHeader,
    u64s: impl Fn(u64, u64) -> Option<Vec<u64>>,
    u32s: impl Fn(u64, u64) -> Option<Vec<u32>>,
) -> Option<Arrays> {
    let n = h.records;
    let labelled = h.flags & super::proto::FLAG_LABELS != 0;
    let sourced = h.flags & super::proto::FLAG_SOURCES != 0;
    let ids = u64s(h.ids_at, n)?;
    let offsets = u64s(h.offsets_at, n.checked_add(1)?)?;
    let labels_at = h
        .offsets_at
        .checked_add(n.checked_add(1)?.checked_mul(8)?)?;
    let sources_at = labels_at.checked_add(if labelled { n.checked_mul(4)? } else { 0 })?;
    let labels = if labelled {
        u32s(labels_at, n)?
    } else {
        Vec::new()
    };
    let sources = if sourced {
        u32s(sources_at, n)?
    } else {
        Vec::new()
    };
    let cut = offsets.windows(2).all(|w| w[0] <= w[1])
        && offsets.last().is_some_and(|&end| end <= h.data_len);
    cut.then_some(Arrays {
        ids,
        offsets,
        labels,
        sources,
    })
}

/// `len` bytes at `at` of `b`, if they are all there.
fn within(b: &[u8], at: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(at).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    b.get(start..end)
}

/// `n` little-endian values of `N` bytes at `at` of `b`, if they are all there.
fn le_values<const N: usize, T>(
    b: &[u8],
    at: u64,
    n: u64,
    from: fn([u8; N]) -> T,
) -> Option<Vec<T>> {
    let s = within(b, at, n.checked_mul(N as u64)?)?;
    Some(
        s.chunks_exact(N)
            .map(|c| from(c.try_into().expect("N bytes")))
            .collect(),
    )
}

impl BatchRef<'_> {
    /// Each record's label, when the daemon sent labels (a `files` dataset of class
    /// directories); empty otherwise.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// Each record's source (an index into OPENED's `sources`), for a mixture; empty
    /// otherwise.
    pub fn sources(&self) -> &[u32] {
        &self.sources
    }
    /// Global record ids.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }
    /// `ids().len() + 1` offsets into [`BatchRef::data`], each at most the next and the
    /// last at most its length (a batch that breaks this is refused when it arrives).
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }
    /// The payload (copied out of the ring, once, for the shm transport).
    pub fn data(&self) -> &[u8] {
        match &self.data {
            Data::Inline(b) => b,
            Data::Ring { map, at, len, copy } => copy.get_or_init(|| {
                let mut v = vec![0u8; *len];
                map.read_at(*at, &mut v)
                    .expect("the range was checked to be in the ring when the batch came");
                v
            }),
        }
    }
    /// Record `i`'s bytes. Panics if `i` is not below `ids().len()`.
    pub fn record(&self, i: usize) -> &[u8] {
        // The offsets are at most the payload's length (checked when the batch came), so
        // they are indexes of it.
        let at = |j: usize| usize::try_from(self.offsets[j]).unwrap_or(usize::MAX);
        &self.data()[at(i)..at(i + 1)]
    }
}

impl Stream<'_> {
    /// Where to resume to get the batches not yet consumed (a batch counts as consumed
    /// once returned).
    pub fn cursor(&self) -> WireCursor {
        self.cursor
    }

    /// The global cursor after the last batch returned: records of its epoch consumed by
    /// all ranks together (every rank having received as many batches). Given as
    /// `OpenRequest::resume_global`, it resumes exactly under any world and batch size.
    pub fn global_cursor(&self) -> super::proto::GlobalCursor {
        self.global
    }

    /// What the stream waited for its batches (the data stall), on this side; the
    /// daemon's view of the same stream is in [`Client::stats`]'s `stream_waits`, under
    /// this `stream` id.
    pub fn stats(&self) -> StreamStats {
        StreamStats {
            stream: self.opened.stream,
            batches: self.waits.len(),
            wait_s: self.waited.as_secs_f64(),
            wait_p50_us: self.waits.value_at_quantile(0.5),
            wait_p99_us: self.waits.value_at_quantile(0.99),
            wait_max_us: self.waits.max(),
        }
    }

    /// Whether the daemon said the stream ended.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Acknowledges the batch held, if any.
    fn release(&mut self) -> Result<()> {
        if let Some(slot) = self.held.take() {
            self.client
                .send(&proto::frame(Kind::Ack, &slot.to_le_bytes()))?;
        }
        Ok(())
    }

    /// The next batch; `None` at the end of the stream.
    pub fn next_batch(&mut self) -> Result<Option<BatchRef<'_>>> {
        if self.ended {
            return Ok(None);
        }
        self.release()?;
        let asked = std::time::Instant::now();
        let (k, body) = self.client.frame()?;
        if matches!(k, Kind::Batch | Kind::BatchInline) {
            let d = asked.elapsed();
            self.waited += d;
            self.waits
                .saturating_record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1));
        }
        match k {
            Kind::End => {
                self.ended = true;
                Ok(None)
            }
            Kind::Error => {
                self.ended = true;
                Err(daemon_error(&body))
            }
            Kind::Batch | Kind::BatchInline => {
                let h = BatchHeader::decode(&body)
                    .ok_or_else(|| Error::Protocol("short BATCH header".into()))?;
                self.held = Some(h.slot);
                self.cursor = WireCursor {
                    epoch: h.epoch,
                    batch: h.index + 1,
                };
                let o = &self.opened;
                let (start, end) = if h.epoch == self.first_epoch && o.start > 0 {
                    (o.start, o.start_end)
                } else {
                    (0, o.epoch_end)
                };
                self.global = super::proto::GlobalCursor {
                    epoch: h.epoch,
                    records: (h.index + 1)
                        .saturating_mul(o.round)
                        .saturating_add(start)
                        .min(end),
                };
                let bad = || Error::Protocol(format!("batch {} lies outside its buffer", h.index));
                if k == Kind::Batch {
                    let m = self.map.as_ref().ok_or_else(bad)?;
                    let a = read_arrays(
                        &h,
                        |at, n| m.read_u64s(at, n).ok(),
                        |at, n| m.read_u32s(at, n).ok(),
                    )
                    .ok_or_else(bad)?;
                    m.check(h.data_at, h.data_len).map_err(|_| bad())?;
                    // Inside the mapping, so its length is a usize too.
                    let len = usize::try_from(h.data_len).map_err(|_| bad())?;
                    Ok(Some(BatchRef {
                        header: h,
                        ids: a.ids,
                        offsets: a.offsets,
                        labels: a.labels,
                        sources: a.sources,
                        data: Data::Ring {
                            map: m,
                            at: h.data_at,
                            len,
                            copy: OnceCell::new(),
                        },
                    }))
                } else {
                    self.inline = body;
                    let b = &self.inline;
                    let a = read_arrays(
                        &h,
                        |at, n| le_values(b, at, n, u64::from_le_bytes),
                        |at, n| le_values(b, at, n, u32::from_le_bytes),
                    )
                    .ok_or_else(bad)?;
                    let data = within(b, h.data_at, h.data_len).ok_or_else(bad)?;
                    Ok(Some(BatchRef {
                        header: h,
                        ids: a.ids,
                        offsets: a.offsets,
                        labels: a.labels,
                        sources: a.sources,
                        data: Data::Inline(data),
                    }))
                }
            }
            k => Err(Error::Protocol(format!("unexpected {k:?} in a stream"))),
        }
    }

    /// Asks the daemon to stop the stream and waits for its `END`.
    pub fn close(mut self) -> Result<()> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> Result<()> {
        if self.ended {
            return Ok(());
        }
        self.release()?;
        self.client
            .send(&proto::json_frame(Kind::Close, &serde_json::json!({})))?;
        loop {
            let (k, body) = self.client.frame()?;
            match k {
                Kind::End => break,
                Kind::Error => return Err(daemon_error(&body)),
                _ => {}
            }
        }
        self.ended = true;
        Ok(())
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}

impl OpenRequest {
    /// One epoch of `batch_size` batches of `dataset`, seed 0, one rank, over shared memory.
    pub fn new(dataset: &str, batch_size: u64) -> OpenRequest {
        OpenRequest {
            dataset: dataset.into(),
            batch_size,
            seed: 0,
            epoch: 0,
            epochs: 1,
            rank: 0,
            world: 1,
            workers: 1,
            tail: "partial".into(),
            grouping: "record".into(),
            resume: None,
            resume_global: None,
            transport: Transport::Shm,
            ring_bytes: None,
            streams: None,
        }
    }

    /// The same request saying that this node will open `streams` streams of its job
    /// (see [`OpenRequest::streams`]): their shared pass waits for all of them.
    pub fn with_streams(mut self, streams: u64) -> OpenRequest {
        self.streams = Some(streams);
        self
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    use super::*;
    use crate::ErrorKind;

    /// A fake daemon on a socket in a fresh directory: it takes one connection, reads the
    /// client's HELLO, answers it properly, then sends `then` (and keeps the connection
    /// open until the client goes).
    fn fake_daemon(then: Vec<u8>) -> (tempfile::TempDir, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("s.sock")).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut head = [0u8; 4];
            s.read_exact(&mut head).unwrap();
            let mut body = vec![0u8; u32::from_le_bytes(head) as usize];
            s.read_exact(&mut body).unwrap();
            let hello = proto::Hello {
                version: proto::VERSION,
                agent: "fake".into(),
                datasets: vec!["train".into()],
                max_frame: 1 << 20,
            };
            s.write_all(&proto::json_frame(Kind::Hello, &hello))
                .unwrap();
            s.write_all(&then).unwrap();
            // Until the client hangs up.
            let _ = s.read_to_end(&mut Vec::new());
        });
        (dir, t)
    }

    /// A daemon that breaks the protocol is a `Protocol` error, not a bad argument of the
    /// caller's.
    #[test]
    fn a_frame_of_no_known_kind_is_a_protocol_error() {
        // A frame of kind 99, one byte of body.
        let (dir, t) = fake_daemon(vec![2, 0, 0, 0, 99, 0]);
        let mut c = Client::connect(dir.path().join("s.sock")).unwrap();
        assert_eq!(c.datasets, ["train"]);
        let e = c.stats().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
        assert_eq!(e.to_string(), "unknown frame kind 99");
        drop(c);
        t.join().unwrap();
    }

    /// A socket call that fails keeps its errno: a read that times out is `EAGAIN`, with
    /// the words the client always gave.
    #[test]
    fn a_failed_read_from_the_daemon_keeps_its_errno() {
        let (dir, t) = fake_daemon(Vec::new());
        let mut c = Client::connect(dir.path().join("s.sock")).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        // The fake daemon never answers STATS.
        let e = c.stats().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Os, "{e}");
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
        assert!(
            e.to_string()
                .starts_with("the connection to riffle serve failed: "),
            "{e}"
        );
        drop(c);
        t.join().unwrap();
    }
}
