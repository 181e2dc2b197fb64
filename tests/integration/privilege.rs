//! Least privilege on the built binary, as root: the process that reads
//! other users' bytes gives up root once set up; the broker keeps root for
//! new segments, renames, deletions, hooks and the tracefs teardown (also
//! after SIGKILL); and files are made only through checked directories,
//! never through a name another user planted. Every kept trace is decoded
//! and loaded in trace processor.

use crate::harness::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TRACEFS: &str = "/sys/kernel/tracing";

/// `name:` lines of /proc/PID/status.
fn status(pid: u32) -> std::collections::BTreeMap<String, String> {
    proc_status(format!("/proc/{pid}/status"))
}

/// Whether `pid` has given up root (its uids; `NoNewPrivs` is set earlier,
/// at the fork of the broker).
fn dropped(pid: u32) -> bool {
    status(pid)
        .get("Uid")
        .is_some_and(|u| u.split_whitespace().all(|i| i != "0"))
}

/// The children of `pid` (their pids).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn finish(child: Child) -> String {
    let out = child.wait_with_output().expect("waits");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// Decodes `path` (whole packets) and loads it in trace processor with no
/// error stats.
fn check_trace(path: &Path) {
    let data = std::fs::read(path).expect("trace");
    assert_eq!(whole_prefix(&data), data.len(), "{}", path.display());
    assert!(!decode(&data).is_empty(), "{}", path.display());
    trace_processor::check(path);
}

const FTRACE: &str = r#"
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" target_buffer: 0
  ftrace_config { ftrace_events: "sched/sched_switch" } } }
write_into_file: true
file_write_period_ms: 200
duration_ms: 30000
"#;

/// `run`'s session with a producer socket in its directory, so that it
/// keeps a socket holder; returns it and the socket's path.
fn spawn_with_producer_socket(run: &Run) -> (Child, PathBuf) {
    let sock = run.dir.path().join("producer.sock");
    let child = run
        .command("pwritev")
        .arg("--producer-socket")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    (child, sock)
}

#[test]
fn the_socket_holder_runs_as_a_service_user_with_no_capabilities() {
    require!(need::tracefs_instances().or_else(need::setpriv));
    let run = Run::new(FTRACE);
    let (child, sock) = spawn_with_producer_socket(&run);
    let pid = child.id();
    let instance = Path::new(TRACEFS).join(format!("instances/recorder-{pid}"));
    wait_for("the drop", Duration::from_secs(20), || {
        status(pid)
            .get("Uid")
            .is_some_and(|u| !u.starts_with("0\t"))
    });
    let st = status(pid);
    let uid: u32 = st["Uid"]
        .split_whitespace()
        .next()
        .and_then(|u| u.parse().ok())
        .expect("uid");
    assert!(uid != 0 && uid != NOBODY_UID, "{st:?}");
    for ids in [&st["Uid"], &st["Gid"]] {
        assert!(ids.split_whitespace().all(|i| i != "0"), "{st:?}");
    }
    for caps in ["CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"] {
        assert_eq!(st[caps], "0000000000000000", "{caps}: {st:?}");
    }
    assert_eq!(st["NoNewPrivs"], "1", "{st:?}");
    assert_eq!(st["Groups"], "", "{st:?}");
    assert!(sock.exists(), "the producer socket is open");
    assert!(instance.is_dir(), "recording into {}", instance.display());
    // The broker, its one child, keeps root.
    let kids = children(pid);
    assert_eq!(kids.len(), 1, "the broker only: {kids:?}");
    let broker = status(kids[0]);
    assert!(broker["Uid"].starts_with("0\t"), "{broker:?}");
    // nobody cannot signal the recorder (a dedicated uid, not 65534).
    let kill = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["kill", "-0", &pid.to_string()])
        .output()
        .expect("setpriv runs");
    assert!(!kill.status.success(), "nobody may not signal the recorder");
    signal(&child, rustix::process::Signal::INT);
    let stderr = finish(child);
    assert!(stderr.contains("gave up root"), "{stderr}");
    assert!(
        !instance.exists(),
        "the broker removed the instance at the stop"
    );
    assert!(!sock.exists(), "the producer socket is removed at the end");
    check_trace(&run.out);
}

