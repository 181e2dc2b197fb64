//! The io_uring sink: WRITEV at explicit offsets (the sink's own counter),
//! a few requests in flight, no SQPOLL (it would spin a core). Passes of at
//! most [`SMALL_WRITE_BYTES`] skip the ring for one pwritev(2) at the same
//! offset counter.
//!
//! ```text
//!  list ──peek───► slot 0: ≤ IOV_MAX iovecs, ≤ SQE_MAX_BYTES @ off
//!                   slot 1: ...                               @ off + len0
//!                   ... ≤ QUEUE_DEPTH slots ──► submit_and_wait ──► reap
//!  short completion → the slot's iovecs advance, resubmitted at off + res
//!  after each reap: progress ◄── everything below the lowest busy slot's
//!                                offset (or the next unsubmitted byte)
//! ```
//!
//! Completions arrive in any order; progress is the prefix of the call
//! with no request left in flight, so the caller may let go of it (P1: the
//! kernel is done with those iovecs, and the list shows the sink nothing
//! below the floor).
//!
//! Invariants the `unsafe` blocks rely on:
//! - U1 Every iovec array handed to the kernel (a slot's `Vec<iovec>`) and
//!   the memory its entries point to stay alive and unmoved until that
//!   request's completion is reaped: slots live for the whole `write_list`
//!   call, a slot's vector is not touched while it is in flight, the list's
//!   buffers are borrowed for the call, and the call returns only when
//!   nothing is in flight. The slots' iovecs are raw copies of the list's
//!   views, so they outlive its reports: the sink tells the list (which may
//!   then let go of memory, P1) only of the prefix below its lowest request
//!   in flight, never of bytes a busy slot points to. If the ring itself
//!   fails mid-call the slots are leaked instead, so the arrays stay valid
//!   for whatever the kernel still holds (the kernel only reads that
//!   memory).
//! - U2 The file descriptor (raw, or registered at index 0) stays open for as
//!   long as the ring exists: the sink owns both, and `ring` is declared (so
//!   dropped) before `fd`.
//! - U3 A request's `user_data` is the index of a busy slot.
#![allow(unsafe_code)]

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::{IoUring, opcode, squeue, types};
use rustix::io::Errno;

use super::batch::IOV_MAX;
use super::pwritev_sink::{poison, pwritev_all, sync_or_poison};
use super::{FileSink, SinkError, SinkKind, WRITE_STEP_BYTES, WriteList};

/// Requests in flight at most (1 MiB writes at depth 8 already match
/// write(2)'s throughput on this project's test hosts; deeper only holds more
/// memory pinned).
pub(super) const QUEUE_DEPTH: usize = 8;
/// Bytes per request at most, so one pass spreads over several requests,
/// its memory is let go of as they complete, and a short write resubmits
/// little.
pub(super) const SQE_MAX_BYTES: usize = WRITE_STEP_BYTES;
/// Passes up to this size are written with one pwritev(2) instead.
pub(super) const SMALL_WRITE_BYTES: usize = 64 * 1024;

/// One request's iovecs (raw: they stay in flight across the list's
/// reports, U1) and where it writes.
struct Slot {
    iov: Vec<libc::iovec>,
    offset: u64,
    len: usize,
    busy: bool,
}

/// Appends at its own offset with io_uring WRITEV.
pub struct UringSink {
    // Declared before `fd`: dropped first (U2).
    ring: IoUring,
    fd: OwnedFd,
    registered: bool,
    offset: u64,
    poisoned: Option<SinkError>,
    /// The block size while `O_DIRECT` is on.
    direct: Option<usize>,
    /// The block size when the file took `O_DIRECT` at open, on or not now.
    direct_capable: Option<usize>,
    /// Requests go to the kernel's workers (`IOSQE_ASYNC`): a submission
    /// blocked until its write was done, as on FUSE and some network file
    /// systems, which write in the submitter's context.
    punt: bool,
}

fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

