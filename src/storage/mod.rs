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
//! - A write reports how far it got while it runs ([`WriteProgress`], through
//!   the sink's [`WriteList`]), so that a write pass unpins the ring regions
//!   already in the file while the rest is in flight.
//!
//! Invariant (the write pass's unpinning relies on it, ringbuf M4):
//! - **P1** Once [`WriteProgress::written`] has returned a floor, nothing
//!   reads the call's buffers below it again, not even to cut the file at a
//!   packet boundary after a failure (packets are walked from the floor,
//!   which is one), and only bytes whose requests completed are reported.
//!
//! P1 lives in [`WriteList`], not in each sink: a sink sees the caller's
//! buffers only through the list, whose views are borrows of it that start
//! at its cursor and end before the next report (reporting needs the list
//! exclusively), and whose failure walk starts at the floor. A safe sink
//! cannot break P1 however it is written. The one sink that keeps the
//! caller's memory past a report is the io_uring sink, as raw iovecs in
//! flight, under its own `unsafe` and invariant (U1): it reports only the
//! prefix below its lowest request in flight.

/// The [`FileSink`] methods of a sink writing a file at an offset of its
/// own, from its fields `fd`, `offset`, `poisoned`, `direct` and
/// `direct_capable`: the io_uring and `pwritev` sinks answer them alike
/// (each names `sync_or_poison` in its module).
macro_rules! positioned_file_methods {
    () => {
        fn file(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            Some(std::os::fd::AsFd::as_fd(&self.fd))
        }

        fn sync_data(&mut self) -> Result<(), SinkError> {
            sync_or_poison(&self.fd, &mut self.poisoned)
        }

        fn bytes_written(&self) -> u64 {
            self.offset
        }

        fn direct_alignment(&self) -> Option<usize> {
            self.direct
        }

        fn end_direct(&mut self) -> Result<(), SinkError> {
            super::clear_direct(&self.fd, &mut self.direct)
        }

        fn direct_capability(&self) -> Option<usize> {
            self.direct_capable
        }

        fn resume_direct(&mut self) -> Result<(), SinkError> {
            super::set_direct(&self.fd, &mut self.direct, self.direct_capable)
        }
    };
}

mod backlog_sink;
mod batch;
pub(crate) mod create;
mod cut;
pub mod direct;
mod output;
pub mod packets;
mod pwritev_sink;
mod stream_sink;
#[cfg(test)]
mod test_records;
mod uring_sink;

use std::io::IoSlice;

pub use backlog_sink::{BacklogError, BacklogSink};
pub use batch::IOV_MAX;
pub use cut::{Cut, cut_at_packet_boundary};
pub use output::{
    IoChoice, OpenOptions, OutputPath, io_uring_available, open_in, open_numbered, open_output,
    sink_for_fd,
};
pub use pwritev_sink::PwritevSink;
pub use stream_sink::StreamSink;
pub use uring_sink::{UringSink, UringUnavailable};

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
    /// Its name in the trace and the summary.
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
        /// What the kernel returned.
        errno: rustix::io::Errno,
        /// File offset the write was at.
        offset: u64,
    },
    /// A write returned 0 bytes with data left: it cannot continue.
    #[error("write at file offset {offset} made no progress")]
    NoProgress {
        /// File offset the write was at.
        offset: u64,
    },
    /// `fdatasync` failed.
    #[error("fdatasync failed: {0}")]
    Sync(rustix::io::Errno),
    /// The io_uring ring itself failed (submission or completion wait).
    #[error("io_uring failed: {0}")]
    Ring(rustix::io::Errno),
    /// A stream's reader took too little: `held` bytes would have waited
    /// for it, past the sink's bound ([`BacklogSink`]).
    #[error(
        "the reader of the output took too little: {held} bytes would wait for it (at offset {offset})"
    )]
    Blocked {
        /// Bytes that would have waited for the reader.
        held: u64,
        /// File offset the write was at.
        offset: u64,
    },
}

