//! Triggers and the control plane on the built binary: START_TRACING,
//! STOP_TRACING (the flight recorder), CLONE_SNAPSHOT, rate limits,
//! `activate_triggers`, `query`/`stop`, and who may do what.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

fn trigger_config(
    mode: &str,
    triggers: &str,
    extra: &str,
    test_fields: &str,
    buffer_kb: u32,
) -> String {
    format!(
        r#"
buffers {{ size_kb: {buffer_kb} fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "for_testing" target_buffer: 0 for_testing {{ {test_fields} }} }} }}
trigger_config {{
  trigger_mode: {mode}
  trigger_timeout_ms: 20000
  {triggers}
}}
{extra}
"#
    )
}

/// Trace processor shows the trace's triggers, with the time and producer
/// the `trigger` packets carry (nothing when it is unavailable).
fn assert_triggers_in_trace_processor(
    trace: &Path,
    packets: &[perfetto_protos::trace_packet::TracePacket],
) {
    let Some(tp) = trace_processor::check(trace) else {
        return;
    };
    let want: Vec<(String, i64, String)> = packets
        .iter()
        .filter_map(|p| {
            let t = if p.has_trigger() {
                p.trigger()
            } else if p.has_clone_snapshot_trigger() {
                p.clone_snapshot_trigger()
            } else {
                return None;
            };
            Some((
                t.trigger_name().to_string(),
                p.timestamp() as i64,
                t.producer_name().to_string(),
            ))
        })
        .collect();
    assert!(!want.is_empty(), "{}: no trigger packet", trace.display());
    assert_eq!(tp.triggers(), want, "{}", trace.display());
}

fn trigger_packets(packets: &[perfetto_protos::trace_packet::TracePacket]) -> Vec<(String, u64)> {
    packets
        .iter()
        .filter(|p| p.has_trigger())
        .map(|p| (p.trigger().trigger_name().to_string(), p.timestamp()))
        .collect()
}

/// The session of `run`, spawned, once its control socket listens.
fn listening(run: &Run) -> Child {
    let child = spawn(run);
    wait_listening(&runtime(run), child.id());
    child
}

/// `recorder stop` ends the session of `run`, which exits 0.
fn stopped_cleanly(run: &Run, child: Child) {
    assert!(
        recorder(run, &["stop", &child.id().to_string()])
            .status
            .success()
    );
    let (status, stderr) = finish(child);
    assert!(status.success(), "{stderr}");
}

#[test]
fn start_trigger_starts_recording_then_stops_after_its_delay() {
    let run = Run::new(&trigger_config(
        "START_TRACING",
        r#"triggers { name: "go" stop_delay_ms: 600 }"#,
        "",
        "message_count: 0 max_messages_per_second: 5000 message_size: 8",
        4096,
    ));
    let child = spawn(&run);
    let pid = child.id();
    wait_listening(&runtime(&run), pid);
    // Time passes untriggered: none of it may be recorded.
    std::thread::sleep(Duration::from_millis(300));
    let t = recorder(&run, &["trigger", "go"]);
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let (status, stderr) = finish(child);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("stop trigger \"go\""), "{stderr}");
    let packets = decode(&run.trace());
    let trig = trigger_packets(&packets);
    assert_eq!(trig.len(), 1);
    assert_triggers_in_trace_processor(&run.out, &packets);
    let counters = test_counters(&packets);
    let c = counters.values().next().expect("data after the trigger");
    assert_eq!(gaps(c), (0, 0));
    // Nothing was recorded before the trigger: every test packet is newer.
    let first_data = packets
        .iter()
        .find(|p| p.has_for_testing())
        .expect("data")
        .timestamp();
    assert!(first_data >= trig[0].1, "data before the start trigger");
}

