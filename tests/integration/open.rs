//! `recorder open`: the trace served once on 127.0.0.1 to the Perfetto UI,
//! checked with a real HTTP client (ureq): the link, CORS and private-network
//! preflight headers, the bytes, exit after the fetch, Ctrl-C, bad input; the
//! URL's random token (other paths 404 and the server waits on), the bounded
//! pool of workers and the deadline on slow clients.

use crate::harness::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const UI: &str = "https://ui.perfetto.dev";

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A small finished trace.
fn trace() -> Run {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 200",
        "message_count: 300 message_size: 32",
    ));
    assert!(run.run("pwritev").status.success());
    run
}

/// `recorder open` on `run`'s trace, with no display (so no browser); returns
/// the child once it printed its link, and the link.
fn open(run: &Run, args: &[&str]) -> (Child, String) {
    let mut child = Command::new(recorder_bin())
        .arg("open")
        .arg(&run.out)
        .args(args)
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("BROWSER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder open starts");
    let link = first_line(&mut child);
    (child, link)
}

/// The whole body of `r` (a trace: up to 64 MiB).
fn body(r: &mut ureq::http::Response<ureq::Body>) -> Vec<u8> {
    r.body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_vec()
        .expect("body")
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

fn header(r: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

#[test]
fn open_serves_the_trace_once_to_the_ui_and_exits() {
    let run = trace();
    let bytes = run.trace();
    let port = free_port();
    let (mut child, link) = open(&run, &["--port", &port.to_string()]);
    let url = link
        .strip_prefix(&format!("{UI}/#!/?url="))
        .expect("a UI link")
        .to_string();
    let token = token_of(&url, port);
    let a = agent();

    // Paths without the token, or with another one, are 404s: a local user
    // who guesses the name gets nothing and the server waits on.
    let other = format!("{:032x}", u128::from_str_radix(token, 16).expect("hex") ^ 1);
    for path in [
        "/trace.pftrace".to_string(),
        format!("/{other}/trace.pftrace"),
        format!("/{token}"),
        format!("/{token}/other.pftrace"),
    ] {
        let r = a
            .get(format!("http://127.0.0.1:{port}{path}"))
            .call()
            .expect("get");
        assert_eq!(r.status(), 404, "{path}");
    }

    // A CORS / private-network preflight from the UI's origin.
    let r = a
        .options(&url)
        .header("Origin", UI)
        .header("Access-Control-Request-Method", "GET")
        .header("Access-Control-Request-Headers", "range")
        .header("Access-Control-Request-Private-Network", "true")
        .call()
        .expect("preflight");
    assert_eq!(r.status(), 204);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some(UI)
    );
    assert!(header(&r, "access-control-allow-methods").is_some_and(|m| m.contains("GET")));
    assert_eq!(
        header(&r, "access-control-allow-headers").as_deref(),
        Some("range")
    );
    assert_eq!(
        header(&r, "access-control-allow-private-network").as_deref(),
        Some("true")
    );

    // HEAD, another path, another method: answered, and the server waits on.
    let r = a.head(&url).header("Origin", UI).call().expect("head");
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-length"), Some(bytes.len().to_string()));
    let r = a
        .get(format!("http://127.0.0.1:{port}/etc/passwd"))
        .call()
        .expect("get");
    assert_eq!(r.status(), 404);
    let r = a.post(&url).send(&b"x"[..]).expect("post");
    assert_eq!(r.status(), 405);
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    raw.write_all(b"NOT HTTP\r\n\r\n").expect("write");
    let mut reply = String::new();
    raw.read_to_string(&mut reply).expect("read");
    assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
    assert!(child.try_wait().expect("wait").is_none(), "still serving");

    // The UI's fetch: the whole file with the CORS header; then it exits.
    let mut r = a.get(&url).header("Origin", UI).call().expect("get");
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some(UI)
    );
    assert_eq!(header(&r, "cache-control").as_deref(), Some("no-cache"));
    let got = body(&mut r);
    assert_eq!(got, bytes, "the bytes served are the file's");
    let (status, err) = wait_exit_stderr(&mut child, Duration::from_secs(20));
    assert!(status.success(), "{err}");
    assert!(err.contains("the UI fetched the trace"), "{err}");
    assert!(
        err.contains("no display here"),
        "no browser without a display: {err}"
    );
}

/// The token in `url` (`http://127.0.0.1:PORT/TOKEN/trace.pftrace`),
/// checked to be 32 hex digits (128 bits).
fn token_of(url: &str, port: u16) -> &str {
    let token = url
        .strip_prefix(&format!("http://127.0.0.1:{port}/"))
        .and_then(|rest| rest.strip_suffix("/trace.pftrace"))
        .unwrap_or_else(|| panic!("unexpected URL {url}"));
    assert_eq!(token.len(), 32, "{url}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{url}");
    token
}

fn threads_of(child: &Child) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .expect("/proc")
        .count()
}