impl SinkError {
    /// The errno behind the error, if there is one (`ENOSPC` is 28).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SinkError::Write { errno, .. } | SinkError::Sync(errno) | SinkError::Ring(errno) => {
                Some(errno.raw_os_error())
            }
            SinkError::NoProgress { .. } | SinkError::Blocked { .. } => None,
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
    /// The output exists and no-clobber forbids replacing it.
    #[error("{path}: already exists (no-clobber)")]
    Exists {
        /// The output named.
        path: std::path::PathBuf,
    },
    /// The output, or its directory, could not be opened or created.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The path it failed on.
        path: std::path::PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// Standard output cannot carry the trace: its descriptor could not be
    /// copied or inspected, or it is a directory.
    #[error("cannot use stdout for the trace: {0}")]
    Stdout(#[source] std::io::Error),
    /// io_uring was asked for explicitly and the system does not offer it,
    /// or it could not be set up with no way back to `pwritev`.
    #[error("io_uring was requested but is unavailable: {0}")]
    IoUringUnavailable(#[source] uring_sink::UringUnavailable),
    /// Creating the output was refused: an unsafe directory, a name that
    /// is not a plain file name, or the privileged broker's refusal.
    #[error(transparent)]
    Create(create::CreateError),
}

impl From<create::CreateError> for StorageError {
    fn from(e: create::CreateError) -> Self {
        match e {
            create::CreateError::Exists { path } => StorageError::Exists { path },
            create::CreateError::OpenDir { path, source }
            | create::CreateError::Create { path, source } => StorageError::Open { path, source },
            e => StorageError::Create(e),
        }
    }
}

/// Told how far a write has got while it runs, so that its caller can let
/// go of memory already in the file (a write pass unpins ring regions).
pub trait WriteProgress {
    /// The first `done` bytes of the call's buffers are in the file (the
    /// requests holding them completed). Returns the floor: a packet
    /// boundary at or below `done` under which the caller may have let go of
    /// the memory; nothing reads the buffers below it again (P1, kept by
    /// the sink's [`WriteList`], which is what calls this). Called with
    /// `done` growing, never twice with the same value.
    fn written(&mut self, done: u64) -> u64;
    /// The write is waiting on the file (its requests in flight, or between
    /// two of its syscalls): the caller's chance to do its other due work,
    /// such as draining the kernel's trace buffers, so that a slow disk does
    /// not stall it. What the write holds stays pinned meanwhile.
    fn idle(&mut self) {}
}

/// Progress nobody listens to: the caller keeps all of its memory.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoProgress;

impl WriteProgress for NoProgress {
    fn written(&mut self, _done: u64) -> u64 {
        0
    }
}

/// One write's bytes as its sink sees them: the caller's list, read only
/// through borrows of this value that start at its cursor, and progress
/// told through `&mut self`. No view a sink takes can outlive a report
/// ([`written`](Self::written) needs the list exclusively), and none starts
/// below the floor a report returned, so every sink keeps P1 by
/// construction, whatever it does; the only code that holds the caller's
/// memory past a report is a sink's own `unsafe` (the io_uring sink's
/// iovecs in flight, which it reports only once they complete, its U1).
///
/// A view held across a report does not compile:
///
/// ```compile_fail,E0499
/// # use std::io::IoSlice;
/// # use recorder::storage::{NoProgress, WriteList};
/// let data = [0x0Au8, 0];
/// let bufs = [IoSlice::new(&data)];
/// let mut progress = NoProgress;
/// let mut list = WriteList::new(&bufs, &mut progress);
/// let view = list.peek(1, 2);
/// list.written(0);
/// assert_eq!(view.len(), 1);
/// ```
pub struct WriteList<'l, 'a> {
    bufs: &'l [IoSlice<'a>],
    cursor: batch::Cursor<'l, 'a>,
    len: u64,
    /// Bytes handed out (the cursor's position).
    pos: u64,
    /// What `progress` was told last.
    reported: u64,
    /// The floor `progress` returned: nothing below it is read again.
    floor: u64,
    progress: &'l mut dyn WriteProgress,
    /// The last [`peek`](Self::peek)'s iovecs, emptied at every report.
    scratch: Vec<IoSlice<'a>>,
}

impl std::fmt::Debug for WriteList<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteList")
            .field("len", &self.len)
            .field("pos", &self.pos)
            .field("reported", &self.reported)
            .field("floor", &self.floor)
            .finish_non_exhaustive()
    }
}