#[test]
fn start_trigger_timeout_leaves_an_empty_file_and_says_why() {
    let cfg = trigger_config(
        "START_TRACING",
        r#"triggers { name: "go" }"#,
        "",
        "message_count: 10",
        1024,
    )
    .replace("trigger_timeout_ms: 20000", "trigger_timeout_ms: 400");
    let run = Run::new(&cfg);
    let out = run.run("auto");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no trigger fired"), "{stderr}");
    assert!(
        stderr.contains("go"),
        "names the triggers in force: {stderr}"
    );
    assert_eq!(
        run.trace().len(),
        0,
        "as Perfetto: an untriggered session writes nothing"
    );
}

#[test]
fn stop_trigger_writes_the_ring_and_what_came_after_the_delay() {
    for delay in [0u64, 700] {
        let run = Run::new(&trigger_config(
            "STOP_TRACING",
            &format!(r#"triggers {{ name: "stop" stop_delay_ms: {delay} }}"#),
            "",
            "message_count: 0 max_messages_per_second: 5000 message_size: 8",
            8192,
        ));
        let child = listening(&run);
        wait_recorded(&run, child.id(), 4096);
        let t = recorder(&run, &["trigger", "stop"]);
        assert!(t.status.success());
        let (status, stderr) = finish(child);
        assert!(status.success(), "{stderr}");
        let packets = decode(&run.trace());
        let trig = trigger_packets(&packets);
        assert_eq!(trig.len(), 1, "delay {delay}");
        let ts: Vec<u64> = packets
            .iter()
            .filter(|p| p.has_for_testing())
            .map(|p| p.timestamp())
            .collect();
        assert!(
            ts.iter().any(|t| *t < trig[0].1),
            "the seconds before the trigger are there"
        );
        if delay > 0 {
            let after = ts.iter().filter(|t| **t > trig[0].1 + 300_000_000).count();
            assert!(after > 0, "data written during the stop delay is there");
        }
        let c = test_counters(&packets);
        assert_eq!(gaps(c.values().next().expect("data")), (0, 0));
        assert_triggers_in_trace_processor(&run.out, &packets);
    }
}

#[test]
fn unlisted_trigger_is_refused_with_exit_1_and_first_stop_trigger_wins() {
    let run = Run::new(&trigger_config(
        "STOP_TRACING",
        r#"triggers { name: "slow" stop_delay_ms: 1500 } triggers { name: "fast" stop_delay_ms: 0 }"#,
        "",
        "message_count: 0 max_messages_per_second: 1000 message_size: 8",
        1024,
    ));
    let child = listening(&run);
    let t = recorder(&run, &["trigger", "nope"]);
    assert_eq!(t.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&t.stderr).contains("not_listed"));
    let t0 = Instant::now();
    assert!(recorder(&run, &["trigger", "slow"]).status.success());
    let second = recorder(&run, &["trigger", "fast"]);
    assert_eq!(
        second.status.code(),
        Some(1),
        "the first STOP trigger owns the session"
    );
    assert!(String::from_utf8_lossy(&second.stderr).contains("already_triggered"));
    let (status, stderr) = finish(child);
    assert!(status.success(), "{stderr}");
    assert!(
        t0.elapsed() >= Duration::from_millis(1400),
        "stopped by the slow trigger's delay"
    );
    assert!(stderr.contains("\"slow\""), "{stderr}");
}

#[test]
fn no_session_means_exit_1() {
    let run = Run::new("");
    let t = recorder(&run, &["trigger", "anything"]);
    assert_eq!(t.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&t.stderr).contains("no running recorder session"));
}

#[test]
fn max_per_24_h_survives_a_restart_and_skip_probability_applies() {
    let cfg = trigger_config(
        "STOP_TRACING",
        r#"triggers { name: "once" max_per_24_h: 1 } triggers { name: "never" skip_probability: 1.0 }"#,
        "",
        "message_count: 0 max_messages_per_second: 1000 message_size: 8",
        1024,
    );
    let run = Run::new(&cfg);
    let child = listening(&run);
    let skipped = recorder(&run, &["trigger", "never"]);
    assert_eq!(skipped.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&skipped.stderr).contains("skipped"));
    assert!(recorder(&run, &["trigger", "once"]).status.success());
    assert!(finish(child).0.success());
    // A new session in the same runtime directory: the history remembers.
    let out2 = run.dir.path().join("second.pftrace");
    let child = run
        .command_to("auto", &out2)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    wait_listening(&runtime(&run), child.id());
    let again = recorder(&run, &["trigger", "once"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("rate_limited"));
    assert!(
        recorder(&run, &["stop", &child.id().to_string()])
            .status
            .success()
    );
    assert!(finish(child).0.success());
}

