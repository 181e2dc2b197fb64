//! Recording end to end on the built binary: durations, streaming passes,
//! the size cap, signals, `--background`, stdout, crashes and a full disk.
//! Every trace is decoded with the independent decoders.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::*;

fn kinds_in_order(packets: &[perfetto_protos::trace_packet::TracePacket]) -> Vec<String> {
    packets
        .iter()
        .map(|p| match &p.data {
            Some(d) => format!("{d:?}").split('(').next().unwrap_or("").to_string(),
            None => "none".into(),
        })
        .collect()
}

/// The checks every complete trace passes: service packets first and in
/// order, one sequence per source, counters in order, stats at the end
/// agreeing with the loss seen.
fn check_complete(
    run: &Run,
    expected_packets: Option<u64>,
) -> Vec<perfetto_protos::trace_packet::TracePacket> {
    let data = run.trace();
    assert_eq!(
        whole_prefix(&data),
        data.len(),
        "a finished trace has no torn tail"
    );
    let packets = decode(&data);
    let kinds = kinds_in_order(&packets);
    assert!(
        kinds[0].contains("ClockSnapshot"),
        "first packet is the initial clock snapshot: {kinds:?}"
    );
    let pos = |k: &str| {
        kinds
            .iter()
            .position(|x| x.contains(k))
            .unwrap_or_else(|| panic!("no {k} in {kinds:?}"))
    };
    assert!(pos("SynchronizationMarker") < pos("TraceConfig"));
    assert!(pos("TraceConfig") < pos("TraceUuid"));
    assert!(pos("TraceUuid") < pos("SystemInfo"));
    assert!(
        kinds.last().is_some_and(|k| k.contains("TraceStats")),
        "the last packet is trace_stats"
    );
    let events = service_events(&packets);
    assert!(
        events.first().is_some_and(|e| e.contains("TracingStarted")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.contains("TracingDisabled")),
        "{events:?}"
    );
    for p in &packets {
        if p.has_for_testing() {
            assert!(
                p.trusted_packet_sequence_id() >= 2,
                "sources write on their own sequences"
            );
        } else if p.has_clock_snapshot() || p.has_trace_config() || p.has_trace_stats() {
            assert_eq!(p.trusted_packet_sequence_id(), 1);
        }
    }
    let counters = test_counters(&packets);
    let stats = packets
        .iter()
        .rev()
        .find(|p| p.has_trace_stats())
        .expect("trace_stats")
        .trace_stats()
        .clone();
    let b0 = &stats.buffer_stats[0];
    for (seq, c) in &counters {
        let (missing, before) = gaps(c);
        if b0.chunks_overwritten() == 0 && b0.chunks_discarded() == 0 {
            assert_eq!(
                (missing, before),
                (0, 0),
                "sequence {seq} lost packets though the stats report none"
            );
        }
        if let Some(n) = expected_packets
            && b0.chunks_overwritten() == 0
            && b0.chunks_discarded() == 0
        {
            assert_eq!(c.len() as u64, n, "sequence {seq}");
        }
    }
    if let Some(py) = python_summary(&run.out) {
        assert_eq!(
            py["packets"].as_u64(),
            Some(packets.len() as u64),
            "both decoders see the same packets"
        );
        assert_eq!(py["torn_bytes"].as_u64(), Some(0));
    }
    trace_processor::check(&run.out);
    packets
}

