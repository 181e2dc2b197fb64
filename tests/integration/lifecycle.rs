//! The session's lifecycle fields on the built binary: `deferred_start` with
//! `recorder start`, `flush_period_ms`, the stats period
//! (`builtin_data_sources.snapshot_interval_ms`), and the third signal that
//! ends a session blocked in its final write.

use crate::harness::*;
use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

fn count(events: &[String], what: &str) -> usize {
    events.iter().filter(|e| e.contains(what)).count()
}

#[test]
fn deferred_start_records_only_after_recorder_start() {
    let run = Run::new(&test_config(
        4096,
        "RING_BUFFER",
        "deferred_start: true duration_ms: 800",
        "message_count: 0 max_messages_per_second: 1000 message_size: 16",
    ));
    let child = spawn(&run);
    let pid = child.id();
    wait_listening(&runtime(&run), pid);
    let q = recorder(&run, &["query", "--json"]);
    let text = String::from_utf8_lossy(&q.stdout);
    assert!(text.contains("deferred"), "query says deferred: {text}");
    // Nothing starts by itself: time passes and the duration has not begun.
    std::thread::sleep(Duration::from_millis(1200));
    let before_start = recorder::clock::boottime_ns();
    let out = recorder(&run, &["start", &pid.to_string()]);
    assert!(
        out.status.success(),
        "start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = recorder(&run, &["start", &pid.to_string()]);
    assert_eq!(again.status.code(), Some(1), "a second start is refused");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already_started"));
    let (status, stderr) = finish(child);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("duration_ms elapsed"), "{stderr}");

    let packets = decode(&run.trace());
    let counters = test_counters(&packets);
    assert!(!counters.is_empty(), "the source recorded after the start");
    let started = packets
        .iter()
        .find(|p| p.has_service_event() && p.service_event().tracing_started())
        .expect("tracing_started");
    assert!(
        started.timestamp() >= before_start,
        "tracing started when `recorder start` asked, not at launch"
    );
}

#[test]
fn start_is_refused_by_a_session_that_is_not_deferred() {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 3000",
        "message_count: 10",
    ));
    let child = spawn(&run);
    wait_listening(&runtime(&run), child.id());
    let out = recorder(&run, &["start"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already_started"));
    let stop = recorder(&run, &["stop"]);
    assert!(stop.status.success());
    let (status, _) = finish(child);
    assert!(status.success());
}

#[test]
fn flush_period_ms_flushes_while_recording() {
    let run = Run::new(&test_config(
        4096,
        "RING_BUFFER",
        "flush_period_ms: 200 duration_ms: 1500",
        "message_count: 0 max_messages_per_second: 1000 message_size: 16",
    ));
    let out = run.run("auto");
    assert!(out.status.success());
    let packets = decode(&run.trace());
    let flushed = count(&service_events(&packets), "AllDataSourcesFlushed");
    // About seven periodic flushes and the stop's own.
    assert!(flushed >= 5, "{flushed} flushes recorded");
    // trace_stats counts them: each flush, the stop's included, was acked in
    // time, and each complete one noted its marker.
    let stats = packets
        .iter()
        .rfind(|p| p.has_trace_stats())
        .expect("trace_stats")
        .trace_stats();
    let requested = stats.flushes_requested();
    assert_eq!(requested, flushed as u64, "{stats:?}");
    assert_eq!(stats.flushes_succeeded(), requested, "{stats:?}");
    assert_eq!(stats.flushes_failed(), 0, "{stats:?}");
    let python = python_summary(&run.out);
    if let Some(p) = python {
        assert_eq!(p["packets"].as_u64(), Some(packets.len() as u64));
        assert_eq!(p["last_flushes"]["requested"].as_u64(), Some(requested));
        assert_eq!(p["last_flushes"]["succeeded"].as_u64(), Some(requested));
        assert_eq!(p["last_flushes"]["failed"].as_u64(), Some(0));
    }
    if let Some(tp) = trace_processor::check(&run.out) {
        assert_eq!(tp.stat("traced_flushes_requested", None), requested as i64);
        assert_eq!(tp.stat("traced_flushes_succeeded", None), requested as i64);
        assert_eq!(tp.stat("traced_flushes_failed", None), 0);
    }
}

#[test]
fn stats_follow_snapshot_interval_ms() {
    let run = Run::new(&test_config(
        4096,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 duration_ms: 1600 \
         builtin_data_sources { snapshot_interval_ms: 250 }",
        "message_count: 0 max_messages_per_second: 1000 message_size: 16",
    ));
    let out = run.run("auto");
    assert!(out.status.success());
    let packets = decode(&run.trace());
    let stats = packets.iter().filter(|p| p.has_trace_stats()).count();
    let markers = packets
        .iter()
        .filter(|p| p.has_synchronization_marker())
        .count();
    // The first pass, one per 250 ms tick, the final pass (the default
    // 10 s period would give two).
    assert!(stats >= 5, "{stats} trace_stats packets");
    assert!(markers >= 5, "{markers} sync markers");
}

#[test]
fn a_third_signal_ends_a_session_blocked_in_its_final_write() {
    // 16 MB buffered, written at the end to a pipe nobody reads: the final
    // write blocks once the pipe is full.
    let run = Run::new(&test_config(
        32768,
        "RING_BUFFER",
        "",
        "message_count: 4000 message_size: 4000",
    ));
    let mut child = run
        .command_to("auto", std::path::Path::new("-"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder starts");
    wait_listening(&runtime(&run), child.id());
    // Far more buffered than the pipe holds.
    wait_recorded(&run, child.id(), 8 << 20);
    use rustix::process::Signal;
    signal(&child, Signal::INT);
    // The stop flushes, stops the source and starts writing: let it block
    // (nothing outside shows it: the loop answers no query while it writes).
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "blocked in write"
    );
    signal(&child, Signal::INT);
    // Two signals, not one pending signal that takes both.
    std::thread::sleep(Duration::from_millis(100));
    signal(&child, Signal::INT);
    let status = poll_exit(&mut child, Duration::from_secs(10)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the third signal did not end the session")
    });
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
    // What reached the pipe is a valid prefix of a trace.
    let mut got = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_end(&mut got).expect("read the pipe");
    }
    assert!(!got.is_empty());
    decode(&got);
}