#[test]
fn clone_snapshot_writes_numbered_snapshots_while_recording_goes_on() {
    let run = Run::new(&trigger_config(
        "CLONE_SNAPSHOT",
        r#"triggers { name: "snap" }"#,
        "",
        "message_count: 0 max_messages_per_second: 5000 message_size: 8",
        4096,
    ));
    let child = listening(&run);
    wait_recorded(&run, child.id(), 4096);
    assert!(recorder(&run, &["trigger", "snap"]).status.success());
    // The second snapshot holds data the first could not.
    wait_recorded(&run, child.id(), bytes_recorded(&run, child.id()) + 4096);
    assert!(recorder(&run, &["trigger", "snap"]).status.success());
    stopped_cleanly(&run, child);
    let mut last_counts = Vec::new();
    for n in 0..2 {
        let p = std::path::PathBuf::from(format!("{}.{n}", run.out.display()));
        let data = std::fs::read(&p).expect("snapshot file");
        let packets = decode(&data);
        assert!(
            packets.iter().any(|p| p.has_clone_snapshot_trigger()),
            "snapshot {n} names its trigger"
        );
        let c = test_counters(&packets);
        let c = c.values().next().expect("data in snapshot");
        assert_eq!(gaps(c), (0, 0));
        last_counts.push(*c.last().expect("counter"));
        // Trace processor: the snapshot's trigger, and when the clone began.
        assert_triggers_in_trace_processor(&p, &packets);
        if let Some(tp) = trace_processor::open(&p) {
            let trig = packets
                .iter()
                .find(|p| p.has_clone_snapshot_trigger())
                .expect("trigger");
            assert_eq!(
                tp.stat("traced_clone_trigger_timestamp_ns", None),
                trig.timestamp() as i64
            );
            let started = packets
                .iter()
                .find(|p| p.has_service_event() && p.service_event().clone_started())
                .expect("clone_started");
            assert_eq!(
                tp.stat("traced_clone_started_timestamp_ns", None),
                started.timestamp() as i64
            );
            assert_eq!(
                tp.metadata("trace_trigger"),
                Some(trace_processor::Value::Text(
                    trig.clone_snapshot_trigger().trigger_name().to_string()
                ))
            );
        }
    }
    assert!(
        last_counts[1] > last_counts[0],
        "the second snapshot holds newer data"
    );
    assert_eq!(
        run.trace().len(),
        0,
        "the main output of a clone-snapshot session stays empty"
    );
}

