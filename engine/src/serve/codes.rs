//! Which `ERROR` code the daemon answers an engine error with: a function of the error's
//! kind alone, so a client can act on the code (fix its request, ask for less, reconnect)
//! without reading the message. docs/protocol.md lists the codes.

use crate::{Error, ErrorKind};

/// The reply code for `e`, an error of the engine met while opening or running a stream:
///
/// - a bad argument ([`ErrorKind::Invalid`]): `bad_request`, the client's to fix;
/// - a budget or resource too small for what was asked ([`ErrorKind::Exhausted`]):
///   `exhausted`, the request does not fit this daemon (unlike `busy`, waiting does not
///   help);
/// - a run stopped under the stream ([`ErrorKind::Cancelled`]: the daemon is stopping):
///   `shutdown`;
/// - anything else (an OS error, a bad dataset file, a failure of the engine): `engine`,
///   the message naming the file and offset when there are some.
pub(crate) fn reply_code(e: &Error) -> &'static str {
    match e.kind() {
        ErrorKind::Invalid => "bad_request",
        ErrorKind::Exhausted => "exhausted",
        ErrorKind::Cancelled => "shutdown",
        _ => "engine",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::ReadOptions;
    use crate::order::{Split, Tail};

    /// Every kind of error the engine makes has its code; the errors come from real
    /// triggers where that is cheap.
    #[test]
    fn each_kind_of_engine_error_gets_its_own_code() {
        // A rank outside its world: a bad argument.
        let bad = Split::new(100, 10, 4, 4, Tail::Partial).unwrap_err();
        assert_eq!(bad.kind(), ErrorKind::Invalid, "{bad}");
        assert_eq!(reply_code(&bad), "bad_request");
        // More I/O slots than a backend takes: a resource refused.
        let cfg = crate::io::IoConfig {
            depth: 1 << 40,
            ..crate::io::IoConfig::default()
        };
        let slots = crate::io::open_backend(&cfg, 4096).err().expect("refused");
        assert!(matches!(slots, Error::Exhausted { .. }), "{slots}");
        assert_eq!(reply_code(&slots), "exhausted");
        assert_eq!(
            reply_code(&Error::OverBudget("--memory 1 is too small".into())),
            "exhausted"
        );
        assert_eq!(
            reply_code(&Error::Cancelled {
                reason: "the run was stopped"
            }),
            "shutdown"
        );
        let os = Error::os(
            "memfd_create",
            std::io::Error::from_raw_os_error(libc::EMFILE),
        );
        assert_eq!(reply_code(&os), "engine");
        let io = Error::io(
            "/data/a.npy",
            "read",
            Some(4096),
            std::io::Error::from_raw_os_error(libc::EIO),
        );
        assert_eq!(reply_code(&io), "engine");
        let input = Error::BadInput {
            path: "/data/a.npy".into(),
            offset: Some(10),
            what: "not an npy header".into(),
        };
        assert_eq!(reply_code(&input), "engine");
        assert_eq!(
            reply_code(&Error::Internal("a thread panicked".into())),
            "engine"
        );
        // Options checked against a dataset: an epoch range that wraps is a bad request.
        let opts = ReadOptions {
            first_epoch: u64::MAX,
            epochs: 2,
            ..ReadOptions::new(10)
        };
        let wraps = opts.check(100).unwrap_err();
        assert_eq!(reply_code(&wraps), "bad_request", "{wraps}");
    }
}