impl UringSink {
    /// Sets up a ring for `fd`, appending from `offset`. Registers the fd
    /// (saves a file lookup per request) when the kernel allows it.
    pub fn new(fd: OwnedFd, offset: u64) -> std::io::Result<Self> {
        let ring = IoUring::builder().build(QUEUE_DEPTH as u32)?;
        let registered = ring.submitter().register_files(&[fd.as_raw_fd()]).is_ok();
        let punt = writes_when_submitted(&fd);
        Ok(UringSink {
            ring,
            fd,
            registered,
            offset,
            poisoned: None,
            direct: None,
            direct_capable: None,
            punt,
        })
    }

    /// The fd was opened `O_DIRECT` (see [`super::direct::enable`]).
    pub(crate) fn with_direct(self, align: Option<usize>) -> Self {
        UringSink {
            direct: align,
            direct_capable: align,
            ..self
        }
    }
}

/// Whether `fd`'s file system is one known to write a request in the
/// context that submits it (FUSE, network file systems): its requests go
/// to the kernel's workers from the start. Any other is found out by the
/// first submission that blocks ([`submit_and_wait_idle`]).
fn writes_when_submitted(fd: &OwnedFd) -> bool {
    const FUSE: i64 = 0x6573_5546;
    const NFS: i64 = 0x6969;
    const SMB: i64 = 0x517b;
    const CIFS: i64 = 0xff53_4d42;
    const SMB2: i64 = 0xfe53_4d42;
    const V9FS: i64 = 0x0102_1997;
    const CEPH: i64 = 0x00c3_6400;
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::fstatfs(fd)
        .is_ok_and(|fs| [FUSE, NFS, SMB, CIFS, SMB2, V9FS, CEPH].contains(&(fs.f_type as i64)))
}

/// Queues `slot`'s request (submitted by the next `submit_and_wait`).
fn push(
    ring: &mut IoUring,
    (registered, punt): (bool, bool),
    fd: &OwnedFd,
    slot: &Slot,
    index: usize,
) {
    let iov = slot.iov.as_ptr();
    // IOV_MAX bounds a slot's length, so it fits a u32.
    let n = slot.iov.len() as u32;
    let op = if registered {
        opcode::Writev::new(types::Fixed(0), iov, n)
    } else {
        opcode::Writev::new(types::Fd(fd.as_raw_fd()), iov, n)
    };
    let flags = if punt {
        squeue::Flags::ASYNC
    } else {
        squeue::Flags::empty()
    };
    let entry = (op.offset(slot.offset).build())
        .flags(flags)
        .user_data(index as u64);
    // SAFETY: U1 keeps the iovec array and the data alive until this request
    // completes; U2 keeps the fd open.
    let pushed = unsafe { ring.submission().push(&entry) };
    // At most QUEUE_DEPTH requests are queued or in flight and the
    // submission queue has QUEUE_DEPTH entries.
    pushed.expect("submission queue has room for every slot");
}

/// A view's address and length, for a request that outlives the view (U1).
fn raw_iovec(s: &IoSlice<'_>) -> libc::iovec {
    libc::iovec {
        iov_base: s.as_ptr().cast_mut().cast(),
        iov_len: s.len(),
    }
}

/// Drops the first `n` bytes of a slot's iovecs (after a short write).
fn advance_raw(iov: &mut Vec<libc::iovec>, mut n: usize) {
    let mut whole = 0;
    for v in iov.iter_mut() {
        if n < v.iov_len {
            // Pointer arithmetic only: nothing is read here.
            v.iov_base = v.iov_base.cast::<u8>().wrapping_add(n).cast();
            v.iov_len -= n;
            break;
        }
        n -= v.iov_len;
        whole += 1;
    }
    iov.drain(..whole);
}

