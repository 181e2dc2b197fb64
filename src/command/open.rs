//! `recorder open TRACE [--port N] [--no-browser] [--origin URL]`: hands a
//! trace to the Perfetto UI the way Perfetto's own open-trace helper does.
//!
//! It serves the one file on `127.0.0.1:PORT` (9001 by default: the port the
//! UI's content security policy allows, the one of trace_processor's RPC
//! server) with the CORS header the UI's origin needs, prints the
//! `ORIGIN/#!/?url=http://127.0.0.1:PORT/TOKEN/NAME` link, starts a browser
//! on it where there is a display, and exits once the UI has fetched the
//! whole file, or on Ctrl-C / SIGTERM.
//!
//! Any local user can connect to 127.0.0.1, so the path carries a token of
//! 128 random bits: only that path serves the trace, every other one is a
//! 404 that leaves the server waiting for the UI.
//!
//! The server is a small HTTP/1.1 responder on std's `TcpListener`. The
//! accept loop reads request heads itself, without blocking (one `poll` over
//! the listener and every connection still sending its head), each within a
//! deadline counted from its accept; only a whole, parsed request goes to
//! the fixed pool of WORKERS threads, and a request for the token's path
//! (the UI's) is answered before any other. Connections still sending
//! their head are bounded per peer uid (the socket's owner, from
//! `/proc/net/tcp`): PENDING_PER_UID for other users, PENDING_OWNER for
//! the user running `open`, MAX_PENDING in all; beyond, 503 at once. So
//! connections another user holds open cost that user's slots alone and
//! never a worker: the UI's fetch is served while they last.
//! `Connection: close` after each response, only GET, HEAD and OPTIONS (a
//! CORS or private-network preflight). Bytes from a socket are untrusted:
//! the request head is bounded and parsed strictly.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::ExitCode;

pub(crate) use crate::cli::{
    OPEN_DEFAULT_ORIGIN as DEFAULT_ORIGIN, OPEN_DEFAULT_PORT as DEFAULT_PORT,
};

/// Longest request head read before answering 431.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a connection may take, from its accept, to send its request
/// head (time spent queued counts: a flood of idle connections expires).
const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// How long a stalled client may hold one write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Threads answering requests: the UI makes one or two at a time.
const WORKERS: usize = 8;
/// Whole requests (other than the UI's) waiting for a worker; more get 503.
const QUEUED: usize = 32;
/// Connections of one other user still sending their request head.
const PENDING_PER_UID: usize = 8;
/// Connections of the user running `open` (the browser) still sending.
const PENDING_OWNER: usize = 32;
/// Connections still sending their request head, in all.
const MAX_PENDING: usize = 128;
/// Random bytes in the URL's token (128 bits).
const TOKEN_BYTES: usize = 16;

/// What `open` was asked to do.
#[derive(Debug, Clone)]
pub(crate) struct OpenRequest<'a> {
    pub trace: &'a Path,
    pub port: u16,
    pub browser: bool,
    pub origin: &'a str,
}

