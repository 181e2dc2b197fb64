//! Saved at death, on the built binary with real processes and signals: a
//! recorder killed while it records (SIGKILL, SIGSEGV, abort, a memory
//! cgroup's OOM kill) has what its buffers held written to its trace by the
//! process that outlives it — the root broker for a root session, the keeper
//! for an unprivileged one — as a valid trace: decoded, the Python oracle,
//! trace processor with no error stat. A death while idle, or at any
//! instant of a pass, a snapshot or a flight recorder's wait, leaves a valid
//! trace with nothing twice.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::harness::*;
use recorder::ringbuf::image::RingImage;

/// The session's command with core dumps off (a SIGSEGV or SIGABRT would
/// write one), as `user` when given (setpriv: uid, gid, no groups).
fn command(run: &Run, user: Option<u32>) -> Command {
    let inner = run.command("auto");
    let mut c = match user {
        Some(uid) => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid", &uid.to_string(), "--regid", &uid.to_string()])
                .arg("--clear-groups")
                .arg("--");
            c
        }
        None => Command::new("prlimit"),
    };
    if user.is_some() {
        c.arg("prlimit");
    }
    c.args(["--core=0", "--"]).arg(inner.get_program());
    c.args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn signal_pid(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    rustix::process::kill_process(pid, sig).expect("signal delivered");
}

/// Kills the recorder with `sig` and waits for its keeper or broker to be
/// done: its stderr closes when the last of them exits. A SIGSEGV sent with
/// kill(2) is taken by Rust's runtime the first time (its stack-overflow
/// handler resets itself to the default and returns, as it does for any
/// fault that is not a guard page hit); it kills on the second delivery,
/// as a real fault does at once.
fn kill_and_collect(child: Child, sig: rustix::process::Signal) -> Output {
    let pid = child.id();
    signal_pid(pid, sig);
    if sig == rustix::process::Signal::SEGV {
        // The runtime's handler is gone once SIGSEGV is no longer caught.
        wait_for("SIGSEGV no longer caught", Duration::from_secs(10), || {
            let caught = proc_status(format!("/proc/{pid}/status"))
                .get("SigCgt")
                .and_then(|m| u64::from_str_radix(m, 16).ok());
            !matches!(caught, Some(m) if m & (1 << 10) != 0)
        });
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).expect("a pid"),
            sig,
        );
    }
    let out = child.wait_with_output().expect("waits");
    assert!(
        !out.status.success(),
        "killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A flight recorder (STOP trigger that never fires) killed with `sig`
/// after five seconds' worth of packets: OUT holds the last seconds.
fn flight_recorder_dies_of(sig: rustix::process::Signal, user: Option<u32>) {
    let run = Run::new(&flight_recorder_config(1024));
    if user.is_some() {
        make_writable(&run);
    }
    let child = command(&run, user).spawn().expect("starts");
    let pid = child.id();
    wait_written(pid, 10_000);
    let out = kill_and_collect(child, sig);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("its buffers were saved"), "{stderr}");
    check_saved(&run.out);
    let counters = contiguous_counters(&run.trace());
    assert!(counters.len() > 3000, "{} packets", counters.len());
    assert!(*counters.last().expect("some") >= 10_000);
}