/// How long a pass waits on its requests before the caller's idle work
/// ([`WriteList::idle`]): well under a drain period, so a disk that takes
/// seconds does not keep the kernel's trace buffers from being read.
const IDLE_TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// Submits what is queued and waits for a completion; while none comes
/// within [`IDLE_TICK`], lets the list's caller do its due work. Without
/// timed waits (IORING_FEAT_EXT_ARG, Linux 5.11) it just waits. A call
/// that took well over a tick blocked in the submission itself: `punt` is
/// set, so that later requests go to the kernel's workers.
fn submit_and_wait_idle(
    ring: &mut IoUring,
    list: &mut WriteList<'_, '_>,
    punt: &mut bool,
) -> std::io::Result<()> {
    if !ring.params().is_feature_ext_arg() {
        return ring.submit_and_wait(1).map(drop);
    }
    let tick = types::Timespec::from(IDLE_TICK);
    let args = types::SubmitArgs::new().timespec(&tick);
    loop {
        let queued = !ring.submission().is_empty();
        let t = std::time::Instant::now();
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
            Err(e) => return Err(e),
        }
        if queued && !*punt && t.elapsed() > 5 * IDLE_TICK {
            *punt = true;
            log::info!(
                "trace file: a write was done while it was submitted ({:?}); \
                 later ones go to the kernel's io_uring workers",
                t.elapsed()
            );
        }
        if !ring.completion().is_empty() {
            return Ok(());
        }
        list.idle();
    }
}

impl FileSink for UringSink {
    fn kind(&self) -> SinkKind {
        SinkKind::IoUring
    }

    positioned_file_methods!();

    fn write_list(&mut self, list: &mut WriteList<'_, '_>) -> Result<u64, SinkError> {
        if let Some(e) = self.poisoned {
            return Err(e);
        }
        // A small pass (an idle session's service packets, a quiet source)
        // is one pwritev(2): through the ring a buffered write is handed to a
        // kernel worker thread, two context switches for a few bytes.
        if list.len() <= SMALL_WRITE_BYTES as u64 {
            return pwritev_all(&self.fd, &mut self.poisoned, &mut self.offset, list);
        }
        let start = self.offset;
        let mut slots: Vec<Slot> = (0..QUEUE_DEPTH)
            .map(|_| Slot {
                iov: Vec::new(),
                offset: 0,
                len: 0,
                busy: false,
            })
            .collect();
        let mut next = start;
        let mut in_flight = 0usize;
        let mut failure: Option<SinkError> = None;
        // The lowest file offset a failed or abandoned request did not write.
        let mut hole = u64::MAX;
        loop {
            if failure.is_none() {
                for (i, slot) in slots.iter_mut().enumerate() {
                    if slot.busy || list.is_done() {
                        continue;
                    }
                    let batch = list.peek(IOV_MAX, SQE_MAX_BYTES);
                    slot.iov.clear();
                    slot.iov.extend(batch.iter().map(raw_iovec));
                    slot.len = slot.iov.iter().map(|v| v.iov_len).sum();
                    list.advance(slot.len);
                    slot.offset = next;
                    slot.busy = true;
                    next += slot.len as u64;
                    push(
                        &mut self.ring,
                        (self.registered, self.punt),
                        &self.fd,
                        slot,
                        i,
                    );
                    in_flight += 1;
                }
            }
            if in_flight == 0 {
                break;
            }
            match submit_and_wait_idle(&mut self.ring, list, &mut self.punt) {
                Ok(()) => {}
                Err(e) if matches!(errno_of(&e), Errno::INTR | Errno::AGAIN | Errno::BUSY) => {}
                Err(e) => {
                    let err = SinkError::Ring(errno_of(&e));
                    // Requests may still be in the kernel: keep their iovec
                    // arrays alive for good (U1).
                    std::mem::forget(slots);
                    self.poisoned = Some(err);
                    log::error!("trace file sink poisoned: {err}");
                    return Err(err);
                }
            }
            let mut resubmit = Vec::new();
            for cqe in self.ring.completion() {
                // U3: user_data is a busy slot's index.
                let i = cqe.user_data() as usize;
                let slot = &mut slots[i];
                let res = cqe.result();
                if res < 0 {
                    failure.get_or_insert(SinkError::Write {
                        errno: Errno::from_raw_os_error(-res),
                        offset: slot.offset,
                    });
                    hole = hole.min(slot.offset);
                } else if res == 0 {
                    failure.get_or_insert(SinkError::NoProgress {
                        offset: slot.offset,
                    });
                    hole = hole.min(slot.offset);
                } else if (res as usize) < slot.len {
                    let n = res as usize;
                    advance_raw(&mut slot.iov, n);
                    slot.offset += n as u64;
                    slot.len -= n;
                    if failure.is_none() {
                        resubmit.push(i);
                        continue;
                    }
                    hole = hole.min(slot.offset);
                }
                slot.busy = false;
                in_flight -= 1;
            }
            for i in resubmit {
                if failure.is_some() {
                    hole = hole.min(slots[i].offset);
                    slots[i].busy = false;
                    in_flight -= 1;
                } else {
                    push(
                        &mut self.ring,
                        (self.registered, self.punt),
                        &self.fd,
                        &slots[i],
                        i,
                    );
                }
            }
            if failure.is_none() {
                // Everything below the lowest byte a request still holds
                // (a resubmitted slot's offset has moved past what it wrote).
                let pending = slots.iter().filter(|s| s.busy).map(|s| s.offset);
                // U1: never a byte a busy slot points to.
                list.written(pending.min().unwrap_or(next) - start);
            }
        }
        match failure {
            None => {
                self.offset = next;
                Ok(next - start)
            }
            Some(err) => {
                let written_to = hole.min(next);
                Err(poison(
                    &self.fd,
                    &mut self.poisoned,
                    &mut self.offset,
                    start,
                    written_to,
                    list,
                    err,
                ))
            }
        }
    }
}

