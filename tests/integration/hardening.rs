//! Hardening on the built binary: a root session against an unprivileged
//! local user (uid 65534 through `setpriv`), hostile inputs, and the edges
//! of the output path. Each attack is followed by the checks that matter:
//! the session kept recording, the trigger got through, and the file
//! decodes with the independent decoder.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::recording::{Run, sinks, test_config};

pub(crate) const NOBODY: &str = "65534";

/// Why the attacker cannot be played here, if it cannot.
pub(crate) fn attacker_missing() -> Option<String> {
    need_root().or_else(|| {
        let ok = Command::new("setpriv")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        (!ok).then(|| "setpriv missing".to_string())
    })
}

pub(crate) fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// `program` run as uid `uid` (no groups).
pub(crate) fn as_user(uid: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid", uid, "--regid", uid, "--clear-groups"])
        .arg(program)
        .stdin(Stdio::null());
    c
}

pub(crate) fn as_nobody(program: impl AsRef<std::ffi::OsStr>) -> Command {
    as_user(NOBODY, program)
}

/// A hostile peer (tests/attacker/hostile_peer.py) as nobody, once it says
/// it is ready. Killed when dropped.
struct Attacker(Child);

impl Attacker {
    fn start(args: &[&str]) -> Attacker {
        let script = repo_root().join("tests/attacker/hostile_peer.py");
        let mut child = as_nobody(python())
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("attacker starts");
        let mut out = child.stdout.take().expect("stdout");
        let mut line = [0u8; 6];
        out.read_exact(&mut line).expect("attacker says ready");
        assert_eq!(&line, b"ready\n");
        Attacker(child)
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `child` at most `limit`; kills it (and says so) when it takes longer.
pub(crate) fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let t0 = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what}: still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn output_within(c: &mut Command, limit: Duration, what: &str) -> Output {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    wait_within(child, limit, what)
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A session shared with other users: its directory is searchable by all and
/// its runtime directory exists, root-owned and sticky (as `/run/recorder`).
pub(crate) fn shared_run(config: &str) -> Run {
    let run = Run::new(config);
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let rt = runtime(&run);
    std::fs::create_dir(&rt).expect("mkdir");
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    run
}

pub(crate) fn runtime(run: &Run) -> PathBuf {
    run.dir.path().join("run")
}

/// `recorder ARGS` against `run`'s runtime directory, as `uid` (None: root).
pub(crate) fn recorder_as(run: &Run, uid: Option<&str>, args: &[&str]) -> Command {
    let mut c = match uid {
        Some(u) => as_user(u, recorder_bin()),
        None => Command::new(recorder_bin()),
    };
    c.args(args)
        .env("RECORDER_RUNTIME_DIR", runtime(run))
        .stdin(Stdio::null());
    c
}

pub(crate) fn wait_listening(run: &Run, pid: u32) {
    let sock = runtime(run).join(format!("recorder-{pid}.trigger"));
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "session {pid} never listened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A flight recorder: STOP_TRACING on `trigger` (no delay), `extra` in the
/// trigger block.
pub(crate) fn flight_config(trigger_extra: &str, top_extra: &str) -> String {
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
fn check_triggered(run: &Run, session: Child, uid: u32) {
    let out = wait_within(
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

#[test]
fn planted_history_files_neither_redirect_nor_block_nor_exhaust_a_root_session() {
    if skip_unless(attacker_missing()) {
        return;
    }
    for attack in ["symlink", "fifo", "sparse"] {
        let run = shared_run(&flight_config("max_per_24_h: 3", ""));
        let victim = run.dir.path().join("victim");
        std::fs::write(&victim, "precious\n").expect("victim");
        let rt = runtime(&run);
        // Every name the history may have, planted before the session starts.
        for name in ["trigger-history", "trigger-history.0"] {
            let p = rt.join(name);
            let mut c = match attack {
                "symlink" => {
                    let mut c = as_nobody("ln");
                    c.arg("-s").arg(&victim).arg(&p);
                    c
                }
                "fifo" => {
                    let mut c = as_nobody("mkfifo");
                    c.arg(&p);
                    c
                }
                _ => {
                    let mut c = as_nobody("truncate");
                    c.args(["-s", "4G"]).arg(&p);
                    c
                }
            };
            assert!(c.status().expect("plant").success(), "{attack}");
        }
        let session = run.spawn("auto");
        wait_listening(&run, session.id());
        // The trigger stops the session at once: give the source time to
        // write (a loaded machine may start it after the socket exists).
        std::thread::sleep(Duration::from_millis(300));
        let t = output_within(
            &mut recorder_as(&run, Some(NOBODY), &["trigger", "go"]),
            Duration::from_secs(10),
            attack,
        );
        assert!(t.status.success(), "{attack}: {}", stderr(&t));
        check_triggered(&run, session, 65534);
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "precious\n",
            "{attack}: the planted link was followed"
        );
    }
}

#[test]
fn a_runtime_directory_another_user_made_is_refused_with_the_fix() {
    if skip_unless(attacker_missing()) {
        return;
    }
    let run = Run::new(&flight_config("", ""));
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let shared = run.dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let theirs = shared.join("recorder");
    assert!(
        as_nobody("mkdir")
            .args(["-m", "1777"])
            .arg(&theirs)
            .status()
            .expect("mkdir")
            .success()
    );
    let link = shared.join("link");
    assert!(
        as_nobody("ln")
            .arg("-s")
            .arg(&theirs)
            .arg(&link)
            .status()
            .expect("ln")
            .success()
    );
    for (dir, says) in [(&theirs, "belongs to uid 65534"), (&link, "symbolic link")] {
        let mut c = run.command("auto");
        c.env("RECORDER_RUNTIME_DIR", dir);
        let out = output_within(&mut c, Duration::from_secs(10), "session start");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(says) && err.contains("RECORDER_RUNTIME_DIR"),
            "{err}"
        );
        let left: Vec<_> = std::fs::read_dir(&theirs).expect("ls").collect();
        assert!(left.is_empty(), "nothing was created in their directory");
    }
}

#[test]
fn a_fake_session_socket_is_not_believed() {
    if skip_unless(attacker_missing()) {
        return;
    }
    let run = shared_run(&flight_config("", ""));
    let session = run.spawn("auto");
    wait_listening(&run, session.id());
    // A root process with no sockets of its own: nobody answers in its name.
    let mut victim = Command::new("sleep").arg("60").spawn().expect("sleep");
    let vpid = victim.id().to_string();
    let rt = runtime(&run);
    let rt = rt.to_str().expect("utf-8 path");
    let _c = Attacker::start(&["fake", rt, "control", "lie", "--pid", &vpid]);
    let _t = Attacker::start(&["fake", rt, "trigger", "lie", "--pid", &vpid]);
    let stop = output_within(
        &mut recorder_as(&run, None, &["stop", &vpid]),
        Duration::from_secs(10),
        "stop",
    );
    assert_eq!(stop.status.code(), Some(1), "{}", stderr(&stop));
    assert!(stderr(&stop).contains("not believed"), "{}", stderr(&stop));
    let query = output_within(
        &mut recorder_as(&run, None, &["query", "--json"]),
        Duration::from_secs(10),
        "query",
    );
    let v: serde_json::Value = serde_json::from_slice(&query.stdout).expect("json");
    let states: Vec<_> = v
        .as_array()
        .expect("array")
        .iter()
        .filter(|s| s.get("state").is_some())
        .collect();
    assert_eq!(states.len(), 1, "only the real session answers: {v}");
    let t = output_within(
        &mut recorder_as(&run, None, &["trigger", "go"]),
        Duration::from_secs(10),
        "trigger",
    );
    let err = stderr(&t);
    assert!(t.status.success(), "{err}");
    assert!(
        err.contains(&format!("session {vpid}: ")) && err.contains("not believed"),
        "{err}"
    );
    check_triggered(&run, session, 0);
    let _ = victim.kill();
    let _ = victim.wait();
}

#[test]
fn slow_and_idle_connections_do_not_keep_a_trigger_out() {
    if skip_unless(attacker_missing()) {
        return;
    }
    let run = shared_run(&flight_config("", ""));
    let session = run.spawn("auto");
    wait_listening(&run, session.id());
    let sock = runtime(&run).join(format!("recorder-{}.trigger", session.id()));
    let sock = sock.to_str().expect("utf-8 path");
    let _idle = Attacker::start(&["hold", sock, "40"]);
    let _slow = Attacker::start(&["hold", sock, "5", "--dribble", "0.4"]);
    std::thread::sleep(Duration::from_millis(500));
    // Another unprivileged user's app fires the trigger.
    let t = output_within(
        &mut recorder_as(&run, Some("65533"), &["trigger", "go"]),
        Duration::from_secs(9),
        "trigger under slow connections",
    );
    assert!(t.status.success(), "{}", stderr(&t));
    check_triggered(&run, session, 65533);
}

#[test]
fn hostile_session_sockets_cost_clients_neither_memory_nor_time() {
    if skip_unless(attacker_missing()) {
        return;
    }
    let run = shared_run(&flight_config("", ""));
    let session = run.spawn("auto");
    wait_listening(&run, session.id());
    let rt = runtime(&run);
    let rt = rt.to_str().expect("utf-8 path");
    let _flood = Attacker::start(&["fake", rt, "trigger", "flood"]);
    let _dribble = Attacker::start(&["fake", rt, "trigger", "dribble"]);
    // Bounded memory: an address-space limit the old reader went through.
    let mut c = Command::new("prlimit");
    c.arg("--as=2147483648")
        .arg(recorder_bin())
        .args(["trigger", "go"])
        .env("RECORDER_RUNTIME_DIR", rt)
        .stdin(Stdio::null());
    let t0 = Instant::now();
    let t = output_within(
        &mut c,
        Duration::from_secs(12),
        "trigger beside fake sessions",
    );
    let err = stderr(&t);
    assert!(t.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "session {}: trigger \"go\" accepted",
            session.id()
        )),
        "{err}"
    );
    assert!(err.contains("larger than"), "the flood is named: {err}");
    assert!(
        err.contains("did not answer"),
        "the dribble is named: {err}"
    );
    eprintln!(
        "trigger beside a flood and a dribble took {:?}",
        t0.elapsed()
    );
    check_triggered(&run, session, 0);
}

#[test]
fn ftrace_event_names_cannot_lead_out_of_tracefs() {
    if skip_unless(need_root()) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // A directory that looks like an event: a format and an enable switch.
    let evil = dir.path().join("evil");
    std::fs::create_dir(&evil).expect("mkdir");
    let format = "name: evil\nID: 1\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\nprint fmt: \"\"\n";
    std::fs::write(evil.join("format"), format).expect("format");
    std::fs::write(evil.join("enable"), "0\n").expect("enable");
    let up = "../".repeat(16);
    let spec = format!("{up}{}", evil.display().to_string().trim_start_matches('/'));
    let cfg = format!(
        r#"buffers {{ size_kb: 1024 }}
duration_ms: 500
data_sources {{ config {{ name: "linux.ftrace" ftrace_config {{ ftrace_events: "sched/sched_switch" ftrace_events: "{spec}" }} }} }}
"#
    );
    let cfg_path = dir.path().join("evil.cfg");
    std::fs::write(&cfg_path, cfg).expect("config");
    let out = output_within(
        Command::new(recorder_bin())
            .arg("--config")
            .arg(&cfg_path)
            .arg("-o")
            .arg(dir.path().join("t.pftrace"))
            .env("RECORDER_RUNTIME_DIR", dir.path().join("run"))
            .stdin(Stdio::null()),
        Duration::from_secs(20),
        "ftrace session",
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("ftrace_events[1]"), "{err}");
    assert_eq!(
        std::fs::read_to_string(evil.join("enable")).expect("enable"),
        "0\n",
        "a file outside tracefs was written"
    );
}

#[test]
fn endless_and_huge_configs_are_refused_with_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limited = |args: &[&str]| {
        let mut c = Command::new("prlimit");
        c.arg("--as=1073741824").arg(recorder_bin()).args(args);
        c
    };
    let check = |mut c: Command, what: &str| {
        let out = output_within(&mut c, Duration::from_secs(30), what);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        err
    };
    let err = check(limited(&["config", "check", "/dev/zero"]), "/dev/zero");
    assert!(err.contains("larger than"), "{err}");
    let out = dir.path().join("t.pftrace");
    let err = check(
        limited(&["--config", "/dev/zero", "-o", out.to_str().expect("utf-8")]),
        "main job on /dev/zero",
    );
    assert!(err.contains("larger than"), "{err}");
    // Endless stdin.
    let mut c = limited(&["config", "check", "-"]);
    c.stdin(
        Command::new("yes")
            .arg("buffers { size_kb: 1 }")
            .stdout(Stdio::piped())
            .spawn()
            .expect("yes")
            .stdout
            .take()
            .expect("pipe"),
    );
    let err = check(c, "endless stdin");
    assert!(
        err.contains("<stdin>") && err.contains("larger than"),
        "{err}"
    );
    // 10 MB of text with 100k data sources, and one under the size cap
    // with too many data sources.
    let one = "data_sources { config { name: \"for_testing\" target_buffer: 0 } }\n";
    let big = dir.path().join("big.cfg");
    std::fs::write(
        &big,
        format!("buffers {{ size_kb: 1024 }}\n{}", one.repeat(150_000)),
    )
    .expect("write");
    let err = check(
        limited(&["config", "check", big.to_str().expect("utf-8")]),
        "10 MB",
    );
    assert!(err.contains("larger than"), "{err}");
    let many = dir.path().join("many.cfg");
    std::fs::write(
        &many,
        format!("buffers {{ size_kb: 1024 }}\n{}", one.repeat(5000)),
    )
    .expect("write");
    let err = check(
        limited(&["config", "check", many.to_str().expect("utf-8")]),
        "5000 sources",
    );
    assert!(err.contains("5000 data_sources"), "{err}");
}

#[test]
fn buffers_beyond_available_memory_are_refused_before_anything_is_mapped() {
    let run = Run::new(&"buffers { size_kb: 4194303 }\n".repeat(128));
    let check = Command::new(recorder_bin())
        .args(["config", "check"])
        .arg(&run.config)
        .output()
        .expect("runs");
    let err = stderr(&check);
    assert_eq!(check.status.code(), Some(2), "{err}");
    assert!(
        err.contains("512.0 GiB") && err.contains("available"),
        "{err}"
    );
    let out = output_within(&mut run.command("auto"), Duration::from_secs(20), "session");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Detaches a mount when dropped (lazily: a closed io_uring releases its
/// file asynchronously).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_at_the_stop_time_write_keeps_what_fits_and_says_what_did_not() {
    if skip_unless(need_root()) {
        return;
    }
    for io in sinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = dir.path().join("small");
        std::fs::create_dir(&mnt).expect("mkdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        if skip_unless((!ok).then(|| "cannot mount a tmpfs".to_string())) {
            return;
        }
        let _mounted = Unmount(mnt.clone());
        // A ring written only at the end: several MiB for a 1 MiB disk.
        let run = Run::new(&test_config(
            8192,
            "RING_BUFFER",
            "duration_ms: 1500",
            "message_count: 0 max_messages_per_second: 50000 message_size: 100",
        ));
        let out_path = mnt.join("trace.pftrace");
        let out = output_within(
            &mut run.command_to(io, &out_path),
            Duration::from_secs(30),
            "session",
        );
        let data = std::fs::read(&out_path).expect("file");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{io}: {err}");
        assert!(
            data.len() > 512 * 1024,
            "{io}: only {} bytes kept of a 1 MiB disk",
            data.len()
        );
        assert_eq!(whole_prefix(&data), data.len(), "{io}: whole packets only");
        let packets = decode(&data);
        let counters = test_counters(&packets);
        let c = counters.values().next().expect("test data kept");
        assert_eq!(gaps(c).0, 0, "{io}: a contiguous run");
        assert!(err.contains("did not reach the file"), "{io}: {err}");
        assert!(!err.contains("nothing lost"), "{io}: {err}");
    }
}

#[test]
fn fifo_output_is_a_stream_and_the_config_is_never_the_output() {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 700",
        "message_count: 0 max_messages_per_second: 2000 message_size: 16",
    ));
    let fifo = run.dir.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(&fifo).expect("read the fifo"))
    };
    let out = output_within(
        &mut run.command_to("auto", &fifo),
        Duration::from_secs(20),
        "fifo",
    );
    let data = reader.join().expect("reader");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(whole_prefix(&data), data.len());
    let counters = test_counters(&decode(&data));
    assert_eq!(gaps(counters.values().next().expect("data")), (0, 0));

    let before = std::fs::read(&run.config).expect("config");
    let link = run.dir.path().join("link.cfg");
    std::os::unix::fs::symlink(&run.config, &link).expect("symlink");
    for out_path in [&run.config, &link] {
        let out = output_within(
            &mut run.command_to("auto", out_path),
            Duration::from_secs(10),
            "-o config",
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("is the config file"), "{err}");
        assert_eq!(std::fs::read(&run.config).expect("config"), before);
    }
    let out = Command::new(recorder_bin())
        .args(["--config", "-", "-o"])
        .arg(&run.config)
        .env("RECORDER_RUNTIME_DIR", run.dir.path().join("run"))
        .stdin(std::fs::File::open(&run.config).expect("open"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(std::fs::read(&run.config).expect("config"), before);
}

#[test]
fn a_size_cap_below_the_head_is_refused_at_once_and_a_reached_cap_is_not_called_lossless() {
    let tiny = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "write_into_file: true max_file_size_bytes: 100",
        "message_count: 0 max_messages_per_second: 1000 message_size: 8",
    ));
    let out = output_within(
        &mut tiny.command("auto"),
        Duration::from_secs(10),
        "tiny cap",
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("max_file_size_bytes") && err.contains("head"),
        "{err}"
    );

    let capped = Run::new(&test_config(
        4096,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 max_file_size_bytes: 65536",
        "message_count: 0 max_messages_per_second: 100000 message_size: 64",
    ));
    let out = output_within(&mut capped.command("auto"), Duration::from_secs(20), "cap");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("nothing lost"), "{err}");
    assert!(
        err.contains("max_file_size_bytes left the rest out"),
        "{err}"
    );
    let data = capped.trace();
    assert!(data.len() < 65536);
    assert_eq!(whole_prefix(&data), data.len());
    decode(&data);
}