/// The run's directory handed to uid 65534 (its config readable, the
/// output and runtime directory made there).
fn make_writable(run: &Run) {
    use std::os::unix::fs::PermissionsExt;
    let nobody = Some(rustix::process::Uid::from_raw(NOBODY_UID));
    let group = Some(rustix::process::Gid::from_raw(NOBODY_UID));
    rustix::fs::chown(run.dir.path(), nobody, group).expect("chown");
    std::fs::set_permissions(&run.config, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}

#[test]
fn a_flight_recorder_killed_by_sigkill_is_saved_to_its_trace() {
    require!(need::prlimit());
    flight_recorder_dies_of(rustix::process::Signal::KILL, None);
}

#[test]
fn a_flight_recorder_killed_by_sigsegv_or_abort_is_saved_to_its_trace() {
    require!(need::prlimit());
    flight_recorder_dies_of(rustix::process::Signal::SEGV, None);
    flight_recorder_dies_of(rustix::process::Signal::ABORT, None);
}

#[test]
fn an_unprivileged_sessions_keeper_saves_its_buffers() {
    require!(need::setpriv().or_else(need::prlimit));
    flight_recorder_dies_of(rustix::process::Signal::KILL, Some(NOBODY_UID));
}

#[test]
fn a_ring_dir_session_killed_is_saved_by_the_survivor_which_removes_its_ring_files() {
    require!(need::prlimit());
    let run = Run::new(&flight_recorder_config(1024));
    let rings = tmpfs_dir();
    let mut c = command(&run, None);
    c.arg("--ring-dir").arg(rings.path());
    let child = c.spawn().expect("starts");
    let ring = rings.path().join("buffer-000.ring");
    wait_for("4000 packets written", Duration::from_secs(60), || {
        std::fs::File::open(&ring)
            .ok()
            .and_then(|f| RingImage::read(&f).ok())
            .and_then(|i| i.stats)
            .map_or(0, |s| s.packets_written)
            >= 4000
    });
    let out = kill_and_collect(child, rustix::process::Signal::KILL);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("its buffers were saved"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_saved(&run.out);
    assert!(!ring.exists(), "saved, so the ring file is gone");
}

#[test]
fn a_death_while_idle_writes_nothing() {
    require!(need::prlimit());
    // Waiting for a start trigger: nothing recorded, nothing to save.
    let run = Run::new(&format!(
        "{}\n{}",
        test_config(
            1024,
            "RING_BUFFER",
            "",
            "message_count: 0 max_messages_per_second: 2000 message_size: 200"
        ),
        "trigger_config { trigger_mode: START_TRACING trigger_timeout_ms: 600000 \
         triggers { name: \"go\" stop_delay_ms: 1000 } }"
    ));
    let child = command(&run, None).spawn().expect("starts");
    let pid = child.id();
    wait_listening(&runtime(&run), pid);
    // The trigger socket is bound before the broker is told what to save:
    // wait until it holds the rings and the trace file.
    wait_for(
        "the broker holding the rings and the trace file",
        Duration::from_secs(20),
        || broker_holds(pid, &run.out),
    );
    let out = kill_and_collect(child, rustix::process::Signal::KILL);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nothing to save"), "{stderr}");
    assert_eq!(std::fs::metadata(&run.out).expect("OUT").len(), 0);
}

/// Whether the root broker of session `pid` (its child) holds the
/// session's rings and its trace file `out`: what to save is registered.
fn broker_holds(pid: u32, out: &Path) -> bool {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children.split_whitespace().any(|c| {
        let c: u32 = c.parse().unwrap_or(0);
        let holds_out = std::fs::read_dir(format!("/proc/{c}/fd")).is_ok_and(|d| {
            d.flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == out))
        });
        holds_out && !ring_fds(c).is_empty()
    })
}

/// The kinds of session killed at random instants: a flight recorder
/// waiting (and its wrap-arounds), a stream mid-pass, a session taking
/// snapshots, a segmented stream mid-rotation.
fn kinds() -> Vec<(&'static str, String)> {
    vec![
        (
            "segments",
            test_config(
                2048,
                "RING_BUFFER",
                "write_into_file: true file_write_period_ms: 100 duration_ms: 60000",
                "message_count: 0 max_messages_per_second: 20000 message_size: 200",
            ),
        ),
        ("waiting", flight_recorder_config(512)),
        (
            "streaming",
            test_config(
                2048,
                "RING_BUFFER",
                "write_into_file: true file_write_period_ms: 100 duration_ms: 60000",
                "message_count: 0 max_messages_per_second: 20000 message_size: 200",
            ),
        ),
        (
            "snapshots",
            test_config(
                1024,
                "RING_BUFFER",
                "trigger_config { trigger_mode: CLONE_SNAPSHOT trigger_timeout_ms: 600000 \
                 triggers { name: \"snap\" } }",
                "message_count: 0 max_messages_per_second: 5000 message_size: 200",
            ),
        ),
    ]
}