#[test]
fn duration_stop_keeps_every_packet() {
    for io in sinks() {
        let run = Run::new(&test_config(
            8192,
            "RING_BUFFER",
            "duration_ms: 1000",
            "message_count: 20000 message_size: 32 seed: 7",
        ));
        let out = run.run(io);
        assert!(
            out.status.success(),
            "{io}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("duration_ms elapsed"), "{stderr}");
        let packets = check_complete(&run, Some(20000));
        assert_eq!(test_counters(&packets).len(), 1);
    }
}

#[test]
fn streaming_writes_between_passes() {
    for io in sinks() {
        let run = Run::new(&test_config(
            4096,
            "RING_BUFFER",
            "duration_ms: 1500 write_into_file: true file_write_period_ms: 100",
            "message_count: 0 max_messages_per_second: 5000 message_size: 16",
        ));
        let mut child = run.spawn(io);
        let mut sizes = Vec::new();
        // The file's size at each poll until the session ends.
        poll(Duration::from_secs(10), || {
            let n = file_size(&run.out);
            if sizes.last() != Some(&n) {
                sizes.push(n);
            }
            child.try_wait().expect("wait")
        });
        let status = child.wait().expect("exit");
        assert!(status.success());
        let growing: Vec<_> = sizes.iter().filter(|n| **n > 0).collect();
        assert!(growing.len() >= 3, "{io}: the file grew only at {sizes:?}");
        check_complete(&run, None);
    }
}

/// A stream that has nothing to write makes no write: its 100 ms passes
/// still look at the buffers, but only a pass that carries something ends
/// with `read_tracing_buffers_completed`, so no marker follows another with
/// nothing between them, and every packet is there.
#[test]
fn an_idle_stream_writes_only_what_happened() {
    for io in sinks() {
        let run = Run::new(&test_config(
            4096,
            "RING_BUFFER",
            "duration_ms: 1500 write_into_file: true file_write_period_ms: 100",
            // 200 packets in the first 0.2 s, then nothing.
            "message_count: 200 max_messages_per_second: 1000 message_size: 16",
        ));
        let out = run.run(io);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{io}: {stderr}");
        let passes: u64 = stderr
            .split(" write passes")
            .next()
            .and_then(|head| head.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{io}: no pass count in {stderr}"));
        let packets = check_complete(&run, Some(200));
        let done = |p: &perfetto_protos::trace_packet::TracePacket| {
            p.has_service_event() && p.service_event().read_tracing_buffers_completed()
        };
        let markers = packets.iter().filter(|p| done(p)).count() as u64;
        assert!(
            packets.windows(2).all(|w| !(done(&w[0]) && done(&w[1]))),
            "{io}: a marker follows another with nothing between them"
        );
        assert!(
            passes >= 10 && markers * 2 < passes,
            "{io}: {markers} markers in {passes} passes"
        );
        if let Some(py) = python_summary(&run.out) {
            let seen = py["service_events"]
                .as_array()
                .expect("service events")
                .iter()
                .filter(|e| e.as_str() == Some("read_tracing_buffers_completed"))
                .count() as u64;
            assert_eq!(seen, markers, "{io}: both decoders count the markers");
        }
    }
}

/// A running session holds its buffers and little else in anonymous
/// memory: the config schema (about 6 MiB of descriptors, more while it is
/// decoded) is let go of once the config is a spec, and its pages go back
/// to the kernel before the buffers are mapped.
#[test]
fn a_running_session_holds_its_buffers_and_little_else() {
    let run = Run::new(&test_config(
        4096,
        "RING_BUFFER",
        "duration_ms: 30000 write_into_file: true file_write_period_ms: 100",
        "message_count: 100 message_size: 16",
    ));
    let child = run.spawn("pwritev");
    assert!(
        wait_for_size(&run.out, 1, Duration::from_secs(20)) > 0,
        "no first pass"
    );
    let status = proc_status(format!("/proc/{}/status", child.id()));
    signal(&child, rustix::process::Signal::TERM);
    let out = child.wait_with_output().expect("exit");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let anon_kb: u64 = status
        .get("RssAnon")
        .and_then(|v| v.trim_end_matches(" kB").parse().ok())
        .unwrap_or_else(|| panic!("no RssAnon in {status:?}"));
    // 4 MiB of buffer; the rest (stacks, the heap, the sink) measured
    // about 3 MiB; with the schema kept it was 10.
    assert!(
        anon_kb <= (4 + 6) * 1024,
        "{anon_kb} KiB of anonymous memory for a 4 MiB buffer"
    );
    check_complete(&run, Some(100));
}

#[test]
fn size_cap_stops_on_a_packet_boundary() {
    for io in sinks() {
        let cap = 300_000u64;
        let run = Run::new(&test_config(
            4096,
            "RING_BUFFER",
            &format!("write_into_file: true file_write_period_ms: 100 max_file_size_bytes: {cap}"),
            "message_count: 0 max_messages_per_second: 200000 message_size: 64",
        ));
        let out = run.run(io);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{io}: {stderr}");
        assert!(stderr.contains("max_file_size_bytes"), "{stderr}");
        let data = run.trace();
        assert!(
            (data.len() as u64) < cap,
            "{} bytes against a cap of {cap}",
            data.len()
        );
        assert!(
            data.len() as u64 > cap / 2,
            "the cap was reached, not an early stop"
        );
        assert_eq!(whole_prefix(&data), data.len(), "ends on a whole packet");
        assert_gap_free(&data);
        trace_processor::check(&run.out);
    }
}

/// No test counter of `data` has a gap.
fn assert_gap_free(data: &[u8]) {
    for c in test_counters(&decode(data)).values() {
        assert_eq!(gaps(c), (0, 0));
    }
}

/// Runs `c` to its end and checks it exited 0.
fn succeeded(c: &mut Command) -> std::process::Output {
    let out = c.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn signal_run(io: &str, signals: &[rustix::process::Signal]) -> Run {
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100",
        "message_count: 0 max_messages_per_second: 20000 message_size: 16",
    ));
    let mut child = run.spawn(io);
    assert!(
        wait_for_size(&run.out, 1, Duration::from_secs(10)) > 0,
        "the first pass wrote something"
    );
    for s in signals {
        signal(&child, *s);
        // Each signal on its own, not coalesced with the next.
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = child.wait().expect("exit");
    assert!(status.success(), "{io}: exit {status:?}");
    run
}

#[test]
fn sigint_and_sigterm_stop_gracefully() {
    use rustix::process::Signal;
    for io in sinks() {
        for sig in [Signal::INT, Signal::TERM] {
            let run = signal_run(io, &[sig]);
            let packets = check_complete(&run, None);
            let events = service_events(&packets);
            assert!(
                events.iter().any(|e| e.contains("AllDataSourcesFlushed")),
                "{events:?}"
            );
        }
    }
}

#[test]
fn a_second_signal_finalizes_at_once() {
    use rustix::process::Signal;
    for io in sinks() {
        let run = signal_run(io, &[Signal::INT, Signal::INT]);
        let data = run.trace();
        assert_eq!(whole_prefix(&data), data.len());
        assert_gap_free(&data);
        trace_processor::check(&run.out);
    }
}

#[test]
fn background_then_sigterm() {
    let run = Run::new(&test_config(
        4096,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100",
        "message_count: 0 max_messages_per_second: 5000 message_size: 16",
    ));
    // A relative output path must still work after the child's chdir("/").
    let mut c = Command::new(recorder_bin());
    c.current_dir(run.dir.path())
        .arg("--config")
        .arg("test.cfg")
        .arg("-o")
        .arg("trace.pftrace")
        .arg("--background")
        .env("RECORDER_RUNTIME_DIR", run.dir.path().join("run"));
    let out = succeeded(&mut c);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.ends_with('\n'), "{stdout:?}");
    let pid: i32 = stdout.trim().parse().expect("stdout is the pid");
    assert!(wait_for_size(&run.out, 1, Duration::from_secs(10)) > 0);
    let p = rustix::process::Pid::from_raw(pid).expect("pid");
    rustix::process::kill_process(p, rustix::process::Signal::TERM).expect("kill");
    poll(Duration::from_secs(20), || {
        rustix::process::test_kill_process(p).is_err().then_some(())
    });
    assert!(
        rustix::process::test_kill_process(p).is_err(),
        "the background recorder exited"
    );
    check_complete(&run, None);
}

/// `recorder inspect T | head` and `config check | head`: a reader that is
/// gone ends the command quietly with success, never a panic.
#[test]
fn printing_commands_end_quietly_when_the_reader_is_gone() {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 100",
        "message_count: 10 message_size: 16",
    ));
    let out = run.run("pwritev");
    assert!(out.status.success());
    for args in [
        vec!["inspect".to_string(), run.out.display().to_string()],
        vec![
            "inspect".into(),
            "--json".into(),
            run.out.display().to_string(),
        ],
        vec![
            "config".into(),
            "check".into(),
            "--explain".into(),
            run.config.display().to_string(),
        ],
    ] {
        // A pipe whose reading end is closed before the command starts.
        let (reader, writer) = rustix::pipe::pipe().expect("pipe");
        drop(reader);
        let out = Command::new(recorder_bin())
            .args(&args)
            .stdout(Stdio::from(writer))
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

#[test]
fn stdout_output_is_a_valid_trace() {
    let run = Run::new(&test_config(
        4096,
        "RING_BUFFER",
        "duration_ms: 500",
        "message_count: 5000 message_size: 8",
    ));
    let mut c = Command::new(recorder_bin());
    c.arg("--config")
        .arg(&run.config)
        .arg("-o")
        .arg("-")
        .env("RECORDER_RUNTIME_DIR", run.dir.path().join("run"));
    let out = succeeded(&mut c);
    assert_eq!(whole_prefix(&out.stdout), out.stdout.len());
    let packets = decode(&out.stdout);
    let counters = test_counters(&packets);
    assert_eq!(counters.values().next().map(|c| c.len()), Some(5000));
    std::fs::write(&run.out, &out.stdout).expect("keep the trace");
    trace_processor::check(&run.out);
}

/// Whether files in `dir` take O_DIRECT (the recorder's own probe).
fn direct_io_works(dir: &Path) -> bool {
    let probe = dir.join("direct-probe");
    let f = std::fs::File::create(&probe).expect("probe file");
    let ok = recorder::storage::direct::enable(&std::os::fd::OwnedFd::from(f)).is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

#[test]
fn sigkill_leaves_a_valid_prefix() {
    for io in sinks() {
        for delay_ms in [150u64, 420, 900] {
            let run = Run::new(&test_config(
                8192,
                "RING_BUFFER",
                "write_into_file: true file_write_period_ms: 100",
                "message_count: 0 max_messages_per_second: 50000 message_size: 200",
            ));
            let mut child = run.spawn(io);
            wait_for_size(&run.out, 1, Duration::from_secs(10));
            // The kill point is the variable: a set time into the run.
            std::thread::sleep(Duration::from_millis(delay_ms));
            signal(&child, rustix::process::Signal::KILL);
            child.wait().expect("reaped");
            let data = run.trace();
            let whole = whole_prefix(&data);
            // At most one torn record at the end.
            let packets = decode(&data);
            assert!(!packets.is_empty());
            assert!(
                data.len() - whole < 64 * 1024,
                "torn tail of {} bytes",
                data.len() - whole
            );
            for c in test_counters(&packets).values() {
                assert_eq!(gaps(c), (0, 0), "everything up to the last pass is there");
            }
            // Where the filesystem takes O_DIRECT the session streamed with
            // it: its passes are padded to whole blocks.
            let padded = packets
                .iter()
                .any(|p| p.special_fields.unknown_fields().get(55).is_some());
            assert_eq!(padded, direct_io_works(run.dir.path()), "{io}");
            // Trace processor reads the prefix as the decoders do: no error,
            // the session's start, the stats of the last pass written.
            trace_processor::check(&run.out);
        }
    }
}

#[test]
fn full_disk_stops_with_exit_1_and_a_valid_file() {
    require!(need::root());
    for io in sinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = dir.path().join("small");
        require!(need::small_tmpfs(&mnt, "1m"));
        let run = Run::new(&test_config(
            8192,
            "RING_BUFFER",
            "write_into_file: true file_write_period_ms: 100",
            "message_count: 0 max_messages_per_second: 100000 message_size: 100",
        ));
        let out_path = mnt.join("trace.pftrace");
        let mut c = run.command_to(io, &out_path);
        let out = c.output().expect("runs");
        let data = std::fs::read(&out_path).expect("file");
        let _ = Command::new("umount").arg(&mnt).status();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("No space left") || stderr.contains("ENOSPC"),
            "{stderr}"
        );
        assert_eq!(
            whole_prefix(&data),
            data.len(),
            "{io}: the file stays valid up to the last complete pass"
        );
        let packets = decode(&data);
        for c in test_counters(&packets).values() {
            assert_eq!(gaps(c), (0, 0));
        }
        let kept = dir.path().join("kept.pftrace");
        std::fs::write(&kept, &data).expect("keep the trace");
        trace_processor::check(&kept);
    }
}

