//! The client side: `recorder trigger`, `query` and `stop` find the live
//! sessions in the runtime directory and talk to them.
//!
//! Any local user may put sockets in that directory, so an answer is
//! believed only from the process that owns the session: the socket's peer
//! credentials must name the pid in the socket's name, and a uid that is
//! root or owns the socket file. Every session is contacted at once (one
//! thread each), each exchange is non-blocking under one overall deadline
//! ([`CLIENT_DEADLINE`]) and replies are read up to
//! [`wire::MAX_REPLY_BYTES`]: a hostile socket costs at most the deadline,
//! never memory, and never delays the answer of another session.
//! Endpoints whose process is gone are stale: they are removed where that
//! is safe (a directory that passes the session's checks) and skipped.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use super::ControlError;
use super::runtime_dir::{self, RuntimeDir};
use super::server::{self, endpoint_names};
use super::wire::{self, BadReply, InvalidReply, Reply, Request, SessionStatus, TriggerOutcome};

/// The most one client command waits, for all sessions together. Longer
/// than the server's own reply deadline, so a busy session's refusal
/// (which says why) arrives before the client gives up.
pub(crate) const CLIENT_DEADLINE: Duration = Duration::from_secs(5);
/// The most sessions one command contacts (root's and the caller's first).
pub(crate) const MAX_SESSIONS: usize = 256;

const _: () = assert!(CLIENT_DEADLINE.as_millis() > server::REPLY_DEADLINE.as_millis());

/// The deadline of a command started now.
pub(crate) fn deadline() -> Instant {
    Instant::now() + CLIENT_DEADLINE
}

/// One live session's endpoints.
#[derive(Clone, Debug)]
pub(crate) struct SessionEndpoint {
    pub pid: u32,
    pub trigger: PathBuf,
    pub control: PathBuf,
    /// Owner of the trigger socket file.
    pub(crate) owner_uid: u32,
    /// The directory, when stale entries may be removed from it.
    cleanup: Option<RuntimeDir>,
}

impl SessionEndpoint {
    /// The endpoints of session `pid` in `dir` (nothing checked).
    pub(crate) fn new(dir: &Path, pid: u32) -> Self {
        let (trigger, control) = server::endpoint_paths(dir, pid);
        let owner_uid = std::fs::symlink_metadata(&trigger).map_or(u32::MAX, |m| m.uid());
        Self {
            pid,
            trigger,
            control,
            owner_uid,
            cleanup: None,
        }
    }

    /// Removes the session's entries after it was found dead.
    fn remove_stale(&self) {
        if let Some(dir) = &self.cleanup {
            log::debug!("removing stale endpoints of session {}", self.pid);
            let (t, c) = endpoint_names(self.pid);
            let _ = dir.remove(&t);
            let _ = dir.remove(&c);
        }
    }
}

fn pid_alive(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    // EPERM means it exists but belongs to someone else.
    !matches!(
        rustix::process::test_kill_process(p),
        Err(rustix::io::Errno::SRCH)
    )
}

/// The sessions listening in `dir`, with stale endpoints removed (where safe).
pub(crate) fn sessions_in(dir: &Path) -> Vec<SessionEndpoint> {
    let Some((rd, trusted)) = runtime_dir::open_for_client(dir) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let me = rustix::process::geteuid().as_raw();
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("recorder-"))
            .and_then(|n| n.strip_suffix(".trigger"))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(meta) = e.metadata() else { continue };
        if !meta.file_type().is_socket() {
            continue;
        }
        let mut ep = SessionEndpoint::new(dir, pid);
        ep.owner_uid = meta.uid();
        // Only entries we could have made, in a directory a session would
        // use: never delete on someone else's word.
        if trusted && (me == 0 || meta.uid() == me) {
            ep.cleanup = Some(rd.clone());
        }
        if !pid_alive(pid) {
            ep.remove_stale();
            continue;
        }
        out.push(ep);
    }
    // Root's sessions, then the caller's, then the rest; at most MAX_SESSIONS.
    out.sort_by_key(|s| (s.owner_uid != 0, s.owner_uid != me, s.pid));
    if out.len() > MAX_SESSIONS {
        log::warn!(
            "{} has {} session sockets; contacting the first {MAX_SESSIONS}",
            dir.display(),
            out.len()
        );
        out.truncate(MAX_SESSIONS);
    }
    out.sort_by_key(|s| s.pid);
    out
}