impl<'l, 'a> WriteList<'l, 'a> {
    /// `bufs`, telling `progress` how far the write got.
    pub fn new(bufs: &'l [IoSlice<'a>], progress: &'l mut dyn WriteProgress) -> Self {
        WriteList {
            bufs,
            cursor: batch::Cursor::new(bufs),
            len: batch::total_len(bufs),
            pos: 0,
            reported: 0,
            floor: 0,
            progress,
            scratch: Vec::new(),
        }
    }

    /// Bytes in the list.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes handed out so far ([`advance`](Self::advance)).
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Every byte has been handed out.
    pub(crate) fn is_done(&self) -> bool {
        self.cursor.is_done()
    }

    /// The next batch at the cursor, at most `max_iov` iovecs and
    /// `max_bytes` bytes, without handing it out; empty once
    /// [`is_done`](Self::is_done). Borrowed from the list, so it ends
    /// before the next report.
    pub fn peek(&mut self, max_iov: usize, max_bytes: usize) -> &[IoSlice<'_>] {
        self.cursor
            .peek_batch(max_iov, max_bytes, &mut self.scratch);
        &self.scratch
    }

    /// The sink waits on the file: see [`WriteProgress::idle`].
    pub fn idle(&mut self) {
        self.progress.idle();
    }

    /// The next `n` bytes at the cursor are on their way to the file
    /// (written, or in a request the kernel holds).
    pub fn advance(&mut self, n: usize) {
        let n = (n as u64).min(self.len - self.pos);
        self.cursor.advance(n as usize);
        self.pos += n;
    }

    /// The first `done` bytes are in the file (their requests completed;
    /// at most what was handed out): tells the caller, once per new
    /// `done`, and returns the floor, a packet boundary at or below `done`
    /// under which the caller may have let go of its memory and below
    /// which nothing is read again (P1).
    pub fn written(&mut self, done: u64) -> u64 {
        self.scratch.clear();
        let done = done.min(self.pos);
        if done > self.reported {
            self.reported = done;
            let floor = self.progress.written(done).min(done);
            self.floor = self.floor.max(floor);
        }
        self.floor
    }

    /// Where the caller may have let go of memory (see
    /// [`written`](Self::written)); 0 until it has.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The bytes from the cursor on, in order (e.g. to hash them before
    /// they are written).
    pub fn rest(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut out = Vec::new();
        self.cursor.peek_batch(usize::MAX, usize::MAX, &mut out);
        out.into_iter().map(|s| crate::sys::iov::io_slice_bytes(&s))
    }

    /// Bytes of the whole `0x0A <len> <packet>` records at the start of
    /// the list that end within its first `n` bytes (`n` at most what was
    /// handed out), walked from the floor, a packet boundary: what a failed
    /// write keeps. Nothing below the floor is read (P1).
    pub(crate) fn whole_packets_within(&self, n: u64) -> u64 {
        let n = n.min(self.pos);
        if n <= self.floor {
            return n;
        }
        let mut from = batch::Cursor::new(self.bufs);
        from.advance(self.floor as usize);
        let mut rest = Vec::new();
        from.peek_batch(usize::MAX, usize::MAX, &mut rest);
        let within = n - self.floor;
        let (_, cut) = cut_at_packet_boundary(&rest, within.saturating_add(1));
        self.floor + cut.kept_bytes.min(within)
    }
}

/// Bytes a positioned sink hands the kernel per request (an io_uring SQE, a
/// pwritev(2) call) at most: the step in which a pass's memory is let go of
/// as it is written ([`WriteProgress`]), and what a short write resubmits.
pub(crate) const WRITE_STEP_BYTES: usize = 4 << 20;