#[test]
fn activate_triggers_config_fires_and_exits() {
    let run = Run::new(&trigger_config(
        "STOP_TRACING",
        r#"triggers { name: "from-config" }"#,
        "",
        "message_count: 0 max_messages_per_second: 1000 message_size: 8",
        1024,
    ));
    let child = listening(&run);
    let act = run.dir.path().join("activate.cfg");
    std::fs::write(&act, "activate_triggers: \"from-config\"\n").expect("write");
    let out = recorder(&run, &["--config", act.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, stderr) = finish(child);
    assert!(status.success());
    assert!(stderr.contains("from-config"), "{stderr}");
}

#[test]
fn query_lists_the_session_and_stop_stops_it() {
    let run = Run::new(&test_config(
        2048,
        "DISCARD",
        "write_into_file: true file_write_period_ms: 100",
        "message_count: 0 max_messages_per_second: 2000 message_size: 8",
    ));
    let child = spawn(&run);
    let pid = child.id();
    wait_listening(&runtime(&run), pid);
    let q = recorder(&run, &["query", "--json"]);
    assert!(q.status.success());
    let v: serde_json::Value = serde_json::from_slice(&q.stdout).expect("json");
    let s = v
        .as_array()
        .and_then(|a| a.iter().find(|s| s["pid"] == pid))
        .expect("our session is listed");
    assert_eq!(s["state"], "recording");
    assert_eq!(s["buffers"][0]["policy"], "DISCARD");
    let text = recorder(&run, &["query"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains(&format!("session {pid}")));
    assert!(recorder(&run, &["stop", &pid.to_string()]).status.success());
    let (status, stderr) = finish(child);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("recorder stop"), "{stderr}");
    assert!(!decode(&run.trace()).is_empty());
}

#[test]
fn flight_recorder_keeps_the_newest_data_contiguous_up_to_the_trigger() {
    let run = Run::new(&trigger_config(
        "STOP_TRACING",
        r#"triggers { name: "incident" }"#,
        "",
        "message_count: 0 message_size: 100",
        256,
    ));
    let child = listening(&run);
    // The ring has wrapped: its oldest data is gone.
    wait_for("the ring overwriting", Duration::from_secs(30), || {
        session_status(&run, child.id())
            .and_then(|s| s["buffers"][0]["bytes_overwritten"].as_u64())
            .is_some_and(|n| n > 0)
    });
    assert!(recorder(&run, &["trigger", "incident"]).status.success());
    let (status, stderr) = finish(child);
    assert!(status.success(), "{stderr}");
    let packets = decode(&run.trace());
    let c = test_counters(&packets);
    let c = c.values().next().expect("data");
    let (missing, before) = gaps(c);
    assert_eq!(missing, 0, "contiguous");
    assert!(
        before > 0,
        "a 256 KiB ring under full load lost its oldest data"
    );
    let stats = packets
        .iter()
        .rev()
        .find(|p| p.has_trace_stats())
        .expect("stats")
        .trace_stats()
        .clone();
    let b = &stats.buffer_stats[0];
    assert!(
        b.chunks_overwritten() > 0 && b.bytes_overwritten() > 0,
        "the loss is counted"
    );
    assert!(stderr.contains("overwritten"), "{stderr}");
    // Trace processor shows the same overwrite, and (as for Perfetto's ring
    // buffers) no sequence loss: only the oldest data went, before each
    // sequence's first packet in the file.
    assert_triggers_in_trace_processor(&run.out, &packets);
    if let Some(tp) = trace_processor::open(&run.out) {
        assert_eq!(
            tp.stat("traced_buf_bytes_overwritten", Some(0)),
            b.bytes_overwritten() as i64
        );
        assert_eq!(tp.stat("traced_buf_sequence_packet_loss", Some(0)), 0);
    }
}

#[test]
fn an_unprivileged_user_may_trigger_but_not_stop_or_query() {
    require!(need::root());
    let setpriv = Command::new("setpriv").arg("--version").output();
    require!(setpriv.is_err().then(|| "setpriv missing".to_string()));
    let run = Run::new(&trigger_config(
        "STOP_TRACING",
        r#"triggers { name: "user-event" }"#,
        "",
        "message_count: 0 max_messages_per_second: 1000 message_size: 8",
        1024,
    ));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let child = spawn(&run);
    let pid = child.id();
    wait_listening(&runtime(&run), pid);
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(recorder_bin())
            .args(args)
            .env("RECORDER_RUNTIME_DIR", runtime(&run))
            .output()
            .expect("setpriv runs")
    };
    let stop = as_nobody(&["stop", &pid.to_string()]);
    assert_eq!(
        stop.status.code(),
        Some(1),
        "nobody may not stop a root session"
    );
    assert!(
        String::from_utf8_lossy(&stop.stderr)
            .to_lowercase()
            .contains("permission"),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let q = as_nobody(&["query", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&q.stdout).expect("json");
    assert!(
        v.as_array()
            .is_some_and(|a| a.iter().all(|s| s.get("state").is_none())),
        "nobody sees no status: {v}"
    );
    let t = as_nobody(&["trigger", "user-event"]);
    assert!(
        t.status.success(),
        "nobody may trigger: {}",
        String::from_utf8_lossy(&t.stderr)
    );
    let (status, _) = finish(child);
    assert!(status.success());
    let packets = decode(&run.trace());
    let trig: Vec<_> = packets.iter().filter(|p| p.has_trigger()).collect();
    assert_eq!(trig.len(), 1);
    assert_eq!(
        trig[0].trigger().trusted_producer_uid(),
        65534,
        "the trigger names the sender's uid"
    );
}

#[test]
fn a_trigger_during_start_up_is_taken_once_the_session_listens() {
    let run = Run::new(&trigger_config(
        "STOP_TRACING",
        r#"triggers { name: "early" }"#,
        "",
        "message_count: 0 max_messages_per_second: 1000 message_size: 8",
        1024,
    ));
    let child = spawn(&run);
    // Fire from the moment the process exists: until it listens the
    // trigger finds no session (exit 1); once it does, it is accepted.
    let t0 = Instant::now();
    let mut refused_before = 0;
    loop {
        let t = recorder(&run, &["trigger", "early"]);
        if t.status.success() {
            break;
        }
        refused_before += 1;
        assert!(t0.elapsed() < Duration::from_secs(20), "never accepted");
    }
    let (status, stderr) = finish(child);
    assert!(status.success(), "{stderr}");
    let packets = decode(&run.trace());
    assert_eq!(trigger_packets(&packets).len(), 1);
    eprintln!("refused {refused_before} times before the session listened");
}

#[test]
fn a_trigger_during_stop_is_refused_and_the_file_stays_valid() {
    let run = Run::new(&trigger_config(
        "STOP_TRACING",
        r#"triggers { name: "first" stop_delay_ms: 0 } triggers { name: "late" }"#,
        "",
        "message_count: 0 max_messages_per_second: 20000 message_size: 64",
        16384,
    ));
    let child = listening(&run);
    // Enough buffered that the stop takes a while.
    wait_recorded(&run, child.id(), 256 * 1024);
    assert!(recorder(&run, &["trigger", "first"]).status.success());
    // The session is now stopping (or gone): a further trigger is not taken.
    let late = recorder(&run, &["trigger", "late"]);
    assert_eq!(
        late.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&late.stderr)
    );
    let (status, stderr) = finish(child);
    assert!(status.success(), "{stderr}");
    let data = run.trace();
    assert_eq!(whole_prefix(&data), data.len());
    let packets = decode(&data);
    let names: Vec<String> = trigger_packets(&packets)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, vec!["first".to_string()]);
}