#[test]
fn stop_and_query_exit_codes_say_what_happened() {
    if skip_unless(attacker_missing()) {
        return;
    }
    // The trace goes to a pipe nobody reads yet: the stop-time write blocks.
    let run = shared_run(&test_config(
        16384,
        "RING_BUFFER",
        "",
        "message_count: 0 max_messages_per_second: 50000 message_size: 200",
    ));
    let mut session = run
        .command_to("auto", Path::new("-"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let pid = session.id().to_string();
    wait_listening(&run, session.id());
    std::thread::sleep(Duration::from_millis(700));
    let first = output_within(
        &mut recorder_as(&run, None, &["stop", &pid]),
        Duration::from_secs(10),
        "stop",
    );
    assert!(first.status.success(), "{}", stderr(&first));
    std::thread::sleep(Duration::from_millis(300));
    // Already stopping (and blocked writing): an honest answer, at once.
    let again = output_within(
        &mut recorder_as(&run, None, &["stop", "--all"]),
        Duration::from_secs(10),
        "stop --all while stopping",
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stderr(&again).contains("stopping"), "{}", stderr(&again));
    // Nobody may query a root session: every session refused, exit 1.
    let q = output_within(
        &mut recorder_as(&run, Some(NOBODY), &["query"]),
        Duration::from_secs(10),
        "query as nobody",
    );
    assert_eq!(q.status.code(), Some(1), "{}", stderr(&q));
    // Drain the pipe: the session finishes.
    let mut stdout = session.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        stdout.read_to_end(&mut v).expect("read");
        v
    });
    let out = wait_within(session, Duration::from_secs(30), "session");
    assert!(out.status.success(), "{}", stderr(&out));
    let data = reader.join().expect("reader");
    assert_eq!(whole_prefix(&data), data.len());
    assert!(!test_counters(&decode(&data)).is_empty());
}

