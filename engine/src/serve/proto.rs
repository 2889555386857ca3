//! The wire protocol of `riffle serve` (documented byte by byte in `docs/protocol.md`).
//!
//! A frame is a little-endian `u32` length, then that many bytes: a one-byte kind and the
//! body. Control messages carry JSON bodies; the per-batch messages (`BATCH`,
//! `BATCH_INLINE`, `ACK`) are small fixed binary structs, so a client pays no parsing for
//! them. No I/O here: encoding, decoding and an incremental frame parser over bytes.

use serde::{Deserialize, Serialize};

use crate::modes::Resume;
use crate::order::{Grouping, Tail};

/// The protocol version this build speaks.
pub const VERSION: u32 = 2;

/// The largest frame (kind byte + body) the daemon accepts from a client. Larger lengths
/// are answered with an error and the connection is closed without reading the body.
pub const MAX_FRAME: usize = 1 << 20;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Both ways, first frame of a connection: JSON [`Hello`].
    Hello = 1,
    /// Client: open a stream, JSON [`OpenRequest`].
    Open = 2,
    /// Daemon: the stream is open, JSON [`Opened`]; the ring's memfd rides along (SCM_RIGHTS).
    Opened = 3,
    /// Daemon: a batch is in the ring, binary [`BatchHeader`].
    Batch = 4,
    /// Daemon: a batch inline, [`BatchHeader`] then ids, offsets and payload.
    BatchInline = 5,
    /// Client: slots it is done with, one or more little-endian `u32`.
    Ack = 6,
    /// Daemon: the stream ended (all epochs delivered, or closed), JSON [`End`].
    End = 7,
    /// Client: stop the current stream (the daemon answers `END`).
    Close = 8,
    /// Client: ask for the daemon's counters (JSON `{}`).
    Stats = 9,
    /// Daemon: the counters, JSON.
    StatsReply = 10,
    /// Daemon: something went wrong, JSON [`ErrorMsg`].
    Error = 15,
}

impl Kind {
    /// The kind of a byte, if it is one.
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Open,
            3 => Kind::Opened,
            4 => Kind::Batch,
            5 => Kind::BatchInline,
            6 => Kind::Ack,
            7 => Kind::End,
            8 => Kind::Close,
            9 => Kind::Stats,
            10 => Kind::StatsReply,
            15 => Kind::Error,
            _ => return None,
        })
    }
}

/// `HELLO`: the version, and who is talking.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// Protocol version.
    pub version: u32,
    /// Free text: "riffle-python 0.1.0", "riffle 0.1.0".
    #[serde(default)]
    pub agent: String,
    /// Daemon only: the datasets it serves.
    #[serde(default)]
    pub datasets: Vec<String>,
    /// Daemon only: the largest frame it accepts.
    #[serde(default)]
    pub max_frame: usize,
}

/// How batches travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Through a shared-memory ring (memfd) the client maps.
    #[default]
    Shm,
    /// In the socket, for clients that cannot map memory.
    Inline,
}

/// The resume cursor on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireCursor {
    /// Epoch.
    pub epoch: u64,
    /// The first batch of that epoch (this rank's numbering) not yet consumed.
    pub batch: u64,
}

/// A global cursor on the wire: `records` positions of `epoch`'s sequence consumed by all
/// ranks together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalCursor {
    /// Epoch.
    pub epoch: u64,
    /// Positions consumed.
    pub records: u64,
}

