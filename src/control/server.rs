//! A session's two control endpoints, served on a thread of their own.
//!
//! The thread multiplexes every connection with poll(2): it never blocks on
//! one client. Each connection has a deadline on its whole request
//! ([`REQUEST_DEADLINE`]), a peer uid may hold at most
//! [`MAX_CONNECTIONS_PER_UID`] connections (a new one pushes out that uid's
//! oldest unanswered one), and the thread holds at most [`MAX_CONNECTIONS`].
//! So slow or idle connections cost their owner, never another user's
//! trigger, and the trigger socket is served beside the control socket, not
//! behind it.
//!
//! A checked request goes to the event loop (a channel plus a wake-up pipe
//! the loop polls); the loop's answer comes back the same way and is written
//! without blocking. When the loop does not answer within [`REPLY_DEADLINE`]
//! (a long write pass), the client is told its request is queued: the loop
//! still acts on it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TryRecvError, TrySendError, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::fs::{AtFlags, Mode};
use rustix::time::Timespec;

use super::ControlError;
use super::runtime_dir::RuntimeDir;
use super::wire::{self, Endpoint, Refusal, Reply, Request};
use crate::transport::peer::{MAX_UIDS, OTHER_UIDS};

/// How long a client has, from connecting, to send its whole request.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(1);
/// How long a connection waits for the event loop's answer.
pub(crate) const REPLY_DEADLINE: Duration = Duration::from_secs(3);
/// How long a client has to take its reply.
const WRITE_DEADLINE: Duration = Duration::from_secs(1);
/// Connections one peer uid may hold open at once.
pub(crate) const MAX_CONNECTIONS_PER_UID: usize = 8;
/// Connections the thread holds at once.
pub(crate) const MAX_CONNECTIONS: usize = 128;
/// How long a stopping server still writes the replies it has.
const FINAL_WRITE_GRACE: Duration = Duration::from_millis(200);
/// Connections taken from one listener per wake-up, so neither socket
/// waits behind the other.
const ACCEPT_BATCH: usize = 16;

/// Where the event loop's answer to one request goes.
#[derive(Debug)]
struct ReplyTo {
    id: u64,
    tx: Sender<(u64, Reply)>,
    /// The serving thread's wake-up pipe.
    wake: Arc<OwnedFd>,
}

/// A checked request waiting for the event loop's answer.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub request: Request,
    pub(crate) peer_uid: u32,
    reply: ReplyTo,
}

impl Incoming {
    /// Sends the reply to the waiting client.
    pub(crate) fn answer(self, reply: Reply) {
        // The client may have gone: nothing to do then.
        let _ = self.reply.tx.send((self.reply.id, reply));
        let _ = rustix::io::write(&*self.reply.wake, &[1]);
    }
}

/// Socket names of the session with process id `pid`.
pub(crate) fn endpoint_names(pid: u32) -> (String, String) {
    (
        format!("recorder-{pid}.trigger"),
        format!("recorder-{pid}.control"),
    )
}

/// Socket paths of the session with process id `pid` in `dir`.
pub(crate) fn endpoint_paths(dir: &Path, pid: u32) -> (PathBuf, PathBuf) {
    let (t, c) = endpoint_names(pid);
    (dir.join(t), dir.join(c))
}

/// A running control server.
pub(crate) struct ControlServer {
    requests: Receiver<Incoming>,
    wake_rx: OwnedFd,
    refused: Arc<AtomicU64>,
    refused_by_uid: RefusedByUid,
    stopping: Arc<AtomicBool>,
    /// Dropping it (closing the pipe) tells the thread to stop: it sleeps in
    /// poll(2) with no timeout when idle, so an idle session costs no wake-ups.
    stop_tx: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    /// The worker of endpoints bound and not served yet.
    held: Option<Box<Worker>>,
    /// The endpoints' directory and names.
    endpoints: Option<(RuntimeDir, (String, String))>,
    paths: (PathBuf, PathBuf),
}