#[test]
fn a_death_at_random_instants_always_leaves_a_valid_trace_with_nothing_twice() {
    require!(need::prlimit());
    let mut rounds = 0;
    for round in 0..12 {
        let all = kinds();
        let (kind, cfg) = &all[round % all.len()];
        let run = Run::new(cfg);
        let segments = run.dir.path().join("segments");
        let mut c = command(&run, None);
        if *kind == "segments" {
            // The trace goes to a directory of segments instead.
            let args: Vec<std::ffi::OsString> = c.get_args().map(|a| a.to_owned()).collect();
            let mut seg = Command::new(c.get_program());
            for a in args {
                if a == run.out.as_os_str() {
                    seg.arg(segments.join(""));
                } else {
                    seg.arg(a);
                }
            }
            seg.args(["--rotate-size", "200K"]);
            for (k, v) in c.get_envs() {
                if let Some(v) = v {
                    seg.env(k, v);
                }
            }
            seg.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            c = seg;
        }
        let child = c.spawn().expect("starts");
        let pid = child.id();
        if *kind == "snapshots" {
            wait_listening(&runtime(&run), pid);
            // Snapshots in a loop while the instant comes.
            let r = recorder(&run, &["trigger", "snap"]);
            assert!(r.status.success(), "{r:?}");
        }
        // The instant: anywhere from set-up to a few passes in.
        let delay = Duration::from_millis(rand::random_range(0..2500));
        // The instant itself is what varies from run to run.
        std::thread::sleep(delay);
        if *kind == "snapshots" {
            let _ = recorder(&run, &["trigger", "snap"]);
        }
        signal_pid(pid, rustix::process::Signal::KILL);
        let out = child.wait_with_output().expect("waits");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("round {round} ({kind}, killed after {delay:?}): {stderr}");
        if *kind == "segments" {
            segments_valid(&segments, &what);
            rounds += usize::from(stderr.contains("its buffers were saved"));
            continue;
        }
        let data = std::fs::read(&run.out).unwrap_or_default();
        assert_eq!(whole_prefix(&data), data.len(), "{what}");
        if data.is_empty() {
            // Killed before anything was recorded, or a flight recorder
            // killed before its first packet: nothing to save.
            continue;
        }
        // Nothing twice: every sequence's counters strictly increase.
        let packets = decode(&data);
        for (seq, c) in test_counters(&packets) {
            let mut last = None;
            for n in c {
                assert!(last < Some(n), "{what}: seq {seq}: {n} after {last:?}");
                last = Some(n);
            }
        }
        if stderr.contains("its buffers were saved") {
            check_saved(&run.out);
            rounds += 1;
        } else {
            trace_processor::check(&run.out);
        }
        // The session's snapshots: whole packets, but for a torn tail in
        // the one being written at the instant (what any crash leaves,
        // which readers skip).
        for n in 0..8 {
            let snap = PathBuf::from(format!("{}.{n}", run.out.display()));
            if let Ok(d) = std::fs::read(&snap) {
                decode(&d);
            }
        }
    }
    assert!(rounds >= 3, "only {rounds} rounds were saved at death");
}

/// A segmented session's files after a death: the closed segments and the
/// saved one whole, the one being written whole but for a torn tail, and
/// every sequence's counters strictly increasing across them in index
/// order (nothing twice).
fn segments_valid(dir: &Path, what: &str) {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let base = name.strip_suffix(".partial").unwrap_or(&name);
                    let index = base.strip_prefix("trace-")?.strip_suffix(".pftrace")?;
                    Some((index.parse().ok()?, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut last: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for (_, path) in &files {
        let data = std::fs::read(path).expect("segment");
        let partial = path.extension().is_some_and(|e| e == "partial");
        if !partial {
            assert_eq!(
                whole_prefix(&data),
                data.len(),
                "{what}: {}",
                path.display()
            );
        }
        for (seq, c) in test_counters(&decode(&data)) {
            for n in c {
                let prev = last.insert(seq, n);
                assert!(
                    prev < Some(n),
                    "{what}: {}: seq {seq}: {n} after {prev:?}",
                    path.display()
                );
            }
        }
    }
}

/// A memory cgroup made for a test: cgroup v2 (`memory.max`,
/// `memory.events`), or, where the memory controller is bound to cgroup v1,
/// v1 (`memory.limit_in_bytes`, `memory.oom_control`).
struct MemCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemCgroup {
    /// A new group, or why not: `Err((true, why))` where the kernel clearly
    /// has a memory controller that could not be used (a failure under
    /// RECORDER_REQUIRE_KERNEL=1), `Err((false, why))` where it has none.
    fn make(name: &str) -> Result<MemCgroup, (bool, String)> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mount_of = |fs: &str, opt: Option<&str>| {
            mounts
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| {
                    f.get(2) == Some(&fs)
                        && opt
                            .is_none_or(|o| f.get(3).is_some_and(|m| m.split(',').any(|x| x == o)))
                })
                .and_then(|f| f.get(1).map(PathBuf::from))
        };
        let v2_root = mount_of("cgroup2", None).filter(|root| {
            std::fs::read_to_string(root.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        });
        let (parent, v2) = if let Some(root) = v2_root {
            // The hierarchy's root may always give controllers to children.
            let subtree =
                std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
            if !subtree.split_whitespace().any(|c| c == "memory")
                && let Err(e) = std::fs::write(root.join("cgroup.subtree_control"), "+memory")
            {
                return Err((
                    true,
                    format!(
                        "cannot enable the memory controller at {}: {e}",
                        root.display()
                    ),
                ));
            }
            (root, true)
        } else if let Some(v1) = mount_of("cgroup", Some("memory")) {
            // This process's own memory group, where v1 nests freely.
            let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
            let rel = own
                .lines()
                .find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
                    ctl.split(',')
                        .any(|c| c == "memory")
                        .then(|| path.to_string())
                })
                .unwrap_or_default();
            (v1.join(rel.trim_start_matches('/')), false)
        } else {
            return Err((
                false,
                "no memory cgroup controller (v2 or v1) mounted".into(),
            ));
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir)
            .map_err(|e| (true, format!("cannot make {}: {e}", dir.display())))?;
        Ok(MemCgroup { dir, v2 })
    }

    fn usage(&self) -> u64 {
        let file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    fn limit(&self, bytes: u64) {
        let file = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(self.dir.join(file), bytes.to_string()).expect("the limit");
    }

    /// Tasks the OOM killer took in the group.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Removable once its last process is gone.
        poll(Duration::from_secs(10), || {
            std::fs::remove_dir(&self.dir).ok()
        });
    }
}

