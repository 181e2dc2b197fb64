//! Hardening of a root session's sockets against an unprivileged local user
//! (uid 65534 through `setpriv`): fake and hostile session sockets, slow and
//! idle connections, floods of triggers and clones, names and uids a caller
//! claims. The trigger still gets through, each caller gets an answer, and
//! the trace decodes with the independent decoder.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

#[test]
fn a_fake_session_socket_is_not_believed() {
    require!(need::attacker());
    let run = shared_run(&flight_config("", ""));
    let session = run.spawn("auto");
    wait_listening(&runtime(&run), session.id());
    // A root process with no sockets of its own: nobody answers in its name.
    let mut victim = Command::new("sleep").arg("60").spawn().expect("sleep");
    let vpid = victim.id().to_string();
    let rt = runtime(&run);
    let rt = rt.to_str().expect("utf-8 path");
    let _c = Attacker::start(&["fake", rt, "control", "lie", "--pid", &vpid]);
    let _t = Attacker::start(&["fake", rt, "trigger", "lie", "--pid", &vpid]);
    let stop = output_within_named(
        &mut recorder_as(&run, None, &["stop", &vpid]),
        Duration::from_secs(10),
        "stop",
    );
    assert_eq!(stop.status.code(), Some(1), "{}", stderr(&stop));
    assert!(stderr(&stop).contains("not believed"), "{}", stderr(&stop));
    let query = output_within_named(
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
    let t = output_within_named(
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
    require!(need::attacker());
    let run = shared_run(&flight_config("", ""));
    let session = run.spawn("auto");
    wait_listening(&runtime(&run), session.id());
    let sock = runtime(&run).join(format!("recorder-{}.trigger", session.id()));
    let sock = sock.to_str().expect("utf-8 path");
    let _idle = Attacker::start(&["hold", sock, "40"]);
    let _slow = Attacker::start(&["hold", sock, "5", "--dribble", "0.4"]);
    // The slow connections are mid-message (a byte each 0.4 s) when the
    // trigger comes.
    std::thread::sleep(Duration::from_millis(500));
    // Another unprivileged user's app fires the trigger.
    let t = output_within_named(
        &mut recorder_as(&run, Some("65533"), &["trigger", "go"]),
        Duration::from_secs(9),
        "trigger under slow connections",
    );
    assert!(t.status.success(), "{}", stderr(&t));
    check_triggered(&run, session, 65533);
}

#[test]
fn hostile_session_sockets_cost_clients_neither_memory_nor_time() {
    require!(need::attacker());
    let run = shared_run(&flight_config("", ""));
    let session = run.spawn("auto");
    wait_listening(&runtime(&run), session.id());
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
    let t = output_within_named(
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
fn stop_and_query_exit_codes_say_what_happened() {
    require!(need::attacker());
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
    wait_listening(&runtime(&run), session.id());
    // More than the pipe holds is buffered.
    wait_recorded(&run, session.id(), 1 << 20);
    let first = output_within_named(
        &mut recorder_as(&run, None, &["stop", &pid]),
        Duration::from_secs(10),
        "stop",
    );
    assert!(first.status.success(), "{}", stderr(&first));
    // The stop reaches its blocked write, which nothing outside shows (the
    // loop answers no query while it writes).
    std::thread::sleep(Duration::from_millis(300));
    // Already stopping (and blocked writing): an honest answer, at once.
    let again = output_within_named(
        &mut recorder_as(&run, None, &["stop", "--all"]),
        Duration::from_secs(10),
        "stop --all while stopping",
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stderr(&again).contains("stopping"), "{}", stderr(&again));
    // Nobody may query a root session: every session refused, exit 1.
    let q = output_within_named(
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
    let out = wait_within_named(session, Duration::from_secs(30), "session");
    assert!(out.status.success(), "{}", stderr(&out));
    let data = reader.join().expect("reader");
    assert_eq!(whole_prefix(&data), data.len());
    assert!(!test_counters(&decode(&data)).is_empty());
}

#[test]
fn unique_session_name_allows_one_live_session_per_name() {
    require!(need::attacker());
    let run = shared_run(&flight_config("", "unique_session_name: \"flight\""));
    // Someone else takes the lock file's name first and holds a lock on it.
    let lock = runtime(&run).join("session.0.flight.lock");
    let mut squatter = as_nobody("flock")
        .arg(&lock)
        .args(["sleep", "60"])
        .spawn()
        .expect("flock");
    wait_for_path(&lock, Duration::from_secs(5));
    let first = run.spawn("auto");
    wait_listening(&runtime(&run), first.id());
    // A second session of that name is refused before it touches its output.
    let second_out = run.dir.path().join("second.pftrace");
    std::fs::write(&second_out, "keep me").expect("write");
    let second = output_within_named(
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
    let t = output_within_named(
        &mut recorder_as(&run, Some(NOBODY), &["trigger", "go"]),
        Duration::from_secs(10),
        "trigger",
    );
    assert!(t.status.success(), "{}", stderr(&t));
    check_triggered(&run, first, 65534);
    // A crashed holder does not block the next session.
    let mut crashed = run.spawn("auto");
    wait_listening(&runtime(&run), crashed.id());
    crashed.kill().expect("SIGKILL");
    let _ = crashed.wait();
    let next = run.spawn("auto");
    wait_listening(&runtime(&run), next.id());
    let t = output_within_named(
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
    require!(need::attacker());
    let run = shared_run(
        &flight_config("", "")
            .replace("stop_delay_ms: 0", "stop_delay_ms: 60000")
            .replace("trigger_timeout_ms: 30000", "trigger_timeout_ms: 120000"),
    );
    let session = run.spawn("auto");
    let pid = session.id();
    wait_listening(&runtime(&run), pid);
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
        let out = wait_within_named(s, Duration::from_secs(300), "trigger sender");
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
    let stop = output_within_named(
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
    require!(need::attacker());
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
    wait_listening(&runtime(&run), session.id());
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
    let stop = output_within_named(
        &mut recorder_as(&run, None, &["stop", &session.id().to_string()]),
        Duration::from_secs(10),
        "stop",
    );
    assert!(stop.status.success(), "{}", stderr(&stop));
    let out = wait_within_named(session, Duration::from_secs(30), "the session");
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
    trace_processor::check(snapshots.last().expect("a snapshot"));
}

/// Nobody's own fake session (its socket, its pid) answers `query` with a
/// status that says uid 0: root's `recorder query` shows the uid the kernel
/// gives for the socket's peer, 65534.
#[test]
fn query_shows_the_peer_uid_not_the_one_a_session_claims() {
    require!(need::attacker());
    let run = shared_run(&flight_config("", ""));
    let rt = runtime(&run);
    let rt = rt.to_str().expect("utf-8 path");
    let fake = Attacker::start(&["fake", rt, "control", "lie"]);
    let pid = fake.0.id().to_string();
    let _listed = Attacker::start(&["fake", rt, "trigger", "lie", "--pid", &pid]);
    let q = output_within_named(
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
    let q = output_within_named(
        &mut recorder_as(&run, None, &["query"]),
        Duration::from_secs(10),
        "query",
    );
    let text = String::from_utf8_lossy(&q.stdout);
    assert!(text.contains("(uid 65534)"), "{text}");
    assert!(!text.contains("(uid 0)"), "{text}");
}

/// Item 6: one uid's 200 CLONE_SNAPSHOT triggers take that uid's share of
/// the budget (3 of 16), refused past it with `snapshot_share_spent`;
/// another uid's trigger and root's are still accepted and written.
#[test]
fn one_uids_snapshot_flood_leaves_room_for_others_and_root() {
    require!(need::attacker());
    let run = shared_run(
        r#"
buffers { size_kb: 1024 fill_policy: RING_BUFFER }
data_sources { config { name: "for_testing" target_buffer: 0
  for_testing { message_count: 0 max_messages_per_second: 1000 message_size: 16 } } }
trigger_config { trigger_mode: CLONE_SNAPSHOT trigger_timeout_ms: 120000 triggers { name: "snap" } }
"#,
    );
    let session = run.spawn("auto");
    wait_listening(&runtime(&run), session.id());
    let snapshots = |run: &Run| {
        (0..64)
            .filter(|n| Path::new(&format!("{}.{n}", run.out.display())).exists())
            .count()
    };
    let script = format!(
        "for i in $(seq 200); do {} trigger snap; done",
        recorder_bin().display()
    );
    let flood = output_within_named(
        as_nobody("sh")
            .args(["-c", &script])
            .env("RECORDER_RUNTIME_DIR", runtime(&run)),
        Duration::from_secs(300),
        "the flood",
    );
    let said = stderr(&flood);
    let took = |text: &str| text.lines().filter(|l| l.ends_with("\" accepted")).count();
    let accepted = took(&said);
    assert!((1..=3).contains(&accepted), "{accepted} accepted");
    assert!(said.contains("snapshot_share_spent"), "{said}");
    assert!(!said.contains("snapshot_budget_spent"), "{said}");
    let after_flood = accepted;
    // Another uid, then root: both accepted, both written.
    for (uid, total) in [(Some("65533"), after_flood + 1), (None, after_flood + 2)] {
        wait_for("the trigger accepted", Duration::from_secs(20), || {
            let t = output_within_named(
                &mut recorder_as(&run, uid, &["trigger", "snap"]),
                Duration::from_secs(10),
                "trigger",
            );
            // Only a snapshot under way may hold it back, briefly.
            took(&stderr(&t)) == 1 || {
                assert!(
                    stderr(&t).contains("snapshot_in_progress"),
                    "{}",
                    stderr(&t)
                );
                false
            }
        });
        wait_for(
            format_args!("snapshot {total} written"),
            Duration::from_secs(20),
            || snapshots(&run) >= total,
        );
    }
    let stop = output_within_named(
        &mut recorder_as(&run, None, &["stop", &session.id().to_string()]),
        Duration::from_secs(10),
        "stop",
    );
    assert!(stop.status.success(), "{}", stderr(&stop));
    let out = wait_within_named(session, Duration::from_secs(30), "session");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("3 at most, 4 of them kept"), "{err}");
}