#[test]
fn text_configs_are_diagnosed_by_what_their_bytes_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&[u8], Option<&str>); 3] = [
        (b"buffers {\x0c size_kb: 1024 }\x0c\n", None),
        (
            b"buffers { size_kb: 1024 }\n\x00duration_ms: 1\n",
            Some(":2:1: error: a NUL byte"),
        ),
        (
            b"# caf\xe9\nbuffers { size_kb: 1024 }\n",
            Some(":1:6: error: byte 0xE9 is not UTF-8"),
        ),
    ];
    for (i, (bytes, want)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("c{i}.cfg"));
        std::fs::write(&p, bytes).expect("write");
        let out = Command::new(recorder_bin())
            .args(["config", "check"])
            .arg(&p)
            .output()
            .expect("runs");
        let err = stderr(&out);
        match want {
            None => assert!(out.status.success(), "{i}: {err}"),
            Some(w) => {
                assert_eq!(out.status.code(), Some(2), "{i}: {err}");
                assert!(err.contains(w), "{i}: {err}");
                assert!(!err.contains("binary"), "{i}: {err}");
            }
        }
    }
}

fn pid_alive(pid: i32) -> bool {
    rustix::process::Pid::from_raw(pid)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

#[test]
fn background_keeps_its_summary_in_a_log_beside_the_trace() {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 800",
        "message_count: 0 max_messages_per_second: 1000 message_size: 16",
    ));
    let out = run.command("auto").arg("-d").output().expect("runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let pid: i32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the pid");
    let t0 = Instant::now();
    while pid_alive(pid) {
        assert!(t0.elapsed() < Duration::from_secs(20), "still running");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log_path = PathBuf::from(format!("{}.log", run.out.display()));
    assert!(
        stderr(&out).contains(&log_path.display().to_string()),
        "{}",
        stderr(&out)
    );
    let log = std::fs::read_to_string(&log_path).expect("the log");
    assert!(log.contains("ended: duration_ms elapsed"), "{log}");
    assert!(log.contains("nothing lost"), "{log}");
    decode(&run.trace());
}

