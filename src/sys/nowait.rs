//! Writing to a stream someone else handed over, without ever waiting and
//! without changing how its other holders see it: `pwritev2(fd, iov, -1,
//! RWF_NOWAIT)` fails with `EAGAIN` where a write would block, on a pipe, a
//! FIFO or a socket, while the description's own flags (`O_NONBLOCK`,
//! shared with the client that passed it) stay as they are. rustix takes
//! no offset of -1 (the current position), so this calls libc.
//!
//! Invariants:
//! - NW1 The iovec array handed to the kernel is `bufs` itself: `IoSlice`
//!   is ABI-compatible with `struct iovec` (std guarantees it), and each
//!   slice points at memory valid for the call (V1 of `iov`); the kernel
//!   only reads it, and only during the call.
//! - NW2 `fd` is a descriptor the caller holds open for the call (a
//!   `BorrowedFd`).

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::io::Errno;

/// One `pwritev2(fd, bufs, -1, RWF_NOWAIT)`: the bytes written, `EAGAIN`
/// when the reader has no room now, `EOPNOTSUPP` where the file cannot be
/// written that way.
pub(crate) fn write_nowait(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
    let count = libc::c_int::try_from(bufs.len()).map_err(|_| Errno::INVAL)?;
    // SAFETY: NW1 — `bufs` is a valid iovec array of `count` entries for
    // the call; NW2 — `fd` is open for its duration.
    let n = unsafe {
        libc::pwritev2(
            fd.as_raw_fd(),
            bufs.as_ptr().cast::<libc::iovec>(),
            count,
            -1,
            libc::RWF_NOWAIT,
        )
    };
    if n < 0 {
        return Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ));
    }
    usize::try_from(n).map_err(|_| Errno::INVAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_full_pipe_says_again_and_its_flags_stay() {
        let (_r, w) = rustix::pipe::pipe().expect("pipe");
        let chunk = [0u8; 4096];
        let mut total = 0;
        loop {
            match write_nowait(w.as_fd(), &[IoSlice::new(&chunk)]) {
                Ok(n) => total += n,
                Err(e) => {
                    assert_eq!(e, Errno::AGAIN);
                    break;
                }
            }
            assert!(total <= 1 << 20, "a pipe never said it was full");
        }
        assert!(total >= 4096);
        let flags = rustix::fs::fcntl_getfl(&w).expect("flags");
        assert!(!flags.contains(rustix::fs::OFlags::NONBLOCK));
    }
}
