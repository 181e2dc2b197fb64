//! The one deadline. A test waits for the thing it needs (a file's size, a
//! socket that answers, a log line, a process's end) by polling for it; at
//! the deadline it fails naming what never came. Nothing waits a fixed time
//! for something that can be observed.

use std::fmt::Display;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Polls `probe` until it gives a value and returns it; panics naming `what`
/// once `timeout` has passed.
pub fn wait_until<T>(what: impl Display, timeout: Duration, probe: impl FnMut() -> Option<T>) -> T {
    poll(timeout, probe).unwrap_or_else(|| panic!("{what}: not within {timeout:?}"))
}

/// Polls `probe` until it gives a value, or None once `timeout` has passed:
/// often at first, then every 20 ms.
pub fn poll<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(found) = probe() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        // The poll interval, not a wait for anything.
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// [`wait_until`] for a condition.
pub fn wait_for(what: impl Display, timeout: Duration, mut cond: impl FnMut() -> bool) {
    wait_until(what, timeout, || cond().then_some(()))
}

/// A description made when it is shown (a log read at the deadline, say).
pub fn described<F: Fn() -> String>(f: F) -> impl Display {
    struct Later<F>(F);
    impl<F: Fn() -> String> Display for Later<F> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&(self.0)())
        }
    }
    Later(f)
}

/// The size of `path` (0 while it does not exist).
pub fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Waits until `path` holds at least `bytes`; returns its size then.
pub fn wait_for_size(path: &Path, bytes: u64, timeout: Duration) -> u64 {
    wait_until(
        format_args!("{} reaching {bytes} bytes", path.display()),
        timeout,
        || Some(file_size(path)).filter(|&n| n >= bytes),
    )
}

/// Waits until `path` grows past `from` bytes; returns its size then.
pub fn wait_for_growth(path: &Path, from: u64, timeout: Duration) -> u64 {
    wait_for_size(path, from + 1, timeout)
}

/// Waits until `path` exists.
pub fn wait_for_path(path: &Path, timeout: Duration) {
    wait_for(
        format_args!("{} to appear", path.display()),
        timeout,
        || path.exists(),
    )
}

/// Waits until the Unix socket at `path` accepts a connection.
pub fn wait_for_socket(path: &Path, timeout: Duration) {
    wait_for(
        format_args!("a listener on {}", path.display()),
        timeout,
        || std::os::unix::net::UnixStream::connect(path).is_ok(),
    )
}

/// Waits until the text `read` returns contains `needle` (a log line);
/// the failure shows the text.
pub fn wait_for_text(needle: &str, timeout: Duration, read: impl Fn() -> String) -> String {
    let last = std::cell::RefCell::new(String::new());
    wait_until(
        described(|| format!("{needle:?} in {:?}", last.borrow())),
        timeout,
        || {
            let text = read();
            let seen = text.contains(needle);
            *last.borrow_mut() = text;
            seen.then(|| last.borrow().clone())
        },
    )
}

/// Waits until the file at `path` contains `needle`.
pub fn wait_for_line(path: &Path, needle: &str, timeout: Duration) -> String {
    wait_for_text(needle, timeout, || {
        std::fs::read_to_string(path).unwrap_or_default()
    })
}

/// Waits until `child` exits; kills it and panics, with its stderr, after
/// `limit`.
pub fn wait_within(mut child: Child, limit: Duration) -> Output {
    let exited = poll_exit(&mut child, limit);
    if exited.is_none() {
        let _ = child.kill();
        let o = child.wait_with_output().expect("output");
        panic!(
            "process {} did not finish within {limit:?}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    child.wait_with_output().expect("output")
}

/// [`wait_within`] naming what the process is.
pub fn wait_within_named(mut child: Child, limit: Duration, what: &str) -> Output {
    if poll_exit(&mut child, limit).is_none() {
        let _ = child.kill();
        let out = child.wait_with_output().expect("output");
        panic!(
            "{what}: still running after {limit:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    child.wait_with_output().expect("output")
}

/// Runs `c` with its output captured, at most `limit`.
pub fn output_within(c: &mut Command, limit: Duration) -> Output {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_within(child, limit)
}

/// [`output_within`] naming what the command is.
pub fn output_within_named(c: &mut Command, limit: Duration, what: &str) -> Output {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    wait_within_named(child, limit, what)
}

/// The exit status of `child` once it exits, or None after `limit`.
pub fn poll_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    poll(limit, || child.try_wait().expect("wait"))
}

/// Waits until `child` exits; kills it and panics after `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    poll_exit(child, limit).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("process {} did not exit within {limit:?}", child.id())
    })
}

/// [`wait_exit`], then what the child wrote to its (piped) stderr.
pub fn wait_exit_stderr(child: &mut Child, limit: Duration) -> (ExitStatus, String) {
    let status = wait_exit(child, limit);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (status, err)
}

/// Whether process `pid` is alive (not gone, not a zombie).
pub fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Waits until process `pid` (not a child of ours) is gone.
pub fn wait_gone(pid: u32, timeout: Duration) {
    wait_for(format_args!("process {pid} to end"), timeout, || {
        !pid_alive(pid)
    })
}

/// The `name: value` lines of a /proc status file (`/proc/PID/status`,
/// `/proc/PID/task/TID/status`), values trimmed; empty once the process or
/// thread is gone.
pub fn proc_status(path: impl AsRef<Path>) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// Waits until process `pid` catches `signal` (its bit in `SigCgt` of
/// /proc/PID/status): a signal sent before the handler is installed takes
/// the default action, which is not what a test of the handler means to
/// send. Panics after 20 s or when the process is gone.
pub fn wait_catches(pid: u32, signal: rustix::process::Signal) {
    let bit = 1u64 << (signal.as_raw() - 1);
    wait_for(
        format_args!("process {pid} catching signal {}", signal.as_raw()),
        Duration::from_secs(20),
        || {
            let status = proc_status(format!("/proc/{pid}/status"));
            let caught = status
                .get("SigCgt")
                .and_then(|m| u64::from_str_radix(m, 16).ok())
                .unwrap_or_else(|| panic!("process {pid} is gone: {status:?}"));
            caught & bit != 0
        },
    )
}