#[test]
fn unique_session_name_allows_one_live_session_per_name() {
    if skip_unless(attacker_missing()) {
        return;
    }
    let run = shared_run(&flight_config("", "unique_session_name: \"flight\""));
    // Someone else takes the lock file's name first and holds a lock on it.
    let lock = runtime(&run).join("session.0.flight.lock");
    let mut squatter = as_nobody("flock")
        .arg(&lock)
        .args(["sleep", "60"])
        .spawn()
        .expect("flock");
    let t0 = Instant::now();
    while !lock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
    let first = run.spawn("auto");
    wait_listening(&run, first.id());
    // A second session of that name is refused before it touches its output.
    let second_out = run.dir.path().join("second.pftrace");
    std::fs::write(&second_out, "keep me").expect("write");
    let second = output_within(
        &mut run.command_to("auto", &second_out),
        Duration::from_secs(10),
        "second session",
    );
    let err = stderr(&second);
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(
        err.contains("\"flight\"") && err.contains(&format!("pid {}", first.id())),
        "{err}"
    );
    assert_eq!(std::fs::read(&second_out).expect("read"), b"keep me");
    // The first one still records and takes its trigger.
    let t = output_within(
        &mut recorder_as(&run, Some(NOBODY), &["trigger", "go"]),
        Duration::from_secs(10),
        "trigger",
    );
    assert!(t.status.success(), "{}", stderr(&t));
    check_triggered(&run, first, 65534);
    // A crashed holder does not block the next session.
    let mut crashed = run.spawn("auto");
    wait_listening(&run, crashed.id());
    crashed.kill().expect("SIGKILL");
    let _ = crashed.wait();
    let next = run.spawn("auto");
    wait_listening(&run, next.id());
    let t = output_within(
        &mut recorder_as(&run, None, &["trigger", "go"]),
        Duration::from_secs(10),
        "trigger",
    );
    assert!(t.status.success(), "{}", stderr(&t));
    check_triggered(&run, next, 0);
    let _ = squatter.kill();
    let _ = squatter.wait();
}