/// Where trace bytes go. Implementations never copy the data: the kernel
/// reads the caller's memory (the ring buffer's mmap) directly.
pub trait FileSink: Send {
    /// Which implementation this is.
    fn kind(&self) -> SinkKind;
    /// Appends all of `bufs`, in order, at the end of what was written so far;
    /// returns when every byte is on its way to the file (completions
    /// reaped), with the bytes this call wrote.
    /// On the first error (ENOSPC, EIO, a short write that cannot continue)
    /// the sink is poisoned: this and every later call return the error, and
    /// nothing is retried.
    fn write_all(&mut self, bufs: &[IoSlice<'_>]) -> Result<u64, SinkError> {
        self.write_list(&mut WriteList::new(bufs, &mut NoProgress))
    }
    /// [`write_all`](Self::write_all), telling `progress` how much of `bufs`
    /// is in the file as requests complete (P1: through a [`WriteList`],
    /// which never shows the sink a byte below the floor `progress`
    /// returns).
    fn write_all_reporting(
        &mut self,
        bufs: &[IoSlice<'_>],
        progress: &mut dyn WriteProgress,
    ) -> Result<u64, SinkError> {
        self.write_list(&mut WriteList::new(bufs, progress))
    }
    /// Appends all of `list` (see [`write_all`](Self::write_all)), telling
    /// it how far the write got as requests complete
    /// ([`WriteList::written`]).
    fn write_list(&mut self, list: &mut WriteList<'_, '_>) -> Result<u64, SinkError>;
    /// `fdatasync` (a no-op for a pipe). Fails with the poison error too.
    fn sync_data(&mut self) -> Result<(), SinkError>;
    /// Bytes in the file as far as the sink knows (after a failure, what the
    /// file holds).
    fn bytes_written(&self) -> u64;
    /// A stream sink holding bytes its reader has not taken yet
    /// ([`BacklogSink`]): the descriptor to wait on for room.
    fn pending_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Writes out what the sink holds as far as its reader takes it;
    /// returns the bytes still held.
    fn drain_pending(&mut self) -> Result<u64, SinkError> {
        Ok(0)
    }
    /// The file takes only `O_DIRECT` writes of whole blocks of this many
    /// bytes: the caller lays its passes out with [`direct::AlignedPass`].
    fn direct_alignment(&self) -> Option<usize> {
        None
    }
    /// Writes from now on go through the page cache (`O_DIRECT` off): for
    /// a session's last, unaligned bytes, or passes too small to fill
    /// blocks. A no-op where it was never on.
    fn end_direct(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    /// The block size of a file that took `O_DIRECT` when it was opened,
    /// whether or not it is on now ([`end_direct`](Self::end_direct) turns
    /// it off, [`resume_direct`](Self::resume_direct) back on).
    fn direct_capability(&self) -> Option<usize> {
        None
    }
    /// Turns `O_DIRECT` back on after [`end_direct`](Self::end_direct); the
    /// caller has brought the file to a block boundary. A no-op where the
    /// file never took it.
    fn resume_direct(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    /// The regular file written at offsets, for a process that is to finish
    /// it if this one dies (`privilege::rescue`); `None` for a stream.
    fn file(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// Turns `O_DIRECT` back on for `fd` when it took it (`capable`): the
/// positioned sinks' `resume_direct`.
pub(crate) fn set_direct(
    fd: &std::os::fd::OwnedFd,
    direct: &mut Option<usize>,
    capable: Option<usize>,
) -> Result<(), SinkError> {
    if direct.is_none() && capable.is_some() {
        direct_flag(fd, true)?;
        *direct = capable;
    }
    Ok(())
}

/// Turns `O_DIRECT` off on `fd` (the positioned sinks' `end_direct`).
pub(crate) fn clear_direct(
    fd: &std::os::fd::OwnedFd,
    direct: &mut Option<usize>,
) -> Result<(), SinkError> {
    if direct.is_some() {
        direct_flag(fd, false)?;
        *direct = None;
    }
    Ok(())
}

/// Sets or clears `O_DIRECT` in `fd`'s status flags.
fn direct_flag(fd: &std::os::fd::OwnedFd, on: bool) -> Result<(), SinkError> {
    use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
    let flags = fcntl_getfl(fd).map_err(|errno| SinkError::Write { errno, offset: 0 })?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    fcntl_setfl(fd, flags).map_err(|errno| SinkError::Write { errno, offset: 0 })
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

    /// Lets go of everything up to 12 bytes once told of them, and keeps
    /// what it was told.
    struct LetGo(Vec<u64>);

    impl WriteProgress for LetGo {
        fn written(&mut self, done: u64) -> u64 {
            self.0.push(done);
            if done >= 12 { 12 } else { 0 }
        }
    }

    /// The list reports only what was handed out, and after a report shows
    /// nothing below the floor: the failure walk starts there (the 12 bytes
    /// below it are not records at all, so a walk from 0 would keep none).
    #[test]
    fn a_write_list_reads_nothing_below_the_floor() {
        let below = [0xFFu8; 12];
        let (a, b) = (
            crate::wire::framing::record(&[1u8; 20]),
            crate::wire::framing::record(&[2u8; 30]),
        );
        let bufs = [IoSlice::new(&below), IoSlice::new(&a), IoSlice::new(&b)];
        let mut progress = LetGo(Vec::new());
        let mut list = WriteList::new(&bufs, &mut progress);
        assert_eq!(list.len(), 66);
        // Nothing handed out yet: nothing to report.
        assert_eq!(list.written(30), 0);
        let step: usize = list.peek(8, 20).iter().map(|s| s.len()).sum();
        assert_eq!(step, 20);
        list.advance(step);
        assert_eq!(list.written(30), 12, "capped at the 20 bytes handed out");
        assert_eq!(list.floor(), 12);
        list.advance(20);
        // 40 bytes in place: the record from 12 to 34 is whole, the next
        // one is not.
        assert_eq!(list.whole_packets_within(40), 34);
        assert_eq!(list.rest().map(<[u8]>::len).sum::<usize>(), 26);
        // At most what was handed out is in place.
        assert_eq!(list.whole_packets_within(66), 34);
        list.advance(26);
        assert!(list.is_done());
        assert_eq!(list.whole_packets_within(66), 66);
        drop(list);
        assert_eq!(progress.0, vec![20]);
    }
}
pub(crate) mod compress;
pub(crate) mod segment;
pub mod write_pass;

/// Why the output failed: a write pass (a write, a sync, compression), or
/// closing and opening segments. Cheap to clone, so the session can carry it
/// as its stop reason.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum OutputError {
    #[error(transparent)]
    Pass(#[from] write_pass::PassError),
    #[error(transparent)]
    Segment(std::sync::Arc<segment::SegmentError>),
    /// The output failed outside a pass: a stream writing out what its
    /// reader had not taken ([`BacklogSink`]), or the last fdatasync.
    #[error(transparent)]
    Sink(#[from] SinkError),
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
            (OutputError::Sink(a), OutputError::Sink(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for OutputError {}
