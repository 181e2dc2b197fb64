//! One consumer connection's transport, on the service's loop: frames in
//! (non-blocking reads into the IPC frame decoder, with the one descriptor a
//! client may pass), replies out (a queue written as the client takes it).
//! A client that takes nothing costs only itself: its queue is bounded,
//! nothing more is read from it while the queue is full, and a connection
//! whose queue has not moved for [`SEND_TIMEOUT`] is closed, as Perfetto's
//! consumer socket does.

use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;

use super::wire;
use crate::protos::IpcFrame;
use crate::transport::frame::{FrameDecoder, FrameError};

/// How long a client has to take what was sent to it before it is dropped.
pub(super) const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes queued for a client above which nothing more is read from it
/// (its requests wait in the socket) and ReadBuffers waits for room.
pub(super) const OUT_HIGH_WATER: usize = 1 << 20;
/// Bytes read from a client per wake-up, so one cannot hold the loop.
const READ_BUDGET: usize = 256 * 1024;
/// Requests in flight (flushes, observers) one connection may hold.
pub(super) const MAX_IN_FLIGHT: usize = 16;

/// Why a connection ends.
#[derive(Debug, thiserror::Error)]
pub(super) enum Closed {
    #[error("the client closed it")]
    Eof,
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("it broke the framing: {0}")]
    Framing(#[source] FrameError),
    #[error("it passed more than one descriptor in a message")]
    Descriptors,
    #[error("it took nothing sent to it for {SEND_TIMEOUT:?}")]
    Stalled,
}

/// One connection.
pub(super) struct Connection {
    stream: UnixStream,
    pub uid: u32,
    pub pid: u32,
    dec: FrameDecoder,
    out: VecDeque<Vec<u8>>,
    /// Bytes of the first queued frame already written.
    out_at: usize,
    out_bytes: usize,
    /// Since when the queue has waited without the client taking a byte.
    stalled_since: Option<Instant>,
    /// The last descriptor the client passed.
    pub(crate) passed_fd: Option<OwnedFd>,
    /// The session it holds.
    pub session: Option<u64>,
    /// An ObserveEvents stream asked before EnableTracing: its request id
    /// and the events it asked for.
    pub(crate) observer: Option<(u64, i32)>,
    /// ObserveEvents streams waiting for `all_data_sources_started`.
    pub(crate) start_watchers: Vec<u64>,
    /// The ReadBuffers being answered, slice by slice, as room comes.
    pub reading: Option<u64>,
    /// Requests to its session not answered yet.
    pub(crate) in_flight: usize,
}

impl Connection {
    pub(super) fn new(stream: UnixStream, uid: u32, pid: u32) -> std::io::Result<Self> {
        stream.set_nonblocking(true)?;
        Ok(Self {
            stream,
            uid,
            pid,
            dec: FrameDecoder::new(),
            out: VecDeque::new(),
            out_at: 0,
            out_bytes: 0,
            stalled_since: None,
            passed_fd: None,
            session: None,
            observer: None,
            start_watchers: Vec::new(),
            reading: None,
            in_flight: 0,
        })
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// What to wait for: requests while its queue has room; room while it
    /// has something queued.
    pub(super) fn interest(&self) -> PollFlags {
        let mut f = PollFlags::empty();
        if self.out_bytes < OUT_HIGH_WATER {
            f |= PollFlags::IN;
        }
        if self.out_bytes > 0 {
            f |= PollFlags::OUT;
        }
        f
    }

    /// Whether ReadBuffers may queue more now.
    pub(super) fn has_room(&self) -> bool {
        self.out_bytes < OUT_HIGH_WATER
    }

    /// When a stalled queue closes the connection.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.stalled_since.map(|t| t + SEND_TIMEOUT)
    }

    /// Reads what the client sent (within the budget) and returns the
    /// frames it completed.
    pub(super) fn receive(&mut self) -> Result<Vec<IpcFrame>, Closed> {
        let mut frames = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut taken = 0;
        while taken < READ_BUDGET {
            let room = self.dec.room().min(buf.len());
            let n = match self.recv(&mut buf[..room]) {
                Ok(0) => return Err(Closed::Eof),
                Ok(n) => n,
                Err(Closed::Io(e)) if e.kind() == ErrorKind::WouldBlock => break,
                Err(Closed::Io(e)) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            taken += n;
            self.dec.feed(&buf[..n]);
            while let Some(f) = self.dec.next_frame().map_err(Closed::Framing)? {
                frames.push(f);
            }
        }
        Ok(frames)
    }

    /// One `recvmsg`, keeping the one descriptor a client may pass along
    /// (the output file of a `write_into_file` session), as Perfetto's
    /// service does: the newest one, whichever frame it rode on.
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, Closed> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let r = rustix::net::recvmsg(
            &self.stream,
            &mut [std::io::IoSliceMut::new(buf)],
            &mut cmsg,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
        )
        .map_err(|e| Closed::Io(e.into()))?;
        for m in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                for fd in fds {
                    self.passed_fd = Some(fd);
                }
            }
        }
        if r.flags.contains(ReturnFlags::CTRUNC) {
            return Err(Closed::Descriptors);
        }
        Ok(r.bytes)
    }

    /// Queues one frame and writes what the client takes now.
    pub(super) fn send(&mut self, f: &IpcFrame) {
        match wire::encode(f) {
            Ok(bytes) => {
                self.out_bytes += bytes.len();
                self.out.push_back(bytes);
                // Best effort now; the loop goes on when the client has room.
                let _ = self.flush();
            }
            Err(e) => log::warn!("consumer reply not sent: {e}"),
        }
    }

    /// Writes what is queued as far as the client takes it.
    pub(super) fn flush(&mut self) -> Result<(), Closed> {
        let mut moved = false;
        while let Some(front) = self.out.front() {
            match self.stream.write(&front[self.out_at..]) {
                Ok(0) => return Err(Closed::Eof),
                Ok(n) => {
                    moved = true;
                    self.out_at += n;
                    self.out_bytes -= n;
                    if self.out_at == front.len() {
                        self.out.pop_front();
                        self.out_at = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Closed::Io(e)),
            }
        }
        let now = Instant::now();
        self.stalled_since = match (self.out.is_empty(), moved, self.stalled_since) {
            (true, _, _) => None,
            (false, true, _) | (false, false, None) => Some(now),
            (false, false, Some(t)) => Some(t),
        };
        match self.deadline() {
            Some(d) if d <= now => Err(Closed::Stalled),
            _ => Ok(()),
        }
    }

    /// A reply frame for request `id`.
    pub(super) fn reply(&mut self, id: u64, reply: &impl prost::Message, has_more: bool) {
        self.send(&wire::reply(id, reply, has_more));
    }

    /// A failed call: the client runs its failure path.
    pub(super) fn fail(&mut self, id: u64) {
        self.send(&wire::failure(id));
    }

    /// Closes the socket both ways.
    pub(super) fn shut(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