/// Serves the trace until the UI fetched it or the user stops; returns the
/// exit code.
pub(crate) fn run(req: &OpenRequest<'_>) -> ExitCode {
    if let Err(e) = check_origin(req.origin) {
        eprintln!("recorder open: --origin {:?}: {e}", req.origin);
        return ExitCode::Usage;
    }
    let file = match File::open(req.trace).and_then(|f| f.metadata().map(|m| (f, m))) {
        Ok((f, m)) if m.is_file() => f,
        Ok(_) => {
            eprintln!("recorder open: {}: not a regular file", req.trace.display());
            return ExitCode::Runtime;
        }
        Err(e) => {
            eprintln!("recorder open: {}: {e}", req.trace.display());
            return ExitCode::Runtime;
        }
    };
    let stop = match Stop::catch() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("recorder open: cannot catch signals: {e}");
            return ExitCode::Runtime;
        }
    };
    let listener = match TcpListener::bind(("127.0.0.1", req.port)) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            eprintln!(
                "recorder open: 127.0.0.1:{} is in use (another `recorder open`, or trace_processor's server?): stop it or choose --port",
                req.port
            );
            return ExitCode::Runtime;
        }
        Err(e) => {
            eprintln!(
                "recorder open: cannot listen on 127.0.0.1:{}: {e}",
                req.port
            );
            return ExitCode::Runtime;
        }
    };
    let token = match new_token() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("recorder open: no random bytes for the URL's token: {e}");
            return ExitCode::Runtime;
        }
    };
    let name = format!("{token}/{}", url_name(req.trace));
    let served = Arc::new(Served {
        file,
        path: format!("/{name}"),
        origin: req.origin.to_string(),
    });
    let link = ui_link(req.origin, req.port, &name);
    let size = served.file.metadata().map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "recorder open: serving {} ({size} bytes) at http://127.0.0.1:{}{}",
        req.trace.display(),
        req.port,
        served.path
    );
    if req.port != DEFAULT_PORT && req.origin == DEFAULT_ORIGIN {
        eprintln!(
            "recorder open: note: ui.perfetto.dev only fetches from port {DEFAULT_PORT} (its content security policy)"
        );
    }
    println!("{link}");
    let _ = std::io::stdout().flush();
    if req.browser {
        match open_browser(&link) {
            Ok(how) => eprintln!("recorder open: opened the link with {how}"),
            Err(why) => eprintln!("recorder open: {why}: open the link above in a browser"),
        }
    }
    eprintln!("recorder open: waiting for the UI to fetch the trace (Ctrl-C to stop)");
    match serve(&listener, &served, &stop) {
        Ok(Ended::Fetched) => {
            eprintln!("recorder open: the UI fetched the trace; done");
            ExitCode::Success
        }
        Ok(Ended::Stopped) => {
            eprintln!("recorder open: stopped before the UI fetched the trace");
            ExitCode::Success
        }
        Err(e) => {
            eprintln!("recorder open: {e}");
            ExitCode::Runtime
        }
    }
}

/// The file and how it is offered.
struct Served {
    file: File,
    /// The one path served: `/` and the file name, made URL-safe.
    path: String,
    /// The value of `Access-Control-Allow-Origin`.
    origin: String,
}

enum Ended {
    Fetched,
    Stopped,
}

/// TOKEN_BYTES from the OS's generator, as lowercase hex (URL-safe).
fn new_token() -> Result<String, rand::rand_core::OsError> {
    use rand::TryRngCore;
    let mut raw = [0u8; TOKEN_BYTES];
    rand::rngs::OsRng.try_fill_bytes(&mut raw)?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// The Perfetto UI link that makes the UI fetch the trace from us.
pub(crate) fn ui_link(origin: &str, port: u16, name: &str) -> String {
    format!("{origin}/#!/?url=http://127.0.0.1:{port}/{name}")
}

/// The file name with every byte outside `[A-Za-z0-9._-]` replaced by `_`:
/// it goes into a URL inside a URL fragment, where escapes are decoded a
/// different number of times by different hops.
pub(crate) fn url_name(trace: &Path) -> String {
    let raw = trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let safe: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.trim_matches('.').is_empty() {
        "trace.pftrace".into()
    } else {
        safe
    }
}

/// An origin is `scheme://host[:port]` and nothing else: it becomes a
/// response header and the start of the link.
fn check_origin(origin: &str) -> Result<(), &'static str> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or("must start with https:// or http://")?;
    let ok = !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c));
    if ok {
        Ok(())
    } else {
        Err("must be scheme://host[:port] with no path")
    }
}

