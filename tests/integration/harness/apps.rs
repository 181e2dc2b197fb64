//! Perfetto SDK apps (`tests/sdk_producer`, the `perfetto-sdk` crate
//! unmodified), built once and run against a producer socket.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::repo_root;
use super::wait::wait_exit;

/// The SDK app, built once (its own cargo workspace, in `sdk_producer`
/// under the build's target dir: it compiles the C SDK).
pub fn sdk_app() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = repo_root();
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root.join("target"), |d| root.join(d))
            .join("sdk_producer");
        let st = Command::new(env!("CARGO"))
            .args(["build", "--release", "--quiet", "--manifest-path"])
            .arg(root.join("tests/sdk_producer/Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .expect("cargo runs");
        assert!(st.success(), "building the SDK test app failed");
        target.join("release/sdk_producer")
    })
    .clone()
}

pub const SEQUENCE_DS: &str = "recorder.test.sequence";

pub struct App {
    pub child: Child,
    lines: BufReader<ChildStdout>,
}

impl App {
    pub fn spawn(socket: &Path, name: &str, args: &[&str]) -> Self {
        let mut child = Command::new(sdk_app())
            .arg0(name)
            .args(args)
            .env("PERFETTO_PRODUCER_SOCK_NAME", socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("SDK app starts");
        let lines = BufReader::new(child.stdout.take().expect("stdout"));
        Self { child, lines }
    }

    /// The next line the app prints that starts with `prefix`.
    pub fn expect(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.lines.read_line(&mut line).expect("read app output");
            assert!(n > 0, "app ended before printing {prefix:?}");
            if line.starts_with(prefix) {
                return line.trim_end().to_string();
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn finish(mut self) -> Option<i32> {
        wait_exit(&mut self.child, Duration::from_secs(60)).code()
    }

    /// Ends an app that lingers (`--linger-secs`, `--forever`).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// for_testing counters per (sequence, pid), in file order.
pub fn counters_by_pid(
    packets: &[perfetto_protos::trace_packet::TracePacket],
) -> Vec<(u32, u32, Vec<u64>)> {
    let mut v: Vec<(u32, u32, Vec<u64>)> = Vec::new();
    for p in packets.iter().filter(|p| p.has_for_testing()) {
        let key = (p.trusted_packet_sequence_id(), p.trusted_pid() as u32);
        match v.iter_mut().find(|(s, pid, _)| (*s, *pid) == key) {
            Some(e) => e.2.push(p.for_testing().counter()),
            None => v.push((key.0, key.1, vec![p.for_testing().counter()])),
        }
    }
    v
}

/// The app `pid` recorded on one sequence, every counter from 0 to
/// `packets` in order.
pub fn assert_app_recorded_all(
    packets: &[perfetto_protos::trace_packet::TracePacket],
    pid: u32,
    count: u64,
) {
    let by_pid = counters_by_pid(packets);
    let ours: Vec<_> = by_pid.iter().filter(|(_, p, _)| *p == pid).collect();
    assert_eq!(ours.len(), 1, "{by_pid:?}");
    assert_eq!(ours[0].2, (0..count).collect::<Vec<_>>());
}