/// Every thread of a root session, not only the one that dropped: no uid
/// 0, no capability, `no_new_privs` (threads started before the drop
/// inherit it from the fork of the broker), checked through
/// /proc/PID/task/*/status while the session records.
#[test]
fn every_thread_of_a_dropped_session_carries_no_new_privs_and_no_capability() {
    require!(need::tracefs_instances());
    let run = Run::new(FTRACE);
    let (child, _) = spawn_with_producer_socket(&run);
    let pid = child.id();
    wait_for("the drop", Duration::from_secs(20), || dropped(pid));
    // A write pass after the drop: every thread of the session is running.
    wait_for("a write pass", Duration::from_secs(20), || {
        std::fs::read(&run.out).is_ok_and(|d| whole_prefix_lenient(&d) > 0)
    });
    let tasks: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    assert!(
        tasks.len() > 1,
        "threads started before the drop: {tasks:?}"
    );
    for tid in &tasks {
        let st = proc_status(format!("/proc/{pid}/task/{tid}/status"));
        if st.is_empty() {
            continue; // ended meanwhile
        }
        let what = format!("thread {tid} ({}): {st:?}", st["Name"]);
        assert!(st["Uid"].split_whitespace().all(|i| i != "0"), "{what}");
        assert!(st["Gid"].split_whitespace().all(|i| i != "0"), "{what}");
        for caps in ["CapEff", "CapPrm"] {
            assert_eq!(st[caps], "0000000000000000", "{caps} of {what}");
        }
        assert_eq!(st["NoNewPrivs"], "1", "{what}");
    }
    // The broker, forked before, runs hooks that may exec setuid programs.
    let kids = children(pid);
    assert_eq!(kids.len(), 1, "the broker only: {kids:?}");
    assert_eq!(status(kids[0])["NoNewPrivs"], "0", "the broker");
    signal(&child, rustix::process::Signal::INT);
    let stderr = finish(child);
    assert!(stderr.contains("gave up root"), "{stderr}");
    check_trace(&run.out);
}

/// The `session.0.*.lock` files of the runtime directory.
fn name_locks(runtime: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(runtime)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("session.0.") && n.ends_with(".lock"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A root session's `unique_session_name` lock file outlives the drop (the
/// service user cannot unlink root's file in the sticky runtime
/// directory): the broker removes it at the end, after a stop and after
/// SIGKILL alike, and the name is free for the next session.
#[test]
fn the_name_lock_of_a_dropped_session_is_removed_at_its_end() {
    require!(need::tracefs_instances());
    let run = Run::new(&format!(
        "{FTRACE}unique_session_name: \"privsmall_lock\"\n"
    ));
    let runtime = run.dir.path().join("run");
    for kill in [false, true] {
        let mut c = run.command("pwritev");
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = c.spawn().expect("starts");
        let pid = child.id();
        wait_for("the drop", Duration::from_secs(20), || dropped(pid));
        let locks = name_locks(&runtime);
        assert_eq!(locks.len(), 1, "{locks:?}");
        let held = std::fs::read_to_string(&locks[0]).expect("lock file");
        assert_eq!(held.trim(), pid.to_string());
        // A second session of the same name is refused while it runs.
        let second = run.command("pwritev").output().expect("runs");
        assert_eq!(second.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&second.stderr).contains("already running"),
            "{}",
            String::from_utf8_lossy(&second.stderr)
        );
        if kill {
            child.kill().expect("SIGKILL");
            child.wait().expect("waits");
            wait_for(
                "the lock removed after SIGKILL",
                Duration::from_secs(10),
                || name_locks(&runtime).is_empty(),
            );
        } else {
            signal(&child, rustix::process::Signal::INT);
            finish(child);
            assert_eq!(name_locks(&runtime), Vec::<PathBuf>::new());
            check_trace(&run.out);
        }
    }
}

#[test]
fn sigkill_of_the_recorder_still_tears_tracefs_down() {
    require!(need::tracefs_instances());
    let run = Run::new(FTRACE);
    let mut c = run.command("pwritev");
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = c.spawn().expect("starts");
    let pid = child.id();
    let instance = Path::new(TRACEFS).join(format!("instances/recorder-{pid}"));
    let runtime = run.dir.path().join("run");
    let control = runtime.join(format!("recorder-{pid}.trigger"));
    wait_for("the drop", Duration::from_secs(20), || dropped(pid));
    assert!(instance.is_dir());
    assert!(control.exists(), "{}", control.display());
    // A write pass after the drop, so there is something the kill must not
    // take away.
    wait_for("a write pass", Duration::from_secs(20), || {
        std::fs::read(&run.out).is_ok_and(|d| whole_prefix_lenient(&d) > 0)
    });
    child.kill().expect("SIGKILL");
    child.wait().expect("waits");
    wait_for(
        "the instance removed after SIGKILL",
        Duration::from_secs(10),
        || !instance.exists(),
    );
    wait_for(
        "the control socket removed",
        Duration::from_secs(10),
        || !control.exists(),
    );
    let data = std::fs::read(&run.out).expect("trace");
    let whole = whole_prefix_lenient(&data);
    assert!(whole > 0, "the killed session kept its passes");
}

/// Whole records at the start of `data` (a SIGKILLed file may end inside one).
fn whole_prefix_lenient(data: &[u8]) -> usize {
    let mut pos = 0;
    while pos < data.len() && data[pos] == 0x0a {
        let mut len: u64 = 0;
        let mut shift = 0;
        let mut i = pos + 1;
        while i < data.len() {
            let b = data[i];
            len |= u64::from(b & 0x7f) << shift;
            shift += 7;
            i += 1;
            if b & 0x80 == 0 {
                break;
            }
        }
        let end = i + len as usize;
        if end > data.len() {
            break;
        }
        pos = end;
    }
    pos
}

const STREAMING: &str = "write_into_file: true file_write_period_ms: 100";

/// Segment files of `dir`: index → (name, closed).
fn segments(dir: &Path) -> std::collections::BTreeMap<u64, (PathBuf, bool)> {
    let mut m = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let (base, partial) = match name.strip_suffix(".partial") {
            Some(b) => (b.to_string(), true),
            None => (name.clone(), false),
        };
        let Some(idx) = base
            .strip_prefix("trace-")
            .and_then(|r| r.strip_suffix(".pftrace"))
            .and_then(|d| d.parse().ok())
        else {
            continue;
        };
        // A planted entry is not a segment.
        if e.file_type().is_ok_and(|t| t.is_file()) && e.metadata().is_ok_and(|m| m.uid() == 0) {
            m.insert(idx, (e.path(), !partial));
        }
    }
    m
}