/// `OPEN`: what to stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenRequest {
    /// A dataset name the daemon was started with.
    pub dataset: String,
    /// Records per batch.
    pub batch_size: u64,
    /// Seed of the order.
    #[serde(default)]
    pub seed: u64,
    /// First epoch.
    #[serde(default)]
    pub epoch: u64,
    /// Epochs to stream.
    #[serde(default = "one")]
    pub epochs: u64,
    /// This rank.
    #[serde(default)]
    pub rank: u64,
    /// Streams in all: ranks x `workers`.
    #[serde(default = "one")]
    pub world: u64,
    /// Streams of each rank (DataLoader workers), which split the rank's batches: stream
    /// `rank` is worker `rank / (world / workers)` of rank `rank % (world / workers)`, and
    /// the tail rule (`partial`, padding, drop-last) is applied over the ranks only.
    #[serde(default = "one")]
    pub workers: u64,
    /// `partial`, `drop_last` or `pad`.
    #[serde(default = "partial")]
    pub tail: String,
    /// `record` or `page`.
    #[serde(default = "record")]
    pub grouping: String,
    /// Resume here.
    #[serde(default)]
    pub resume: Option<WireCursor>,
    /// Resume from a global cursor instead (`resume` left out): `records` positions of
    /// `epoch`'s sequence consumed by all ranks together, under any world and batch size.
    #[serde(default)]
    pub resume_global: Option<GlobalCursor>,
    /// `shm` (default) or `inline`.
    #[serde(default)]
    pub transport: Transport,
    /// Ring bytes wanted (capped by the daemon's per-client share).
    #[serde(default)]
    pub ring_bytes: Option<u64>,
    /// How many streams of this job this node will open (its ranks here, or their
    /// workers' sub-streams): the job's shared pass waits for that many before it
    /// decides its first batch, up to the daemon's `--join-deadline`. At least 1; more
    /// than the world counts as the world. Left out: the pass waits as before (a LIRS
    /// `--join-window`, two-pass its scatter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u64>,
}

impl OpenRequest {
    /// The tail policy `tail` names: `partial`, `drop_last` or `pad`.
    pub fn parse_tail(&self) -> Result<Tail, String> {
        match self.tail.as_str() {
            "partial" => Ok(Tail::Partial),
            "drop_last" => Ok(Tail::DropLast),
            "pad" => Ok(Tail::Pad),
            t => Err(format!(
                "unknown tail '{t}': expected partial, drop_last or pad"
            )),
        }
    }

    /// The grouping `grouping` names: `record`, or `page` (blocks of 4 KiB).
    pub fn parse_grouping(&self) -> Result<Grouping, String> {
        crate::request::parse_grouping(&self.grouping, 4096)
    }

    /// Where to resume: `resume` (this rank's cursor) or `resume_global`, not both.
    pub fn parse_resume(&self) -> Result<Option<Resume>, String> {
        match (self.resume, self.resume_global) {
            (Some(_), Some(_)) => Err("give resume or resume_global, not both".into()),
            (Some(c), None) => Ok(Some(Resume::Rank {
                epoch: c.epoch,
                batch: c.batch,
                world: None,
                size: None,
            })),
            (None, Some(g)) => Ok(Some(Resume::Global {
                epoch: g.epoch,
                records: g.records,
            })),
            (None, None) => Ok(None),
        }
    }
}

fn one() -> u64 {
    1
}
fn partial() -> String {
    "partial".into()
}
fn record() -> String {
    "record".into()
}

/// `OPENED`: the stream's shape.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Opened {
    /// Records in the dataset.
    pub records: u64,
    /// This rank's batches per epoch.
    pub batches_per_epoch: u64,
    /// `shm` or `inline`.
    pub transport: Transport,
    /// Size of the ring the attached memfd holds (0 inline).
    pub ring_bytes: u64,
    /// Most batches the daemon sends before it needs an `ACK`.
    pub credits: u32,
    /// An upper bound on a batch's bytes (ids, offsets and payload): the batch size times
    /// the longest record, plus the arrays.
    #[serde(default)]
    pub max_batch_bytes: u64,
    /// The mode reading the dataset.
    pub mode: String,
    /// How the stream is read: `shared` (one pass for the ranks of its job), `own` (a
    /// pass of its own: a world of one rank).
    #[serde(default)]
    pub pass: String,
    /// The job's id in the daemon's stats, when the pass is shared.
    #[serde(default)]
    pub job: Option<u64>,
    /// The stream's id in the daemon's stats (`stream_waits`).
    #[serde(default)]
    pub stream: Option<u64>,
    /// The dataset's format (`npy`, `tar`, `mds`, `files`, ...): how a client decodes a
    /// record (`tar` and `mds` records are samples).
    #[serde(default)]
    pub format: String,
    /// An MDS dataset's columns, in a sample's order (empty otherwise).
    #[serde(default)]
    pub columns: Vec<crate::dataset::MdsColumn>,
    /// A labelled dataset's class names, in label order (empty otherwise).
    #[serde(default)]
    pub classes: Vec<String>,
    /// A mixture's source names (a batch's `sources` index them; empty otherwise).
    #[serde(default)]
    pub sources: Vec<String>,
    /// Where the stream's first batch starts in its epoch's sequence (records consumed by
    /// all ranks before it), and where that epoch's batches end: with `round` (records per
    /// round of batches, batch size x world), a client's global cursor after its batch `j`
    /// of that epoch is `min(start + (j + 1) * round, end)`; later epochs start at 0 and
    /// end at `epoch_end`.
    #[serde(default)]
    pub start: u64,
    /// The end of the first epoch's batches (see `start`).
    #[serde(default)]
    pub start_end: u64,
    /// Records per round of batches.
    #[serde(default)]
    pub round: u64,
    /// The end of a whole epoch's batches, in records (padding not counted, so that a
    /// padded epoch's end is its record count, the end under any world).
    #[serde(default)]
    pub epoch_end: u64,
}

