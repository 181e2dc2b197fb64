//! A session's two control endpoints, served on a thread of their own.
//!
//! The thread accepts a connection, reads one request line under a short
//! deadline, checks it and the peer's credentials, hands a valid request to
//! the event loop (a channel plus a wake-up pipe the loop polls), waits for
//! the reply (bounded) and writes it back. A slow or hostile client costs
//! only its own deadline on this thread, never the session's loop.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, poll};

use super::ControlError;
use super::message::{self, Endpoint, Refusal, Reply, Request};

/// How long a client has to send its request.
const READ_DEADLINE: Duration = Duration::from_millis(500);
/// How long the thread waits for the event loop's reply.
const REPLY_DEADLINE: Duration = Duration::from_secs(5);

/// A checked request waiting for the event loop's answer.
#[derive(Debug)]
pub struct Incoming {
    pub request: Request,
    pub peer_uid: u32,
    pub peer_pid: u32,
    reply: SyncSender<Reply>,
}

impl Incoming {
    /// Sends the reply to the waiting client.
    pub fn answer(self, reply: Reply) {
        // The client may have gone: nothing to do then.
        let _ = self.reply.send(reply);
    }
}

/// Socket paths of the session with process id `pid` in `dir`.
pub fn endpoint_paths(dir: &Path, pid: u32) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("recorder-{pid}.trigger")),
        dir.join(format!("recorder-{pid}.control")),
    )
}

/// A running control server.
pub struct ControlServer {
    requests: Receiver<Incoming>,
    wake_rx: OwnedFd,
    refused: Arc<AtomicU64>,
    /// Dropping it (closing the pipe) tells the thread to stop: it sleeps in
    /// poll(2) with no timeout, so an idle session costs no wake-ups.
    stop_tx: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    paths: (PathBuf, PathBuf),
}

impl ControlServer {
    /// Binds both endpoints of session `pid` (owned by `owner_uid`) in `dir`
    /// and starts serving them.
    pub fn start(dir: &Path, pid: u32, owner_uid: u32) -> Result<Self, ControlError> {
        let (trigger_path, control_path) = endpoint_paths(dir, pid);
        let trigger = bind(&trigger_path, 0o666)?;
        let control = bind(&control_path, 0o600)?;
        let sock_err = |source| ControlError::Socket {
            path: dir.display().to_string(),
            source,
        };
        let (wake_rx, wake_tx) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )
        .map_err(|e| sock_err(e.into()))?;
        let (stop_rx, stop_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| sock_err(e.into()))?;
        let (tx, rx) = sync_channel(16);
        let refused = Arc::new(AtomicU64::new(0));
        let worker = Worker {
            trigger,
            control,
            tx,
            wake_tx,
            refused: refused.clone(),
            stop_rx,
            owner_uid,
        };
        let thread = std::thread::Builder::new()
            .name("recorder-control".into())
            .spawn(move || worker.run())
            .map_err(sock_err)?;
        Ok(Self {
            requests: rx,
            wake_rx,
            refused,
            stop_tx: Some(stop_tx),
            thread: Some(thread),
            paths: (trigger_path, control_path),
        })
    }

    /// Readable when requests are pending: the event loop polls it.
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake_rx.as_fd()
    }

    /// Takes the pending requests (and clears the wake-up pipe).
    pub fn pending(&self) -> Vec<Incoming> {
        let mut drain = [0u8; 64];
        while matches!(rustix::io::read(&self.wake_rx, &mut drain), Ok(n) if n > 0) {}
        let mut out = Vec::new();
        loop {
            match self.requests.try_recv() {
                Ok(i) => out.push(i),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return out,
            }
        }
    }

    /// Requests refused so far (malformed, oversized, not permitted).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The two socket paths.
    pub fn paths(&self) -> (&Path, &Path) {
        (&self.paths.0, &self.paths.1)
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        drop(self.stop_tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.paths.0);
        let _ = std::fs::remove_file(&self.paths.1);
    }
}

fn bind(path: &Path, mode: u32) -> Result<UnixListener, ControlError> {
    let err = |source| ControlError::Socket {
        path: path.display().to_string(),
        source,
    };
    // A socket file left by a killed session with our pid (pids get reused).
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    Ok(l)
}

struct Worker {
    trigger: UnixListener,
    control: UnixListener,
    tx: SyncSender<Incoming>,
    wake_tx: OwnedFd,
    refused: Arc<AtomicU64>,
    /// Read end of the stop pipe: readable (end of file) once the server is dropped.
    stop_rx: OwnedFd,
    owner_uid: u32,
}

