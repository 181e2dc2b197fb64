//! The `pwritev(2)` sink: the fallback where io_uring is blocked (containers,
//! `kernel.io_uring_disabled`). Same semantics as the io_uring sink, one
//! synchronous call per batch of at most `IOV_MAX` iovecs.

use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};

use rustix::io::Errno;

use super::batch::{Cursor, IOV_MAX};
use super::{FileSink, SinkError, SinkKind};

/// The kernel's cap on one read/write (`MAX_RW_COUNT`); larger requests are
/// short writes anyway.
const MAX_CALL_BYTES: usize = 0x7fff_f000;

/// Appends at its own offset with `pwritev`.
pub struct PwritevSink {
    fd: OwnedFd,
    offset: u64,
    poisoned: Option<SinkError>,
}

impl PwritevSink {
    /// A sink appending to `fd` from `offset` (0 for a freshly truncated file).
    pub fn new(fd: OwnedFd, offset: u64) -> Self {
        PwritevSink {
            fd,
            offset,
            poisoned: None,
        }
    }
}

/// Poisons after a failed call: the file is cut back to where the call began
/// so it still ends where a previous call ended; when even that fails, the
/// sink reports `written_to`, the end of the bytes known to be in place.
/// fdatasync, unless the sink is poisoned; a failure poisons it (shared by
/// the positioned sinks).
pub(super) fn sync_or_poison(
    fd: impl AsFd,
    poisoned: &mut Option<SinkError>,
) -> Result<(), SinkError> {
    if let Some(e) = *poisoned {
        return Err(e);
    }
    rustix::fs::fdatasync(fd).map_err(|errno| {
        let e = SinkError::Sync(errno);
        *poisoned = Some(e);
        e
    })
}

pub(super) fn poison(
    fd: impl AsFd,
    slot: &mut Option<SinkError>,
    offset: &mut u64,
    call_start: u64,
    written_to: u64,
    err: SinkError,
) -> SinkError {
    *slot = Some(err);
    *offset = if written_to == call_start || rustix::fs::ftruncate(fd, call_start).is_ok() {
        call_start
    } else {
        written_to
    };
    log::error!(
        "trace file sink poisoned: {err}; file kept at {} bytes",
        *offset
    );
    err
}

/// Writes `bufs` at `*offset` with pwritev(2) until all are written, and
/// moves `*offset` past them; a failure poisons the sink (see [`poison`]).
/// Shared by the positioned sinks.
pub(super) fn pwritev_all(
    fd: &OwnedFd,
    poisoned: &mut Option<SinkError>,
    offset: &mut u64,
    bufs: &[IoSlice<'_>],
) -> Result<u64, SinkError> {
    if let Some(e) = *poisoned {
        return Err(e);
    }
    let start = *offset;
    let mut pos = start;
    let mut cursor = Cursor::new(bufs);
    let mut batch = Vec::with_capacity(bufs.len().min(IOV_MAX));
    loop {
        let len = cursor.peek_batch(IOV_MAX, MAX_CALL_BYTES, &mut batch);
        if len == 0 {
            break;
        }
        let err = match rustix::io::pwritev(fd, &batch, pos) {
            Ok(0) => SinkError::NoProgress { offset: pos },
            Ok(n) => {
                pos += n as u64;
                cursor.advance(n);
                continue;
            }
            Err(Errno::INTR) => continue,
            Err(errno) => SinkError::Write { errno, offset: pos },
        };
        return Err(poison(fd, poisoned, offset, start, pos, err));
    }
    *offset = pos;
    Ok(pos - start)
}

impl FileSink for PwritevSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Pwritev
    }

    fn write_all(&mut self, bufs: &[IoSlice<'_>]) -> Result<u64, SinkError> {
        pwritev_all(&self.fd, &mut self.poisoned, &mut self.offset, bufs)
    }

    fn sync_data(&mut self) -> Result<(), SinkError> {
        sync_or_poison(&self.fd, &mut self.poisoned)
    }

    fn bytes_written(&self) -> u64 {
        self.offset
    }
}