/// `END`: why the stream stopped and where it stopped.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct End {
    /// `done` (every epoch delivered) or `closed` (the client asked).
    pub reason: String,
    /// Batches sent on this stream.
    pub batches: u64,
}

/// `ERROR`: a code for programs, a message for people.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorMsg {
    /// `version`, `protocol`, `oversize`, `unknown_dataset`, `bad_request`, `engine`,
    /// `too_large`, `busy`, `shutdown`.
    pub code: String,
    /// What happened, naming the thing.
    pub message: String,
    /// Whether the daemon closes the connection after this frame.
    pub fatal: bool,
}

/// `BatchHeader::flags`: the batch carries one label (u32) per record, right after its
/// offsets (a `files` dataset of class directories).
pub const FLAG_LABELS: u32 = 1;

/// `BatchHeader::flags`: the batch carries each record's source (u32, an index into
/// OPENED's `sources`) right after its offsets, and after its labels if it has them (a
/// mixture).
pub const FLAG_SOURCES: u32 = 2;

/// The fixed part of `BATCH` and `BATCH_INLINE`: 80 bytes, little-endian.
///
/// For `BATCH`, `ids_at`, `offsets_at` and `data_at` are byte offsets in the ring; for
/// `BATCH_INLINE` they are offsets in the frame body (ids right after this header). With
/// [`FLAG_LABELS`], the records' labels (u32 each) follow the offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BatchHeader {
    /// The slot to acknowledge.
    pub slot: u32,
    /// [`FLAG_LABELS`]; other bits 0.
    pub flags: u32,
    /// Epoch.
    pub epoch: u64,
    /// Index of the batch in this rank's epoch.
    pub index: u64,
    /// Records (padding included).
    pub records: u64,
    /// Padding records at the end.
    pub padding: u64,
    /// Payload bytes.
    pub data_len: u64,
    /// Where the `records` u64 ids start.
    pub ids_at: u64,
    /// Where the `records + 1` u64 offsets start.
    pub offsets_at: u64,
    /// Where the payload starts.
    pub data_at: u64,
    /// CLOCK_MONOTONIC nanoseconds when the engine completed the batch (its age, and the
    /// start of its hand-off latency, count from here).
    pub ready_ns: u64,
}

impl BatchHeader {
    /// Encoded size.
    pub const LEN: usize = 8 + 8 * 9;

    /// Appends the encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.slot.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        for v in [
            self.epoch,
            self.index,
            self.records,
            self.padding,
            self.data_len,
            self.ids_at,
            self.offsets_at,
            self.data_at,
            self.ready_ns,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Decodes the first [`BatchHeader::LEN`] bytes.
    pub fn decode(b: &[u8]) -> Option<BatchHeader> {
        if b.len() < Self::LEN {
            return None;
        }
        let u = |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        Some(BatchHeader {
            slot: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            flags: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            epoch: u(0),
            index: u(1),
            records: u(2),
            padding: u(3),
            data_len: u(4),
            ids_at: u(5),
            offsets_at: u(6),
            data_at: u(7),
            ready_ns: u(8),
        })
    }
}

/// One frame: the length prefix, the kind and the body, ready to write.
pub fn frame(kind: Kind, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    frame_into(&mut out, kind, body.len());
    out.extend_from_slice(body);
    out
}

