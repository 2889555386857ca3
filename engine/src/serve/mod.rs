//! `riffle serve`: a batch-feeder daemon on a Unix socket, and its Rust client.
//!
//! - `proto.rs`: the versioned, length-prefixed wire protocol (no I/O);
//! - `ring.rs`: which bytes of a stream's shared-memory ring are live (pure bookkeeping);
//! - `shm.rs`: memfd rings, read-only client mappings and descriptor passing (the only
//!   unsafe code here);
//! - `state.rs`: what the daemon's threads share: its config, counters, jobs, budget;
//! - `server.rs`: the daemon: the socket, the accept loop, shutdown;
//! - `conn.rs`: one connection's thread: handshake, streams, flow control;
//! - `wire.rs`: a connection's socket shared with its stream's engine thread, which
//!   announces batches it completed in the ring;
//! - `open.rs`: an OPEN made a read (through `crate::request`, as `riffle read` makes
//!   its flags one), its ring and its job;
//! - `catalog.rs`: the datasets served: those started with, and those OPENs name by path;
//! - `job.rs`: the jobs whose ranks share one engine pass;
//! - `held.rs`: datasets held resident, one copy per node shared by every stream of them;
//! - `rolled.rs`: piles a pass rolled past its last epoch, kept for its job's next pass;
//! - `telemetry.rs`: per stream and per job, the waits on the engine and on the client;
//! - `budget.rs`: the daemon's budgets (memory, scratch, open files), which rings and
//!   passes take from: `too_large` for what never fits, `busy` for what must wait;
//! - `space.rs`: reservations of the scratch filesystems' real free space;
//! - `codes.rs`: the `ERROR` code an engine error is answered with, by its kind;
//! - `user.rs`: the per-user node daemon's private directory and its locks;
//! - `client.rs`: a Rust client (tests and benches use it).
//!
//! Sizes and counts here come from the wire, the ring and the engine; a cast that could
//! truncate, wrap or drop a sign is a bounds check waiting to be skipped, so they are
//! converted with `try_from` (or widened with `from`) instead.
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

mod budget;
mod catalog;
pub mod client;
mod codes;
mod conn;
mod held;
mod job;
mod open;
pub mod proto;
pub mod ring;
mod rolled;
pub mod server;
pub mod shm;
mod space;
mod state;
mod telemetry;
pub mod user;
mod wire;

pub use catalog::OnOpen;
pub use client::{BatchRef, Client, Stream, StreamStats};
pub use proto::{OpenRequest, Transport, WireCursor};
pub use rolled::DEFAULT_KEEP_SECS;
pub use server::{monotonic_ns, ServeConfig, ServeMode, Server, Shutdown};