/// A trigger name too long for any session (130 KB) or unprintable is
/// refused before connecting, with the rule and without echoing it whole;
/// no "Broken pipe".
#[test]
fn a_long_or_unprintable_trigger_name_is_refused_up_front() {
    let d = tempfile::tempdir().expect("tempdir");
    // One argument holds at most 128 KiB (MAX_ARG_STRLEN).
    let long = "n".repeat(120 * 1024);
    let many: Vec<String> = (0..65).map(|i| format!("t{i}")).collect();
    let wide: Vec<String> = (0..60).map(|i| format!("{i:0>200}")).collect();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![long], "1 to 256 printable"),
        (vec!["a\u{1b}[2Jb".to_string()], "1 to 256 printable"),
        (many, "at most 64 at once"),
        (wide, "send fewer at once"),
    ];
    for (names, says) in cases {
        let out = Command::new(recorder_bin())
            .arg("trigger")
            .args(&names)
            .env("RECORDER_RUNTIME_DIR", d.path())
            .stdin(Stdio::null())
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!err.contains("Broken pipe"), "{err}");
        assert!(err.len() < 1000, "{} bytes", err.len());
        assert!(!err.contains('\u{1b}'), "{err}");
    }
}

/// A snapshot that does not fit on the disk (a 1 MiB tmpfs for 8 MiB of
/// data; 64 KiB when compressed), plain and compressed: the snapshot file ends on a whole packet,
/// decodes, and the session goes on and ends well.
#[test]
fn a_snapshot_on_a_full_disk_ends_on_a_whole_packet() {
    require!(need::root());
    for compress in [false, true] {
        let run = Run::new(&trigger_config(
            "CLONE_SNAPSHOT",
            r#"triggers { name: "snap" }"#,
            "",
            // Random payloads: they compress poorly, so the disk fills.
            "message_count: 0 max_messages_per_second: 20000 message_size: 400 seed: 3",
            8192,
        ));
        let mnt = run.dir.path().join("small");
        // The test data compresses about 40 times: a smaller disk then.
        let size = if compress { "64k" } else { "1m" };
        require!(need::small_tmpfs(&mnt, size));
        let out = mnt.join("t.pftrace");
        let mut c = run.command_to("auto", &out);
        if compress {
            c.arg("--compress=1");
        }
        let child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts");
        wait_listening(&runtime(&run), child.id());
        // More buffered than the disk holds.
        wait_recorded(&run, child.id(), 4 << 20);
        let t = recorder(&run, &["trigger", "snap"]);
        // The snapshot meets the full disk while the session records on:
        // the stop comes after it, not during it.
        std::thread::sleep(Duration::from_millis(500));
        let stop = recorder(&run, &["stop", &child.id().to_string()]);
        let (status, stderr) = finish(child);
        let snap = std::fs::read(mnt.join("t.pftrace.0")).unwrap_or_default();
        let _ = Command::new("umount").arg("-l").arg(&mnt).status();
        assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
        assert!(stop.status.success());
        assert!(status.success(), "{stderr}");
        assert!(
            stderr.contains("No space left"),
            "compress={compress}: {stderr}"
        );
        assert!(!snap.is_empty(), "compress={compress}");
        assert_eq!(
            whole_prefix(&snap),
            snap.len(),
            "compress={compress}: the snapshot ends on a whole packet"
        );
        let (packets, _) = expand(&snap);
        let counters = test_counters(&packets);
        let c = counters.values().next().expect("data in the snapshot");
        assert_eq!(gaps(c).0, 0, "compress={compress}");
        let copy = run.dir.path().join("snap.pftrace");
        std::fs::write(&copy, &snap).expect("copy");
        trace_processor::check(&copy);
    }
}