/// Appends a frame header for a body of `body_len` bytes that the caller appends next.
///
/// Panics if the kind byte and the body do not fit the u32 length prefix: a caller sends
/// nothing that large (a batch too large for one frame is refused before it is framed),
/// and a length cut to 32 bits would desynchronise the stream.
pub fn frame_into(out: &mut Vec<u8>, kind: Kind, body_len: usize) {
    let len = body_len
        .checked_add(1)
        .and_then(|n| u32::try_from(n).ok())
        .expect("a frame of at most 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.push(kind as u8);
}

/// A JSON frame.
pub fn json_frame<T: Serialize>(kind: Kind, msg: &T) -> Vec<u8> {
    frame(
        kind,
        &serde_json::to_vec(msg).expect("JSON of a plain struct"),
    )
}

/// What the parser found at the front of its buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole frame yet.
    Incomplete,
    /// A frame: its kind byte and the body's range in the buffer; `len` bytes to consume.
    Frame {
        /// The kind byte (not yet checked against [`Kind`]).
        kind: u8,
        /// Bytes of the whole frame, prefix included.
        len: usize,
    },
    /// The length prefix says more than `max` or is zero: not a frame anyone should read.
    Bad {
        /// The announced length.
        announced: u64,
    },
}

/// Looks at the front of `buf` for one frame no longer than `max` (kind + body).
pub fn parse(buf: &[u8], max: usize) -> Parsed {
    if buf.len() < 4 {
        return Parsed::Incomplete;
    }
    let n = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
    if n == 0 || n > max {
        return Parsed::Bad {
            announced: n as u64,
        };
    }
    if buf.len() < 4 + n {
        return Parsed::Incomplete;
    }
    Parsed::Frame {
        kind: buf[4],
        len: 4 + n,
    }
}

/// A buffer that collects bytes and hands out whole frames.
#[derive(Default)]
pub struct FrameBuf {
    buf: Vec<u8>,
    start: usize,
}

impl FrameBuf {
    /// Room for reading at least `want` more bytes; call [`FrameBuf::filled`] after.
    pub fn spare(&mut self, want: usize) -> &mut [u8] {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + want, 0);
        &mut self.buf[len..]
    }

    /// After [`FrameBuf::spare`] of `want`: `got` of those bytes are real.
    pub fn filled(&mut self, want: usize, got: usize) {
        let len = self.buf.len();
        self.buf.truncate(len - want + got);
    }

    /// The next frame, if whole: `(kind byte, body)`, consumed. `Err(announced)` for a bad
    /// length prefix.
    pub fn next(&mut self, max: usize) -> Result<Option<(u8, &[u8])>, u64> {
        match parse(&self.buf[self.start..], max) {
            Parsed::Incomplete => Ok(None),
            Parsed::Bad { announced } => Err(announced),
            Parsed::Frame { kind, len } => {
                let at = self.start;
                self.start += len;
                Ok(Some((kind, &self.buf[at + 5..at + len])))
            }
        }
    }

    /// Bytes of a partial frame.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Decodes an `ACK` body: one or more u32 slots.
pub fn decode_acks(body: &[u8]) -> Option<impl Iterator<Item = u32> + '_> {
    if body.is_empty() || !body.len().is_multiple_of(4) {
        return None;
    }
    Some(
        body.chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap())),
    )
}

