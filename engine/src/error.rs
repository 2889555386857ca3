use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in the engine, with what a user needs to act on it: the
/// file, the byte offset where it applies, and the operation that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed on a file.
    #[error("{path}: {op} failed{}: {err}", at_offset(*offset))]
    Io {
        /// The file the operation was on.
        path: PathBuf,
        /// What was being done: "open", "read", "write", ...
        op: &'static str,
        /// The byte offset of the operation, when it had one.
        offset: Option<u64>,
        /// The operating system's error (shown in the message, so deliberately not a
        /// chained source: reports would print it twice).
        err: io::Error,
    },
    /// The input is not what it should be.
    #[error("{path}{}: {what}", at_offset(*offset))]
    BadInput {
        /// The offending file.
        path: PathBuf,
        /// Where in it, when known.
        offset: Option<u64>,
        /// What was expected and what was found.
        what: String,
    },
    /// io_uring could not be used and the caller insisted on it.
    #[error("io_uring is unavailable: {0}")]
    UringUnavailable(String),
    /// A request that the engine cannot honour (bad argument, budget too small, ...).
    #[error("{0}")]
    Invalid(String),
    /// A resource asked for is beyond what this process can have (more I/O slots or
    /// requests in flight than a backend takes, a buffer whose size overflows): refused,
    /// never cut down in silence.
    #[error("not enough {resource}: {asked} asked, {limit} available")]
    Exhausted {
        /// What ran out, in the plural ("I/O slots", "requests in flight", ...).
        resource: &'static str,
        /// How many were asked for (`u64::MAX` when the count itself overflowed).
        asked: u64,
        /// The most there can be.
        limit: u64,
    },
    /// `riffle serve` refused or ended a request, and said why: `code` is its reason
    /// (`busy`, `shutdown`, `bad_request`, `unknown_dataset`, `engine`, ...; see
    /// docs/protocol.md), `message` its words.
    #[error("riffle serve: {message} ({code})")]
    Daemon {
        /// The daemon's reason, as a word a program can match.
        code: String,
        /// What it said.
        message: String,
    },
}

fn at_offset(offset: Option<u64>) -> String {
    match offset {
        Some(o) => format!(" at byte {o}"),
        None => String::new(),
    }
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(
        path: impl Into<PathBuf>,
        op: &'static str,
        offset: Option<u64>,
        source: io::Error,
    ) -> Self {
        Error::Io {
            path: path.into(),
            op,
            offset,
            err: source,
        }
    }

    /// The daemon's reason (`busy`, `shutdown`, ...), when `riffle serve` said why.
    pub fn daemon_code(&self) -> Option<&str> {
        match self {
            Error::Daemon { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The OS error number behind this error, if there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { err, .. } => err.raw_os_error(),
            _ => None,
        }
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