/// The sessions in every candidate runtime directory.
pub(crate) fn sessions() -> Vec<SessionEndpoint> {
    let mut all: Vec<SessionEndpoint> = runtime_dir::candidates()
        .iter()
        .flat_map(|d| sessions_in(d))
        .collect();
    all.truncate(MAX_SESSIONS);
    all
}

fn remaining(deadline: Instant, pid: u32) -> Result<Duration, ControlError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ControlError::Timeout {
            pid,
            secs: CLIENT_DEADLINE.as_secs(),
        });
    }
    Ok(left)
}

fn wait(
    stream: &UnixStream,
    flags: PollFlags,
    deadline: Instant,
    pid: u32,
) -> Result<(), ControlError> {
    let left = remaining(deadline, pid)?;
    let ts = rustix::time::Timespec {
        tv_sec: left.as_secs() as i64,
        tv_nsec: i64::from(left.subsec_nanos()),
    };
    let mut fds = [PollFd::new(stream, flags)];
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(_) | Err(Errno::INTR) => Ok(()),
        Err(e) => Err(ControlError::Socket {
            path: String::new(),
            source: e.into(),
        }),
    }
}

/// Connects without blocking (a listener whose queue is full makes a
/// blocking connect wait forever) and checks who serves the socket.
fn connect(path: &Path, pid: u32, deadline: Instant) -> Result<(UnixStream, u32), ControlError> {
    let sock = |source: std::io::Error| ControlError::Socket {
        path: path.display().to_string(),
        source,
    };
    let addr = SocketAddrUnix::new(path).map_err(|e| sock(e.into()))?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| sock(e.into()))?;
    loop {
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => break,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                remaining(deadline, pid)?;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(sock(e.into())),
        }
    }
    let stream = UnixStream::from(fd);
    let peer = crate::transport::peer::of(&stream).map_err(sock)?;
    let (peer_pid, peer_uid) = (peer.pid, peer.uid);
    let file_uid = std::fs::symlink_metadata(path).map_or(u32::MAX, |m| m.uid());
    if peer_pid != pid || (peer_uid != 0 && peer_uid != file_uid) {
        return Err(ControlError::Impostor {
            path: path.display().to_string(),
            pid,
            peer_pid,
            peer_uid,
        });
    }
    Ok((stream, peer_uid))
}

/// Sends one request to session `pid` at `path` and reads the reply, all
/// before `deadline`.
#[cfg(test)]
pub(crate) fn request(
    path: &Path,
    pid: u32,
    req: &Request,
    deadline: Instant,
) -> Result<Reply, ControlError> {
    request_from(path, pid, req, deadline).map(|(reply, _)| reply)
}

/// One request to session `pid` at `path`, its reply read before
/// `deadline`, with the uid the kernel gives for the process that
/// answered (SO_PEERCRED): what a session says of itself is not believed.
pub(crate) fn request_from(
    path: &Path,
    pid: u32,
    req: &Request,
    deadline: Instant,
) -> Result<(Reply, u32), ControlError> {
    // A session under load may close a connection it cannot take before it
    // reads the request (EPIPE or ECONNRESET on our write, or nothing to
    // read): asked again, a little later, it usually takes it.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match request_once(path, pid, req, deadline) {
            Err(ControlError::Socket { source, .. })
                if closed_early(&source)
                    && attempts < CLOSED_ATTEMPTS
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20 * u64::from(attempts)));
            }
            Err(ControlError::Socket { source, .. }) if closed_early(&source) => {
                return Err(ControlError::Closed { pid, attempts });
            }
            r => return r,
        }
    }
}

/// Tries of one request whose connection the session closes early.
const CLOSED_ATTEMPTS: u32 = 4;

/// The session closed the connection before answering.
fn closed_early(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::UnexpectedEof
    )
}

