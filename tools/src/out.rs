//! Printing to stdout that returns its error instead of panicking (`println!` panics when
//! stdout is a closed pipe or a full disk).
//!
//! A write that fails comes back as a [`StdoutError`], which `main` tells apart: a closed
//! pipe (`riffle read X | head -1`) ends the run quietly with 141, the status a shell sees
//! when coreutils are stopped by SIGPIPE, after the run's scratch has been dropped on the
//! way out; any other failure (`> /dev/full`) is an error naming stdout, exit 1.

use std::fmt;
use std::io::Write;

/// A write to stdout failed.
#[derive(Debug)]
pub struct StdoutError(pub std::io::Error);

impl fmt::Display for StdoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stdout: write failed: {}", self.0)
    }
}

impl std::error::Error for StdoutError {}

impl StdoutError {
    /// Whether stdout is a pipe whose reader has gone: not a failure of the run.
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Writes `args` to stdout and flushes it, so that a failure is seen here, at the write
/// that hit it, and not lost when the process exits.
pub fn print(args: fmt::Arguments<'_>) -> Result<(), StdoutError> {
    let mut o = std::io::stdout().lock();
    o.write_fmt(args)
        .and_then(|()| o.flush())
        .map_err(StdoutError)
}

/// A `Write` over stdout whose errors carry a [`StdoutError`] (inside the `io::Error`, kind
/// kept), for code that writes through a generic writer: `main` finds it there.
pub struct Stdout(std::io::StdoutLock<'static>);

impl Stdout {
    /// Locks stdout for this writer.
    pub fn lock() -> Stdout {
        Stdout(std::io::stdout().lock())
    }
}

fn tagged(e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), StdoutError(e))
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(tagged)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(tagged)
    }
}

/// What a failed run's error says about stdout: `Some(true)` for a closed pipe, `Some(false)`
/// for another write failure on stdout, `None` when the error is not about stdout. Looks
/// through the whole chain: a `StdoutError` itself, one inside an `io::Error` (from
/// [`Stdout`]), or an engine error on `<stdout>` (a shuffle written to stdout).
pub fn stdout_failure(e: &anyhow::Error) -> Option<bool> {
    for cause in e.chain() {
        if let Some(s) = cause.downcast_ref::<StdoutError>() {
            return Some(s.is_closed_pipe());
        }
        if let Some(s) = cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<StdoutError>())
        {
            return Some(s.is_closed_pipe());
        }
        if let Some(riffle::Error::Io { path, err, .. }) = cause.downcast_ref::<riffle::Error>() {
            if path.as_os_str() == "<stdout>" {
                return Some(err.kind() == std::io::ErrorKind::BrokenPipe);
            }
        }
    }
    None
}

/// `println!` that returns a `Result<(), StdoutError>` instead of panicking.
macro_rules! outln {
    () => {
        $crate::out::print(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that returns a `Result<(), StdoutError>` instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::print(format_args!($($arg)*))
    };
}

pub(crate) use {out, outln};