impl Worker {
    fn run(self) {
        loop {
            let mut fds = [
                PollFd::new(&self.trigger, PollFlags::IN),
                PollFd::new(&self.control, PollFlags::IN),
                PollFd::new(&self.stop_rx, PollFlags::IN),
            ];
            if poll(&mut fds, None).is_err() {
                // EINTR (or a transient ENOMEM): poll again.
                continue;
            }
            let ready = fds.map(|f| !f.revents().is_empty());
            if ready[2] {
                return;
            }
            if ready[0] {
                self.accept(&self.trigger, Endpoint::Trigger);
            }
            if ready[1] {
                self.accept(&self.control, Endpoint::Control);
            }
        }
    }

    fn accept(&self, l: &UnixListener, endpoint: Endpoint) {
        while let Ok((stream, _)) = l.accept() {
            let reply = match self.serve(&stream, endpoint) {
                Ok(reply) => reply,
                Err(refusal) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    log::debug!("control request refused: {refusal}");
                    Reply::Refused(refusal.to_string())
                }
            };
            let mut s = &stream;
            let _ = s.write_all(&message::encode_reply(&reply));
        }
    }

    fn serve(&self, stream: &UnixStream, endpoint: Endpoint) -> Result<Reply, Refusal> {
        let io = |e: std::io::Error| Refusal::Malformed(e.to_string());
        stream.set_nonblocking(false).map_err(io)?;
        stream.set_read_timeout(Some(READ_DEADLINE)).map_err(io)?;
        stream.set_write_timeout(Some(READ_DEADLINE)).map_err(io)?;
        let cred = rustix::net::sockopt::socket_peercred(stream).map_err(|e| io(e.into()))?;
        let line = read_line(stream)?;
        let request = message::decode_request(&line, endpoint)?;
        let uid = cred.uid.as_raw();
        if matches!(request, Request::Query {} | Request::Stop {})
            && uid != 0
            && uid != self.owner_uid
        {
            return Err(Refusal::PermissionDenied);
        }
        let (reply_tx, reply_rx) = sync_channel(1);
        let incoming = Incoming {
            request,
            peer_uid: uid,
            peer_pid: cred.pid.as_raw_nonzero().get() as u32,
            reply: reply_tx,
        };
        self.tx
            .send(incoming)
            .map_err(|_| Refusal::Malformed("session is shutting down".into()))?;
        let _ = rustix::io::write(&self.wake_tx, &[1]);
        reply_rx
            .recv_timeout(REPLY_DEADLINE)
            .map_err(|_| Refusal::Malformed("session did not answer in time".into()))
    }
}

/// Reads one line of at most `MAX_REQUEST_BYTES` (the newline included).
fn read_line(mut stream: &UnixStream) -> Result<Vec<u8>, Refusal> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(buf),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > message::MAX_REQUEST_BYTES {
                    return Err(Refusal::TooLarge);
                }
                if buf.contains(&b'\n') {
                    return Ok(buf);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Refusal::Malformed(format!("reading the request: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::client;
    use crate::control::message::TriggerOutcome;

    #[test]
    fn serves_a_trigger_and_refuses_garbage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = std::process::id();
        let uid = rustix::process::getuid().as_raw();
        let server = ControlServer::start(dir.path(), me, uid).expect("start");
        let (tpath, _) = endpoint_paths(dir.path(), me);
        let client = std::thread::spawn(move || {
            let req = Request::Trigger {
                names: vec!["t1".into()],
                producer: "test".into(),
            };
            client::request(&tpath, me, &req).expect("reply")
        });
        let incoming = loop {
            let mut p = server.pending();
            if let Some(i) = p.pop() {
                break i;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(incoming.peer_uid, uid);
        assert!(
            matches!(&incoming.request, Request::Trigger { names, .. } if names == &["t1".to_string()])
        );
        let outcome = vec![TriggerOutcome {
            name: "t1".into(),
            accepted: true,
            reason: None,
        }];
        incoming.answer(Reply::Triggers(outcome.clone()));
        assert_eq!(client.join().expect("client"), Reply::Triggers(outcome));

        // Garbage and a query on the trigger socket are refused and counted.
        let (tpath, _) = endpoint_paths(dir.path(), me);
        let mut s = UnixStream::connect(&tpath).expect("connect");
        s.write_all(b"\x00\x01garbage\n").expect("write");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).expect("read");
        assert!(matches!(message::decode_reply(&buf), Ok(Reply::Refused(_))));
        let r = client::request(&tpath, me, &Request::Query {}).expect("reply");
        assert!(matches!(r, Reply::Refused(_)));
        assert_eq!(server.refused(), 2);
        assert_eq!(client::sessions_in(dir.path()).len(), 1);
        drop(server);
        assert!(client::sessions_in(dir.path()).is_empty());
    }
}
