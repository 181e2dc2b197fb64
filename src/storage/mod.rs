//! The output path: file sinks (io_uring, `pwritev`, a stream) that move the
//! ring buffer's bytes to the trace file without copying them.
//!
//! ```text
//!  ring mmap ── &[IoSlice] ──► FileSink::write_all ──► kernel ──► trace file
//!                  (iovecs point into the mmap; batches ≤ IOV_MAX)
//! ```
//!
//! - [`open_output`] opens the file (`O_CREAT|O_TRUNC`, or `O_EXCL` with
//!   no-clobber, mode 0600) and picks the sink: io_uring when a real ring
//!   setup and a NOP succeed, else `pwritev` (logged), or a [`SinkKind::Stream`]
//!   sink with plain `writev` for stdout.
//! - Positioned sinks keep the file offset themselves and append at it.
//! - The first failed write poisons a sink: that call and every later one
//!   return the same [`SinkError`]; nothing is retried. A failed call leaves
//!   a regular file cut after the last whole packet of that call that made
//!   it (best effort, then synced): a full disk keeps every packet that fit,
//!   and the file stays a valid trace.
//! - A FIFO, a character device or a socket named by `-o` is written as a
//!   stream (no offsets, no fdatasync), like stdout.
//! - [`cut_at_packet_boundary`] trims a write to the last whole packet under
//!   a byte cap (`max_file_size_bytes`).
//! - A write reports how far it got while it runs ([`WriteProgress`]), so
//!   that a write pass unpins the ring regions already in the file while
//!   the rest is in flight.
//!
//! Invariant (the write pass's unpinning relies on it, ringbuf M4):
//! - **P1** A sink that was told a floor by [`WriteProgress::written`] never
//!   reads the call's buffers below it again, not even to cut the file at a
//!   packet boundary after a failure (it walks packets from the floor, which
//!   is one). Every sink in this module honours it.

mod batch;
mod cut;
pub mod direct;
mod output;
mod pwritev_sink;
mod stream_sink;
#[cfg(test)]
mod test_records;
mod uring_sink;

use std::io::IoSlice;

pub use batch::IOV_MAX;
pub use cut::{Cut, cut_at_packet_boundary};
pub use output::{IoChoice, OpenOptions, OutputPath, io_uring_available, open_output};
pub use pwritev_sink::PwritevSink;
pub use stream_sink::StreamSink;
pub use uring_sink::UringSink;

/// Which implementation a sink uses (reported in the trace and the summary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum SinkKind {
    /// io_uring WRITEV at explicit offsets.
    IoUring,
    /// `pwritev(2)` at explicit offsets.
    Pwritev,
    /// `writev(2)` on a stream (stdout: a pipe or a file), no positioned writes.
    Stream,
}

impl SinkKind {
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::IoUring => "io_uring",
            SinkKind::Pwritev => "pwritev",
            SinkKind::Stream => "stream",
        }
    }
}

impl std::fmt::Display for SinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed sink operation. `Copy`, so a poisoned sink can hand it out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The kernel refused a write (ENOSPC, EIO, EPIPE, ...).
    #[error("write at file offset {offset} failed: {errno}")]
    Write {
        errno: rustix::io::Errno,
        offset: u64,
    },
    /// A write returned 0 bytes with data left: it cannot continue.
    #[error("write at file offset {offset} made no progress")]
    NoProgress { offset: u64 },
    /// `fdatasync` failed.
    #[error("fdatasync failed: {0}")]
    Sync(rustix::io::Errno),
    /// The io_uring ring itself failed (submission or completion wait).
    #[error("io_uring failed: {0}")]
    Ring(rustix::io::Errno),
}

impl SinkError {
    /// The errno behind the error, if there is one (`ENOSPC` is 28).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SinkError::Write { errno, .. } | SinkError::Sync(errno) | SinkError::Ring(errno) => {
                Some(errno.raw_os_error())
            }
            SinkError::NoProgress { .. } => None,
        }
    }

    /// True for a full disk (ENOSPC, or EDQUOT / EFBIG which mean the same to a user).
    pub fn is_disk_full(&self) -> bool {
        matches!(
            self.raw_os_error(),
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG)
        )
    }
}