/// Why io_uring cannot carry the sink here.
#[derive(Debug, thiserror::Error)]
pub enum UringUnavailable {
    /// The ring could not be set up: io_uring is absent, disabled
    /// (`kernel.io_uring_disabled`) or blocked by seccomp.
    #[error("io_uring_setup failed: {0} (blocked by seccomp or kernel.io_uring_disabled?)")]
    Setup(#[source] std::io::Error),
    /// The kernel's io_uring cannot write vectors (`IORING_OP_WRITEV`).
    #[error("io_uring does not support WRITEV")]
    NoWritev,
    /// The probe's NOP did not fit in the submission queue.
    #[error("io_uring push failed: {0}")]
    Push(#[source] io_uring::squeue::PushError),
    /// Submitting the probe's NOP failed.
    #[error("io_uring_enter failed: {0}")]
    Enter(#[source] std::io::Error),
    /// The probe's NOP was submitted but no completion came back.
    #[error("io_uring NOP did not complete")]
    NoCompletion,
    /// The probe's NOP completed with an error.
    #[error("io_uring NOP failed: {0}")]
    Nop(#[source] Errno),
    /// The ring could not be set up after the probe passed, and the file
    /// could not be kept for `pwritev` instead.
    #[error("{ring}; {dup}")]
    NoFallback {
        /// Why the ring could not be set up.
        ring: std::io::Error,
        /// Why the file could not be kept (duplicated) for `pwritev`.
        dup: std::io::Error,
    },
}

/// Probes io_uring the way the sink will use it: a real ring setup, a NOP
/// through it, and WRITEV support.
pub(super) fn probe() -> Result<(), UringUnavailable> {
    let mut ring = IoUring::new(QUEUE_DEPTH as u32).map_err(UringUnavailable::Setup)?;
    let mut probe = io_uring::Probe::new();
    if ring.submitter().register_probe(&mut probe).is_ok()
        && !probe.is_supported(opcode::Writev::CODE)
    {
        return Err(UringUnavailable::NoWritev);
    }
    let nop = opcode::Nop::new().build().user_data(7);
    // SAFETY: U1, U2 — a NOP references no memory and no fd, so there is
    // nothing for them to keep alive.
    unsafe { ring.submission().push(&nop) }.map_err(UringUnavailable::Push)?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(UringUnavailable::Enter(e)),
        }
    }
    let cqe = ring
        .completion()
        .next()
        .ok_or(UringUnavailable::NoCompletion)?;
    if cqe.result() < 0 || cqe.user_data() != 7 {
        return Err(UringUnavailable::Nop(Errno::from_raw_os_error(
            -cqe.result(),
        )));
    }
    Ok(())
}
