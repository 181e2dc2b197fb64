//! `recorder open`: the trace served once on 127.0.0.1 to the Perfetto UI,
//! checked with a real HTTP client (ureq): the link, CORS and private-network
//! preflight headers, the bytes, exit after the fetch, Ctrl-C, bad input.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::recording::{Run, test_config};

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
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the link");
    (child, line.trim().to_string())
}

fn wait_exit(child: &mut Child) -> (std::process::ExitStatus, String) {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "recorder open did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    (status, err)
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
    let url = format!("http://127.0.0.1:{port}/trace.pftrace");
    assert_eq!(link, format!("{UI}/#!/?url={url}"));
    let a = agent();

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
    let got = r
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_vec()
        .expect("body");
    assert_eq!(got, bytes, "the bytes served are the file's");
    let (status, err) = wait_exit(&mut child);
    assert!(status.success(), "{err}");
    assert!(err.contains("the UI fetched the trace"), "{err}");
    assert!(
        err.contains("no display here"),
        "no browser without a display: {err}"
    );
}

#[test]
fn open_stops_on_ctrl_c_and_refuses_bad_input() {
    let run = trace();
    let port = free_port();
    let (mut child, _) = open(&run, &["--port", &port.to_string(), "--no-browser"]);
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT");
    let (status, err) = wait_exit(&mut child);
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