/// Why no browser was started (the link is printed anyway).
#[derive(Debug, thiserror::Error)]
enum BrowserError {
    #[error("no display here")]
    NoDisplay,
    #[error("not starting a browser as root")]
    RootUnderSudo,
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Starts a browser on `link` where there is a display: `$BROWSER` if set,
/// else `xdg-open`. Not as root under sudo (the browser would run as root).
fn open_browser(link: &str) -> Result<String, BrowserError> {
    let display = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    if !display {
        return Err(BrowserError::NoDisplay);
    }
    if rustix::process::geteuid().is_root() && std::env::var_os("SUDO_USER").is_some() {
        return Err(BrowserError::RootUnderSudo);
    }
    let program = std::env::var("BROWSER")
        .ok()
        .filter(|b| !b.trim().is_empty())
        .unwrap_or_else(|| "xdg-open".into());
    std::process::Command::new(&program)
        .arg(link)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(|_| program.clone())
        .map_err(|source| BrowserError::Spawn { program, source })
}

/// A connection still sending its request head.
struct Pending {
    conn: TcpStream,
    deadline: Instant,
    head: Vec<u8>,
    /// Its peer's uid (`None`: not found; counted as one more stranger).
    uid: Option<u32>,
}

/// Whole requests waiting for a worker: the UI's (its token's path) first.
#[derive(Default)]
struct Ready {
    token: VecDeque<(TcpStream, Head)>,
    other: VecDeque<(TcpStream, Head)>,
    closed: bool,
}

/// The ready requests. A worker panics only outside the lock (serving a
/// request), so a poisoned queue means the server is ending: its users stop.
type Queue = Arc<(Mutex<Ready>, Condvar)>;

/// Accepts connections and reads their request heads until one has
/// fetched the whole file or SIGINT/SIGTERM arrives; WORKERS threads
/// answer the whole requests.
fn serve(listener: &TcpListener, served: &Arc<Served>, stop: &Stop) -> std::io::Result<Ended> {
    listener.set_nonblocking(true)?;
    let (done_r, done_w) = rustix::pipe::pipe().map_err(std::io::Error::from)?;
    let done_w: Arc<OwnedFd> = Arc::new(done_w);
    let queue: Queue = Arc::default();
    for i in 0..WORKERS {
        let (served, done, queue) = (Arc::clone(served), Arc::clone(&done_w), Arc::clone(&queue));
        std::thread::Builder::new()
            .name(format!("open-{i}"))
            .spawn(move || work(&queue, &served, &done))?;
    }
    let ended = accept_loop(listener, served, stop, &done_r, &queue);
    if let Ok(mut q) = queue.0.lock() {
        q.closed = true;
    }
    queue.1.notify_all();
    ended
}

fn accept_loop(
    listener: &TcpListener,
    served: &Served,
    stop: &Stop,
    done_r: &OwnedFd,
    queue: &Queue,
) -> std::io::Result<Ended> {
    use rustix::event::{PollFd, PollFlags};
    let owner = rustix::process::geteuid().as_raw();
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        let now = Instant::now();
        let wait = pending
            .iter()
            .map(|p| p.deadline.saturating_duration_since(now))
            .min();
        let ts = wait.map(|w| rustix::time::Timespec {
            tv_sec: w.as_secs() as i64,
            tv_nsec: i64::from(w.subsec_nanos()),
        });
        let mut fds = vec![
            PollFd::new(listener, PollFlags::IN),
            PollFd::new(&stop.read, PollFlags::IN),
            PollFd::new(done_r, PollFlags::IN),
        ];
        fds.extend(pending.iter().map(|p| PollFd::new(&p.conn, PollFlags::IN)));
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if !fds[2].revents().is_empty() {
            return Ok(Ended::Fetched);
        }
        if !fds[1].revents().is_empty() {
            return Ok(Ended::Stopped);
        }
        let readable: Vec<bool> = fds[3..].iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        // Heads that arrived, in full or in part; expired ones answered 408.
        let now = Instant::now();
        let mut kept = Vec::with_capacity(pending.len());
        for (mut p, ready) in pending.drain(..).zip(readable) {
            let step = if ready { read_some(&mut p) } else { Step::More };
            match step {
                Step::More if now >= p.deadline => {
                    refuse(p.conn, served, "408 Request Timeout", &[]);
                }
                Step::More => kept.push(p),
                Step::Gone => {}
                Step::Head(Ok(head)) => dispatch(p.conn, head, served, queue),
                Step::Head(Err(BadRequest::TooLarge)) => {
                    refuse(p.conn, served, "431 Request Header Fields Too Large", &[]);
                }
                Step::Head(Err(_)) => refuse(p.conn, served, "400 Bad Request", &[]),
            }
        }
        pending = kept;
        // New connections, each charged to its peer's uid.
        loop {
            match listener.accept() {
                Ok((conn, _)) => admit(conn, owner, &mut pending, served),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::debug!("accept: {e}");
                    break;
                }
            }
        }
    }
}