fn request_once(
    path: &Path,
    pid: u32,
    req: &Request,
    deadline: Instant,
) -> Result<(Reply, u32), ControlError> {
    let sock = |source: std::io::Error| ControlError::Socket {
        path: path.display().to_string(),
        source,
    };
    let (mut s, peer_uid) = connect(path, pid, deadline)?;
    let out = wire::encode_request(req);
    let mut pos = 0;
    // A session that refuses the connection may have said why before
    // closing it: its words are read even when our write failed.
    let mut write_failed = None;
    while pos < out.len() {
        match s.write(&out[pos..]) {
            Ok(0) => return Err(sock(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => pos += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                wait(&s, PollFlags::OUT, deadline, pid)?
            }
            Err(e) if closed_early(&e) => {
                write_failed = Some(e);
                break;
            }
            Err(e) => return Err(sock(e)),
        }
    }
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) if buf.is_empty() => {
                return Err(sock(
                    write_failed.unwrap_or_else(|| std::io::ErrorKind::UnexpectedEof.into()),
                ));
            }
            Ok(0) => break,
            Err(e) if buf.is_empty() && closed_early(&e) => {
                return Err(sock(write_failed.unwrap_or(e)));
            }
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > wire::MAX_REPLY_BYTES {
                    return Err(ControlError::BadReply {
                        pid,
                        source: BadReply::TooLarge,
                    });
                }
                if buf.ends_with(b"\n") {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                wait(&s, PollFlags::IN, deadline, pid)?
            }
            Err(e) => return Err(sock(e)),
        }
    }
    wire::decode_reply(&buf)
        .map(|reply| (reply, peer_uid))
        .map_err(|source| ControlError::BadReply { pid, source })
}

/// Runs `f` for every session at once; results in the sessions' order.
fn each_session<T: Send>(
    sessions: &[SessionEndpoint],
    f: impl Fn(&SessionEndpoint) -> T + Sync,
) -> Vec<(u32, T)> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = sessions
            .iter()
            .map(|s| {
                let h = std::thread::Builder::new()
                    .name("recorder-client".into())
                    .stack_size(256 * 1024)
                    .spawn_scoped(scope, move || f(s));
                (s, h)
            })
            .collect();
        handles
            .into_iter()
            .map(|(s, h)| {
                let r = match h {
                    Ok(h) => h.join().unwrap_or_else(|_| f(s)),
                    // No thread to be had: ask in this one.
                    Err(_) => f(s),
                };
                (s.pid, r)
            })
            .collect()
    })
}

/// A socket nobody listens on that is older than this belongs to a dead
/// session whose pid was reused (a live one listens microseconds after it
/// binds).
const STALE_AFTER: Duration = Duration::from_secs(2);

/// A request to one session, with a stale endpoint removed when nothing
/// listens on it any more.
fn ask(
    s: &SessionEndpoint,
    path: &Path,
    req: &Request,
    deadline: Instant,
) -> Result<Reply, ControlError> {
    ask_from(s, path, req, deadline).map(|(reply, _)| reply)
}

/// [`ask`], with the answering process's uid (SO_PEERCRED).
fn ask_from(
    s: &SessionEndpoint,
    path: &Path,
    req: &Request,
    deadline: Instant,
) -> Result<(Reply, u32), ControlError> {
    let r = request_from(path, s.pid, req, deadline);
    if let Err(ControlError::Socket { source, .. }) = &r
        && source.kind() == std::io::ErrorKind::ConnectionRefused
        && std::fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > STALE_AFTER))
    {
        s.remove_stale();
    }
    r
}

/// A session's answer to a trigger request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TriggerAnswer {
    /// The outcome per name.
    Outcomes(Vec<TriggerOutcome>),
    /// The session is busy: the names wait in its queue and will be acted
    /// on (the message says why no outcome came).
    Queued(String),
}

/// Why one session gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoAnswer {
    /// It could not be asked, or its reply could not be read.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// It refused, in its own (printable) words.
    #[error("{0}")]
    Refused(String),
    /// It answered another question (the name of the request asked).
    #[error("unexpected reply to a {0}")]
    Unexpected(&'static str),
    /// It answered with another process's status.
    #[error("answered with the status of pid {0}")]
    OtherPid(u32),
}

/// Each session's answer: its pid and its answer, or why it could not answer.
pub(crate) type TriggerResults = Vec<(u32, Result<TriggerAnswer, NoAnswer>)>;

