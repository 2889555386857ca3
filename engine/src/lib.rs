//! riffle: a storage engine that feeds shuffled training data from local storage as fast
//! as the device allows.
//!
//! The crate is layered (see `ARCHITECTURE.md` at the repository root):
//!
//! - [`io`]: aligned buffers, the io_uring backend, the pread fallback and a reader that
//!   turns arbitrary byte ranges into whole aligned O_DIRECT extents;
//! - [`device`]: which block device holds a path, and what it says about itself;
//! - [`probe`]: measures a device the way fio does and caches the profile;
//! - [`emulate`]: runs the process under a kernel I/O throttle that makes a device behave
//!   like a slower class (`hdd`, `sata-ssd`), for benches and tests.
//!
//! Reading arbitrary byte ranges of a file takes a few lines:
//!
//! ```
//! # fn main() -> Result<(), riffle::Error> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("data.bin");
//! # std::fs::write(&path, (0..10_000u32).map(|i| i as u8).collect::<Vec<_>>()).unwrap();
//! use riffle::io::{IoConfig, RangeReader};
//!
//! let mut reader = RangeReader::open(&[&path], &IoConfig::default())?;
//! let mut got = Vec::new();
//! reader.read_ranges([(0, 17, 5), (0, 9_998, 100)], |tag, bytes| got.push((tag, bytes.to_vec())))?;
//! got.sort();
//! assert_eq!(got[0].1, vec![17, 18, 19, 20, 21]);
//! assert_eq!(got[1].1.len(), 2); // the range is clipped at the end of the file
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod dataset;
pub mod device;
pub mod door;
pub mod emulate;
mod error;
pub mod format;
pub mod gen;
pub mod io;
pub mod mix;
pub mod modes;
pub mod notice;
pub mod order;
mod piles;
mod pipeline;
pub mod plan;
pub mod probe;
pub mod remote;
pub mod request;
pub mod resources;
pub mod scratch;
pub mod serve;
pub mod shuffle;
pub mod size;
pub mod source;
#[doc(hidden)]
pub mod testing;

pub use error::{Error, ErrorKind, Result};
