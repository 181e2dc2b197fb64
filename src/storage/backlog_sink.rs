//! The backlog sink: a stream (a pipe, a FIFO, a socket, a terminal) that a
//! service must never wait on. `recorder serve` hosts every session on one
//! thread, so a client's output whose reader stops reading must cost that
//! session, never the others: every write is non-blocking, and what the
//! reader has not taken yet is copied into a backlog of the session's own,
//! bounded. The host waits for room ([`FileSink::pending_fd`]) with the
//! rest of its work and writes the backlog out as it comes
//! ([`FileSink::drain_pending`]). A backlog that would pass its bound fails
//! the sink ([`SinkError::Blocked`]): the session stops, and what did not
//! reach the reader is counted.
//!
//! Each write is non-blocking on its own (`RWF_NOWAIT`, [`crate::sys::nowait`]):
//! the descriptor's flags, shared with the client that passed it, stay as
//! they are. A stream the kernel cannot write that way (some character
//! devices) is refused when the sink is made.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::FileType;
use rustix::io::Errno;

use super::batch::IOV_MAX;
use super::{FileSink, SinkError, SinkKind, WRITE_STEP_BYTES, WriteList};
use crate::sys::nowait;

/// Why a stream cannot be written without waiting.
#[derive(Debug, thiserror::Error)]
pub enum BacklogError {
    /// The descriptor could not be inspected (`fstat` failed).
    #[error("cannot look at the output descriptor: {0}")]
    Stat(#[source] std::io::Error),
    /// The kernel does not take `RWF_NOWAIT` writes on this stream, so a
    /// write could block.
    #[error(
        "the output stream cannot be written without waiting ({0}): give a file, a pipe or a socket"
    )]
    CannotWait(#[source] std::io::Error),
    /// The output is not a stream (the kind it is named): a regular file
    /// takes a positioned sink instead.
    #[error("the output is a {0}, not a pipe, FIFO, socket or character device")]
    NotAStream(&'static str),
}

/// A stream written without ever waiting, with a bounded backlog.
pub struct BacklogSink {
    fd: OwnedFd,
    backlog: VecDeque<u8>,
    max_backlog: usize,
    /// Bytes handed over: written, or held in the backlog.
    accepted: u64,
    poisoned: Option<SinkError>,
}

impl BacklogSink {
    /// A sink for the stream `fd` (which the caller may share with
    /// others), holding at most `max_backlog` bytes its reader has not
    /// taken.
    pub fn new(fd: OwnedFd, max_backlog: usize) -> Result<Self, BacklogError> {
        let st = rustix::fs::fstat(&fd).map_err(|e| BacklogError::Stat(e.into()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Socket | FileType::Fifo | FileType::CharacterDevice => {}
            FileType::RegularFile => return Err(BacklogError::NotAStream("regular file")),
            FileType::Directory => return Err(BacklogError::NotAStream("directory")),
            _ => return Err(BacklogError::NotAStream("special file")),
        }
        // An empty write says whether the kernel takes RWF_NOWAIT here.
        if let Err(e) = nowait::write_nowait(fd.as_fd(), &[]) {
            return Err(BacklogError::CannotWait(e.into()));
        }
        Ok(Self {
            fd,
            backlog: VecDeque::new(),
            max_backlog,
            accepted: 0,
            poisoned: None,
        })
    }

    fn fail(&mut self, err: SinkError) -> SinkError {
        self.poisoned = Some(err);
        log::info!(
            "trace stream failed: {err}; {} bytes accepted",
            self.accepted
        );
        err
    }

    /// One non-blocking write of `bufs`; `Ok(0)` when the reader has no
    /// room now.
    fn send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        loop {
            match nowait::write_nowait(self.fd.as_fd(), bufs) {
                Ok(n) => return Ok(n),
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => return Ok(0),
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes the backlog out as far as the reader takes it.
    fn push_backlog(&mut self) -> Result<(), SinkError> {
        while !self.backlog.is_empty() {
            let (a, b) = self.backlog.as_slices();
            let bufs = [IoSlice::new(a), IoSlice::new(b)];
            let n = self.send(&bufs).map_err(|errno| SinkError::Write {
                errno,
                offset: self.accepted - self.backlog.len() as u64,
            })?;
            if n == 0 {
                return Ok(());
            }
            self.backlog.drain(..n);
        }
        Ok(())
    }
}

impl FileSink for BacklogSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Stream
    }

    fn write_list(&mut self, list: &mut WriteList<'_, '_>) -> Result<u64, SinkError> {
        if let Some(e) = self.poisoned {
            return Err(e);
        }
        let start = self.accepted;
        if let Err(e) = self.push_backlog() {
            return Err(self.fail(e));
        }
        // Straight to the reader while the backlog is empty and it takes.
        while self.backlog.is_empty() {
            let batch = list.peek(IOV_MAX, WRITE_STEP_BYTES);
            if batch.is_empty() {
                break;
            }
            match self.send(batch) {
                Ok(0) => break,
                Ok(n) => {
                    self.accepted += n as u64;
                    list.advance(n);
                    list.written(self.accepted - start);
                }
                Err(errno) => {
                    let offset = self.accepted;
                    return Err(self.fail(SinkError::Write { errno, offset }));
                }
            }
        }
        // The rest waits in the backlog, within its bound.
        let rest = list.len() - list.position();
        let held = self.backlog.len() as u64;
        if held + rest > self.max_backlog as u64 {
            return Err(self.fail(SinkError::Blocked {
                held: held + rest,
                offset: self.accepted,
            }));
        }
        loop {
            let batch = list.peek(IOV_MAX, WRITE_STEP_BYTES);
            if batch.is_empty() {
                break;
            }
            let n: usize = batch.iter().map(|s| s.len()).sum();
            for s in batch {
                self.backlog.extend(s.iter());
            }
            list.advance(n);
            self.accepted += n as u64;
            // Copied: the list's bytes below are not read again (P1).
            list.written(self.accepted - start);
        }
        Ok(self.accepted - start)
    }

    fn sync_data(&mut self) -> Result<(), SinkError> {
        self.poisoned.map_or(Ok(()), Err)
    }

    fn bytes_written(&self) -> u64 {
        self.accepted
    }

    fn pending_fd(&self) -> Option<BorrowedFd<'_>> {
        (!self.backlog.is_empty() && self.poisoned.is_none()).then(|| self.fd.as_fd())
    }

    fn drain_pending(&mut self) -> Result<u64, SinkError> {
        if let Some(e) = self.poisoned {
            return Err(e);
        }
        if let Err(e) = self.push_backlog() {
            return Err(self.fail(e));
        }
        Ok(self.backlog.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::NoProgress;
    use std::io::Read;

    fn fill(pipe_w: &OwnedFd) -> usize {
        // Fill the pipe, as a reader that stopped reading.
        let mut n = 0;
        let chunk = [0u8; 4096];
        while let Ok(k) = nowait::write_nowait(pipe_w.as_fd(), &[IoSlice::new(&chunk)]) {
            n += k;
        }
        n
    }

    #[test]
    fn a_reader_that_takes_nothing_costs_the_backlog_then_the_sink_fails() {
        let (r, w) = rustix::pipe::pipe().expect("pipe");
        let filled = fill(&w);
        let mut sink = BacklogSink::new(w, 10_000).expect("sink");
        let data = vec![7u8; 6_000];
        let bufs = [IoSlice::new(&data)];
        // Never waits: the bytes wait in the backlog.
        assert_eq!(
            sink.write_list(&mut WriteList::new(&bufs, &mut NoProgress))
                .expect("held"),
            6_000
        );
        assert!(sink.pending_fd().is_some());
        // Past the bound: the sink fails, and says how much was held.
        let err = sink
            .write_list(&mut WriteList::new(&bufs, &mut NoProgress))
            .expect_err("bound");
        assert!(matches!(err, SinkError::Blocked { held: 12_000, .. }));
        // The reader takes: the first 6,000 bytes come after what was there.
        let mut reader = std::fs::File::from(r);
        let mut got = vec![0u8; filled];
        reader.read_exact(&mut got).expect("old");
        assert!(sink.drain_pending().is_err(), "poisoned stays poisoned");
    }

    #[test]
    fn the_backlog_goes_out_in_order_as_the_reader_takes() {
        let (r, w) = rustix::pipe::pipe().expect("pipe");
        let filled = fill(&w);
        let mut sink = BacklogSink::new(w, 1 << 20).expect("sink");
        let a = vec![1u8; 3_000];
        let b = vec![2u8; 3_000];
        for d in [&a, &b] {
            let bufs = [IoSlice::new(d)];
            sink.write_list(&mut WriteList::new(&bufs, &mut NoProgress))
                .expect("held");
        }
        let mut reader = std::fs::File::from(r);
        let mut old = vec![0u8; filled];
        reader.read_exact(&mut old).expect("old");
        assert_eq!(sink.drain_pending().expect("drain"), 0);
        assert!(sink.pending_fd().is_none());
        let mut got = vec![0u8; 6_000];
        reader.read_exact(&mut got).expect("new");
        assert!(got[..3_000].iter().all(|b| *b == 1));
        assert!(got[3_000..].iter().all(|b| *b == 2));
        assert_eq!(sink.bytes_written(), 6_000);
    }

    #[test]
    fn the_clients_description_stays_blocking() {
        let (_r, w) = rustix::pipe::pipe().expect("pipe");
        let dup = w.try_clone().expect("dup");
        let _sink = BacklogSink::new(w, 1).expect("sink");
        let flags = rustix::fs::fcntl_getfl(&dup).expect("flags");
        assert!(!flags.contains(rustix::fs::OFlags::NONBLOCK));
    }

    #[test]
    fn a_regular_file_is_not_a_stream() {
        let f = tempfile::tempfile().expect("file");
        assert!(matches!(
            BacklogSink::new(f.into(), 1),
            Err(BacklogError::NotAStream("regular file"))
        ));
    }
}
