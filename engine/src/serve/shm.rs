//! Shared memory and descriptor passing for `riffle serve`: the only unsafe code of the
//! daemon and its Rust client.
//!
//! The daemon owns a [`Ring`] per stream: a sealed memfd (it cannot shrink or grow, so no
//! client can make the daemon's writes fault) mapped read-write; the client gets a
//! read-only descriptor of the same file and maps it with [`Mapping`]. Which bytes of the
//! ring belong to whom is the protocol's business (`serve::ring`): the daemon writes only
//! slots the client has acknowledged or never received.
#![allow(unsafe_code)]

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::{Error, Result};

fn os(what: &str, e: nix::Error) -> Error {
    Error::Invalid(format!("{what}: {e}"))
}

/// The daemon's side of one stream's shared memory.
pub struct Ring {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; nothing in it is tied to the
// thread that created it.
unsafe impl Send for Ring {}

impl Ring {
    /// A new memfd of `len` bytes (sealed against resizing), mapped read-write.
    pub fn new(name: &str, len: usize) -> Result<Ring> {
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| Error::Invalid("a shared-memory ring needs at least one byte".into()))?;
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(|e| os("memfd_create", e))?;
        nix::unistd::ftruncate(&fd, len as i64).map_err(|e| os("ftruncate of the memfd", e))?;
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(|e| os("sealing the memfd", e))?;
        // SAFETY: a fresh shared mapping of a file of exactly `len` bytes that cannot shrink
        // (sealed), so every byte of it stays backed; no other mapping in this process
        // aliases it, and it is unmapped only in Drop.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                // Populated now: no page faults when batches are written later, and the
                // ring's memory is all accounted for from the start.
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                &fd,
                0,
            )
        }
        .map_err(|e| os("mmap of the memfd", e))?;
        Ok(Ring {
            fd,
            ptr: ptr.cast(),
            len,
        })
    }

    /// Its size.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: [`Ring::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` to byte `at`. Panics if that runs past the end.
    pub fn write(&mut self, at: usize, src: &[u8]) {
        assert!(
            at.checked_add(src.len()).is_some_and(|end| end <= self.len),
            "ring write of {} bytes at {at} past its end ({})",
            src.len(),
            self.len
        );
        // SAFETY: the range is inside the mapping (checked above); `src` is ordinary memory
        // of this process and cannot overlap the mapping, which no Rust reference points
        // into. The client maps the file read-only, so the only writer is this call.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(at), src.len())
        };
    }

    /// Writes `vals` little-endian at byte `at`.
    pub fn write_u64s(&mut self, at: usize, vals: &[u64]) {
        if cfg!(target_endian = "little") {
            // The in-memory form of a u64 slice on a little-endian machine is the wire form.
            let n = std::mem::size_of_val(vals);
            // SAFETY: any u64 slice is readable as its bytes (u8 has no alignment or
            // validity requirement); the view lives only for this call.
            let raw = unsafe { std::slice::from_raw_parts(vals.as_ptr().cast::<u8>(), n) };
            self.write(at, raw);
        } else {
            let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.write(at, &bytes);
        }
    }

    /// A descriptor for the client: read-only when `/proc/self/fd` allows reopening the
    /// memfd so, else the read-write one.
    pub fn client_fd(&self) -> Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        match std::fs::File::open(path) {
            Ok(f) => Ok(f.into()),
            Err(_) => self
                .fd
                .try_clone()
                .map_err(|e| Error::Invalid(format!("cannot duplicate the memfd: {e}"))),
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in `new` with this length and is unmapped only here;
        // no reference into it outlives `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// A client's read-only view of a stream's ring.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a read-only mapping owned by this value.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` read-only.
    pub fn new(fd: &OwnedFd, len: usize) -> Result<Mapping> {
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| Error::Invalid("the daemon announced an empty ring".into()))?;
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| os("fstat of the memfd", e))?;
        if (st.st_size as u64) < len as u64 {
            return Err(Error::Invalid(format!(
                "the ring's memfd holds {} bytes, not the {len} announced",
                st.st_size
            )));
        }
        // SAFETY: a fresh read-only shared mapping of `len` bytes of a file at least that
        // long (checked above; the daemon seals it against shrinking). It is unmapped only
        // in Drop.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                fd,
                0,
            )
        }
        .map_err(|e| os("mmap of the ring", e))?;
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Bytes `at..at + len`, or `None` past the end.
    ///
    /// The daemon does not write a slot between announcing it and receiving its ack, and the
    /// client's borrow of a batch ends before it acks, so the bytes are stable while seen.
    pub fn bytes(&self, at: u64, len: u64) -> Option<&[u8]> {
        let end = at.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: the range is inside the mapping, which lives as long as `self`; the
        // protocol keeps the daemon from writing it while the borrow lasts (see above).
        Some(unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(at as usize), len as usize)
        })
    }

    /// `n` little-endian u64 at byte `at` (8-aligned: the daemon aligns every array).
    pub fn u64s(&self, at: u64, n: u64) -> Option<&[u64]> {
        let bytes = self.bytes(at, n.checked_mul(8)?)?;
        if !cfg!(target_endian = "little") || !(bytes.as_ptr() as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: the bytes are in the mapping (checked by `bytes`), 8-aligned (checked
        // above) and any bit pattern is a valid u64; little-endian is the wire order.
        Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<u64>(), n as usize) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; borrows of it cannot outlive `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// Writes all of `bytes` to `sock`, with `fd` attached to the first byte (SCM_RIGHTS).
pub fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: &OwnedFd) -> std::io::Result<()> {
    use std::io::Write;
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(bytes)];
    let n = loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => break n,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    // The descriptor went with the first byte; the rest (if the socket took only part)
    // follows as plain data.
    let mut s = sock;
    s.write_all(&bytes[n..])
}

/// Reads what is there (blocking until something is) into `buf`, collecting descriptors
/// that came with it. Returns the bytes read (0 at end of stream).
pub fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    let mut space = nix::cmsg_space!([RawFd; 4]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let n = msg.bytes;
                for c in msg.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        for r in raw {
                            // SAFETY: the kernel just installed `r` in this process for
                            // this message (SCM_RIGHTS); nothing else owns it.
                            fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                        }
                    }
                }
                return Ok(n);
            }
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_seen_through_a_passed_read_only_descriptor() {
        let mut ring = Ring::new("riffle-test", 1 << 16).unwrap();
        ring.write(100, b"hello");
        ring.write_u64s(128, &[1, 2, u64::MAX]);
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fd(&a, b"x", &ring.client_fd().unwrap()).unwrap();
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut buf, &mut fds).unwrap(), 1);
        assert_eq!(fds.len(), 1);
        let m = Mapping::new(&fds[0], 1 << 16).unwrap();
        assert_eq!(m.bytes(100, 5).unwrap(), b"hello");
        assert_eq!(m.u64s(128, 3).unwrap(), &[1, 2, u64::MAX]);
        assert!(m.bytes(1 << 16, 1).is_none());
        assert!(m.u64s(129, 1).is_none(), "misaligned arrays are refused");
        // The daemon's later writes show through the client's mapping.
        ring.write(100, b"HELLO");
        assert_eq!(m.bytes(100, 5).unwrap(), b"HELLO");
        // The sealed memfd cannot be shrunk by whoever holds it.
        assert!(nix::unistd::ftruncate(&ring.fd, 0).is_err());
    }
}