/// The bundled configs that need no root record traces trace processor
/// reads cleanly and as recorded: quickstart's process tree, per-process
/// memory and system counters; buffer_policies' two buffers, each with its
/// own stats (the root-only ones are in the ftrace tests).
#[test]
fn bundled_configs_open_cleanly_in_trace_processor() {
    for name in ["quickstart.cfg", "buffer_policies.cfg"] {
        let text = std::fs::read_to_string(repo_root().join("configs").join(name)).expect("config");
        let run = Run::new(&text);
        let child = run.spawn("auto");
        let pid = child.id() as i64;
        let out = child.wait_with_output().expect("exits");
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let packets = decode(&run.trace());
        let Some(tp) = trace_processor::check(&run.out) else {
            return;
        };
        if name == "quickstart.cfg" {
            trace_processor::assert_process_view(&tp, &packets);
            assert!(trace_processor::assert_sys_stats_view(&tp, &packets) > 0);
            let me = tp.query(&format!(
                "select hex(cmdline) as c from process where pid = {pid}"
            ));
            assert_eq!(
                me.rows.len(),
                1,
                "the recorder itself is in the process table"
            );
        } else {
            let buffers = tp.query(
                "select count(distinct idx) as n from stats where name = 'traced_buf_buffer_size'",
            );
            assert_eq!(buffers.scalar().int(), 2, "{name}: two buffers");
        }
    }
}

