//! The stream sink: `writev(2)` on stdout (a pipe or a file), for `-o -`.
//! A pipe has no offsets, so writes go in order at the stream's position.

use std::os::fd::OwnedFd;

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;

use super::batch::IOV_MAX;
use super::{FileSink, SinkError, SinkKind, WRITE_STEP_BYTES, WriteList};

/// Writes in order with `writev`; `sync_data` is a no-op unless the stream
/// is a regular file.
pub struct StreamSink {
    fd: OwnedFd,
    regular_file: bool,
    written: u64,
    poisoned: Option<SinkError>,
}

impl StreamSink {
    /// `regular_file` decides whether `sync_data` calls `fdatasync`.
    pub fn new(fd: OwnedFd, regular_file: bool) -> Self {
        StreamSink {
            fd,
            regular_file,
            written: 0,
            poisoned: None,
        }
    }

    fn fail(&mut self, err: SinkError) -> SinkError {
        self.poisoned = Some(err);
        log::error!(
            "trace stream poisoned: {err}; {} bytes written",
            self.written
        );
        err
    }
}

impl FileSink for StreamSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Stream
    }

    fn write_list(&mut self, list: &mut WriteList<'_, '_>) -> Result<u64, SinkError> {
        if let Some(e) = self.poisoned {
            return Err(e);
        }
        let start = self.written;
        loop {
            let batch = list.peek(IOV_MAX, WRITE_STEP_BYTES);
            if batch.is_empty() {
                break;
            }
            match rustix::io::writev(&self.fd, batch) {
                Ok(0) => {
                    return Err(self.fail(SinkError::NoProgress {
                        offset: self.written,
                    }));
                }
                Ok(n) => {
                    self.written += n as u64;
                    list.advance(n);
                    // A stream is never cut after a failure, so nothing
                    // is read below the cursor again.
                    list.written(self.written - start);
                }
                Err(Errno::INTR) => {}
                // A non-blocking stdout: wait until the reader makes room.
                Err(Errno::AGAIN) => {
                    let mut fds = [PollFd::new(&self.fd, PollFlags::OUT)];
                    match rustix::event::poll(&mut fds, None) {
                        Ok(_) | Err(Errno::INTR) => {}
                        Err(errno) => {
                            let offset = self.written;
                            return Err(self.fail(SinkError::Write { errno, offset }));
                        }
                    }
                }
                Err(errno) => {
                    let offset = self.written;
                    return Err(self.fail(SinkError::Write { errno, offset }));
                }
            }
        }
        Ok(self.written - start)
    }

    fn sync_data(&mut self) -> Result<(), SinkError> {
        if let Some(e) = self.poisoned {
            return Err(e);
        }
        if !self.regular_file {
            return Ok(());
        }
        rustix::fs::fdatasync(&self.fd).map_err(|errno| self.fail(SinkError::Sync(errno)))
    }

    fn bytes_written(&self) -> u64 {
        self.written
    }
}