#[test]
fn a_rotating_session_in_a_root_directory_still_rotates_deletes_and_runs_hooks_as_root() {
    require!(need::root());
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        &format!("{STREAMING} duration_ms: 2500"),
        "message_count: 0 message_size: 200 max_messages_per_second: 8000",
    ));
    let dir = dir_with_mode(&run.dir.path().join("ring"), 0o755);
    let hook_log = run.dir.path().join("hook.log");
    let hook = run.dir.path().join("hook.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho \"$(id -u) $1\" >> {}\n",
            hook_log.display()
        ),
    )
    .expect("hook");
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut c = run.command_to("pwritev", &dir.join(""));
    c.args(["--rotate-size", "64K", "--max-segments", "3"])
        .arg("--on-segment-closed")
        .arg(&hook)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let stderr = finish(c.spawn().expect("starts"));
    assert!(stderr.contains("gave up root"), "{stderr}");
    let files = segments(&dir);
    assert_eq!(files.len(), 3, "{files:?}\n{stderr}");
    let last = *files.keys().last().expect("some");
    assert!(last >= 5, "{stderr}");
    for (path, closed) in files.values() {
        assert!(closed, "{}", path.display());
        let meta = std::fs::metadata(path).expect("meta");
        assert_eq!(meta.uid(), 0, "the broker made it");
        assert_eq!(meta.mode() & 0o777, 0o600);
        let car = PathBuf::from(format!("{}.json", path.display()));
        assert!(car.is_file(), "{}", car.display());
        check_trace(path);
    }
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") || n.ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(stderr.contains("deleted by the budget"), "{stderr}");
    let log = std::fs::read_to_string(&hook_log).expect("hooks ran");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len() as u64, last + 1, "{log}");
    assert!(
        lines.iter().all(|l| l.starts_with("0 ")),
        "hooks run as root: {log}"
    );
}