/// `c` run inside cgroup `group` (it joins before it execs).
fn in_group(group: &Path, c: &Command) -> Command {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
            group.display()
        ))
        .arg(c.get_program())
        .args(c.get_args());
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            sh.env(k, v);
        }
    }
    sh
}

#[test]
fn a_memory_cgroup_oom_kill_of_the_recorder_saves_its_ring_too() {
    require!(need::root().or_else(need::prlimit));
    let group = match MemCgroup::make(&format!("recorder-oom-{}", std::process::id())) {
        Ok(g) => Ok(g),
        Err((true, why)) => Err(need::Missing::kernel(why)),
        Err((false, why)) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let group = require!(group);
    if !group.v2 {
        eprintln!("note: no cgroup v2 memory controller here: using cgroup v1's");
    }
    // A 64 MiB ring, charged to the group with the recorder's own memory.
    let run = Run::new(&flight_recorder_config(64 * 1024));
    let mut rec = in_group(&group.dir, &command(&run, None));
    rec.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = rec.spawn().expect("starts");
    let pid = child.id();
    wait_written(pid, 4000);
    // Then the group runs out: a second process in it takes memory a MiB at
    // a time up to the limit, 32 MiB over what the group holds now. The
    // OOM killer takes the largest task, the recorder (the ring is in its
    // RSS; the keeper or broker maps nothing), then the hog, which leaves
    // the survivor room to save.
    group.limit(group.usage() + (32 << 20));
    let mut hog = Command::new("python3");
    hog.args([
        "-c",
        "import time\nl = []\nwhile True:\n    l.append(bytearray(1 << 20))\n    time.sleep(0.005)",
    ]);
    let mut hog = in_group(&group.dir, &hog);
    hog.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut hog = hog.spawn().expect("the hog starts");
    let out = child.wait_with_output().expect("waits");
    let _ = hog.kill();
    let _ = hog.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_none(),
        "the recorder was killed: {:?}\n{stderr}",
        out.status
    );
    assert!(group.oom_kills() >= 1, "an OOM kill in the group\n{stderr}");
    assert!(stderr.contains("its buffers were saved"), "{stderr}");
    check_saved(&run.out);
    let counters = contiguous_counters(&run.trace());
    assert!(counters.len() > 3000, "{} packets", counters.len());
}

const TRACEFS: &str = "/sys/kernel/tracing";

#[test]
fn the_kernels_ftrace_leftover_is_drained_into_the_save_before_the_instance_goes() {
    require!(need::tracefs_instances(), need::prlimit());
    // A long drain period: what the kernel recorded since the start is
    // still in its buffers when the recorder dies.
    let run = Run::new(
        r#"
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" target_buffer: 0
  ftrace_config { ftrace_events: "sched/sched_switch" drain_period_ms: 60000 } } }
data_sources { config { name: "for_testing" target_buffer: 0
  for_testing { message_count: 0 max_messages_per_second: 1000 message_size: 100 } } }
trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 600000
  triggers { name: "never-fires" stop_delay_ms: 0 } }
"#,
    );
    let child = command(&run, None).spawn().expect("starts");
    let pid = child.id();
    let instance = Path::new(TRACEFS).join(format!("instances/recorder-{pid}"));
    wait_written(pid, 1000);
    assert!(instance.is_dir());
    let out = kill_and_collect(child, rustix::process::Signal::KILL);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("of what the kernel still held"), "{stderr}");
    assert!(
        !instance.exists(),
        "the instance is removed after the drain"
    );
    check_saved(&run.out);
    let packets = decode(&run.trace());
    // Typed events, and sched_switch in its compact form.
    let events: usize = packets
        .iter()
        .filter(|p| p.has_ftrace_events())
        .map(|p| {
            let b = p.ftrace_events();
            b.event.len() + b.compact_sched.switch_timestamp.len()
        })
        .sum();
    assert!(events > 0, "sched_switch events drained");
}
