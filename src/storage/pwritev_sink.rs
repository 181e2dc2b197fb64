//! The `pwritev(2)` sink: the fallback where io_uring is blocked (containers,
//! `kernel.io_uring_disabled`). Same semantics as the io_uring sink, one
//! synchronous call per batch of at most `IOV_MAX` iovecs and
//! [`WRITE_STEP_BYTES`], progress reported after each.

use std::os::fd::{AsFd, OwnedFd};

use rustix::io::Errno;

use super::batch::IOV_MAX;
use super::{FileSink, SinkError, SinkKind, WRITE_STEP_BYTES, WriteList};

/// Appends at its own offset with `pwritev`.
pub struct PwritevSink {
    fd: OwnedFd,
    offset: u64,
    poisoned: Option<SinkError>,
    /// The block size while `O_DIRECT` is on.
    direct: Option<usize>,
    /// The block size when the file took `O_DIRECT` at open, on or not now.
    direct_capable: Option<usize>,
}

impl PwritevSink {
    /// A sink appending to `fd` from `offset` (0 for a freshly truncated file).
    pub fn new(fd: OwnedFd, offset: u64) -> Self {
        PwritevSink {
            fd,
            offset,
            poisoned: None,
            direct: None,
            direct_capable: None,
        }
    }

    /// The fd was opened `O_DIRECT` (see [`super::direct::enable`]).
    pub(crate) fn with_direct(self, align: Option<usize>) -> Self {
        PwritevSink {
            direct: align,
            direct_capable: align,
            ..self
        }
    }
}

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

/// Poisons after a failed call. Of the call's bytes, those in place
/// (`call_start..written_to`) are kept up to the last whole packet in them
/// (the list holds the file's framing), so a full disk keeps every packet
/// that fit; the file is cut there and synced (best effort). When the cut
/// fails, the sink reports `written_to`, the end of the bytes known to be
/// in place. Packets are walked from the list's floor (P1).
///
/// The cut is made even when the kept bytes end at `written_to`: io_uring's
/// requests complete in any order, so one above a failed request may have
/// filled blocks past the hole (a full disk gives the last free blocks to
/// whichever request takes them first) and the file would end with a hole
/// and then stray data.
pub(super) fn poison(
    fd: impl AsFd,
    slot: &mut Option<SinkError>,
    offset: &mut u64,
    call_start: u64,
    written_to: u64,
    list: &WriteList<'_, '_>,
    err: SinkError,
) -> SinkError {
    *slot = Some(err);
    let in_place = written_to.saturating_sub(call_start);
    let keep = call_start + list.whole_packets_within(in_place);
    *offset = if rustix::fs::ftruncate(&fd, keep).is_ok() {
        keep
    } else {
        written_to
    };
    let _ = rustix::fs::fdatasync(&fd);
    log::error!(
        "trace file sink poisoned: {err}; file kept at {} bytes ({} of the failed write's {} bytes)",
        *offset,
        *offset - call_start,
        list.len()
    );
    err
}

/// Writes `list` at `*offset` with pwritev(2) until all of it is written,
/// and moves `*offset` past it; a failure poisons the sink (see [`poison`]).
/// Tells the list after each call. Shared by the positioned sinks.
pub(super) fn pwritev_all(
    fd: &OwnedFd,
    poisoned: &mut Option<SinkError>,
    offset: &mut u64,
    list: &mut WriteList<'_, '_>,
) -> Result<u64, SinkError> {
    if let Some(e) = *poisoned {
        return Err(e);
    }
    let start = *offset;
    let mut pos = start;
    loop {
        let batch = list.peek(IOV_MAX, WRITE_STEP_BYTES);
        if batch.is_empty() {
            break;
        }
        let err = match rustix::io::pwritev(fd, batch, pos) {
            Ok(0) => SinkError::NoProgress { offset: pos },
            Ok(n) => {
                pos += n as u64;
                list.advance(n);
                list.written(pos - start);
                list.idle();
                continue;
            }
            Err(Errno::INTR) => continue,
            Err(errno) => SinkError::Write { errno, offset: pos },
        };
        return Err(poison(fd, poisoned, offset, start, pos, list, err));
    }
    *offset = pos;
    Ok(pos - start)
}

impl FileSink for PwritevSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Pwritev
    }

    positioned_file_methods!();

    fn write_list(&mut self, list: &mut WriteList<'_, '_>) -> Result<u64, SinkError> {
        pwritev_all(&self.fd, &mut self.poisoned, &mut self.offset, list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::NoProgress;
    use std::io::IoSlice;

    /// A failed call whose kept packets end exactly where its bytes in place
    /// end still cuts the file there: a request above the hole (io_uring
    /// completes them in any order) had extended it with stray bytes.
    #[test]
    fn a_failed_call_cuts_off_what_a_request_past_the_hole_wrote() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = std::fs::File::create(dir.path().join("cut.bin")).expect("file");
        // Two TracePacket records: 0x0A, length 3, three bytes.
        let packets = [0x0a, 3, 1, 2, 3, 0x0a, 3, 4, 5, 6];
        let bufs = [IoSlice::new(&packets)];
        let mut progress = NoProgress;
        let mut list = WriteList::new(&bufs, &mut progress);
        let _ = list.peek(IOV_MAX, usize::MAX);
        list.advance(packets.len());
        // The first record is in place; a later request wrote at 20..30.
        rustix::io::pwrite(file.as_fd(), &packets[..5], 0).expect("first");
        rustix::io::pwrite(file.as_fd(), &[9; 10], 20).expect("past the hole");
        let mut poisoned = None;
        let mut offset = 0;
        let err = SinkError::Write {
            errno: Errno::NOSPC,
            offset: 5,
        };
        poison(&file, &mut poisoned, &mut offset, 0, 5, &list, err);
        assert_eq!(offset, 5);
        assert_eq!(poisoned, Some(err));
        let len = file.metadata().expect("metadata").len();
        assert_eq!(len, 5, "the file ends at the last whole packet in place");
    }
}