fn victim(dir: &Path, name: &str) -> (PathBuf, std::fs::Metadata) {
    let v = dir.join(name);
    std::fs::write(&v, b"precious\n").expect("victim");
    let meta = std::fs::metadata(&v).expect("meta");
    (v, meta)
}

fn untouched(v: &Path, before: &std::fs::Metadata) {
    assert_eq!(
        std::fs::read(v).expect("victim"),
        b"precious\n",
        "{}",
        v.display()
    );
    let now = std::fs::metadata(v).expect("meta");
    assert_eq!(now.mtime_nsec(), before.mtime_nsec(), "{}", v.display());
    assert_eq!(now.mode(), before.mode(), "{}", v.display());
}

#[test]
fn names_planted_in_a_sticky_directory_are_never_written_through() {
    require!(need::root());
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 250 duration_ms: 4000",
        "message_count: 0 message_size: 200 max_messages_per_second: 4000",
    ));
    let safe = run.dir.path().join("safe");
    std::fs::create_dir(&safe).expect("mkdir");
    let shared = dir_with_mode(&run.dir.path().join("shared"), 0o1777);
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let victims: Vec<(PathBuf, std::fs::Metadata)> =
        (0..8).map(|i| victim(&safe, &format!("v{i}"))).collect();

    // A single-file trace at a planted symlink: replaced, not written through.
    let single = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 300",
        "message_count: 100 message_size: 64",
    ));
    let out = shared.join("single.pftrace");
    plant(&shared.join("single.pftrace"), "symlink", &victims[0].0);
    let o = single.command_to("pwritev", &out).output().expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::symlink_metadata(&out).expect("meta").is_file());
    check_trace(&out);
    // With --no-clobber the planted name is an error, and nothing is opened.
    plant(&shared.join("nc.pftrace"), "fifo", &victims[0].0);
    let mut c = single.command_to("pwritev", &shared.join("nc.pftrace"));
    c.arg("--no-clobber");
    let o = c.output().expect("runs");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already exists"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // A rotating session: links, FIFOs and hard links at the names it will
    // use next, planted while it runs.
    let mut c = run.command_to("pwritev", &shared.join(""));
    c.args(["--rotate-size", "16K"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("starts");
    wait_for("segment 1", Duration::from_secs(20), || {
        shared.join("trace-000001.pftrace.json").exists()
    });
    let base = segments(&shared).keys().last().copied().unwrap_or(1) + 3;
    let n = |i: u64| format!("trace-{i:06}.pftrace");
    // Each name gets its own victim, so an entry written through shows.
    let planted = [
        (format!("{}.partial", n(base)), "symlink"),
        (format!("{}.partial", n(base + 1)), "fifo"),
        (format!("{}.partial", n(base + 2)), "hardlink"),
        (n(base + 3), "symlink"),
        (format!("{}.json", n(base + 3)), "hardlink"),
        (format!(".{}.json.tmp", n(base + 4)), "symlink"),
        (format!("{}.json.tmp", n(base + 4)), "fifo"),
    ];
    for ((name, what), (victim, _)) in planted.iter().zip(&victims[1..]) {
        plant(&shared.join(name), what, victim);
    }
    let stderr = finish(child);
    for (v, meta) in &victims {
        untouched(v, meta);
    }
    assert!(
        stderr.contains("was already taken by another entry"),
        "{stderr}"
    );
    let files = segments(&shared);
    assert!(
        files.keys().last().is_some_and(|l| *l > base + 4),
        "{files:?}\n{stderr}"
    );
    for i in [base, base + 1, base + 2] {
        assert!(
            !files.contains_key(&i),
            "segment {i} was skipped: {files:?}"
        );
    }
    // The final name and sidecar of base+3 were replaced by the segment's own.
    assert!(files.get(&(base + 3)).is_some_and(|(_, closed)| *closed));
    for (path, closed) in files.values() {
        assert!(closed, "{}", path.display());
        assert!(PathBuf::from(format!("{}.json", path.display())).is_file());
        check_trace(path);
    }
}

#[test]
fn a_directory_another_user_owns_is_refused_before_anything_is_opened() {
    require!(need::root());
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 300",
        "message_count: 100 message_size: 64",
    ));
    let theirs = dir_with_mode(&run.dir.path().join("theirs"), 0o755);
    rustix::fs::chown(
        &theirs,
        Some(rustix::process::Uid::from_raw(NOBODY_UID)),
        Some(rustix::process::Gid::from_raw(NOBODY_UID)),
    )
    .expect("chown");
    let existing = theirs.join("trace.pftrace");
    std::fs::write(&existing, b"earlier\n").expect("write");
    let open = dir_with_mode(&run.dir.path().join("open"), 0o777);
    for (out, rotate, fix) in [
        (existing.clone(), false, "belongs to uid 65534"),
        (theirs.join("segs/"), true, "belongs to uid 65534"),
        (open.join("t.pftrace"), false, "chmod +t"),
    ] {
        let mut c = run.command_to("pwritev", &out);
        if rotate {
            c.args(["--rotate-size", "64K"]);
        }
        let o = c.output().expect("runs");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {stderr}", out.display());
        assert!(stderr.contains(fix), "{stderr}");
    }
    assert_eq!(std::fs::read(&existing).expect("kept"), b"earlier\n");
    assert!(!theirs.join("segs").exists());
    assert_eq!(std::fs::read_dir(&open).expect("dir").count(), 0);
}

