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
//! The server is a small HTTP/1.1 responder on std's `TcpListener`: a fixed
//! pool of WORKERS threads fed by a queue of at most QUEUED accepted
//! connections (beyond that, 503 at once), a deadline for each request head
//! counted from the accept, `Connection: close` after each response, only
//! GET, HEAD and OPTIONS (a CORS or private-network preflight). Bytes from a
//! socket are untrusted: the request head is bounded and parsed strictly.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ExitCode;

pub use crate::cli::{OPEN_DEFAULT_ORIGIN as DEFAULT_ORIGIN, OPEN_DEFAULT_PORT as DEFAULT_PORT};

/// Longest request head read before answering 431.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a connection may take, from its accept, to send its request
/// head (time spent queued counts: a flood of idle connections expires).
const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// How long a stalled client may hold one write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Threads answering requests: the UI makes one or two at a time.
const WORKERS: usize = 8;
/// Accepted connections waiting for a worker; more get 503 at once.
const QUEUED: usize = 32;
/// Random bytes in the URL's token (128 bits).
const TOKEN_BYTES: usize = 16;

/// What `open` was asked to do.
#[derive(Debug, Clone)]
pub struct OpenRequest<'a> {
    pub trace: &'a Path,
    pub port: u16,
    pub browser: bool,
    pub origin: &'a str,
}

/// Serves the trace until the UI fetched it or the user stops; returns the
/// exit code.
pub fn run(req: &OpenRequest<'_>) -> ExitCode {
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
pub fn ui_link(origin: &str, port: u16, name: &str) -> String {
    format!("{origin}/#!/?url=http://127.0.0.1:{port}/{name}")
}

/// The file name with every byte outside `[A-Za-z0-9._-]` replaced by `_`:
/// it goes into a URL inside a URL fragment, where escapes are decoded a
/// different number of times by different hops.
pub fn url_name(trace: &Path) -> String {
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

/// A connection waiting for a worker, with its head's deadline.
type Job = (TcpStream, Instant);

/// Accepts connections until one has fetched the whole file or
/// SIGINT/SIGTERM arrives; WORKERS threads answer them, QUEUED may wait.
fn serve(listener: &TcpListener, served: &Arc<Served>, stop: &Stop) -> std::io::Result<Ended> {
    listener.set_nonblocking(true)?;
    let (done_r, done_w) = rustix::pipe::pipe().map_err(std::io::Error::from)?;
    let done_w: Arc<OwnedFd> = Arc::new(done_w);
    let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(QUEUED);
    let queue = Arc::new(Mutex::new(queue));
    for i in 0..WORKERS {
        let (served, done, queue) = (Arc::clone(served), Arc::clone(&done_w), Arc::clone(&queue));
        std::thread::Builder::new()
            .name(format!("open-{i}"))
            .spawn(move || work(&queue, &served, &done))?;
    }
    let stop_r = &stop.read;
    loop {
        let mut fds = [
            rustix::event::PollFd::new(listener, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(stop_r, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(&done_r, rustix::event::PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
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
        match listener.accept() {
            Ok((conn, _)) => enqueue(&jobs, conn, served),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => log::debug!("accept: {e}"),
        }
    }
}

/// Hands `conn` to the pool, or answers 503 without waiting when the queue
/// is full (the accepted socket is non-blocking: a client that reads
/// nothing cannot stall the accept loop).
fn enqueue(jobs: &SyncSender<Job>, conn: TcpStream, served: &Served) {
    match jobs.try_send((conn, Instant::now() + HEAD_DEADLINE)) {
        Ok(()) => {}
        Err(TrySendError::Full((mut conn, _)) | TrySendError::Disconnected((mut conn, _))) => {
            let _ = conn.set_nonblocking(true);
            let extra = [("Retry-After", "1".to_string())];
            respond(&mut conn, served, "503 Service Unavailable", &extra, 0);
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

/// One worker: answers queued connections until the accept loop is gone.
fn work(queue: &Mutex<Receiver<Job>>, served: &Served, done: &OwnedFd) {
    loop {
        let job = match queue.lock() {
            Ok(q) => q.recv(),
            Err(_) => return,
        };
        let Ok((conn, deadline)) = job else { return };
        if handle(conn, deadline, served) {
            let _ = rustix::io::write(done.as_fd(), &[1]);
        }
    }
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
    /// No whole head before the deadline.
    Slow,
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

/// Reads the request head: up to the blank line, at most MAX_HEAD_BYTES,
/// before `deadline`.
fn read_head(conn: &mut TcpStream, deadline: Instant) -> Result<Vec<u8>, BadRequest> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end + 4);
            return Ok(buf);
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(BadRequest::TooLarge);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return Err(BadRequest::Slow);
        }
        match conn.read(&mut chunk) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(BadRequest::Slow);
            }
            Ok(0) | Err(_) => return Err(BadRequest::Malformed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Answers one request on `conn`; true when it was a GET of the trace whose
/// every byte was written.
fn handle(mut conn: TcpStream, deadline: Instant, served: &Served) -> bool {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let head = match read_head(&mut conn, deadline).and_then(|b| parse_head(&b)) {
        Ok(h) => h,
        Err(BadRequest::TooLarge) => {
            respond(
                &mut conn,
                served,
                "431 Request Header Fields Too Large",
                &[],
                0,
            );
            return false;
        }
        Err(BadRequest::Malformed) => {
            respond(&mut conn, served, "400 Bad Request", &[], 0);
            return false;
        }
        Err(BadRequest::Slow) => {
            respond(&mut conn, served, "408 Request Timeout", &[], 0);
            let _ = conn.shutdown(Shutdown::Both);
            return false;
        }
    };
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