/// The load test: 1000 triggers from 4 processes while 20 slow
/// connections are held open; each gets an answer, none is lost.
#[test]
fn a_thousand_triggers_from_four_processes_all_get_an_answer_beside_slow_connections() {
    if skip_unless(attacker_missing()) {
        return;
    }
    let run = shared_run(
        &flight_config("", "")
            .replace("stop_delay_ms: 0", "stop_delay_ms: 60000")
            .replace("trigger_timeout_ms: 30000", "trigger_timeout_ms: 120000"),
    );
    let session = run.spawn("auto");
    let pid = session.id();
    wait_listening(&run, pid);
    let sock = runtime(&run).join(format!("recorder-{pid}.trigger"));
    let _slow = Attacker::start(&[
        "hold",
        sock.to_str().expect("utf-8"),
        "20",
        "--dribble",
        "0.4",
    ]);
    let script = format!(
        "for i in $(seq 250); do {} trigger go; done",
        recorder_bin().display()
    );
    let senders: Vec<Child> = (0..4)
        .map(|_| {
            Command::new("sh")
                .args(["-c", &script])
                .env("RECORDER_RUNTIME_DIR", runtime(&run))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("sender")
        })
        .collect();
    let mut answers = Vec::new();
    for s in senders {
        let out = wait_within(s, Duration::from_secs(300), "trigger sender");
        answers.extend(
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| l.starts_with("session "))
                .map(str::to_string)
                .collect::<Vec<_>>(),
        );
    }
    let accepted = format!("session {pid}: trigger \"go\" accepted");
    let refused = format!("session {pid}: trigger \"go\" not taken (already_triggered)");
    let odd: Vec<&String> = answers
        .iter()
        .filter(|l| **l != accepted && **l != refused)
        .collect();
    assert!(
        odd.is_empty(),
        "answers other than accepted/refused: {odd:?}"
    );
    assert_eq!(answers.len(), 1000, "every trigger got an answer");
    assert_eq!(answers.iter().filter(|l| **l == accepted).count(), 1);
    let stop = output_within(
        &mut recorder_as(&run, None, &["stop", &pid.to_string()]),
        Duration::from_secs(10),
        "stop",
    );
    assert!(stop.status.success(), "{}", stderr(&stop));
    check_triggered(&run, session, 0);
}