/// A streaming session flushes its data sources as often as the
/// `trace_config` it records says (`flush_period_ms`, the flush plan's
/// period), so trace processor can sort the file incrementally at each
/// flush marker instead of holding it whole.
#[test]
fn streaming_sessions_flush_as_often_as_their_trace_config_says() {
    for (extra, period_ms) in [
        (
            "write_flush_mode: WRITE_FLUSH_ENABLED file_write_period_ms: 300",
            300u64,
        ),
        (
            "write_flush_mode: WRITE_FLUSH_DISABLED flush_period_ms: 250 file_write_period_ms: 1000",
            250,
        ),
    ] {
        let run = Run::new(&test_config(
            4096,
            "RING_BUFFER",
            &format!("duration_ms: 2000 write_into_file: true {extra}"),
            "message_count: 0 max_messages_per_second: 1000 message_size: 16",
        ));
        let out = run.run("auto");
        assert!(out.status.success());
        let packets = decode(&run.trace());
        let recorded = packets
            .iter()
            .find(|p| p.has_trace_config())
            .expect("trace_config")
            .trace_config()
            .flush_period_ms();
        assert_eq!(u64::from(recorded), period_ms, "{extra}");
        let flushes: Vec<u64> = packets
            .iter()
            .filter(|p| p.has_service_event() && p.service_event().all_data_sources_flushed())
            .map(|p| p.timestamp())
            .collect();
        assert!(
            flushes.len() as u64 >= 2000 / period_ms - 1,
            "{extra}: {} flushes in 2 s",
            flushes.len()
        );
        trace_processor::check(&run.out);
    }
}