/// What reading a pending connection gave.
enum Step {
    More,
    Gone,
    Head(Result<Head, BadRequest>),
}

/// Reads what `p` sent (it does not block), at most up to MAX_HEAD_BYTES.
fn read_some(p: &mut Pending) -> Step {
    let mut chunk = [0u8; 4096];
    loop {
        match p.conn.read(&mut chunk) {
            Ok(0) => return Step::Gone,
            Ok(n) => {
                p.head.extend_from_slice(&chunk[..n]);
                if let Some(end) = p.head.windows(4).position(|w| w == b"\r\n\r\n") {
                    p.head.truncate(end + 4);
                    return Step::Head(parse_head(&p.head));
                }
                if p.head.len() >= MAX_HEAD_BYTES {
                    return Step::Head(Err(BadRequest::TooLarge));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::More,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Step::Gone,
        }
    }
}

/// Takes `conn` in while its uid has room, else answers 503 at once. The
/// owner's connection finds room by pushing out another user's oldest.
fn admit(conn: TcpStream, owner: u32, pending: &mut Vec<Pending>, served: &Served) {
    if conn.set_nonblocking(true).is_err() {
        return;
    }
    let uid = peer_uid(&conn);
    let limit = if uid == Some(owner) {
        PENDING_OWNER
    } else {
        PENDING_PER_UID
    };
    let retry = [("Retry-After", "1".to_string())];
    if pending.iter().filter(|p| p.uid == uid).count() >= limit {
        refuse(conn, served, "503 Service Unavailable", &retry);
        return;
    }
    if pending.len() >= MAX_PENDING {
        let other = pending.iter().position(|p| p.uid != Some(owner));
        match other {
            Some(i) if uid == Some(owner) => {
                let old = pending.remove(i);
                refuse(old.conn, served, "503 Service Unavailable", &retry);
            }
            _ => {
                refuse(conn, served, "503 Service Unavailable", &retry);
                return;
            }
        }
    }
    pending.push(Pending {
        conn,
        deadline: Instant::now() + HEAD_DEADLINE,
        head: Vec::new(),
        uid,
    });
}

/// A whole request to the workers: the UI's (its token's path) ahead of
/// every other, which waits in a bounded queue (503 beyond it).
fn dispatch(conn: TcpStream, head: Head, served: &Served, queue: &Queue) {
    let ours = head.target.split('?').next() == Some(served.path.as_str());
    let Ok(mut q) = queue.0.lock() else { return };
    if ours {
        q.token.push_back((conn, head));
    } else if q.other.len() < QUEUED {
        q.other.push_back((conn, head));
    } else {
        drop(q);
        let retry = [("Retry-After", "1".to_string())];
        refuse(conn, served, "503 Service Unavailable", &retry);
        return;
    }
    drop(q);
    queue.1.notify_one();
}

/// Answers `status` with no body, from the accept loop: the socket does not
/// block, so a client that reads nothing cannot stall it.
fn refuse(mut conn: TcpStream, served: &Served, status: &str, extra: &[(&str, String)]) {
    let _ = conn.set_nonblocking(true);
    respond(&mut conn, served, status, extra, 0);
    let _ = conn.shutdown(Shutdown::Both);
}

/// One worker: answers whole requests, the UI's first, until the accept
/// loop is gone.
fn work(queue: &Queue, served: &Served, done: &OwnedFd) {
    loop {
        let job = {
            let Ok(mut q) = queue.0.lock() else { return };
            loop {
                if let Some(j) = q.token.pop_front().or_else(|| q.other.pop_front()) {
                    break j;
                }
                if q.closed {
                    return;
                }
                q = match queue.1.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
        };
        let (conn, head) = job;
        if answer(conn, &head, served) {
            let _ = rustix::io::write(done.as_fd(), &[1]);
        }
    }
}

/// The uid owning the other end of a loopback connection: its socket's
/// line in `/proc/net/tcp` (local and remote ports swapped from ours).
fn peer_uid(conn: &TcpStream) -> Option<u32> {
    let (ours, theirs) = (conn.local_addr().ok()?, conn.peer_addr().ok()?);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let want_local = format!(":{:04X}", theirs.port());
    let want_remote = format!(":{:04X}", ours.port());
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (local, remote, uid) = (f.get(1)?, f.get(2)?, f.get(7)?);
        (local.ends_with(&want_local) && remote.ends_with(&want_remote))
            .then(|| uid.parse().ok())
            .flatten()
    })
}

/// SIGINT and SIGTERM, caught from before the link is printed (a user may
/// press Ctrl-C at once) into a pipe the server polls.
struct Stop {
    read: OwnedFd,
    ids: Vec<signal_hook::SigId>,
}

impl Stop {
    fn catch() -> std::io::Result<Stop> {
        let (read, write) = rustix::pipe::pipe().map_err(std::io::Error::from)?;
        let mut ids = Vec::new();
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            ids.push(signal_hook::low_level::pipe::register(
                sig,
                write.try_clone()?,
            )?);
        }
        Ok(Stop { read, ids })
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// A request head, as far as we need it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Head {
    method: String,
    target: String,
    request_headers: Option<String>,
    private_network: bool,
}

/// Why a request head is refused.
#[derive(Debug, PartialEq, Eq)]
enum BadRequest {
    TooLarge,
    Malformed,
}

/// Parses `METHOD SP TARGET SP HTTP/1.x CRLF (name: value CRLF)* CRLF`.
fn parse_head(head_untrusted: &[u8]) -> Result<Head, BadRequest> {
    let text = std::str::from_utf8(head_untrusted).map_err(|_| BadRequest::Malformed)?;
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (first.next(), first.next(), first.next(), first.next())
    else {
        return Err(BadRequest::Malformed);
    };
    let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic());
    if !token(method) || !target.starts_with('/') || !version.starts_with("HTTP/1.") {
        return Err(BadRequest::Malformed);
    }
    let mut h = Head {
        method: method.to_string(),
        target: target.to_string(),
        ..Head::default()
    };
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(BadRequest::Malformed)?;
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            // Echoed back: header names only.
            "access-control-request-headers"
                if value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_, ".contains(&b)) =>
            {
                h.request_headers = Some(value.to_string());
            }
            "access-control-request-private-network" => {
                h.private_network = value.eq_ignore_ascii_case("true");
            }
            _ => {}
        }
    }
    Ok(h)
}