/// 300 CLONE_SNAPSHOT triggers from nobody within about five seconds: a
/// root session makes at most its budget of snapshots (16), refuses and
/// counts the rest, and neither the snapshots nor its live ring lose data.
#[test]
fn a_flood_of_clone_triggers_stays_within_the_snapshot_budget() {
    if skip_unless(attacker_missing()) {
        return;
    }
    let run = shared_run(
        r#"
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
data_sources { config { name: "for_testing" target_buffer: 0
  for_testing { message_count: 0 max_messages_per_second: 5000 message_size: 16 } } }
trigger_config {
  trigger_mode: CLONE_SNAPSHOT
  trigger_timeout_ms: 60000
  triggers { name: "snap" }
}
"#,
    );
    let session = run.spawn("auto");
    wait_listening(&run, session.id());
    let t0 = Instant::now();
    let sent: Vec<std::thread::JoinHandle<(u32, u32)>> = (0..4)
        .map(|_| {
            let rt = runtime(&run);
            std::thread::spawn(move || {
                let (mut ok, mut refused) = (0, 0);
                for _ in 0..75 {
                    let out = as_nobody(recorder_bin())
                        .args(["trigger", "snap"])
                        .env("RECORDER_RUNTIME_DIR", &rt)
                        .output()
                        .expect("trigger runs");
                    if out.status.success() {
                        ok += 1;
                    } else {
                        refused += 1;
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for t in sent {
        let (o, r) = t.join().expect("sender");
        ok += o;
        refused += r;
    }
    let took = t0.elapsed();
    let stop = output_within(
        &mut recorder_as(&run, None, &["stop", &session.id().to_string()]),
        Duration::from_secs(10),
        "stop",
    );
    assert!(stop.status.success(), "{}", stderr(&stop));
    let out = wait_within(session, Duration::from_secs(30), "the session");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let snapshots: Vec<PathBuf> = (0..400)
        .map(|n| PathBuf::from(format!("{}.{n}", run.out.display())))
        .filter(|p| p.exists())
        .collect();
    assert!(
        (1..=16).contains(&snapshots.len()),
        "{} snapshots from 300 triggers in {took:?}",
        snapshots.len()
    );
    let refused_line = format!("{} snapshot trigger(s) refused", 300 - snapshots.len());
    assert!(err.contains(&refused_line), "{refused_line}: {err}");
    assert_eq!(ok + refused, 300);
    // The ring was never lapped (4 MiB hold far more than the test
    // writes), so each snapshot holds every counter from the first on.
    for p in &snapshots {
        let data = std::fs::read(p).expect("snapshot");
        assert_eq!(whole_prefix(&data), data.len(), "{}", p.display());
        let packets = decode(&data);
        let counters = test_counters(&packets);
        let c = counters.values().next().expect("test data in the snapshot");
        assert_eq!(gaps(c), (0, 0), "{}: nothing lost", p.display());
    }
    crate::trace_processor::check(snapshots.last().expect("a snapshot"));
}

/// Nobody's own fake session (its socket, its pid) answers `query` with a
/// status that says uid 0: root's `recorder query` shows the uid the kernel
/// gives for the socket's peer, 65534.
#[test]
fn query_shows_the_peer_uid_not_the_one_a_session_claims() {
    if skip_unless(attacker_missing()) {
        return;
    }
    let run = shared_run(&flight_config("", ""));
    let rt = runtime(&run);
    let rt = rt.to_str().expect("utf-8 path");
    let fake = Attacker::start(&["fake", rt, "control", "lie"]);
    let pid = fake.0.id().to_string();
    let _listed = Attacker::start(&["fake", rt, "trigger", "lie", "--pid", &pid]);
    let q = output_within(
        &mut recorder_as(&run, None, &["query", "--json"]),
        Duration::from_secs(10),
        "query",
    );
    let v: serde_json::Value = serde_json::from_slice(&q.stdout).expect("json");
    let fake: Vec<_> = v
        .as_array()
        .expect("array")
        .iter()
        .filter(|s| s.get("state").is_some())
        .collect();
    assert_eq!(fake.len(), 1, "{v}");
    assert_eq!(fake[0]["uid"], 65534, "{v}");
    let q = output_within(
        &mut recorder_as(&run, None, &["query"]),
        Duration::from_secs(10),
        "query",
    );
    let text = String::from_utf8_lossy(&q.stdout);
    assert!(text.contains("(uid 65534)"), "{text}");
    assert!(!text.contains("(uid 0)"), "{text}");
}