/// Delivers `names` to every session at once; returns each session's outcomes.
pub(crate) fn fire_triggers(
    names: &[String],
    producer: &str,
) -> Result<TriggerResults, ControlError> {
    let all = sessions();
    if all.is_empty() {
        return Err(ControlError::NoSessions(runtime_dir::candidates()));
    }
    let req = Request::Trigger {
        names: names.to_vec(),
        producer: producer.to_string(),
    };
    let deadline = deadline();
    Ok(each_session(&all, |s| {
        match ask(s, &s.trigger, &req, deadline) {
            Ok(Reply::Triggers(o)) => {
                // An answer must be about the names asked, in order.
                if o.len() == names.len() && o.iter().zip(names).all(|(o, n)| &o.name == n) {
                    Ok(TriggerAnswer::Outcomes(o))
                } else {
                    Err(NoAnswer::Control(ControlError::BadReply {
                        pid: s.pid,
                        source: BadReply::Invalid(InvalidReply::UnaskedOutcomes),
                    }))
                }
            }
            Ok(Reply::Queued(m)) => Ok(TriggerAnswer::Queued(wire::printable(&m))),
            Ok(Reply::Refused(m)) => Err(NoAnswer::Refused(wire::printable(&m))),
            Ok(_) => Err(NoAnswer::Unexpected("trigger")),
            Err(e) => Err(e.into()),
        }
    }))
}

/// Queries every session the caller may see, at once.
pub(crate) fn query_all() -> Vec<(u32, Result<SessionStatus, NoAnswer>)> {
    let all = sessions();
    let deadline = deadline();
    each_session(&all, |s| {
        match ask_from(s, &s.control, &Request::Query {}, deadline) {
            // The uid is the kernel's word for who answered, not the
            // session's own (another user's session could claim uid 0).
            Ok((Reply::Status(mut st), uid)) if st.pid == s.pid => {
                st.uid = uid;
                Ok(*st)
            }
            Ok((Reply::Status(st), _)) => Err(NoAnswer::OtherPid(st.pid)),
            Ok((Reply::Refused(m) | Reply::Queued(m), _)) => {
                Err(NoAnswer::Refused(wire::printable(&m)))
            }
            Ok(_) => Err(NoAnswer::Unexpected("query")),
            Err(e) => Err(e.into()),
        }
    })
}

/// How a stop request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// The session said it is stopping (or already was).
    Stopping,
    /// The session did not answer, but its process has exited.
    Exited,
    /// The session is busy: the stop request waits in its queue.
    Queued,
}

fn stop_one(s: &SessionEndpoint, deadline: Instant) -> Result<Stopped, ControlError> {
    let pid = s.pid;
    let r = ask(s, &s.control, &Request::Stop {}, deadline);
    let gone = || !pid_alive(pid);
    match r {
        Ok(Reply::Stopping) => Ok(Stopped::Stopping),
        Ok(Reply::Queued(_)) if gone() => Ok(Stopped::Exited),
        Ok(Reply::Queued(_)) => Ok(Stopped::Queued),
        // Refused because busy, or no answer: it may be exiting right now.
        Ok(Reply::Refused(m)) if m.starts_with("busy") && gone() => Ok(Stopped::Exited),
        Ok(Reply::Refused(msg)) => Err(ControlError::Session {
            pid,
            msg: wire::printable(&msg),
        }),
        Ok(_) => Err(ControlError::BadReply {
            pid,
            source: BadReply::Invalid(InvalidReply::Unexpected("stop")),
        }),
        Err(e @ (ControlError::Impostor { .. } | ControlError::BadReply { .. })) => Err(e),
        Err(_) if gone() => Ok(Stopped::Exited),
        Err(e) => Err(e),
    }
}

/// Asks session `pid` to stop gracefully.
pub(crate) fn stop(pid: u32) -> Result<Stopped, ControlError> {
    let Some(s) = sessions().into_iter().find(|s| s.pid == pid) else {
        return Err(ControlError::NoSuchSession(pid));
    };
    stop_one(&s, deadline())
}

/// Asks every session the caller may stop (its own; all of them for root)
/// to stop, at once.
pub(crate) fn stop_all() -> Vec<(u32, Result<Stopped, ControlError>)> {
    let deadline = deadline();
    each_session(&my_sessions(), |s| stop_one(s, deadline))
}