/// Answers one whole request on `conn`; true when it was a GET of the trace
/// whose every byte was written.
fn answer(mut conn: TcpStream, head: &Head, served: &Served) -> bool {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let ours = head.target.split('?').next() == Some(served.path.as_str());
    let result = match (head.method.as_str(), ours) {
        ("OPTIONS", _) => {
            let allow_headers = head.request_headers.clone().unwrap_or_default();
            let mut extra = vec![
                (
                    "Access-Control-Allow-Methods",
                    "GET, HEAD, OPTIONS".to_string(),
                ),
                ("Access-Control-Max-Age", "600".to_string()),
            ];
            if !allow_headers.is_empty() {
                extra.push(("Access-Control-Allow-Headers", allow_headers));
            }
            if head.private_network {
                extra.push(("Access-Control-Allow-Private-Network", "true".into()));
            }
            respond(&mut conn, served, "204 No Content", &extra, 0);
            false
        }
        ("GET" | "HEAD", true) => {
            let len = served.file.metadata().map(|m| m.len()).unwrap_or(0);
            let extra = [("Content-Type", "application/octet-stream".to_string())];
            respond(&mut conn, served, "200 OK", &extra, len)
                && head.method == "GET"
                && send_file(&mut conn, &served.file, len)
        }
        ("GET" | "HEAD", false) => {
            respond(&mut conn, served, "404 Not Found", &[], 0);
            false
        }
        _ => {
            let extra = [("Allow", "GET, HEAD, OPTIONS".to_string())];
            respond(&mut conn, served, "405 Method Not Allowed", &extra, 0);
            false
        }
    };
    let _ = conn.flush();
    let _ = conn.shutdown(Shutdown::Write);
    result
}

