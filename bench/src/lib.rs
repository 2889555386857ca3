//! riffle's reproducible experiments. Each suite writes `results/<date>-<host>/` with a JSON
//! file (every figure) and a Markdown summary, with the device identity beside them.
//!
//! Suites: [`mod@fio_parity`] (the engine's raw random reads against fio's io_uring engine on
//! the same file, block size and queue depth, in one run), [`probe_check`] (`riffle
//! probe`'s figures against fio's on the same device), [`lirs`], [`planner`] and
//! [`convergence`] (SGD on label-sorted data fed by each mode), [`au`] (accelerator
//! utilisation with a simulated compute time per batch), [`modes`] (every mode x record
//! size x device, with shuffle quality), [`peers`] (numpy memmap and a Python shuffle buffer
//! under a memory limit), [`scale`] (100,000 files, hundreds of piles under a small fd limit,
//! 100 million records), [`formats`] (the formats users already have: a tree of one file
//! per sample against fio), [`node`] (the daemon serving the 16 streams of one job),
//! [`fast_device`] (the engine against fio, io_uring feature by feature, lirs and two-pass on
//! a loop device over tmpfs). [`plot`] draws their SVG charts. [`netem`] emulates a remote
//! link (latency, a bandwidth cap per connection) for the object-store benches.

pub mod au;
pub mod child;
pub mod convergence;
pub mod data;
pub mod fast_device;
pub mod fio;
pub mod fio_parity;
pub mod formats;
pub mod lirs;
pub mod loop_device;
pub mod modes;
pub mod needs;
pub mod netem;
pub mod node;
pub mod object_store;
pub mod peers;
pub mod planner;
pub mod plot;
pub mod probe_check;
pub mod report;
pub mod scale;
pub mod soak;

pub use fio_parity::{run as fio_parity, ParityOptions, ParityReport};