/// The sessions the caller owns (every one for root).
fn my_sessions() -> Vec<SessionEndpoint> {
    let me = rustix::process::geteuid().as_raw();
    sessions()
        .into_iter()
        .filter(|s| me == 0 || s.owner_uid == me)
        .collect()
}

/// Asks `deferred_start` session `pid` to start recording.
pub(crate) fn start(pid: u32) -> Result<(), ControlError> {
    let Some(s) = sessions().into_iter().find(|s| s.pid == pid) else {
        return Err(ControlError::NoSuchSession(pid));
    };
    match ask(&s, &s.control, &Request::Start {}, deadline())? {
        Reply::Started => Ok(()),
        Reply::Refused(msg) => Err(ControlError::Session {
            pid,
            msg: wire::printable(&msg),
        }),
        Reply::Queued(msg) => Err(ControlError::Session {
            pid,
            msg: wire::printable(&msg),
        }),
        _ => Err(ControlError::BadReply {
            pid,
            source: BadReply::Invalid(InvalidReply::Unexpected("start")),
        }),
    }
}

/// Asks segmented session `pid` to close its segment and open the next.
pub(crate) fn rotate(pid: u32) -> Result<(), ControlError> {
    let Some(s) = sessions().into_iter().find(|s| s.pid == pid) else {
        return Err(ControlError::NoSuchSession(pid));
    };
    rotate_one(&s, deadline())
}

fn rotate_one(s: &SessionEndpoint, deadline: Instant) -> Result<(), ControlError> {
    let pid = s.pid;
    match ask(s, &s.control, &Request::Rotate {}, deadline)? {
        Reply::Rotated => Ok(()),
        Reply::Refused(msg) | Reply::Queued(msg) => Err(ControlError::Session {
            pid,
            msg: wire::printable(&msg),
        }),
        _ => Err(ControlError::BadReply {
            pid,
            source: BadReply::Invalid(InvalidReply::Unexpected("rotate")),
        }),
    }
}

/// Asks every session the caller may rotate (its own; all of them for
/// root) to rotate, at once.
pub(crate) fn rotate_all() -> Vec<(u32, Result<(), ControlError>)> {
    let deadline = deadline();
    each_session(&my_sessions(), |s| rotate_one(s, deadline))
}

/// The runtime directories searched, for messages.
pub(crate) fn dirs_text() -> String {
    dirs_text_of(&runtime_dir::candidates())
}

/// `dirs` for a message: `A or B`.
pub(crate) fn dirs_text_of(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(" or ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A fake session socket under the name of pid `pid` (a live process
    /// that is not us) is not believed.
    #[test]
    fn a_socket_served_by_another_process_is_not_believed() {
        let t = tempfile::tempdir().expect("tempdir");
        let path = t.path().join("recorder-1.control");
        let l = UnixListener::bind(&path).expect("bind");
        let r = request(&path, 1, &Request::Stop {}, deadline());
        assert!(
            matches!(r, Err(ControlError::Impostor { peer_pid, .. }) if peer_pid == std::process::id()),
            "{r:?}"
        );
        drop(l);
    }

    /// A socket that dribbles costs the deadline, one that floods costs
    /// at most MAX_REPLY_BYTES.
    #[test]
    fn replies_are_bounded_in_time_and_size() {
        let t = tempfile::tempdir().expect("tempdir");
        let me = std::process::id();
        let path = t.path().join(format!("recorder-{me}.control"));
        let l = UnixListener::bind(&path).expect("bind");
        let srv = std::thread::spawn(move || {
            // First client: a byte now and then. Second: endless bytes.
            let (mut a, _) = l.accept().expect("accept");
            let _ = a.write_all(b"{");
            let (mut b, _) = l.accept().expect("accept");
            let junk = vec![b'x'; 64 * 1024];
            while b.write_all(&junk).is_ok() {}
            drop(a);
        });
        let t0 = Instant::now();
        let r = request(
            &path,
            me,
            &Request::Query {},
            Instant::now() + Duration::from_millis(300),
        );
        assert!(matches!(r, Err(ControlError::Timeout { .. })), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        let r = request(&path, me, &Request::Query {}, deadline());
        assert!(
            matches!(
                r,
                Err(ControlError::BadReply {
                    source: BadReply::TooLarge,
                    ..
                })
            ),
            "{r:?}"
        );
        srv.join().expect("server");
    }
}