#[test]
fn planted_snapshot_and_log_names_are_replaced_not_written_through() {
    require!(need::root());
    let run = Run::new(
        r#"
buffers { size_kb: 2048 fill_policy: RING_BUFFER }
data_sources { config { name: "for_testing" target_buffer: 0
  for_testing { message_count: 0 max_messages_per_second: 2000 message_size: 8 } } }
trigger_config { trigger_mode: CLONE_SNAPSHOT trigger_timeout_ms: 3000 triggers { name: "snap" } }
"#,
    );
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let shared = dir_with_mode(&run.dir.path().join("shared"), 0o1777);
    let safe = run.dir.path().join("safe");
    std::fs::create_dir(&safe).expect("mkdir");
    let victims: Vec<(PathBuf, std::fs::Metadata)> =
        (0..3).map(|i| victim(&safe, &format!("v{i}"))).collect();
    plant(&shared.join("snap.pftrace.0"), "symlink", &victims[0].0);
    plant(&shared.join("snap.pftrace.1"), "hardlink", &victims[1].0);
    plant(&shared.join("snap.pftrace.log"), "symlink", &victims[2].0);
    let out = shared.join("snap.pftrace");
    let o = run
        .command_to("pwritev", &out)
        .arg("--background")
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pid: u32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("pid");
    wait_for("the drop", Duration::from_secs(20), || dropped(pid));
    for _ in 0..2 {
        let t = Command::new(recorder_bin())
            .args(["trigger", "snap"])
            .env("RECORDER_RUNTIME_DIR", run.dir.path().join("run"))
            .output()
            .expect("trigger");
        assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
        // Each trigger its own snapshot, not one under way.
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_for(
        "the background session's end",
        Duration::from_secs(20),
        || !Path::new(&format!("/proc/{pid}")).exists(),
    );
    for (v, meta) in &victims {
        untouched(v, meta);
    }
    let log = std::fs::read_to_string(shared.join("snap.pftrace.log")).expect("log");
    assert!(
        std::fs::symlink_metadata(shared.join("snap.pftrace.log"))
            .expect("meta")
            .is_file()
    );
    for n in 0..2 {
        let p = shared.join(format!("snap.pftrace.{n}"));
        let meta = std::fs::symlink_metadata(&p).expect("snapshot");
        assert!(
            meta.is_file() && meta.nlink() == 1,
            "{}: {log}",
            p.display()
        );
        assert!(
            decode(&std::fs::read(&p).expect("read"))
                .iter()
                .any(|p| p.has_clone_snapshot_trigger()),
            "{log}"
        );
        check_trace(&p);
    }
}

const FLIGHT_FTRACE: &str = r#"
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" target_buffer: 0
  ftrace_config { ftrace_events: "sched/sched_switch" } } }
trigger_config { trigger_mode: START_TRACING trigger_timeout_ms: 60000
  triggers { name: "go" stop_delay_ms: 1500 } }
write_into_file: true
file_write_period_ms: 200
"#;

/// Each thread of `pid`: (name, real uid).
fn threads(pid: u32) -> Vec<(String, u32)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| {
            let text = std::fs::read_to_string(t.path().join("status")).ok()?;
            let field = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.trim().to_string())
            };
            let uid = field("Uid:")?.split_whitespace().next()?.parse().ok()?;
            Some((field("Name:")?, uid))
        })
        .collect()
}

