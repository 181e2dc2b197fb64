//! Hardening against hostile inputs and the edges of the output path:
//! ftrace event names, endless and huge configs, buffers beyond memory, a
//! full disk, a FIFO, a size cap below the head, text configs of odd bytes,
//! the background log, and messages that say what happened.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::*;

#[test]
fn ftrace_event_names_cannot_lead_out_of_tracefs() {
    require!(need::root());
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
    let out = output_within_named(
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
        let out = output_within_named(&mut c, Duration::from_secs(30), what);
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
    let out = output_within_named(&mut run.command("auto"), Duration::from_secs(20), "session");
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
    require!(need::root());
    for io in sinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = dir.path().join("small");
        require!(need::small_tmpfs(&mnt, "1m"));
        let _mounted = Unmount(mnt.clone());
        // A ring written only at the end: several MiB for a 1 MiB disk.
        let run = Run::new(&test_config(
            8192,
            "RING_BUFFER",
            "duration_ms: 1500",
            "message_count: 0 max_messages_per_second: 50000 message_size: 100",
        ));
        let out_path = mnt.join("trace.pftrace");
        let out = output_within_named(
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

/// What the FUSE fixture needs: /dev/fuse, fusepy and libfuse2.
fn fuse_fixture() -> Option<need::Missing> {
    if !Path::new("/dev/fuse").exists() {
        return need::present(false, "no /dev/fuse: cannot mount the FUSE fixture");
    }
    need::present(
        Command::new("python3")
            .args(["-c", "import fuse"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        "python3's fusepy (and libfuse2) missing: pip install fusepy",
    )
}

/// A FUSE file system (tests/fixtures/failing_sync_fs.py) over a backing
/// directory whose fsync and fdatasync fail with EIO, as a network file
/// system's do when its server loses the data, or whose writes take their
/// time, as the marks made in the backing directory say; unmounted
/// (lazily) on drop, its server killed.
struct FailingSyncFs {
    server: Child,
    backing: PathBuf,
    mount: PathBuf,
}

impl FailingSyncFs {
    /// Mounted with `marks` (name, contents) in the backing directory from
    /// the start: `.fail-sync` (every sync fails), `.slow-write` (ms a
    /// write waits per new 64 KiB).
    fn mount(dir: &Path, marks: &[(&str, &str)]) -> Result<FailingSyncFs, String> {
        let backing = dir.join("backing");
        let mount = dir.join("mnt");
        for d in [&backing, &mount] {
            std::fs::create_dir(d).map_err(|e| e.to_string())?;
        }
        for (name, text) in marks {
            std::fs::write(backing.join(name), text).map_err(|e| e.to_string())?;
        }
        let server = Command::new("python3")
            .arg(repo_root().join("tests/fixtures/failing_sync_fs.py"))
            .arg(&backing)
            .arg(&mount)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut fs = FailingSyncFs {
            server,
            backing,
            mount,
        };
        let mounted = || {
            std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
                m.lines()
                    .any(|l| l.split(' ').nth(1) == fs.mount.to_str() && l.contains("fuse"))
            })
        };
        // Mounted, or the server gave up (its error is the reason).
        let up = poll(Duration::from_secs(20), || {
            if mounted() {
                return Some(Ok(()));
            }
            match fs.server.try_wait() {
                Ok(Some(_)) => Some(Err(())),
                _ => None,
            }
        });
        match up {
            Some(Ok(())) => {}
            Some(Err(())) => {
                let mut err = String::new();
                if let Some(mut e) = fs.server.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(format!("the FUSE server ended: {err}"));
            }
            None => return Err("not mounted within 20 s".into()),
        }
        Ok(fs)
    }
}

impl Drop for FailingSyncFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Item 18: a failed fdatasync at the stop is the output failing: exit 1
/// and the error said, every packet written kept. After a flight
/// recorder's one pass and a stream's last pass (their syncs), and when
/// nothing may be written — a flight recorder whose stop trigger never
/// came — where the stop's only step is the sync of what the file holds.
#[test]
fn a_failed_fdatasync_at_the_stop_is_exit_1_and_keeps_what_was_written() {
    require!(need::root());
    require!(fuse_fixture());
    let fields = "message_count: 0 max_messages_per_second: 5000 message_size: 100";
    // (kind, top-level fields, whether packets reach the file)
    let kinds = [
        ("flight recorder", "duration_ms: 1500", true),
        (
            "stream",
            "write_into_file: true file_write_period_ms: 100 duration_ms: 1500",
            true,
        ),
        (
            "untriggered flight recorder",
            "trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 1000 \
             triggers { name: \"never\" stop_delay_ms: 0 } }",
            false,
        ),
    ];
    for io in sinks() {
        for (kind, top, writes) in kinds {
            let dir = tempfile::tempdir().expect("tempdir");
            // Every sync fails from the start: the session's first is at
            // its stop.
            let fs = match FailingSyncFs::mount(dir.path(), &[(".fail-sync", "")]) {
                Ok(fs) => fs,
                Err(e) => {
                    require!(need::present(false, &format!("FUSE mount: {e}")));
                    return;
                }
            };
            let run = Run::new(&test_config(2048, "RING_BUFFER", top, fields));
            let out = output_within_named(
                &mut run.command_to(io, &fs.mount.join("trace.pftrace")),
                Duration::from_secs(30),
                "session",
            );
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{io}, {kind}: {err}");
            assert!(
                err.contains("fdatasync failed: Input/output error"),
                "{io}, {kind}: {err}"
            );
            // What was written is all there, in the backing file.
            let kept = fs.backing.join("trace.pftrace");
            let data = std::fs::read(&kept).expect("the backing file");
            assert_eq!(whole_prefix(&data), data.len(), "{io}, {kind}");
            if !writes {
                assert!(data.is_empty(), "{io}, {kind}: {} bytes", data.len());
                // Nothing was to be written: the summary says so, not that
                // the buffers' contents were lost.
                assert!(err.contains("no trigger fired"), "{io}, {kind}: {err}");
                assert!(!err.contains("never written"), "{io}, {kind}: {err}");
                continue;
            }
            assert!(!err.contains("no trigger fired"), "{io}, {kind}: {err}");
            let packets = decode(&data);
            let counters = test_counters(&packets);
            let c = counters.values().next().expect("test data kept");
            assert!(c.len() > 1000, "{io}, {kind}: {} packets", c.len());
            assert_eq!(gaps(c).0, 0, "{io}, {kind}: a contiguous run");
            assert!(packets.iter().any(|p| p.has_trace_stats()), "{io}, {kind}");
            if let Some(s) = python_summary(&kept) {
                assert!(s["packets"].as_u64().unwrap_or(0) >= packets.len() as u64);
            }
            trace_processor::check(&kept);
        }
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
    mkfifo(&fifo);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(&fifo).expect("read the fifo"))
    };
    let out = output_within_named(
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
        let out = output_within_named(
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
    let out = output_within_named(
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
    let out = output_within_named(&mut capped.command("auto"), Duration::from_secs(20), "cap");
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
    wait_for(
        "the background session to end",
        Duration::from_secs(20),
        || !pid_alive(pid),
    );
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

/// Item 16: 1000 `for_testing` sources on a 1 MiB DISCARD buffer fill its
/// chunks with a few bytes each: the summary says the chunks were taken by
/// many writers, not that the buffer was full; and `config check` of a
/// config that only fires triggers says it records nothing and writes no
/// file.
#[test]
fn messages_say_what_happened_many_writers_and_trigger_only_configs() {
    let mut cfg =
        String::from("buffers { size_kb: 1024 fill_policy: DISCARD }\nduration_ms: 600\n");
    for _ in 0..1000 {
        cfg.push_str("data_sources { config { name: \"for_testing\" target_buffer: 0 for_testing { message_count: 10 message_size: 16 } } }\n");
    }
    let run = Run::new(&cfg);
    let o = output_within_named(
        &mut run.command("pwritev"),
        Duration::from_secs(60),
        "session",
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("the buffer was full"), "{err}");
    assert!(
        err.contains("many data sources on few chunks, not a full buffer")
            && err.contains("use fewer data sources per buffer"),
        "{err}"
    );
    decode(&run.trace());
    let trig = Run::new("activate_triggers: \"x\"\n");
    let check = output_within_named(
        Command::new(recorder_bin())
            .args(["config", "check"])
            .arg(&trig.config),
        Duration::from_secs(10),
        "config check",
    );
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{}", stderr(&check));
    assert!(out.contains("records nothing, writes no file"), "{out}");
    for wrong in [
        "records until stopped",
        "writes the buffers",
        "producer socket",
    ] {
        assert!(!out.contains(wrong), "{wrong}: {out}");
    }
}

/// A disk that takes its time does not stall the recording: while a write
/// pass waits on its requests, the sources' due work goes on. The FUSE
/// fixture's writes wait 40 ms per new 64 KiB, so a half-second pass of
/// about a megabyte takes most of a second; a 100 ms meminfo poll keeps its
/// pace through it all the same. (The io_uring sink: a pwritev(2) is one
/// blocking call, between whose steps alone the sources can run.)
#[test]
fn a_slow_disk_does_not_stall_the_sources() {
    require!(need::root());
    require!(need::io_uring());
    require!(fuse_fixture());
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = match FailingSyncFs::mount(dir.path(), &[(".slow-write", "40")]) {
        Ok(fs) => fs,
        Err(e) => {
            require!(need::present(false, &format!("FUSE mount: {e}")));
            return;
        }
    };
    let run = Run::new(
        r#"
buffers { size_kb: 32768 fill_policy: RING_BUFFER }
data_sources { config { name: "for_testing" target_buffer: 0
  for_testing { message_count: 0 max_messages_per_second: 20000 message_size: 100 } } }
data_sources { config { name: "linux.sys_stats"
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE } } }
write_into_file: true
file_write_period_ms: 500
duration_ms: 4000
"#,
    );
    let out = output_within_named(
        run.command_to("io_uring", &fs.mount.join("t.pftrace"))
            .env("RUST_LOG", "info,recorder::event_loop::runner=debug"),
        Duration::from_secs(60),
        "session",
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    // The disk was slow: a pass took most of a second (`pass N: B bytes in D`).
    let slowest = err
        .lines()
        .filter_map(|l| {
            l.split_once("] pass ")?
                .1
                .split_once(" in ")?
                .1
                .parse_duration()
        })
        .max()
        .unwrap_or_default();
    assert!(
        slowest >= Duration::from_millis(400),
        "passes were not slow: {err}"
    );
    // The meminfo polls kept their pace: no two more than 300 ms apart.
    let data = std::fs::read(fs.backing.join("t.pftrace")).expect("the backing file");
    assert_eq!(whole_prefix(&data), data.len());
    let mut polls: Vec<u64> = decode(&data)
        .iter()
        .filter(|p| p.has_sys_stats())
        .map(|p| p.timestamp())
        .collect();
    polls.sort_unstable();
    assert!(polls.len() >= 20, "{} meminfo polls", polls.len());
    let gap = polls.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    assert!(
        gap < 300_000_000,
        "a {:.0} ms gap between meminfo polls while passes took up to {slowest:?}",
        gap as f64 / 1e6
    );
    trace_processor::check(&fs.backing.join("t.pftrace"));
}

/// A `Duration`'s Debug text (`680.5ms`, `1.2s`, `95µs`) read back.
trait ParseDuration {
    fn parse_duration(&self) -> Option<Duration>;
}

impl ParseDuration for str {
    fn parse_duration(&self) -> Option<Duration> {
        let t = self.trim();
        let (num, scale) = [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)]
            .iter()
            .find_map(|(unit, scale)| Some((t.strip_suffix(unit)?, *scale)))?;
        num.parse::<f64>()
            .ok()
            .map(|v| Duration::from_secs_f64(v * scale))
    }
}
