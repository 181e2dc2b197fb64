//! A recording run of the built binary: a config in a temporary directory,
//! `recorder` spawned on it with its own runtime directory, the output
//! path; and the control commands (`trigger`, `query`, `stop`) against it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::decode::{decode, gaps, test_counters, whole_prefix};
use super::need;
use super::recorder_bin;
use super::users::as_user;
use super::wait::{wait_for, wait_for_path, wait_within_named};

/// A config and a place to record it.
pub struct Run {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub out: PathBuf,
}

impl Run {
    pub fn new(config_text: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("test.cfg");
        std::fs::write(&config, config_text).expect("write config");
        let out = dir.path().join("trace.pftrace");
        Self { dir, config, out }
    }

    pub fn command(&self, io: &str) -> Command {
        self.command_to(io, &self.out)
    }

    pub fn command_to(&self, io: &str, out: &Path) -> Command {
        let mut c = Command::new(recorder_bin());
        c.arg("--config").arg(&self.config).arg("-o").arg(out);
        c.env("RECORDER_RUNTIME_DIR", self.dir.path().join("run"));
        c.env("RECORDER_IO", io);
        c.stdin(Stdio::null());
        c
    }

    pub fn run(&self, io: &str) -> Output {
        self.command(io).output().expect("recorder runs")
    }

    pub fn spawn(&self, io: &str) -> Child {
        self.command(io)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("recorder starts")
    }

    pub fn trace(&self) -> Vec<u8> {
        std::fs::read(&self.out).expect("trace file exists")
    }
}

/// The io choices to test: io_uring where the kernel allows it, and pwritev.
pub fn sinks() -> Vec<&'static str> {
    let mut v = vec!["pwritev"];
    if need::met(need::io_uring()) {
        v.push("io_uring");
    }
    v
}

pub fn test_config(buffer_kb: u32, policy: &str, extra_top: &str, test_fields: &str) -> String {
    format!(
        r#"
buffers {{ size_kb: {buffer_kb} fill_policy: {policy} }}
data_sources {{
  config {{
    name: "for_testing"
    target_buffer: 0
    for_testing {{ {test_fields} }}
  }}
}}
{extra_top}
"#
    )
}

pub fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process(pid, sig).expect("signal delivered");
}

pub fn runtime(run: &Run) -> std::path::PathBuf {
    run.dir.path().join("run")
}

pub fn spawn(run: &Run) -> Child {
    run.command("auto")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder starts")
}

/// Waits until the session with `pid` listens in the runtime directory
/// `dir`.
pub fn wait_listening(dir: &Path, pid: u32) {
    wait_for_path(
        &dir.join(format!("recorder-{pid}.trigger")),
        Duration::from_secs(20),
    );
}

pub fn recorder(run: &Run, args: &[&str]) -> Output {
    Command::new(recorder_bin())
        .args(args)
        .env("RECORDER_RUNTIME_DIR", runtime(run))
        .stdin(Stdio::null())
        .output()
        .expect("recorder runs")
}

pub fn finish(child: Child) -> (std::process::ExitStatus, String) {
    let out = child.wait_with_output().expect("exit");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Makes directory `path` with `mode` (not narrowed by the umask) and
/// returns it.
pub fn dir_with_mode(path: &Path, mode: u32) -> PathBuf {
    std::fs::create_dir(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path.to_path_buf()
}

/// A session shared with other users: its directory is searchable by all and
/// its runtime directory exists, root-owned and sticky (as `/run/recorder`).
pub fn shared_run(config: &str) -> Run {
    let run = Run::new(config);
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let rt = runtime(&run);
    std::fs::create_dir(&rt).expect("mkdir");
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    run
}

/// `recorder ARGS` against `run`'s runtime directory, as `uid` (None: root).
pub fn recorder_as(run: &Run, uid: Option<&str>, args: &[&str]) -> Command {
    let mut c = match uid {
        Some(u) => as_user(u, recorder_bin()),
        None => Command::new(recorder_bin()),
    };
    c.args(args)
        .env("RECORDER_RUNTIME_DIR", runtime(run))
        .stdin(Stdio::null());
    c
}

/// A flight recorder: STOP_TRACING on `trigger` (no delay), `extra` in the
/// trigger block.
pub fn flight_config(trigger_extra: &str, top_extra: &str) -> String {
    format!(
        r#"
buffers {{ size_kb: 2048 fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "for_testing" target_buffer: 0
  for_testing {{ message_count: 0 max_messages_per_second: 2000 message_size: 16 }} }} }}
trigger_config {{
  trigger_mode: STOP_TRACING
  trigger_timeout_ms: 30000
  triggers {{ name: "go" stop_delay_ms: 0 {trigger_extra} }}
}}
{top_extra}
"#
    )
}

/// The session ended well after its trigger: exit 0, a file that decodes,
/// one trigger packet from `uid`, and the test data in order.
pub fn check_triggered(run: &Run, session: Child, uid: u32) {
    let out = wait_within_named(
        session,
        Duration::from_secs(20),
        "session after its trigger",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let data = run.trace();
    assert_eq!(whole_prefix(&data), data.len());
    let packets = decode(&data);
    let trig: Vec<_> = packets.iter().filter(|p| p.has_trigger()).collect();
    assert_eq!(trig.len(), 1, "one trigger packet");
    assert_eq!(trig[0].trigger().trigger_name(), "go");
    assert_eq!(trig[0].trigger().trusted_producer_uid(), uid as i32);
    let counters = test_counters(&packets);
    let c = counters.values().next().expect("test data recorded");
    assert_eq!(gaps(c).0, 0, "the ring kept a contiguous run");
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn service_events(packets: &[perfetto_protos::trace_packet::TracePacket]) -> Vec<String> {
    packets
        .iter()
        .filter(|p| p.has_service_event())
        .map(|p| {
            format!("{:?}", p.service_event().event_type)
                .split('(')
                .nth(1)
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// What `recorder query --json` shows of session `pid` in `run`'s runtime
/// directory; None while it is not listed.
pub fn session_status(run: &Run, pid: u32) -> Option<serde_json::Value> {
    let q = recorder(run, &["query", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&q.stdout).ok()?;
    v.as_array()?.iter().find(|s| s["pid"] == pid).cloned()
}

/// The bytes session `pid` has written into its buffers so far (0 while
/// it is not listed).
pub fn bytes_recorded(run: &Run, pid: u32) -> u64 {
    session_status(run, pid)
        .and_then(|s| {
            s["buffers"]
                .as_array()
                .map(|b| b.iter().filter_map(|b| b["bytes_written"].as_u64()).sum())
        })
        .unwrap_or(0)
}

/// Waits until session `pid` has written at least `bytes` into its
/// buffers: what a trigger, a stop or a signal is to keep is there.
pub fn wait_recorded(run: &Run, pid: u32, bytes: u64) {
    wait_for(
        format_args!("session {pid} recording {bytes} bytes"),
        Duration::from_secs(30),
        || bytes_recorded(run, pid) >= bytes,
    )
}

/// Makes a FIFO at `path` with mkfifo(1).
pub fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(st.success(), "mkfifo {}", path.display());
}

/// The first line `child` writes to its piped stdout, trimmed; what it
/// writes next stays unread.
pub fn first_line(child: &mut Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("a first line");
    line.trim().to_string()
}