#[test]
fn open_tokens_differ_and_a_connection_flood_neither_grows_nor_ends_it() {
    let run = trace();
    let bytes = run.trace();
    let port = free_port();
    let (mut first, link) = open(&run, &["--port", &port.to_string()]);
    let (status, _) = {
        let pid = rustix::process::Pid::from_child(&first);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        wait_exit_stderr(&mut first, Duration::from_secs(20))
    };
    assert!(status.success());
    let first_token = token_of(link.rsplit("url=").next().expect("url"), port).to_string();

    let (mut child, link) = open(&run, &["--port", &port.to_string()]);
    let url = link.rsplit("url=").next().expect("url").to_string();
    assert_ne!(token_of(&url, port), first_token, "a new token each run");

    // 400 idle connections: a thread each would be 400 threads. The pool
    // stays at its fixed size; those beyond its queue get 503 at once.
    let mut idle = Vec::new();
    for _ in 0..400 {
        idle.push(std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"));
    }
    // Those beyond the queue are answered 503 (at least 300 of them).
    let mut answered = vec![false; idle.len()];
    wait_for(
        "300 of 400 refused with 503",
        Duration::from_secs(20),
        || {
            for (c, seen) in idle.iter_mut().zip(answered.iter_mut()) {
                if *seen {
                    continue;
                }
                c.set_read_timeout(Some(Duration::from_millis(1)))
                    .expect("timeout");
                let mut buf = [0u8; 64];
                if let Ok(n) = c.read(&mut buf)
                    && buf[..n].starts_with(b"HTTP/1.1 503 ")
                {
                    *seen = true;
                }
            }
            answered.iter().filter(|s| **s).count() >= 300
        },
    );
    // Answered without a thread each.
    let threads = threads_of(&child);
    assert!(threads <= 12, "{threads} threads for 400 connections");

    // A client that never finishes its head is cut off at the deadline
    // (5 s from its accept), with a 408, once the flood is gone.
    drop(idle);
    // The server has let the flood go: a new request is served again.
    wait_for(
        "a request served after the flood",
        Duration::from_secs(20),
        || {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            c.write_all(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
                .expect("write");
            c.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut buf = [0u8; 64];
            let n = c.read(&mut buf).unwrap_or(0);
            n > 0 && !buf[..n].starts_with(b"HTTP/1.1 503 ")
        },
    );
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    slow.write_all(b"GET /").expect("write");
    let t0 = Instant::now();
    slow.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let mut reply = String::new();
    slow.read_to_string(&mut reply).expect("read");
    assert!(reply.starts_with("HTTP/1.1 408 "), "{reply}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(child.try_wait().expect("wait").is_none(), "still serving");

    // The UI still gets the trace.
    let mut r = agent().get(&url).header("Origin", UI).call().expect("get");
    assert_eq!(r.status(), 200);
    let got = body(&mut r);
    assert_eq!(got, bytes);
    let (status, err) = wait_exit_stderr(&mut child, Duration::from_secs(20));
    assert!(status.success(), "{err}");
}

#[test]
fn open_stops_on_ctrl_c_and_refuses_bad_input() {
    let run = trace();
    let port = free_port();
    let (mut child, _) = open(&run, &["--port", &port.to_string(), "--no-browser"]);
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT");
    let (status, err) = wait_exit_stderr(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("stopped before the UI fetched the trace"),
        "{err}"
    );

    let recorder = |args: &[&str]| {
        Command::new(recorder_bin())
            .arg("open")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("runs")
    };
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy_port = busy.local_addr().expect("addr").port().to_string();
    let trace = run.out.to_str().expect("utf-8");
    let out = recorder(&[trace, "--no-browser", "--port", &busy_port]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is in use"));
    let missing = run.dir.path().join("missing.pftrace");
    let out = recorder(&[missing.to_str().expect("utf-8"), "--no-browser"]);
    assert_eq!(out.status.code(), Some(1));
    let out = recorder(&[trace, "--origin", "https://evil.example/path"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Item 17 of round 4: another user (nobody) holding 45 connections open —
/// all idle, or sending a request head a byte at a time — costs that user's
/// slots alone: the UI's fetch (by the user running `open`) is served while
/// they last, and most of nobody's connections get 503 at once.
#[test]
fn connections_another_user_holds_do_not_keep_the_ui_out() {
    require!(need::attacker());
    let run = trace();
    let bytes = run.trace();
    let port = free_port();
    let (mut child, link) = open(&run, &["--port", &port.to_string()]);
    let url = link.rsplit("url=").next().expect("url").to_string();
    let hold = format!(
        r#"
import socket, sys, time
conns = []
for i in range(45):
    s = socket.create_connection(("127.0.0.1", {port}))
    if i % 2:
        s.send(b"GET /")
    conns.append(s)
refused = 0
for s in conns:
    s.settimeout(0.2)
    try:
        if s.recv(64).startswith(b"HTTP/1.1 503 "):
            refused += 1
    except OSError:
        pass
print(refused, flush=True)
time.sleep(30)
"#
    );
    let mut holder = as_nobody(python())
        .args(["-c", &hold])
        .stdout(Stdio::piped())
        .spawn()
        .expect("holder");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the holder's count");
    let refused: usize = line.trim().parse().expect("a count");
    assert!(refused >= 30, "only {refused} of 45 got 503");
    // The UI's fetch while the connections are held.
    let t0 = Instant::now();
    let mut r = agent().get(&url).header("Origin", UI).call().expect("get");
    assert_eq!(r.status(), 200);
    let got = body(&mut r);
    assert_eq!(got, bytes);
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "served only after {:?} (a head's deadline is 5 s)",
        t0.elapsed()
    );
    let (status, err) = wait_exit_stderr(&mut child, Duration::from_secs(20));
    assert!(status.success(), "{err}");
    let _ = holder.kill();
    let _ = holder.wait();
}
