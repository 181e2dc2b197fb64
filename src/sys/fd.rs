//! Descriptors named by number: `-o /dev/fd/N` writes through descriptor N
//! of this process, as a shell set it up (`3>file`).
//!
//! Invariant:
//! - FD1 `fcntl(F_DUPFD_CLOEXEC)` on a descriptor number reads and writes
//!   no memory of ours; a number that is not open fails with `EBADF`, so any
//!   number is safe to pass, and the copy returned is a new descriptor that
//!   nothing else owns.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// A copy (close-on-exec, numbered 3 or above) of this process's
/// descriptor `n`, which stays open and untouched.
pub(crate) fn dup_numbered(n: i32) -> io::Result<OwnedFd> {
    // SAFETY: FD1 — the call touches no memory; it fails on a number that
    // is not open.
    let copy = unsafe { libc::fcntl(n, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: FD1 — `copy` is a new descriptor, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_an_open_descriptor_and_refuses_a_closed_one() {
        let copy = dup_numbered(2).expect("stderr is open");
        assert!(rustix::fs::fstat(&copy).is_ok());
        assert!(dup_numbered(1 << 20).is_err());
        assert!(dup_numbered(-1).is_err());
    }
}
