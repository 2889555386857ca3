use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in the engine, with what a user needs to act on it: the
/// file, the byte offset where it applies, and the operation that failed.
///
/// A program tells the kinds apart with [`Error::kind`]: a run that was stopped
/// ([`ErrorKind::Cancelled`]) is not a failure of the run, an OS error keeps its errno
/// ([`Error::raw_os_error`]), a bad argument is the caller's to fix, and a budget or
/// resource too small for the work asked says so ([`ErrorKind::Exhausted`]).
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
    /// A call to the operating system that is not about a file failed (shared memory, a
    /// socket, starting a thread, ...); its errno is kept in `err`.
    #[error("{op}: {err}")]
    Os {
        /// What was being done, as the message says it: "memfd_create", "cannot start
        /// the I/O thread", ...
        op: &'static str,
        /// The operating system's error (shown in the message, not chained: see `Io`).
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
    /// What was asked cannot be done on this system: a kernel feature or controller is
    /// missing, or the process lacks the privilege (device emulation's cgroups).
    #[error("{0}")]
    Unsupported(String),
    /// A request that the engine cannot honour: a bad argument, or options that do not go
    /// together. The caller has to ask for something else.
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
    /// A budget the run was given (`--memory`, the free scratch space, ...) is too small
    /// for the work asked; the message names what needs how much. Of the same kind as
    /// [`Error::Exhausted`] ([`ErrorKind::Exhausted`]).
    #[error("{0}")]
    OverBudget(String),
    /// The run was stopped before it finished: its stop flag was set (a consumer that
    /// dropped or finished its stream, a daemon's CLOSE or shutdown), or the process is
    /// exiting on a signal. Not a failure of the run: whoever stopped it asked for this.
    #[error("{reason}")]
    Cancelled {
        /// Why, as the message says it: "the run was stopped", ...
        reason: &'static str,
    },
    /// Something the engine relies on broke: a thread of the run panicked, a pool's
    /// threads went away, a read returned less than was planned. A bug, or a system in
    /// trouble; not the caller's argument.
    #[error("{0}")]
    Internal(String),
    /// `riffle serve` broke the protocol, or closed the connection without saying why
    /// (the client's view).
    #[error("{0}")]
    Protocol(String),
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

/// What kind of error an [`Error`] is, for a program to match on ([`Error::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The run was stopped ([`Error::Cancelled`]).
    Cancelled,
    /// An OS call failed, with an errno when the OS gave one ([`Error::Io`] on a file,
    /// [`Error::Os`] otherwise).
    Os,
    /// A file's contents are not what they should be ([`Error::BadInput`]).
    BadInput,
    /// A bad argument or request ([`Error::Invalid`]).
    Invalid,
    /// A resource or a budget too small for the work asked ([`Error::Exhausted`],
    /// [`Error::OverBudget`]).
    Exhausted,
    /// The system cannot do what was asked ([`Error::Unsupported`], and
    /// [`Error::UringUnavailable`] when io_uring was required).
    Unsupported,
    /// The engine itself failed ([`Error::Internal`]).
    Internal,
    /// `riffle serve` broke the protocol or went away ([`Error::Protocol`]).
    Protocol,
    /// `riffle serve` refused a request ([`Error::Daemon`]; its code says why).
    Daemon,
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

    /// An [`Error::Os`]: `op` failed with `err` (an `io::Error`, or a `nix` errno).
    pub fn os(op: &'static str, err: impl Into<io::Error>) -> Self {
        Error::Os {
            op,
            err: err.into(),
        }
    }

    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Io { .. } | Error::Os { .. } => ErrorKind::Os,
            Error::BadInput { .. } => ErrorKind::BadInput,
            Error::UringUnavailable(_) | Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Invalid(_) => ErrorKind::Invalid,
            Error::Exhausted { .. } | Error::OverBudget(_) => ErrorKind::Exhausted,
            Error::Cancelled { .. } => ErrorKind::Cancelled,
            Error::Internal(_) => ErrorKind::Internal,
            Error::Protocol(_) => ErrorKind::Protocol,
            Error::Daemon { .. } => ErrorKind::Daemon,
        }
    }

    /// Whether the run was stopped rather than failed ([`ErrorKind::Cancelled`]).
    pub fn is_cancelled(&self) -> bool {
        self.kind() == ErrorKind::Cancelled
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
            Error::Io { err, .. } | Error::Os { err, .. } => err.raw_os_error(),
            _ => None,
        }
    }

    /// The same error again, for handing one failure to several receivers (the ranks of
    /// a shared pass): the same variant, fields and message; an OS error keeps its errno
    /// (any other `io::Error` its kind and words).
    pub(crate) fn duplicate(&self) -> Error {
        let again = |e: &io::Error| match e.raw_os_error() {
            Some(n) => io::Error::from_raw_os_error(n),
            None => io::Error::new(e.kind(), e.to_string()),
        };
        match self {
            Error::Io {
                path,
                op,
                offset,
                err,
            } => Error::io(path.clone(), op, *offset, again(err)),
            Error::Os { op, err } => Error::Os {
                op,
                err: again(err),
            },
            Error::BadInput { path, offset, what } => Error::BadInput {
                path: path.clone(),
                offset: *offset,
                what: what.clone(),
            },
            Error::UringUnavailable(m) => Error::UringUnavailable(m.clone()),
            Error::Unsupported(m) => Error::Unsupported(m.clone()),
            Error::Invalid(m) => Error::Invalid(m.clone()),
            Error::Exhausted {
                resource,
                asked,
                limit,
            } => Error::Exhausted {
                resource,
                asked: *asked,
                limit: *limit,
            },
            Error::OverBudget(m) => Error::OverBudget(m.clone()),
            Error::Cancelled { reason } => Error::Cancelled { reason },
            Error::Internal(m) => Error::Internal(m.clone()),
            Error::Protocol(m) => Error::Protocol(m.clone()),
            Error::Daemon { code, message } => Error::Daemon {
                code: code.clone(),
                message: message.clone(),
            },
        }
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant, with a fixed message, for the tests below.
    fn one_of_each() -> Vec<Error> {
        vec![
            Error::io(
                "/d/a.npy",
                "read",
                Some(4096),
                io::Error::from_raw_os_error(libc::EIO),
            ),
            Error::os("memfd_create", io::Error::from_raw_os_error(libc::EMFILE)),
            Error::BadInput {
                path: "/d/a.npy".into(),
                offset: Some(8),
                what: "not an npy header".into(),
            },
            Error::UringUnavailable("the kernel forbids it".into()),
            Error::Unsupported("device emulation needs root".into()),
            Error::Invalid("the batch size must be at least 1".into()),
            Error::Exhausted {
                resource: "I/O slots",
                asked: 5,
                limit: 4,
            },
            Error::OverBudget("--memory 1 is too small".into()),
            Error::Cancelled {
                reason: "the run was stopped",
            },
            Error::Internal("the lead's thread panicked".into()),
            Error::Protocol("unknown frame kind 99".into()),
            Error::Daemon {
                code: "busy".into(),
                message: "full".into(),
            },
        ]
    }

    #[test]
    fn each_variant_has_its_kind_and_only_os_errors_an_errno() {
        use ErrorKind::*;
        let kinds: Vec<ErrorKind> = one_of_each().iter().map(Error::kind).collect();
        assert_eq!(
            kinds,
            [
                Os,
                Os,
                BadInput,
                Unsupported,
                Unsupported,
                Invalid,
                Exhausted,
                Exhausted,
                Cancelled,
                Internal,
                Protocol,
                Daemon
            ]
        );
        let errnos: Vec<Option<i32>> = one_of_each().iter().map(Error::raw_os_error).collect();
        assert_eq!(errnos[..2], [Some(libc::EIO), Some(libc::EMFILE)]);
        assert!(errnos[2..].iter().all(Option::is_none));
        let stops: Vec<bool> = one_of_each().iter().map(Error::is_cancelled).collect();
        assert_eq!(stops.iter().filter(|&&s| s).count(), 1);
    }

    /// The messages users see: the new variants say what the `Invalid` strings said.
    #[test]
    fn messages_keep_their_words() {
        let words: Vec<String> = one_of_each().iter().map(Error::to_string).collect();
        assert_eq!(
            words[1],
            format!(
                "memfd_create: {}",
                io::Error::from_raw_os_error(libc::EMFILE)
            )
        );
        assert_eq!(words[7], "--memory 1 is too small");
        assert_eq!(words[8], "the run was stopped");
        assert_eq!(words[9], "the lead's thread panicked");
        assert_eq!(words[10], "unknown frame kind 99");
    }

    /// A shared pass hands one failure to every rank: each copy is the same kind, with the
    /// same message and errno.
    #[test]
    fn a_duplicate_is_the_same_error() {
        let custom = Error::io(
            "/d/b",
            "write",
            None,
            io::Error::new(io::ErrorKind::StorageFull, "the pile disk is full"),
        );
        for e in one_of_each().into_iter().chain([custom]) {
            let d = e.duplicate();
            assert_eq!(d.kind(), e.kind());
            assert_eq!(d.to_string(), e.to_string());
            assert_eq!(d.raw_os_error(), e.raw_os_error());
            assert_eq!(d.daemon_code(), e.daemon_code());
        }
    }
}