/// 400 `recorder trigger` calls at once, 16 at a time, against one session:
/// every one ends with an outcome or a precise message, never a bare
/// "Broken pipe".
#[test]
fn triggers_under_load_never_end_in_a_bare_broken_pipe() {
    let run = Run::new(&trigger_config(
        "CLONE_SNAPSHOT",
        r#"triggers { name: "snap" }"#,
        "",
        "message_count: 0 max_messages_per_second: 2000 message_size: 8",
        1024,
    ));
    let child = listening(&run);
    let rt = runtime(&run);
    let senders: Vec<std::thread::JoinHandle<Vec<String>>> = (0..16)
        .map(|_| {
            let rt = rt.clone();
            std::thread::spawn(move || {
                (0..25)
                    .map(|_| {
                        let out = Command::new(recorder_bin())
                            .args(["trigger", "snap"])
                            .env("RECORDER_RUNTIME_DIR", &rt)
                            .stdin(Stdio::null())
                            .output()
                            .expect("trigger runs");
                        String::from_utf8_lossy(&out.stderr).into_owned()
                    })
                    .collect()
            })
        })
        .collect();
    let mut outputs = Vec::new();
    for s in senders {
        outputs.extend(s.join().expect("sender"));
    }
    stopped_cleanly(&run, child);
    assert_eq!(outputs.len(), 400);
    for err in &outputs {
        assert!(
            err.contains("accepted") || err.contains("not taken") || err.contains("session "),
            "{err}"
        );
        assert!(
            !err.contains("Broken pipe") && !err.contains("os error 32"),
            "{err}"
        );
    }
}
