//! Least privilege on the built binary: a producer socket that stays closed
//! unless a session needs apps, per-uid quotas on the one that opens, a
//! trigger that gets through whatever another uid does, and signals caught
//! from the first instruction. The attacker is uid 65534 (`setpriv`), the
//! recorder root; every trace is decoded by the independent decoders.

use crate::harness::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// RSS growth an attack may cause, at most.
const RSS_BOUND_KB: u64 = 64 * 1024;
/// Log bytes 3000 producers that come and go may cause, at most.
const LOG_BOUND: usize = 256 * 1024;

/// A hostile peer (tests/attacker/hostile_peer.py) as nobody, with room for
/// many descriptors, once it says it is ready; its later lines are read
/// with [`Flood::wait_for`]. Killed when dropped.
struct Flood {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Flood {
    fn start(args: &[&str]) -> Flood {
        Flood::start_as(NOBODY, args)
    }

    fn start_as(uid: &str, args: &[&str]) -> Flood {
        let script = repo_root().join("tests/attacker/hostile_peer.py");
        let mut child = Command::new("prlimit")
            .arg("--nofile=4096:4096")
            .args(["setpriv", "--reuid", uid, "--regid", uid])
            .arg("--clear-groups")
            .arg(python())
            .arg(script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("attacker starts");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut f = Flood { child, out };
        f.wait_for("ready");
        f
    }

    fn wait_for(&mut self, word: &str) {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).expect("attacker output");
            assert!(n > 0, "the attacker ended before saying {word:?}");
            if line.trim() == word {
                return;
            }
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rss_kb(pid: u32) -> u64 {
    proc_status(format!("/proc/{pid}/status"))
        .get("VmRSS")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs `attack` (which returns what keeps it going) against `session`
/// and checks the session's RSS grew by less than [`RSS_BOUND_KB`];
/// `what` names the attack in the log.
fn rss_bounded_across<T>(run: &Run, session: &Child, what: &str, attack: impl FnOnce() -> T) -> T {
    wait_recorded(run, session.id(), 1);
    let before = rss_kb(session.id());
    let going = attack();
    // Caught up with the attack: it answers a query.
    wait_recorded(run, session.id(), 1);
    let after = rss_kb(session.id());
    eprintln!("RSS {before} KiB before, {after} KiB after {what}");
    assert!(
        after.saturating_sub(before) < RSS_BOUND_KB,
        "RSS grew from {before} to {after} KiB"
    );
    going
}

/// What `recorder config check CONFIG` says with the environment's
/// producer socket at `socket`.
fn config_check_with_socket(config: &Path, socket: &Path) -> String {
    let check = Command::new(recorder_bin())
        .args(["config", "check"])
        .arg(config)
        .env("PERFETTO_PRODUCER_SOCK_NAME", socket)
        .output()
        .expect("config check");
    String::from_utf8_lossy(&check.stdout).into_owned()
}

/// The `recorder.quota.uid.<uid>.<limit>` attribute of a trace, read by the
/// Python oracle.
fn quota_attribute(trace: &Path, uid: u32, limit: &str) -> Option<i64> {
    let py = python_summary(trace)?;
    py["attributes"][format!("recorder.quota.uid.{uid}.{limit}")].as_i64()
}

/// A flight recorder (STOP_TRACING on "go", no delay) with test data and,
/// with `apps`, the SDK app's data source.
fn flight(apps: bool) -> String {
    let app = if apps {
        format!("data_sources {{ config {{ name: \"{SEQUENCE_DS}\" target_buffer: 1 }} }}\n")
    } else {
        String::new()
    };
    format!(
        r#"
buffers {{ size_kb: 2048 fill_policy: RING_BUFFER }}
buffers {{ size_kb: 16384 fill_policy: DISCARD }}
data_sources {{ config {{ name: "for_testing" target_buffer: 0
  for_testing {{ message_count: 0 max_messages_per_second: 2000 message_size: 16 }} }} }}
{app}
trigger_config {{
  trigger_mode: STOP_TRACING
  trigger_timeout_ms: 120000
  triggers {{ name: "go" stop_delay_ms: 0 }}
}}
"#
    )
}

/// A root session of `config` in a directory every user may search, its
/// producer socket there (when `apps`), under `ulimit -n` of `nofile` when
/// given.
fn root_session(run: &Run, apps: bool, nofile: Option<u32>) -> (Child, PathBuf) {
    let socket = run.dir.path().join("producer.sock");
    let mut c = Command::new("prlimit");
    if let Some(n) = nofile {
        c.arg(format!("--nofile={n}:{n}"));
    }
    c.arg(recorder_bin())
        .arg("--config")
        .arg(&run.config)
        .arg("-o")
        .arg(&run.out)
        .env("RECORDER_RUNTIME_DIR", runtime(run))
        .env("RECORDER_IO", "pwritev")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if apps {
        c.arg("--producer-socket").arg(&socket);
    }
    let child = c.spawn().expect("recorder starts");
    wait_listening(&runtime(run), child.id());
    if apps {
        wait_for_socket(&socket, Duration::from_secs(20));
    }
    (child, socket)
}

/// The quota hits of `uid` that session `pid` shows.
fn quota_hits(run: &Run, pid: u32, uid: u32) -> u64 {
    session_status(run, pid)
        .and_then(|s| {
            s["quotas"]
                .as_array()?
                .iter()
                .find(|q| q["uid"] == uid)
                .map(|q| {
                    q["hits"]
                        .as_array()
                        .map_or(0, |h| h.iter().filter_map(|h| h[1].as_u64()).sum())
                })
        })
        .unwrap_or(0)
}

/// `recorder trigger go` as uid 65533: answered within 1 s, accepted.
fn trigger_within_a_second(run: &Run) -> Duration {
    let t0 = Instant::now();
    let t = output_within_named(
        &mut recorder_as(run, Some("65533"), &["trigger", "go"]),
        Duration::from_secs(10),
        "trigger beside the attack",
    );
    let took = t0.elapsed();
    assert!(t.status.success(), "{}", stderr(&t));
    assert!(
        took < Duration::from_secs(1),
        "the trigger took {took:?}: {}",
        stderr(&t)
    );
    took
}

/// The session ended on its trigger from uid 65533: exit 0, a whole file,
/// one trigger packet; returns the packets and the recorder's stderr.
fn ended_on_the_trigger(
    run: &Run,
    session: Child,
) -> (Vec<perfetto_protos::trace_packet::TracePacket>, String) {
    let out = wait_within_named(
        session,
        Duration::from_secs(30),
        "session after its trigger",
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let data = run.trace();
    assert_eq!(whole_prefix(&data), data.len());
    let packets = decode(&data);
    let trig: Vec<_> = packets.iter().filter(|p| p.has_trigger()).collect();
    assert_eq!(trig.len(), 1, "one trigger packet");
    assert_eq!(trig[0].trigger().trusted_producer_uid(), 65533);
    (packets, err)
}

#[test]
fn a_squatted_producer_path_cannot_touch_a_session_of_built_in_sources() {
    require!(need::attacker());
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 400",
        "message_count: 0 max_messages_per_second: 2000 message_size: 16",
    ));
    let squat = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        squat.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .expect("chmod");
    // Another user's regular file, then another user's live socket, where
    // the environment says apps look.
    let file = squat.path().join("perfetto-producer");
    let st = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .args(["sh", "-c", "echo mine > \"$0\""])
        .arg(&file)
        .status()
        .expect("setpriv");
    assert!(st.success());
    let sock = squat.path().join("held.sock");
    let mut holder = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .arg(python())
        .args([
            "-c",
            "import socket,sys,time\ns=socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\nprint('ready',flush=True)\ntime.sleep(60)",
        ])
        .arg(&sock)
        .stdout(Stdio::piped())
        .spawn()
        .expect("holder");
    first_line(&mut holder);
    for path in [&file, &sock] {
        let out = run
            .command("pwritev")
            .env("PERFETTO_PRODUCER_SOCK_NAME", path)
            .output()
            .expect("recorder runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {err}", path.display());
        assert!(!err.contains("producer socket"), "{err}");
        let data = run.trace();
        assert_eq!(whole_prefix(&data), data.len());
        assert!(
            !test_counters(&decode(&data)).is_empty(),
            "test data recorded"
        );
        let said = config_check_with_socket(&run.config, path);
        assert!(said.contains("producer socket: stays closed"), "{said}");
    }
    assert_eq!(std::fs::read_to_string(&file).expect("file"), "mine\n");
    // A config that needs apps does claim the path, and says why it cannot.
    let apps = Run::new(&flight(true));
    let said = config_check_with_socket(&apps.config, &file);
    assert!(
        said.contains(&format!("producer socket: opens at {}", file.display()))
            && said.contains(SEQUENCE_DS),
        "{said}"
    );
    // A built-in source its producer filters leave out is for apps as well.
    let filtered = Run::new(
        "buffers { size_kb: 1024 }\n\
         data_sources { config { name: \"linux.process_stats\" } producer_name_filter: \"an_app\" }\n",
    );
    let said = config_check_with_socket(&filtered.config, &file);
    assert!(said.contains("producer socket: opens at"), "{said}");
    let out = apps
        .command("pwritev")
        .env("PERFETTO_PRODUCER_SOCK_NAME", &file)
        .output()
        .expect("recorder runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a socket"),
        "{}",
        stderr(&out)
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

/// SIGTERM while the config is still being read (stdin) and while the
/// output is being opened (a FIFO nobody reads yet): the session stops as
/// soon as it runs, with a valid trace and exit 0.
#[test]
fn a_signal_during_set_up_stops_the_session_with_a_valid_trace() {
    let config = test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 60000",
        "message_count: 0 max_messages_per_second: 2000 message_size: 16",
    );
    // While loading the config.
    let run = Run::new(&config);
    let mut child = Command::new(recorder_bin())
        .args(["--config", "-", "-o"])
        .arg(&run.out)
        .env("RECORDER_RUNTIME_DIR", run.dir.path().join("run"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder starts");
    // Caught from before the config is read; a TERM sent earlier would
    // kill it outright (a busy machine can take longer than any sleep).
    wait_catches(child.id(), rustix::process::Signal::TERM);
    // The signal lands some way into the set-up, not at its first step.
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("kill");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(config.as_bytes()).expect("config");
    drop(stdin);
    let out = wait_within_named(child, Duration::from_secs(20), "signalled while loading");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "it did not run its 60 s"
    );
    let data = run.trace();
    assert!(!data.is_empty());
    assert_eq!(whole_prefix(&data), data.len());
    let packets = decode(&data);
    assert!(packets.iter().any(|p| p.has_trace_config()), "a valid head");

    // While opening the output.
    let run = Run::new(&config);
    let fifo = run.dir.path().join("fifo");
    mkfifo(&fifo);
    let child = run
        .command_to("pwritev", &fifo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder starts");
    wait_catches(child.id(), rustix::process::Signal::TERM);
    // Blocked opening the FIFO (no reader yet), which nothing outside shows.
    std::thread::sleep(Duration::from_millis(300));
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("kill");
    let data = std::fs::read(&fifo).expect("read the fifo");
    let out = wait_within_named(child, Duration::from_secs(20), "signalled while opening");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stopped by a signal"),
        "{}",
        stderr(&out)
    );
    assert!(!data.is_empty());
    assert_eq!(whole_prefix(&data), data.len());
    assert!(decode(&data).iter().any(|p| p.has_trace_stats()));
}

/// 1500 idle producer connections of one uid against a recorder under
/// `ulimit -n 1024`: another uid's trigger is answered within 1 s and acted
/// on, and a real SDK app records every packet; the refusals are counted
/// against the attacker's uid in the summary and the trace.
#[test]
fn idle_producer_connections_keep_neither_a_trigger_nor_an_app_out() {
    require!(need::attacker());
    // Built before the attack starts.
    sdk_app();
    let run = shared_run(&flight(true));
    let (session, socket) = root_session(&run, true, Some(1024));
    let sock = socket.to_str().expect("utf-8");
    let _idle = Flood::start(&["hold", sock, "1500"]);
    wait_for(
        "uid 65534's connections refused",
        Duration::from_secs(30),
        || quota_hits(&run, session.id(), 65534) > 0,
    );
    let mut app = App::spawn(&socket, "quota_app", &["--packets", "300"]);
    let app_pid = app.pid();
    app.expect("wrote 300");
    let took = trigger_within_a_second(&run);
    eprintln!("trigger beside 1500 idle connections: {took:?}");
    let (packets, err) = ended_on_the_trigger(&run, session);
    app.finish();
    assert_app_recorded_all(&packets, app_pid, 300);
    assert!(
        err.contains("producers of uid 65534:") && err.contains("connections refused"),
        "{err}"
    );
    let refused = quota_attribute(&run.out, 65534, "connections_per_uid");
    if python_summary(&run.out).is_some() {
        assert!(refused.is_some_and(|n| n > 0), "{refused:?}");
        assert_eq!(quota_attribute(&run.out, 0, "connections_per_uid"), None);
    }
}

/// 8 producers × 1024 data sources with names of 100 KB: refused, counted,
/// and the session's RSS grows by less than [`RSS_BOUND_KB`].
#[test]
fn huge_data_source_names_cost_their_producer_not_the_sessions_memory() {
    require!(need::attacker());
    let run = shared_run(&flight(true));
    let (session, socket) = root_session(&run, true, None);
    let flood = rss_bounded_across(&run, &session, "8 x 1024 names of 100 KB", || {
        let mut flood = Flood::start(&[
            "names",
            socket.to_str().expect("utf-8"),
            "8",
            "1024",
            "100000",
        ]);
        flood.wait_for("done");
        flood
    });
    trigger_within_a_second(&run);
    drop(flood);
    let (_, err) = ended_on_the_trigger(&run, session);
    assert!(err.contains("names refused (too long)"), "{err}");
    if python_summary(&run.out).is_some() {
        assert_eq!(
            quota_attribute(&run.out, 65534, "name_length"),
            Some(8 * 1024)
        );
    }
}

/// 32 producers of one uid (its connection cap) that each commit 40 MiB of
/// chunks that need patches and never send them: what they hold is one
/// uid's (`MAX_HELD_BYTES_PER_UID`, 32 MiB), not 32 × 32 MiB, so the
/// session's RSS grows by less than [`RSS_BOUND_KB`]; the chunks given up
/// are counted against that uid, and another uid's SDK app still records
/// every packet.
#[test]
fn producers_that_never_send_their_patches_hold_one_uids_bytes_not_each_their_own() {
    require!(need::attacker());
    sdk_app();
    let run = shared_run(&flight(true));
    let (session, socket) = root_session(&run, true, None);
    let sock = socket.to_str().expect("utf-8");
    let flood = rss_bounded_across(&run, &session, "32 producers held 40 MiB each", || {
        let mut flood = Flood::start(&["patches", sock, "32", SEQUENCE_DS, "40"]);
        flood.wait_for("done");
        flood
    });
    // The live figures: `recorder query` words them as the summary does,
    // and its JSON has them by limit key. (Asked again while a loaded
    // machine keeps the session from answering in time.)
    let query = |args: &[&str]| {
        let last = std::cell::RefCell::new(String::new());
        wait_until(
            described(|| format!("an answer to {args:?}: {}", last.borrow())),
            Duration::from_secs(100),
            || {
                let q = output_within_named(
                    &mut recorder_as(&run, None, args),
                    Duration::from_secs(20),
                    "query during the attack",
                );
                if !q.status.success() {
                    *last.borrow_mut() =
                        format!("{}{}", String::from_utf8_lossy(&q.stdout), stderr(&q));
                }
                q.status.success().then_some(q.stdout)
            },
        )
    };
    let out = query(&["query"]);
    let text = String::from_utf8_lossy(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("  producers of uid 65534:"))
        .unwrap_or_else(|| panic!("no quota line of uid 65534: {text}"));
    assert!(line.contains("given up (bytes held for patches"), "{line}");
    let v: serde_json::Value = serde_json::from_slice(&query(&["query", "--json"])).expect("JSON");
    let ours = v
        .as_array()
        .and_then(|a| a.iter().find(|s| s["pid"] == session.id()))
        .unwrap_or_else(|| panic!("no status of the session: {v}"));
    let uid = ours["quotas"]
        .as_array()
        .and_then(|a| a.iter().find(|u| u["uid"] == 65534))
        .unwrap_or_else(|| panic!("no quota figures of uid 65534: {ours}"));
    let held = uid["hits"]
        .as_array()
        .and_then(|h| h.iter().find(|kv| kv[0] == "held_bytes"))
        .and_then(|kv| kv[1].as_u64());
    assert!(held.is_some_and(|n| n > 0), "{uid}");
    let mut app = App::spawn(&socket, "held_app", &["--packets", "300"]);
    let app_pid = app.pid();
    app.expect("wrote 300");
    trigger_within_a_second(&run);
    let (packets, err) = ended_on_the_trigger(&run, session);
    drop(flood);
    app.finish();
    assert_app_recorded_all(&packets, app_pid, 300);
    assert!(
        err.contains("producers of uid 65534:") && err.contains("bytes held for patches"),
        "{err}"
    );
    if python_summary(&run.out).is_some() {
        let given_up = quota_attribute(&run.out, 65534, "held_bytes");
        assert!(given_up.is_some_and(|n| n > 0), "{given_up:?}");
        assert_eq!(quota_attribute(&run.out, 0, "held_bytes"), None);
    }
}

/// 3000 producers that connect, register and close, with long names: the
/// session keeps 64 of them one by one and folds the rest into one line of
/// their uid; RSS and the log stay bounded.
#[test]
fn producers_that_come_and_go_leave_memory_and_the_log_bounded() {
    require!(need::attacker());
    let run = shared_run(&flight(true));
    let (session, socket) = root_session(&run, true, None);
    let _churn = rss_bounded_across(&run, &session, "3000 producers came and went", || {
        let mut flood = Flood::start(&["churn", socket.to_str().expect("utf-8"), "3000", "1000"]);
        flood.wait_for("done");
        flood
    });
    trigger_within_a_second(&run);
    let (packets, err) = ended_on_the_trigger(&run, session);
    assert!(err.len() < LOG_BOUND, "{} bytes of log", err.len());
    assert!(err.contains("more closed producers"), "{err}");
    let stats = packets
        .iter()
        .rfind(|p| p.has_trace_stats())
        .expect("trace_stats");
    let seen = stats.trace_stats().producers_seen();
    if python_summary(&run.out).is_some() {
        // Each came in (seen) or was turned away at its uid's cap.
        let refused = quota_attribute(&run.out, 65534, "connections_per_uid").unwrap_or(0);
        assert!(
            seen + refused as u64 >= 3000,
            "{seen} seen, {refused} refused"
        );
        let folded = quota_attribute(&run.out, 65534, "closed_producers").unwrap_or(0);
        assert!(
            folded + 64 + refused >= 3000,
            "{folded} folded, {refused} refused"
        );
    }
}

/// Every attack at once against a root flight recorder under `ulimit -n
/// 1024` for `RECORDER_SOAK_SECS` (60): idle producer and trigger
/// connections (uid 65534), huge names (65532), producers that come and go
/// (65531); the trigger of another uid must arrive within 1 s at the end,
/// an app beside it records every packet, and RSS and the log stay bounded.
#[test]
fn a_hostile_soak_leaves_the_trigger_and_the_apps_their_way() {
    require!(need::attacker());
    let secs: u64 = std::env::var("RECORDER_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let run = shared_run(&flight(true));
    let (session, socket) = root_session(&run, true, Some(1024));
    let sock = socket.to_str().expect("utf-8");
    let trig = runtime(&run).join(format!("recorder-{}.trigger", session.id()));
    let trig = trig.to_str().expect("utf-8");
    let s = secs.to_string();
    let before = rss_kb(session.id());
    let _idle = Flood::start(&["hold", sock, "1500", "--seconds", &s]);
    // Each attack from its own uid, so that each gets past the others' caps.
    let _names = Flood::start_as(
        "65532",
        &["names", sock, "8", "1024", "100000", "--seconds", &s],
    );
    let _churn = Flood::start_as("65531", &["churn", sock, "0", "1000", "--seconds", &s]);
    let _trigger_idle = Flood::start(&["hold", trig, "64", "--seconds", &s]);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut peak = 0;
    while Instant::now() < end {
        peak = peak.max(rss_kb(session.id()));
        // The soak lasts its time; RSS is sampled through it.
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut app = App::spawn(&socket, "soak_app", &["--packets", "300"]);
    let app_pid = app.pid();
    app.expect("wrote 300");
    let took = trigger_within_a_second(&run);
    eprintln!("after {secs} s of attacks: trigger in {took:?}, RSS {before} -> peak {peak} KiB");
    assert!(
        peak.saturating_sub(before) < RSS_BOUND_KB,
        "RSS grew from {before} to {peak} KiB"
    );
    let (packets, err) = ended_on_the_trigger(&run, session);
    app.finish();
    assert_app_recorded_all(&packets, app_pid, 300);
    assert!(err.len() < LOG_BOUND, "{} bytes of log", err.len());
}

/// A session's quota lines name other users (whoever hit its 0666 trigger
/// socket or its producer socket): `recorder query` shows a non-root
/// caller the line of its own uid only (its SO_PEERCRED uid), in text and
/// in JSON, while root sees every uid's.
#[test]
fn query_shows_a_non_root_caller_its_own_uids_quota_line_only() {
    require!(need::attacker());
    let run = shared_run(&flight(false));
    std::os::unix::fs::chown(run.dir.path(), Some(65534), Some(65534)).expect("chown");
    let session = as_nobody(recorder_bin())
        .arg("--config")
        .arg(&run.config)
        .arg("-o")
        .arg(&run.out)
        .env("RECORDER_RUNTIME_DIR", runtime(&run))
        .env("RECORDER_IO", "pwritev")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder starts as nobody");
    wait_listening(&runtime(&run), session.id());
    // A request that is not JSON on the trigger socket, refused and
    // counted against its sender's uid: the owner's and another user's.
    let trigger = runtime(&run).join(format!("recorder-{}.trigger", session.id()));
    for uid in ["65533", NOBODY] {
        let out = as_user(uid, python())
            .args([
                "-c",
                "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.sendall(b'not json\\n')\nprint(s.recv(4096).decode())",
            ])
            .arg(&trigger)
            .output()
            .expect("python runs");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("not one JSON line"),
            "uid {uid}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
    }
    let query = |uid: Option<&str>, args: &[&str]| {
        let q = output_within_named(
            &mut recorder_as(&run, uid, args),
            Duration::from_secs(20),
            "query",
        );
        assert!(q.status.success(), "{}", stderr(&q));
        q.stdout
    };
    let quota_lines = |text: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(text)
            .lines()
            .filter(|l| l.contains("control or trigger requests refused"))
            .map(str::to_string)
            .collect()
    };
    let json_uids = |out: &[u8]| -> Vec<u64> {
        let v: serde_json::Value = serde_json::from_slice(out).expect("JSON");
        let ours = v
            .as_array()
            .and_then(|a| a.iter().find(|s| s["pid"] == session.id()))
            .unwrap_or_else(|| panic!("no status of the session: {v}"))
            .clone();
        ours["quotas"].as_array().map_or_else(Vec::new, |a| {
            a.iter().filter_map(|q| q["uid"].as_u64()).collect()
        })
    };
    let all = quota_lines(&query(None, &["query"]));
    assert_eq!(all.len(), 2, "root sees both uids: {all:?}");
    assert!(all[0].starts_with("  producers of uid 65533:"), "{all:?}");
    assert!(all[1].starts_with("  producers of uid 65534:"), "{all:?}");
    assert_eq!(
        json_uids(&query(None, &["query", "--json"])),
        [65533, 65534]
    );
    let own = quota_lines(&query(Some(NOBODY), &["query"]));
    assert_eq!(own.len(), 1, "the owner sees its own line only: {own:?}");
    assert!(own[0].starts_with("  producers of uid 65534:"), "{own:?}");
    assert_eq!(
        json_uids(&query(Some(NOBODY), &["query", "--json"])),
        [65534]
    );
    trigger_within_a_second(&run);
    ended_on_the_trigger(&run, session);
}