/// An `ERROR` frame: `code` for programs, `message` for people; `fatal` when the daemon
/// closes the connection after it.
pub(super) fn error_frame(code: &str, message: &str, fatal: bool) -> Vec<u8> {
    json_frame(
        Kind::Error,
        &ErrorMsg {
            code: code.into(),
            message: message.into(),
            fatal,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trips() {
        let h = BatchHeader {
            slot: 7,
            flags: 0,
            epoch: 3,
            index: 99,
            records: 256,
            padding: 2,
            data_len: 1 << 40,
            ids_at: 64,
            offsets_at: 64 + 2048,
            data_at: 4160,
            ready_ns: 123456789,
        };
        let mut v = Vec::new();
        h.encode(&mut v);
        assert_eq!(v.len(), BatchHeader::LEN);
        assert_eq!(BatchHeader::decode(&v), Some(h));
        assert_eq!(BatchHeader::decode(&v[..79]), None);
    }

    #[test]
    fn frames_are_split_and_bad_lengths_reported() {
        let mut fb = FrameBuf::default();
        let mut bytes = frame(Kind::Ack, &5u32.to_le_bytes());
        bytes.extend(json_frame(Kind::Stats, &serde_json::json!({})));
        // Feed one byte at a time: a frame appears only when whole.
        let mut got = Vec::new();
        for b in &bytes {
            fb.spare(1)[0] = *b;
            fb.filled(1, 1);
            while let Some((k, body)) = fb.next(MAX_FRAME).unwrap() {
                got.push((k, body.to_vec()));
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], (Kind::Ack as u8, 5u32.to_le_bytes().to_vec()));
        assert_eq!(got[1].0, Kind::Stats as u8);
        assert_eq!(fb.pending(), 0);

        let mut fb = FrameBuf::default();
        fb.spare(4)
            .copy_from_slice(&(u32::try_from(MAX_FRAME).unwrap() + 1).to_le_bytes());
        assert_eq!(fb.next(MAX_FRAME).unwrap_err(), MAX_FRAME as u64 + 1);
        let mut fb = FrameBuf::default();
        fb.spare(4).copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(fb.next(MAX_FRAME).unwrap_err(), 0);
    }

    proptest::proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Whatever bytes arrive, in whatever pieces, the parser hands out exactly the
        /// frames that were encoded, or reports a bad length; it never panics.
        #[test]
        fn arbitrary_bytes_never_panic_the_parser(
            frames in proptest::collection::vec(
                (0u8..20, proptest::collection::vec(proptest::num::u8::ANY, 0..300)), 0..8),
            garbage in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            piece in 1usize..97,
        ) {
            let mut bytes = Vec::new();
            for (k, body) in &frames {
                bytes.extend(frame_raw(*k, body));
            }
            bytes.extend(&garbage);
            let mut fb = FrameBuf::default();
            let mut got = Vec::new();
            'feed: for chunk in bytes.chunks(piece) {
                fb.spare(chunk.len()).copy_from_slice(chunk);
                loop {
                    match fb.next(256) {
                        Ok(Some((k, body))) => got.push((k, body.to_vec())),
                        Ok(None) => break,
                        Err(_) => break 'feed,
                    }
                }
            }
            // Every frame within the limit and before the first oversized one came out.
            let fitting: Vec<_> = frames.iter().take_while(|(_, b)| b.len() < 256).cloned().collect();
            proptest::prop_assert_eq!(&got[..fitting.len().min(got.len())], &fitting[..fitting.len().min(got.len())]);
            proptest::prop_assert!(got.len() >= fitting.len());
        }
    }

    fn frame_raw(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = u32::try_from(body.len() + 1)
            .unwrap()
            .to_le_bytes()
            .to_vec();
        v.push(kind);
        v.extend_from_slice(body);
        v
    }

    /// A message as the tests see it: what a frame of each kind decodes to.
    #[derive(Clone, Debug, PartialEq)]
    enum Msg {
        /// A control message (kind byte, its JSON as the typed struct serialises it).
        Json(u8, serde_json::Value),
        /// `BATCH` or `BATCH_INLINE`: the header and what follows it.
        Batch(u8, BatchHeader, Vec<u8>),
        /// `ACK`.
        Acks(Vec<u32>),
    }

    /// What a daemon or a client makes of a frame: `None` when the body does not decode
    /// as its kind says.
    fn decode_msg(kind: u8, body: &[u8]) -> Option<Msg> {
        fn typed<T: serde::de::DeserializeOwned + Serialize>(kind: u8, body: &[u8]) -> Option<Msg> {
            let v: T = serde_json::from_slice(body).ok()?;
            Some(Msg::Json(kind, serde_json::to_value(v).ok()?))
        }
        match Kind::from_u8(kind)? {
            Kind::Hello => typed::<Hello>(kind, body),
            Kind::Open => typed::<OpenRequest>(kind, body),
            Kind::Opened => typed::<Opened>(kind, body),
            Kind::End => typed::<End>(kind, body),
            Kind::Error => typed::<ErrorMsg>(kind, body),
            Kind::Close | Kind::Stats | Kind::StatsReply => typed::<serde_json::Value>(kind, body),
            Kind::Batch | Kind::BatchInline => {
                let h = BatchHeader::decode(body)?;
                Some(Msg::Batch(kind, h, body[BatchHeader::LEN..].to_vec()))
            }
            Kind::Ack => Some(Msg::Acks(decode_acks(body)?.collect())),
        }
    }

    fn encode_msg(m: &Msg) -> Vec<u8> {
        match m {
            Msg::Json(k, v) => frame(Kind::from_u8(*k).unwrap(), &serde_json::to_vec(v).unwrap()),
            Msg::Batch(k, h, tail) => {
                let mut b = Vec::new();
                h.encode(&mut b);
                b.extend_from_slice(tail);
                frame(Kind::from_u8(*k).unwrap(), &b)
            }
            Msg::Acks(v) => {
                let b: Vec<u8> = v.iter().flat_map(|s| s.to_le_bytes()).collect();
                frame(Kind::Ack, &b)
            }
        }
    }

    mod strategies {
        use super::super::*;
        use super::Msg;
        use proptest::collection::vec;
        use proptest::prelude::*;

        fn json<T: Serialize>(kind: Kind, v: T) -> Msg {
            Msg::Json(kind as u8, serde_json::to_value(v).unwrap())
        }

        fn cursor() -> impl Strategy<Value = Option<WireCursor>> {
            proptest::option::of(
                any::<(u64, u64)>().prop_map(|(epoch, batch)| WireCursor { epoch, batch }),
            )
        }

        fn open() -> impl Strategy<Value = Msg> {
            (
                (".{0,12}", any::<[u64; 6]>(), ".{0,8}", ".{0,8}"),
                (
                    cursor(),
                    proptest::option::of(any::<(u64, u64)>()),
                    any::<bool>(),
                    any::<Option<u64>>(),
                ),
            )
                .prop_map(
                    |((dataset, n, tail, grouping), (resume, global, inline, ring_bytes))| {
                        json(
                            Kind::Open,
                            OpenRequest {
                                dataset,
                                batch_size: n[0],
                                seed: n[1],
                                epoch: n[2],
                                epochs: n[3],
                                rank: n[4],
                                world: n[5],
                                workers: n[5] % 3,
                                tail,
                                grouping,
                                resume,
                                resume_global: global
                                    .map(|(epoch, records)| GlobalCursor { epoch, records }),
                                transport: if inline {
                                    Transport::Inline
                                } else {
                                    Transport::Shm
                                },
                                ring_bytes,
                                streams: ring_bytes.map(|b| b % 17),
                            },
                        )
                    },
                )
        }

        fn header() -> impl Strategy<Value = BatchHeader> {
            (any::<(u32, u32)>(), any::<[u64; 9]>()).prop_map(|((slot, flags), v)| BatchHeader {
                slot,
                flags,
                epoch: v[0],
                index: v[1],
                records: v[2],
                padding: v[3],
                data_len: v[4],
                ids_at: v[5],
                offsets_at: v[6],
                data_at: v[7],
                ready_ns: v[8],
            })
        }

        /// Any message either side sends.
        pub fn msg() -> impl Strategy<Value = Msg> {
            prop_oneof![
                (any::<u32>(), ".{0,16}", vec(".{0,8}", 0..4), any::<usize>()).prop_map(
                    |(version, agent, datasets, max_frame)| json(
                        Kind::Hello,
                        Hello {
                            version,
                            agent,
                            datasets,
                            max_frame
                        }
                    )
                ),
                open(),
                (".{0,8}", any::<u64>())
                    .prop_map(|(reason, batches)| json(Kind::End, End { reason, batches })),
                (".{0,8}", ".{0,40}", any::<bool>()).prop_map(|(code, message, fatal)| json(
                    Kind::Error,
                    ErrorMsg {
                        code,
                        message,
                        fatal
                    }
                )),
                Just(json(Kind::Close, serde_json::json!({}))),
                Just(json(Kind::Stats, serde_json::json!({}))),
                (header(), vec(any::<u8>(), 0..64)).prop_map(|(h, tail)| Msg::Batch(
                    Kind::Batch as u8,
                    h,
                    tail
                )),
                (header(), vec(any::<u8>(), 0..200)).prop_map(|(h, tail)| Msg::Batch(
                    Kind::BatchInline as u8,
                    h,
                    tail
                )),
                vec(any::<u32>(), 1..8).prop_map(Msg::Acks),
            ]
        }
    }

    /// Feeds `bytes` to a parser in pieces of the sizes `pieces` cycles through, takes
    /// every whole frame out after each piece, and returns them, stopping at a bad length
    /// (where a connection is closed). The parser never holds more than its consumed
    /// prefix (drained past 64 KiB), one frame of at most `max` bytes and a piece.
    fn feed(bytes: &[u8], pieces: &[usize], max: usize) -> Vec<(u8, Vec<u8>)> {
        let mut fb = FrameBuf::default();
        let mut got = Vec::new();
        let mut at = 0;
        for piece in pieces.iter().cycle() {
            if at >= bytes.len() {
                break;
            }
            let chunk = &bytes[at..(at + piece).min(bytes.len())];
            at += chunk.len();
            fb.spare(chunk.len()).copy_from_slice(chunk);
            assert!(
                fb.buf.len() <= 64 * 1024 + 4 + max + piece,
                "{} bytes held",
                fb.buf.len()
            );
            loop {
                match fb.next(max) {
                    Ok(Some((k, body))) => got.push((k, body.to_vec())),
                    Ok(None) => break,
                    Err(_) => return got,
                }
            }
        }
        got
    }

    proptest::proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every message either side sends comes out of the parser as it went in,
        /// whatever pieces the socket cuts the bytes into, and decodes to itself.
        #[test]
        fn valid_frames_round_trip(
            msgs in proptest::collection::vec(strategies::msg(), 1..12),
            pieces in proptest::collection::vec(1usize..700, 1..8),
        ) {
            let bytes: Vec<u8> = msgs.iter().flat_map(encode_msg).collect();
            let got = feed(&bytes, &pieces, MAX_FRAME);
            proptest::prop_assert_eq!(got.len(), msgs.len());
            for ((k, body), m) in got.iter().zip(&msgs) {
                proptest::prop_assert_eq!(decode_msg(*k, body), Some(m.clone()));
            }
        }

        /// Valid frames with bytes changed, inserted, removed or cut, and bytes that were
        /// never frames, neither panic the parser nor the decoders of any kind, and the
        /// parser's memory stays bounded by its limit whatever the length prefixes say.
        #[test]
        fn mutated_frames_and_arbitrary_bytes_never_panic(
            msgs in proptest::collection::vec(strategies::msg(), 0..8),
            edits in proptest::collection::vec((any::<proptest::sample::Index>(), 0u8..4, proptest::num::u8::ANY), 0..6),
            noise in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            pieces in proptest::collection::vec(1usize..700, 1..8),
            max in 5usize..4096,
        ) {
            let mut bytes: Vec<u8> = msgs.iter().flat_map(encode_msg).collect();
            if bytes.is_empty() {
                bytes = noise;
            }
            for (i, op, v) in edits {
                if bytes.is_empty() {
                    break;
                }
                let i = i.index(bytes.len());
                match op {
                    0 => bytes[i] = v,
                    1 => bytes.insert(i, v),
                    2 => { bytes.remove(i); }
                    _ => bytes.truncate(i),
                }
            }
            for (k, body) in feed(&bytes, &pieces, max) {
                prop_assert!(body.len() < max, "a body within the limit");
                let _ = decode_msg(k, &body);
            }
        }
    }

    #[test]
    fn acks_need_whole_u32s() {
        assert!(decode_acks(&[]).is_none());
        assert!(decode_acks(&[1, 2, 3]).is_none());
        let v: Vec<u32> = decode_acks(&[1, 0, 0, 0, 2, 0, 0, 0]).unwrap().collect();
        assert_eq!(v, vec![1, 2]);
    }

    #[test]
    fn open_requests_take_defaults_and_refuse_unknown_fields() {
        let r: OpenRequest = serde_json::from_str(r#"{"dataset":"train","batch_size":4}"#).unwrap();
        assert_eq!((r.epochs, r.world, r.transport), (1, 1, Transport::Shm));
        assert!(
            serde_json::from_str::<OpenRequest>(r#"{"dataset":"t","batch_size":4,"x":1}"#).is_err()
        );
    }
}