impl ControlServer {
    /// Binds both endpoints of session `pid` (owned by `owner_uid`) in the
    /// checked directory `dir` and starts serving them.
    #[cfg(test)]
    pub(crate) fn start(dir: &RuntimeDir, pid: u32, owner_uid: u32) -> Result<Self, ControlError> {
        let mut server = Self::bind(dir, pid, owner_uid)?;
        server.serve()?;
        Ok(server)
    }

    /// Starts serving the endpoints [`bind`](Self::bind) made: until then
    /// clients wait in the listen backlog and no byte of theirs is read (a
    /// root session serves only once it has given up root). Once only.
    pub(crate) fn serve(&mut self) -> Result<(), ControlError> {
        let Some(worker) = self.held.take() else {
            return Ok(());
        };
        let thread = std::thread::Builder::new()
            .name("recorder-control".into())
            .spawn(move || worker.run())
            .map_err(|source| ControlError::Socket {
                path: self.paths.0.display().to_string(),
                source,
            })?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Binds both endpoints of session `pid` (owned by `owner_uid`) in the
    /// checked directory `dir`, without serving them yet.
    pub(crate) fn bind(dir: &RuntimeDir, pid: u32, owner_uid: u32) -> Result<Self, ControlError> {
        let names = endpoint_names(pid);
        let trigger = bind(dir, &names.0, 0o666)?;
        let control = match bind(dir, &names.1, 0o600) {
            Ok(c) => c,
            Err(e) => {
                let _ = dir.remove(&names.0);
                return Err(e);
            }
        };
        let sock_err = |source| ControlError::Socket {
            path: dir.path().display().to_string(),
            source,
        };
        let pipe = |flags| rustix::pipe::pipe_with(flags).map_err(|e| sock_err(e.into()));
        use rustix::pipe::PipeFlags;
        let (wake_rx, wake_tx) = pipe(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let (stop_rx, stop_tx) = pipe(PipeFlags::CLOEXEC)?;
        let (answer_rx, answer_wake) = pipe(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(2 * MAX_CONNECTIONS);
        let (reply_tx, reply_rx) = channel();
        let refused = Arc::new(AtomicU64::new(0));
        let refused_by_uid = RefusedByUid::default();
        let stopping = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            trigger,
            control,
            tx,
            wake_tx,
            refused: refused.clone(),
            refused_by_uid: refused_by_uid.clone(),
            stopping: stopping.clone(),
            stop_rx,
            answer_rx,
            answer_wake: Arc::new(answer_wake),
            reply_tx,
            reply_rx,
            owner_uid,
            conns: Vec::new(),
            next_id: 0,
        };
        let paths = (dir.path().join(&names.0), dir.path().join(&names.1));
        Ok(Self {
            requests: rx,
            wake_rx,
            refused,
            refused_by_uid,
            stopping,
            stop_tx: Some(stop_tx),
            thread: None,
            held: Some(Box::new(worker)),
            endpoints: Some((dir.clone(), names)),
            paths,
        })
    }

    /// Readable when requests are pending: the event loop polls it.
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake_rx.as_fd()
    }

    /// Takes the pending requests (and clears the wake-up pipe).
    pub(crate) fn pending(&self) -> Vec<Incoming> {
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

    /// Requests refused so far (malformed, oversized, not permitted, too
    /// slow, pushed out by a peer's connection cap).
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The same, by the peer's uid (uids past `transport::peer::MAX_UIDS` share
    /// `transport::peer::OTHER_UIDS`).
    pub(crate) fn refused_by_uid(&self) -> Vec<(u32, u64)> {
        self.refused_by_uid.snapshot()
    }

    /// Tells the server the session is stopping: a further stop request is
    /// answered at once ("stopping") instead of waiting for a loop that is
    /// busy finishing the trace.
    pub(crate) fn mark_stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        drop(self.stop_tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some((dir, names)) = &self.endpoints {
            let _ = dir.remove(&names.0);
            let _ = dir.remove(&names.1);
        }
    }
}

/// Binds `name` in `dir` through its checked descriptor and gives it `mode`.
fn bind(dir: &RuntimeDir, name: &str, mode: u32) -> Result<UnixListener, ControlError> {
    let err = |source| ControlError::Socket {
        path: dir.path().join(name).display().to_string(),
        source,
    };
    // A socket left by a killed session with our pid (pids get reused), or
    // an entry someone planted under our name: in a sticky directory only
    // its owner or root may remove it; otherwise bind fails and says so.
    dir.remove(name).map_err(err)?;
    let l = UnixListener::bind(dir.pinned_path(name)).map_err(err)?;
    // The entry is ours and the directory is sticky: nobody can swap it
    // between bind and chmod.
    rustix::fs::chmodat(dir.fd(), name, Mode::from_raw_mode(mode), AtFlags::empty())
        .map_err(|e| err(e.into()))?;
    l.set_nonblocking(true).map_err(err)?;
    Ok(l)
}

/// Requests refused per peer uid, shared with the server's owner; bounded
/// as the producer quotas are (`transport::peer::MAX_UIDS`). A count is
/// for the log: a poisoned map is skipped, not trusted.
#[derive(Clone, Debug, Default)]
struct RefusedByUid(Arc<std::sync::Mutex<std::collections::BTreeMap<u32, u64>>>);

impl RefusedByUid {
    fn add(&self, uid: u32) {
        let Ok(mut m) = self.0.lock() else { return };
        let key = if m.contains_key(&uid) || m.len() < MAX_UIDS {
            uid
        } else {
            OTHER_UIDS
        };
        *m.entry(key).or_default() += 1;
    }

    fn snapshot(&self) -> Vec<(u32, u64)> {
        self.0
            .lock()
            .map(|m| m.iter().map(|(u, n)| (*u, *n)).collect())
            .unwrap_or_default()
    }
}

/// What a connection is doing.
enum Phase {
    /// Reading the request line.
    Reading { buf: Vec<u8> },
    /// The event loop has the request; `stop` when it is a stop request.
    Waiting { stop: bool },
    /// Writing the reply.
    Writing { out: Vec<u8>, pos: usize },
}

struct Conn {
    id: u64,
    stream: UnixStream,
    endpoint: Endpoint,
    uid: u32,
    phase: Phase,
    deadline: Instant,
}

impl Conn {
    /// Ready to be pushed out for a newer connection (the loop does not
    /// hold its request).
    fn evictable(&self) -> bool {
        !matches!(self.phase, Phase::Waiting { .. })
    }
}

struct Worker {
    trigger: UnixListener,
    control: UnixListener,
    tx: SyncSender<Incoming>,
    wake_tx: OwnedFd,
    refused: Arc<AtomicU64>,
    refused_by_uid: RefusedByUid,
    stopping: Arc<AtomicBool>,
    /// Read end of the stop pipe: readable (end of file) once the server is dropped.
    stop_rx: OwnedFd,
    /// Readable when the event loop answered a request.
    answer_rx: OwnedFd,
    answer_wake: Arc<OwnedFd>,
    reply_tx: Sender<(u64, Reply)>,
    reply_rx: Receiver<(u64, Reply)>,
    owner_uid: u32,
    conns: Vec<Conn>,
    next_id: u64,
}

impl Worker {
    fn run(mut self) {
        loop {
            let now = Instant::now();
            let timeout = self
                .conns
                .iter()
                .map(|c| c.deadline.saturating_duration_since(now))
                .min()
                .map(|d| Timespec {
                    tv_sec: d.as_secs() as i64,
                    // Round up so the deadline has passed on wake-up.
                    tv_nsec: i64::from(d.subsec_nanos()) + 1_000_000,
                })
                .map(|mut t| {
                    if t.tv_nsec >= 1_000_000_000 {
                        t.tv_sec += 1;
                        t.tv_nsec -= 1_000_000_000;
                    }
                    t
                });
            // Connections waiting on the loop are left out: poll(2) would
            // report a hang-up on them at once, again and again.
            let polled: Vec<u64> = self
                .conns
                .iter()
                .filter(|c| c.evictable())
                .map(|c| c.id)
                .collect();
            let (fixed, conn_ready) = {
                let mut fds = vec![
                    PollFd::new(&self.trigger, PollFlags::IN),
                    PollFd::new(&self.control, PollFlags::IN),
                    PollFd::new(&self.stop_rx, PollFlags::IN),
                    PollFd::new(&self.answer_rx, PollFlags::IN),
                ];
                // Same order as `polled`: the connections not waiting.
                for c in self.conns.iter().filter(|c| c.evictable()) {
                    let flags = match c.phase {
                        Phase::Writing { .. } => PollFlags::OUT,
                        _ => PollFlags::IN,
                    };
                    fds.push(PollFd::new(&c.stream, flags));
                }
                if poll(&mut fds, timeout.as_ref()).is_err() {
                    // EINTR (or a transient ENOMEM): poll again.
                    continue;
                }
                let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
                (ready[..4].to_vec(), ready[4..].to_vec())
            };
            if fixed[2] {
                return self.finish();
            }
            if fixed[3] {
                self.take_answers();
            }
            let ids: Vec<u64> = polled
                .iter()
                .zip(&conn_ready)
                .filter(|(_, r)| **r)
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                self.progress(id);
            }
            self.expire();
            if fixed[0] {
                self.accept(Endpoint::Trigger);
            }
            if fixed[1] {
                self.accept(Endpoint::Control);
            }
        }
    }

    /// The server is being dropped: answers the loop gave are still
    /// delivered (briefly), everyone else learns the session is ending.
    fn finish(mut self) {
        self.take_answers();
        let ids: Vec<u64> = self.conns.iter().map(|c| c.id).collect();
        for id in ids {
            if !matches!(self.conn(id).map(|c| &c.phase), Some(Phase::Writing { .. })) {
                self.refuse_with(id, &Refusal::Busy("the session is ending"));
            }
        }
        let until = Instant::now() + FINAL_WRITE_GRACE;
        while !self.conns.is_empty() && Instant::now() < until {
            let mut fds: Vec<PollFd<'_>> = self
                .conns
                .iter()
                .map(|c| PollFd::new(&c.stream, PollFlags::OUT))
                .collect();
            let left = until.saturating_duration_since(Instant::now());
            let ts = Timespec {
                tv_sec: 0,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let _ = poll(&mut fds, Some(&ts));
            drop(fds);
            let ids: Vec<u64> = self.conns.iter().map(|c| c.id).collect();
            for id in ids {
                self.progress(id);
            }
        }
    }

    fn conn(&mut self, id: u64) -> Option<&mut Conn> {
        self.conns.iter_mut().find(|c| c.id == id)
    }

    fn close(&mut self, id: u64) {
        self.conns.retain(|c| c.id != id);
    }

    fn refuse(&self, uid: u32, why: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.refused_by_uid.add(uid);
        log::debug!("control request refused: {why}");
    }

    /// Starts writing `reply` on connection `id`.
    fn reply(&mut self, id: u64, reply: &Reply) {
        let out = wire::encode_reply(reply);
        if let Some(c) = self.conn(id) {
            c.phase = Phase::Writing { out, pos: 0 };
            c.deadline = Instant::now() + WRITE_DEADLINE;
        }
        // Most replies fit the socket buffer: write at once.
        self.progress(id);
    }

    fn refuse_with(&mut self, id: u64, refusal: &Refusal) {
        let uid = self.conn(id).map_or(OTHER_UIDS, |c| c.uid);
        self.refuse(uid, &refusal.to_string());
        self.reply(id, &Reply::Refused(refusal.to_string()));
    }

    fn take_answers(&mut self) {
        let mut drain = [0u8; 64];
        while matches!(rustix::io::read(&self.answer_rx, &mut drain), Ok(n) if n > 0) {}
        while let Ok((id, reply)) = self.reply_rx.try_recv() {
            let Some(c) = self.conn(id) else { continue };
            let Phase::Waiting { stop } = c.phase else {
                continue;
            };
            if stop && reply == Reply::Stopping {
                self.stopping.store(true, Ordering::Relaxed);
            }
            self.reply(id, &reply);
        }
    }

    /// Reads or writes what connection `id` is ready for.
    fn progress(&mut self, id: u64) {
        let Some(c) = self.conn(id) else { return };
        match &mut c.phase {
            Phase::Reading { buf } => {
                let mut chunk = [0u8; 1024];
                let done = loop {
                    match (&c.stream).read(&mut chunk) {
                        // Connected and left without a word: nothing to answer.
                        Ok(0) if buf.is_empty() => break Some(Err(Refusal::Empty)),
                        Ok(0) => break Some(Ok(())),
                        Ok(n) => {
                            buf.extend_from_slice(&chunk[..n]);
                            if buf.len() > wire::MAX_REQUEST_BYTES {
                                break Some(Err(Refusal::TooLarge));
                            }
                            if buf.contains(&b'\n') {
                                break Some(Ok(()));
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break None,
                        Err(e) => {
                            break Some(Err(Refusal::Unread(
                                rustix::io::Errno::from_io_error(&e)
                                    .unwrap_or(rustix::io::Errno::IO),
                            )));
                        }
                    }
                };
                match done {
                    None => {}
                    Some(Err(Refusal::Empty)) => self.close(id),
                    Some(Err(r)) => self.refuse_with(id, &r),
                    Some(Ok(())) => {
                        let line = std::mem::take(buf);
                        self.handle(id, &line);
                    }
                }
            }
            Phase::Writing { out, pos } => {
                let finished = loop {
                    if *pos >= out.len() {
                        break true;
                    }
                    match (&c.stream).write(&out[*pos..]) {
                        Ok(0) => break true,
                        Ok(n) => *pos += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                        // The client went away.
                        Err(_) => break true,
                    }
                };
                if finished {
                    self.close(id);
                }
            }
            Phase::Waiting { .. } => {}
        }
    }

    /// Checks a complete request line and passes it on.
    fn handle(&mut self, id: u64, line: &[u8]) {
        let Some(c) = self.conn(id) else { return };
        let (endpoint, uid) = (c.endpoint, c.uid);
        let request = match wire::decode_request(line, endpoint) {
            Ok(r) => r,
            Err(r) => return self.refuse_with(id, &r),
        };
        if request.owner_only() && uid != 0 && uid != self.owner_uid {
            return self.refuse_with(id, &Refusal::PermissionDenied);
        }
        let stop = matches!(request, Request::Stop {});
        if stop && self.stopping.load(Ordering::Relaxed) {
            // Already stopping: the loop may be busy writing the trace.
            return self.reply(id, &Reply::Stopping);
        }
        if let Request::Trigger { names, .. } = &request
            && self.stopping.load(Ordering::Relaxed)
        {
            // A stopping session acts on no trigger (listed or not): say so
            // now rather than "queued" while it writes its last pass.
            let outcomes = names
                .iter()
                .map(|n| wire::TriggerOutcome {
                    name: n.clone(),
                    accepted: false,
                    reason: Some("not_recording".into()),
                })
                .collect();
            return self.reply(id, &Reply::Triggers(outcomes));
        }
        let incoming = Incoming {
            request,
            peer_uid: uid,
            reply: ReplyTo {
                id,
                tx: self.reply_tx.clone(),
                wake: self.answer_wake.clone(),
            },
        };
        match self.tx.try_send(incoming) {
            Ok(()) => {
                let _ = rustix::io::write(&self.wake_tx, &[1]);
                if let Some(c) = self.conn(id) {
                    c.phase = Phase::Waiting { stop };
                    c.deadline = Instant::now() + REPLY_DEADLINE;
                }
            }
            Err(TrySendError::Full(_)) => {
                self.refuse_with(id, &Refusal::Busy("too many requests queued"))
            }
            Err(TrySendError::Disconnected(_)) => {
                self.refuse_with(id, &Refusal::Busy("the session is shutting down"))
            }
        }
    }

    /// Ends connections whose deadline passed.
    fn expire(&mut self) {
        let now = Instant::now();
        let due: Vec<(u64, bool)> = self
            .conns
            .iter()
            .filter(|c| c.deadline <= now)
            .map(|c| (c.id, matches!(c.phase, Phase::Writing { .. })))
            .collect();
        for (id, writing) in due {
            if writing {
                self.close(id);
                continue;
            }
            let waiting = matches!(self.conn(id).map(|c| &c.phase), Some(Phase::Waiting { .. }));
            if waiting {
                // The loop holds the request and will act on it: say so
                // rather than refuse (a trigger is not lost to a long write).
                self.reply(
                    id,
                    &Reply::Queued(format!(
                        "the session is busy (no answer within {} s, e.g. a long write): the request is queued and will be acted on",
                        REPLY_DEADLINE.as_secs()
                    )),
                );
            } else {
                self.refuse_with(id, &Refusal::Slow(REQUEST_DEADLINE.as_millis() as u64));
            }
            // The reply gets one more deadline; a client not reading it is dropped then.
        }
    }

    fn accept(&mut self, endpoint: Endpoint) {
        for _ in 0..ACCEPT_BATCH {
            let l = match endpoint {
                Endpoint::Trigger => &self.trigger,
                Endpoint::Control => &self.control,
            };
            let Ok((stream, _)) = l.accept() else { return };
            let Ok(cred) = crate::transport::peer::of(&stream) else {
                continue;
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let uid = cred.uid;
            let id = self.next_id;
            self.next_id += 1;
            if !self.make_room(uid) {
                // Every connection of that uid waits on the loop: this one
                // is turned away at once.
                self.refuse(uid, "no room for another connection");
                let refusal = Refusal::TooManyConnections(MAX_CONNECTIONS_PER_UID);
                let _ = (&stream).write(&wire::encode_reply(&Reply::Refused(refusal.to_string())));
                continue;
            }
            self.conns.push(Conn {
                id,
                stream,
                endpoint,
                uid,
                phase: Phase::Reading {
                    buf: Vec::with_capacity(256),
                },
                deadline: Instant::now() + REQUEST_DEADLINE,
            });
            self.progress(id);
        }
    }

    /// Makes room for one more connection of `uid`: beyond its cap, or the
    /// thread's, the oldest connection of that uid (or of the uid holding
    /// the most) whose request the loop does not hold is pushed out. False
    /// when there is none to push out.
    fn make_room(&mut self, uid: u32) -> bool {
        let of_uid = self.conns.iter().filter(|c| c.uid == uid).count();
        let victim_uid = if of_uid >= MAX_CONNECTIONS_PER_UID {
            Some(uid)
        } else if self.conns.len() >= MAX_CONNECTIONS {
            let mut per: HashMap<u32, usize> = HashMap::new();
            for c in self.conns.iter().filter(|c| c.evictable()) {
                *per.entry(c.uid).or_default() += 1;
            }
            per.into_iter().max_by_key(|(_, n)| *n).map(|(u, _)| u)
        } else {
            None
        };
        let Some(victim_uid) = victim_uid else {
            return self.conns.len() < MAX_CONNECTIONS;
        };
        let Some(pos) = self
            .conns
            .iter()
            .position(|c| c.uid == victim_uid && c.evictable())
        else {
            return false;
        };
        let victim = self.conns.remove(pos);
        self.refuse(
            victim_uid,
            &format!("uid {victim_uid} holds too many connections"),
        );
        if matches!(victim.phase, Phase::Reading { .. }) {
            // Best effort: a client that reads learns why.
            let refusal = Refusal::TooManyConnections(MAX_CONNECTIONS_PER_UID);
            let _ =
                (&victim.stream).write(&wire::encode_reply(&Reply::Refused(refusal.to_string())));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::client;
    use crate::control::runtime_dir::open_checked;
    use crate::control::wire::TriggerOutcome;

    /// A server in a fresh runtime directory, and its trigger socket's path.
    struct Fixture {
        _tmp: tempfile::TempDir,
        dir: RuntimeDir,
        me: u32,
        uid: u32,
        server: ControlServer,
        tpath: PathBuf,
    }

    impl Fixture {
        fn new() -> Fixture {
            let tmp = tempfile::tempdir().expect("tempdir");
            let dir = open_checked(&tmp.path().join("run")).expect("dir");
            let me = std::process::id();
            let uid = rustix::process::getuid().as_raw();
            let server = ControlServer::start(&dir, me, uid).expect("start");
            let (tpath, _) = endpoint_paths(dir.path(), me);
            Fixture {
                _tmp: tmp,
                dir,
                me,
                uid,
                server,
                tpath,
            }
        }
    }

    fn serve_one(server: &ControlServer) -> Incoming {
        loop {
            if let Some(i) = server.pending().pop() {
                return i;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn serves_a_trigger_and_refuses_garbage() {
        let Fixture {
            _tmp: _t,
            dir,
            me,
            uid,
            server,
            tpath,
        } = Fixture::new();
        let endpoint = client::SessionEndpoint::new(dir.path(), me);
        let ep = endpoint.clone();
        let c = std::thread::spawn(move || {
            let req = Request::Trigger {
                names: vec!["t1".into()],
                producer: "test".into(),
            };
            client::request(&ep.trigger, me, &req, client::deadline()).expect("reply")
        });
        let incoming = serve_one(&server);
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
        assert_eq!(c.join().expect("client"), Reply::Triggers(outcome));

        // Garbage and a query on the trigger socket are refused and counted.
        let mut s = UnixStream::connect(&tpath).expect("connect");
        s.write_all(b"\x00\x01garbage\n").expect("write");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).expect("read");
        assert!(matches!(wire::decode_reply(&buf), Ok(Reply::Refused(_))));
        let r = client::request(&tpath, me, &Request::Query {}, client::deadline()).expect("reply");
        assert!(matches!(r, Reply::Refused(_)));
        assert_eq!(server.refused(), 2);
        // Charged to the uid that sent them, and to no other.
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(server.refused_by_uid(), vec![(uid, 2)]);
        assert_eq!(client::sessions_in(dir.path()).len(), 1);
        drop(server);
        assert!(client::sessions_in(dir.path()).is_empty());
    }

    #[test]
    fn idle_and_slow_connections_do_not_delay_a_trigger() {
        let f = Fixture::new();
        let (me, server) = (f.me, &f.server);
        // The client thread takes its own path.
        let tpath = f.tpath.clone();
        // Idle connections and one that dribbles: more than one uid may hold.
        let mut idle: Vec<UnixStream> = (0..40)
            .map(|_| UnixStream::connect(&tpath).expect("connect"))
            .collect();
        // The newest dribbles: the oldest may already have been pushed out
        // (more than one uid may hold), and a write to it would fail.
        idle.last_mut()
            .expect("connections")
            .write_all(b"{")
            .expect("dribble");
        let t0 = Instant::now();
        let c = std::thread::spawn(move || {
            let req = Request::Trigger {
                names: vec!["t".into()],
                producer: "p".into(),
            };
            client::request(&tpath, me, &req, client::deadline())
        });
        let incoming = serve_one(server);
        incoming.answer(Reply::Triggers(vec![TriggerOutcome {
            name: "t".into(),
            accepted: true,
            reason: None,
        }]));
        assert!(matches!(c.join().expect("client"), Ok(Reply::Triggers(_))));
        assert!(t0.elapsed() < REQUEST_DEADLINE, "{:?}", t0.elapsed());
        // The older connections were pushed out (refused and counted).
        assert!(server.refused() >= 40 - MAX_CONNECTIONS_PER_UID as u64);
        drop(idle);
    }

    #[test]
    fn a_request_the_busy_loop_has_not_answered_is_reported_queued_and_kept() {
        let Fixture {
            _tmp: _t,
            me,
            server,
            tpath,
            ..
        } = Fixture::new();
        let req = Request::Trigger {
            names: vec!["t".into()],
            producer: "p".into(),
        };
        // The loop is busy (nobody calls pending()): the client hears "queued".
        let r = client::request(&tpath, me, &req, client::deadline()).expect("reply");
        assert!(matches!(r, Reply::Queued(_)), "{r:?}");
        // The request is still there for the loop.
        let mut got = server.pending();
        assert_eq!(got.len(), 1);
        assert_eq!(got.pop().map(|i| i.request), Some(req));
    }

    #[test]
    fn a_uid_whose_requests_all_wait_on_the_loop_gets_no_more_room() {
        let Fixture {
            _tmp: _t,
            dir: _,
            me: _,
            uid: _,
            server,
            tpath,
        } = Fixture::new();
        let req = wire::encode_request(&Request::Trigger {
            names: vec!["t".into()],
            producer: "p".into(),
        });
        let waiting: Vec<UnixStream> = (0..MAX_CONNECTIONS_PER_UID)
            .map(|_| {
                let mut s = UnixStream::connect(&tpath).expect("connect");
                s.write_all(&req).expect("write");
                s
            })
            .collect();
        // The loop holds them all, unanswered.
        let t0 = Instant::now();
        let mut held = Vec::new();
        while held.len() < MAX_CONNECTIONS_PER_UID {
            assert!(t0.elapsed() < REPLY_DEADLINE, "requests reached the loop");
            held.extend(server.pending());
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut s = UnixStream::connect(&tpath).expect("connect");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).expect("read");
        assert!(
            matches!(wire::decode_reply(&buf), Ok(Reply::Refused(m)) if m.contains("too many connections")),
            "{}",
            String::from_utf8_lossy(&buf)
        );
        assert!(t0.elapsed() < REPLY_DEADLINE, "refused at once");
        drop((waiting, held));
    }

    /// A server of this process marked stopping, in a directory of its
    /// own, with its (trigger, control) socket paths.
    fn stopping_server() -> (tempfile::TempDir, ControlServer, (PathBuf, PathBuf)) {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = open_checked(&t.path().join("run")).expect("dir");
        let me = std::process::id();
        let uid = rustix::process::getuid().as_raw();
        let server = ControlServer::start(&dir, me, uid).expect("start");
        server.mark_stopping();
        let paths = endpoint_paths(dir.path(), me);
        (t, server, paths)
    }

    #[test]
    fn a_stop_while_stopping_is_answered_at_once() {
        let (_t, server, (_, cpath)) = stopping_server();
        let me = std::process::id();
        let r = client::request(&cpath, me, &Request::Stop {}, client::deadline()).expect("reply");
        assert_eq!(r, Reply::Stopping);
        assert!(server.pending().is_empty(), "the loop was not asked");
    }

    #[test]
    fn a_trigger_while_stopping_is_refused_at_once_not_queued() {
        let (_t, server, (tpath, _)) = stopping_server();
        let me = std::process::id();
        let req = Request::Trigger {
            names: vec!["unlisted".into(), "listed".into()],
            producer: "p".into(),
        };
        let t0 = Instant::now();
        let r = client::request(&tpath, me, &req, client::deadline()).expect("reply");
        assert!(t0.elapsed() < REPLY_DEADLINE, "answered at once");
        let Reply::Triggers(outcomes) = r else {
            panic!("{r:?}")
        };
        assert_eq!(outcomes.len(), 2);
        assert!(
            outcomes
                .iter()
                .all(|o| !o.accepted && o.reason.as_deref() == Some("not_recording"))
        );
        assert!(server.pending().is_empty(), "the loop was not asked");
    }
}