/// Threads that read other users' bytes (control) or run a started source.
const SERVING_THREADS: &[&str] = &["recorder-control", "ftrace-reader"];

#[test]
fn a_flight_recorder_waiting_for_its_trigger_already_runs_unprivileged_and_records_ftrace_after_it()
{
    require!(need::tracefs_instances());
    let run = Run::new(FLIGHT_FTRACE);
    let mut c = run.command("pwritev");
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let child = c.spawn().expect("starts");
    let pid = child.id();
    let instance = Path::new(TRACEFS).join(format!("instances/recorder-{pid}"));
    let control = run
        .dir
        .path()
        .join("run")
        .join(format!("recorder-{pid}.control"));
    // From the first instant: no thread that serves a socket or reads
    // ftrace ever runs as root, and the first control request is answered
    // by a process that already gave up root.
    let t0 = Instant::now();
    let mut query: Option<Child> = None;
    let answered_as = loop {
        assert!(t0.elapsed() < Duration::from_secs(20), "no answer");
        for (name, uid) in threads(pid) {
            assert!(
                !(uid == 0 && SERVING_THREADS.contains(&name.as_str())),
                "{name} runs as root"
            );
        }
        if query.is_none() && control.exists() {
            query = Some(
                recorder_as(&run, None, &["query", "--json"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("query runs"),
            );
        }
        if let Some(q) = query.as_mut()
            && q.try_wait().expect("query").is_some()
        {
            break status(pid)["Uid"].clone();
        }
    };
    let out = query.expect("query").wait_with_output().expect("query");
    assert!(out.status.success(), "query answered");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let me = listed
        .as_array()
        .and_then(|a| a.iter().find(|s| s["pid"] == pid))
        .expect("the session is listed");
    assert_eq!(me["state"], "waiting for trigger", "{me}");
    assert!(!answered_as.starts_with("0\t"), "answered as {answered_as}");
    let st = status(pid);
    assert!(st["Uid"].split_whitespace().all(|i| i != "0"), "{st:?}");
    assert_eq!(st["CapEff"], "0000000000000000", "{st:?}");
    assert_eq!(st["CapPrm"], "0000000000000000", "{st:?}");
    assert_eq!(st["NoNewPrivs"], "1", "{st:?}");
    // Prepared as root, not armed: the instance is set up, tracing off.
    assert!(instance.is_dir(), "{}", instance.display());
    let on = std::fs::read_to_string(instance.join("tracing_on")).expect("tracing_on");
    assert_eq!(on.trim(), "0", "not recording before the trigger");
    let enabled =
        std::fs::read_to_string(instance.join("events/sched/sched_switch/enable")).expect("enable");
    assert_eq!(enabled.trim(), "1");
    let t = recorder_as(&run, None, &["trigger", "go"])
        .output()
        .expect("trigger runs");
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    // Armed through the descriptor opened as root.
    wait_for("tracing on", Duration::from_secs(10), || {
        std::fs::read_to_string(instance.join("tracing_on")).is_ok_and(|v| v.trim() == "1")
    });
    for (name, uid) in threads(pid) {
        assert!(uid != 0, "{name} runs as root after the trigger");
    }
    let stderr = finish(child);
    assert!(stderr.contains("gave up root"), "{stderr}");
    assert!(!instance.exists(), "the broker removed the instance");
    let packets = decode(&std::fs::read(&run.out).expect("trace"));
    let events: usize = packets
        .iter()
        .filter(|p| p.has_ftrace_events())
        .map(|p| {
            let b = p.ftrace_events();
            b.event.len()
                + b.compact_sched
                    .as_ref()
                    .map_or(0, |c| c.switch_timestamp.len())
        })
        .sum();
    assert!(events > 0, "sched_switch recorded after the trigger");
    check_trace(&run.out);
}

/// The uid a root session says it will run as (its log's first lines).
fn chosen_uid(stderr: &str) -> Option<u32> {
    stderr
        .split("the session will run as uid ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// Item 13: a root session never runs as a uid some process already runs
/// as (that process could stop or signal it), nor as one another live
/// session holds: two sessions beside a process of the first free uid of
/// the dynamic range each get a uid of their own, which that process
/// cannot signal.
#[test]
fn a_session_takes_a_uid_no_process_uses_and_holds_it() {
    require!(need::setpriv());
    let cfg = test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 60000",
        "message_count: 0 message_size: 16 max_messages_per_second: 100",
    );
    // Which uid a session takes when nothing is in the way.
    let probe = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 100",
        "message_count: 10 message_size: 16",
    ));
    let o = probe.run("pwritev");
    let first = chosen_uid(&String::from_utf8_lossy(&o.stderr)).expect("the log names the uid");
    if !(61184..=65519).contains(&first) {
        // A `recorder` system user (or RECORDER_USER) decides instead.
        return;
    }
    let _squatter = Reaped(
        Command::new("setpriv")
            .args(["--reuid", &first.to_string(), "--regid", &first.to_string()])
            .args(["--clear-groups", "sleep", "120"])
            .spawn()
            .expect("squatter"),
    );
    let runs: Vec<Run> = (0..2).map(|_| Run::new(&cfg)).collect();
    let mut sessions: Vec<Child> = runs
        .iter()
        .map(|r| {
            r.command("pwritev")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starts")
        })
        .collect();
    let mut uids = Vec::new();
    for s in &sessions {
        let pid = s.id();
        wait_for("the drop", Duration::from_secs(20), || dropped(pid));
        let uid: u32 = status(pid)["Uid"]
            .split_whitespace()
            .next()
            .and_then(|u| u.parse().ok())
            .expect("uid");
        uids.push(uid);
        let kill = Command::new("setpriv")
            .args(["--reuid", &first.to_string(), "--regid", &first.to_string()])
            .args(["--clear-groups", "kill", "-STOP", &pid.to_string()])
            .output()
            .expect("setpriv");
        assert!(!kill.status.success(), "uid {first} stopped session {pid}");
    }
    assert!(
        !uids.contains(&first),
        "{uids:?} beside a process of uid {first}"
    );
    assert_ne!(uids[0], uids[1], "two live sessions share a uid");
    for s in &mut sessions {
        signal(s, rustix::process::Signal::INT);
    }
    for s in sessions {
        let err = finish(s);
        assert!(err.contains("gave up root"), "{err}");
    }
    for r in &runs {
        check_trace(&r.out);
    }
}

/// A child killed and reaped when dropped (also when a test fails).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Item 12: SIGKILL at any moment of a root ftrace session's set-up (0 to
/// 300 ms after it starts: before, during and after its tracefs instance,
/// sockets and drop) leaves neither the instance nor its sockets: the
/// broker, told the pid and the socket names before anything is set up,
/// removes what it finds (sockets only when nobody listens on them).
#[test]
fn sigkill_during_set_up_leaves_no_tracefs_instance_nor_sockets() {
    require!(need::tracefs_instances());
    let run = Run::new(
        r#"
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" target_buffer: 0
  ftrace_config { ftrace_events: "sched/sched_switch" } } }
trigger_config { trigger_mode: START_TRACING trigger_timeout_ms: 60000
  triggers { name: "go" stop_delay_ms: 1000 } }
"#,
    );
    let runtime = run.dir.path().join("run");
    let producer = run.dir.path().join("producer.sock");
    let mut caught_mid_way = 0;
    for delay_ms in [
        0u64, 10, 20, 30, 40, 50, 60, 70, 80, 100, 120, 150, 200, 300,
    ] {
        let mut c = run.command("pwritev");
        c.arg("--producer-socket")
            .arg(&producer)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = c.spawn().expect("starts");
        let pid = child.id();
        // The kill point is the variable here: a set time after the start.
        std::thread::sleep(Duration::from_millis(delay_ms));
        let instance = Path::new(TRACEFS).join(format!("instances/recorder-{pid}"));
        if instance.exists() && !dropped(pid) {
            caught_mid_way += 1;
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("waits");
        let sockets = [
            runtime.join(format!("recorder-{pid}.trigger")),
            runtime.join(format!("recorder-{pid}.control")),
            producer.clone(),
        ];
        wait_for(
            format!("nothing left {delay_ms} ms in"),
            Duration::from_secs(15),
            || !instance.exists() && sockets.iter().all(|s| !s.exists()),
        );
    }
    eprintln!("{caught_mid_way} kills landed between the instance and the drop");
}