/// Opening the output failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{path}: already exists (no-clobber)")]
    Exists { path: std::path::PathBuf },
    #[error("cannot open {path}: {source}")]
    Open {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use stdout for the trace: {0}")]
    Stdout(#[source] std::io::Error),
    #[error("io_uring was requested but is unavailable: {0}")]
    IoUringUnavailable(String),
}

/// Told how far a write has got while it runs, so that its caller can let
/// go of memory already in the file (a write pass unpins ring regions).
pub trait WriteProgress {
    /// The first `done` bytes of the call's buffers are in the file (the
    /// requests holding them completed). Returns the floor: a packet
    /// boundary at or below `done` under which the caller may have let go of
    /// the memory; the sink never reads the buffers below it again (P1).
    /// Called with `done` growing, never twice with the same value.
    fn written(&mut self, done: u64) -> u64;
}

/// Progress nobody listens to: the caller keeps all of its memory.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl WriteProgress for NoProgress {
    fn written(&mut self, _done: u64) -> u64 {
        0
    }
}

/// Bytes a positioned sink hands the kernel per request (an io_uring SQE, a
/// pwritev(2) call) at most: the step in which a pass's memory is let go of
/// as it is written ([`WriteProgress`]), and what a short write resubmits.
pub const WRITE_STEP_BYTES: usize = 4 << 20;

/// Where trace bytes go. Implementations never copy the data: the kernel
/// reads the caller's memory (the ring buffer's mmap) directly.
pub trait FileSink: Send {
    fn kind(&self) -> SinkKind;
    /// Appends all of `bufs`, in order, at the end of what was written so far;
    /// returns when every byte is on its way to the file (completions
    /// reaped), with the bytes this call wrote.
    /// On the first error (ENOSPC, EIO, a short write that cannot continue)
    /// the sink is poisoned: this and every later call return the error, and
    /// nothing is retried.
    fn write_all(&mut self, bufs: &[IoSlice<'_>]) -> Result<u64, SinkError> {
        self.write_all_reporting(bufs, &mut NoProgress)
    }
    /// [`write_all`](Self::write_all), telling `progress` how much of `bufs`
    /// is in the file as requests complete, and honouring the floor it
    /// returns (P1).
    fn write_all_reporting(
        &mut self,
        bufs: &[IoSlice<'_>],
        progress: &mut dyn WriteProgress,
    ) -> Result<u64, SinkError>;
    /// `fdatasync` (a no-op for a pipe). Fails with the poison error too.
    fn sync_data(&mut self) -> Result<(), SinkError>;
    /// Bytes in the file as far as the sink knows (after a failure, what the
    /// file holds).
    fn bytes_written(&self) -> u64;
    /// The file takes only `O_DIRECT` writes of whole blocks of this many
    /// bytes: the caller lays its passes out with [`direct::AlignedPass`].
    fn direct_alignment(&self) -> Option<usize> {
        None
    }
    /// Writes from now on go through the page cache (`O_DIRECT` off): for
    /// a session's last, unaligned bytes. A no-op where it was never on.
    fn end_direct(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Turns `O_DIRECT` off on `fd` (the positioned sinks' `end_direct`).
pub(crate) fn clear_direct(
    fd: &std::os::fd::OwnedFd,
    direct: &mut Option<usize>,
) -> Result<(), SinkError> {
    if direct.is_some() {
        let flags =
            rustix::fs::fcntl_getfl(fd).map_err(|errno| SinkError::Write { errno, offset: 0 })?;
        rustix::fs::fcntl_setfl(fd, flags - rustix::fs::OFlags::DIRECT)
            .map_err(|errno| SinkError::Write { errno, offset: 0 })?;
        *direct = None;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_full_is_recognised() {
        let e = SinkError::Write {
            errno: rustix::io::Errno::NOSPC,
            offset: 3,
        };
        assert!(e.is_disk_full());
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert!(!SinkError::Sync(rustix::io::Errno::IO).is_disk_full());
        assert!(e.to_string().contains("offset 3"));
    }
}
pub mod compress;
pub mod segment;
pub mod write_pass;

/// Why the output failed: a write pass (a write, a sync, compression), or
/// closing and opening segments. Cheap to clone, so the session can carry it
/// as its stop reason.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OutputError {
    #[error(transparent)]
    Pass(#[from] write_pass::PassError),
    #[error(transparent)]
    Segment(std::sync::Arc<segment::SegmentError>),
}

impl From<segment::SegmentError> for OutputError {
    fn from(e: segment::SegmentError) -> Self {
        OutputError::Segment(std::sync::Arc::new(e))
    }
}

impl PartialEq for OutputError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (OutputError::Pass(a), OutputError::Pass(b)) => a == b,
            (OutputError::Segment(a), OutputError::Segment(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for OutputError {}