/// Writes a status line and headers (every response carries the CORS
/// headers the UI needs); true when they were written.
fn respond(
    conn: &mut TcpStream,
    served: &Served,
    status: &str,
    extra: &[(&str, String)],
    content_length: u64,
) -> bool {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nAccess-Control-Allow-Origin: {}\r\nCache-Control: no-cache\r\nConnection: close\r\nContent-Length: {content_length}\r\n",
        served.origin
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).is_ok()
}

/// Streams `len` bytes of the file (positional reads: connections share it).
fn send_file(conn: &mut TcpStream, file: &File, len: u64) -> bool {
    let mut buf = vec![0u8; 256 * 1024];
    let mut off = 0u64;
    while off < len {
        let want = buf
            .len()
            .min(usize::try_from(len - off).unwrap_or(usize::MAX));
        match file.read_at(&mut buf[..want], off) {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    return false;
                }
                off += n as u64;
            }
        }
    }
    conn.flush().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_and_name_are_url_safe() {
        assert_eq!(
            url_name(Path::new("/tmp/my trace#1?.pftrace")),
            "my_trace_1_.pftrace"
        );
        assert_eq!(url_name(Path::new("/")), "trace.pftrace");
        assert_eq!(
            ui_link(DEFAULT_ORIGIN, 9001, "t.pftrace"),
            "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/t.pftrace"
        );
    }

    #[test]
    fn tokens_are_128_random_bits_in_hex() {
        let a = new_token().expect("random");
        let b = new_token().expect("random");
        assert_eq!(a.len(), 2 * TOKEN_BYTES);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn origins_are_scheme_and_host_only() {
        assert!(check_origin("https://ui.perfetto.dev").is_ok());
        assert!(check_origin("http://localhost:10000").is_ok());
        assert!(check_origin("ui.perfetto.dev").is_err());
        assert!(check_origin("https://ui.perfetto.dev/x").is_err());
        assert!(check_origin("https://a\r\nSet-Cookie: x").is_err());
    }

    #[test]
    fn request_heads_parse_strictly() {
        let h = parse_head(
            b"OPTIONS /t.pftrace HTTP/1.1\r\nOrigin: https://ui.perfetto.dev\r\n\
              Access-Control-Request-Headers: range, x-y\r\n\
              Access-Control-Request-Private-Network: true\r\n\r\n",
        )
        .expect("parses");
        assert_eq!(
            (h.method.as_str(), h.target.as_str()),
            ("OPTIONS", "/t.pftrace")
        );
        assert_eq!(h.request_headers.as_deref(), Some("range, x-y"));
        assert!(h.private_network);
        let evil = parse_head(b"GET / HTTP/1.1\r\nAccess-Control-Request-Headers: a\rb: c\r\n\r\n")
            .expect("parses");
        assert_eq!(evil.request_headers, None, "not echoed");
        for bad in [
            &b"GET\r\n\r\n"[..],
            b"GET t HTTP/1.1\r\n\r\n",
            b"GET / SPDY/3\r\n\r\n",
            b"GE T / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
            b"\xff / HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(parse_head(bad), Err(BadRequest::Malformed), "{bad:?}");
        }
    }
}
