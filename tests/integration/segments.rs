//! Compression and segmented output on the built binary. Every trace and
//! segment is decoded with the independent decoders: `perfetto_protos` (the
//! zstd packets decompressed here, since its schema predates field 133) and
//! Python's `perfetto_trace_pb2` with `zstandard`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;
use perfetto_protos::trace_packet::TracePacket;
use protobuf::Message;
use sha2::Digest;

/// `TracePacket.trace_attributes` (newer than the decoder's schema: read as
/// an unknown field).
const ATTRIBUTES_FIELD: u32 = 126;

/// The data kind of a packet (`attributes` for trace_attributes).
fn kind(p: &TracePacket) -> String {
    if p.special_fields
        .unknown_fields()
        .get(ATTRIBUTES_FIELD)
        .is_some()
    {
        return "trace_attributes".into();
    }
    match &p.data {
        Some(d) => format!("{d:?}").split('(').next().unwrap_or("").to_string(),
        None => "none".into(),
    }
}

/// The TestEvents of each sequence, in order.
fn test_events(packets: &[TracePacket]) -> BTreeMap<u32, Vec<Vec<u8>>> {
    let mut m: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    for p in packets.iter().filter(|p| p.has_for_testing()) {
        m.entry(p.trusted_packet_sequence_id())
            .or_default()
            .push(p.for_testing().write_to_bytes().expect("encodes"));
    }
    m
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

const SEEDED: &str =
    "message_count: 6000 message_size: 300 seed: 42 max_messages_per_second: 12000";

/// Counters `c` of a segment are gap-free and carry on from the last
/// counter of the segment before (`prev_last`), which becomes theirs.
fn assert_continues(prev_last: &mut Option<u64>, c: &[u64]) {
    assert_eq!(gaps(c).0, 0);
    if let Some(p) = *prev_last {
        assert_eq!(c[0], p + 1, "consecutive segments continue");
    }
    *prev_last = c.last().copied();
}

#[test]
fn compressed_output_decodes_to_the_packets_of_an_uncompressed_run() {
    let top = "write_into_file: true file_write_period_ms: 100 duration_ms: 1200";
    let plain = Run::new(&test_config(16384, "RING_BUFFER", top, SEEDED));
    ok(&plain.run("pwritev"));
    let flag = Run::new(&test_config(16384, "RING_BUFFER", top, SEEDED));
    let mut c = flag.command("io_uring");
    c.arg("--compress=1");
    ok(&c.output().expect("runs"));
    let configured = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        &format!("{top} compression {{ zstd {{ level: 3 }} }}"),
        SEEDED,
    ));
    ok(&configured.run("pwritev"));

    let (reference, none) = expand(&plain.trace());
    assert!(none.is_empty());
    let want = test_events(&reference);
    assert_eq!(want.values().map(Vec::len).sum::<usize>(), 6000);
    // The plain run streamed with O_DIRECT where the filesystem allows: its
    // padding packets are not the session's.
    let want_kinds: std::collections::BTreeSet<String> = reference
        .iter()
        .filter(|p| !is_padding(p))
        .map(kind)
        .collect();
    for run in [&flag, &configured] {
        let data = run.trace();
        let outer = decode(&data);
        assert!(
            outer
                .iter()
                .all(|p| p.special_fields.unknown_fields().get(ZSTD_FIELD).is_some()),
            "every packet of a compressed trace is a compressed packet"
        );
        let (packets, sizes) = expand(&data);
        assert!(sizes.iter().all(|s| *s < 512 * 1024), "{sizes:?}");
        assert!(data.len() * 2 < plain.trace().len(), "it compresses");
        assert_eq!(test_events(&packets), want, "the same TestEvents, in order");
        let kinds: std::collections::BTreeSet<String> = packets.iter().map(kind).collect();
        assert_eq!(kinds, want_kinds);
        // Perfetto's trace processor decompresses it and reads what the
        // packets inside hold: no error stat, the buffer stats, the session.
        trace_processor::check(&run.out);

        let (Some(py), Some(py_plain)) = (python_summary(&run.out), python_summary(&plain.out))
        else {
            continue;
        };
        assert!(py["compressed_packets"].as_u64() > Some(0));
        assert_eq!(
            py["sequences"]["2"]["counters"],
            py_plain["sequences"]["2"]["counters"]
        );
        assert_eq!(py["kinds"]["for_testing"], 6000);
        let head = |v: &serde_json::Value| -> Vec<serde_json::Value> {
            v["first_kinds"]
                .as_array()
                .map(|a| a[..4].to_vec())
                .unwrap_or_default()
        };
        assert_eq!(head(&py), head(&py_plain), "the same head");
    }
    // inspect reads the compressed trace.
    let out = Command::new(recorder_bin())
        .args(["inspect", "--json"])
        .arg(&flag.out)
        .output()
        .expect("inspect");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["by_kind"]["for_testing"]["packets"], 6000);
    assert!(report["compressed"]["packets"].as_u64() > Some(0));
    let seq = &report["by_sequence"]["2"]["for_testing"];
    assert_eq!(
        (seq["first"].as_u64(), seq["last"].as_u64()),
        (Some(0), Some(5999))
    );
}

#[test]
fn the_size_cap_holds_for_compressed_output() {
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        "write_into_file: true file_write_period_ms: 100 max_file_size_bytes: 30000 duration_ms: 5000",
        "message_count: 0 message_size: 200 max_messages_per_second: 20000",
    ));
    let mut c = run.command("pwritev");
    c.arg("--compress");
    let stderr = ok(&c.output().expect("runs"));
    assert!(stderr.contains("max_file_size_bytes reached"), "{stderr}");
    let data = run.trace();
    assert!(data.len() < 30000, "{}", data.len());
    let (packets, _) = expand(&data);
    for c in test_counters(&packets).values() {
        assert_eq!(gaps(c).0, 0);
    }
}

#[test]
fn deflate_is_refused_and_config_check_says_what_is_done() {
    let dir = tempfile::tempdir().expect("tempdir");
    let check = |text: &str| {
        let cfg = dir.path().join("c.cfg");
        std::fs::write(&cfg, text).expect("write");
        Command::new(recorder_bin())
            .args(["config", "check"])
            .arg(&cfg)
            .output()
            .expect("runs")
    };
    let base = "buffers { size_kb: 1024 } duration_ms: 100 ";
    for deflate in [
        "compression { deflate {} }",
        "compression_type: COMPRESSION_TYPE_DEFLATE",
    ] {
        let out = check(&format!("{base}{deflate}"));
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(err.contains("deflate is not supported"), "{err}");
    }
    let out = check(&format!("{base}compression {{ zstd {{ level: 5 }} }}"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("compresses with zstd level 5"));
    // Deflate is refused even beside zstd (which Perfetto would pick): the
    // config names a codec recorder does not have.
    let out = check(&format!("{base}compression {{ deflate {{}} zstd {{}} }}"));
    assert_eq!(out.status.code(), Some(2));
    let out = check(&format!("{base}compression {{ zstd {{}} }}"));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("zstd level 3"));
    // The settings file beside the config is part of the plan.
    std::fs::write(
        dir.path().join("c.segments.toml"),
        "rotate_size = \"64M\"\nmax_segments = 4\n",
    )
    .expect("write");
    let out = check(base);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("c.segments.toml") && text.contains("4 segments"),
        "{text}"
    );
}

/// The segment files of `dir`, by index: (path, partial).
fn segment_files(dir: &Path) -> BTreeMap<u64, (PathBuf, bool)> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let (base, partial) = match name.strip_suffix(".partial") {
            Some(b) => (b.to_string(), true),
            None => (name.clone(), false),
        };
        let Some(rest) = base.strip_prefix("trace-") else {
            continue;
        };
        let Some(idx) = rest.strip_suffix(".pftrace") else {
            continue;
        };
        m.insert(idx.parse().expect("index"), (e.path(), partial));
    }
    m
}

fn sidecar(path: &Path) -> Option<serde_json::Value> {
    let mut p = path.as_os_str().to_owned();
    p.push(".json");
    let text = std::fs::read(PathBuf::from(p)).ok()?;
    Some(serde_json::from_slice(&text).expect("sidecar is JSON"))
}

fn sha256_hex(data: &[u8]) -> String {
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks one closed segment: its sidecar matches it and it is a complete
/// trace on its own; returns its packets.
fn closed_segment(path: &Path, index: u64) -> Vec<TracePacket> {
    let data = std::fs::read(path).expect("segment");
    let car = sidecar(path).unwrap_or_else(|| panic!("{}: no sidecar", path.display()));
    assert_eq!(car["index"], index);
    assert_eq!(car["bytes"], data.len() as u64);
    assert_eq!(car["sha256"], sha256_hex(&data));
    assert_eq!(
        whole_prefix(&data),
        data.len(),
        "{}: whole packets only",
        path.display()
    );
    let (packets, _) = expand(&data);
    assert_eq!(car["packets"], packets.len() as u64, "{}", path.display());
    packets
}

const STREAMING: &str = "write_into_file: true file_write_period_ms: 100";

fn with_process_stats(duration_ms: u32, test_fields: &str) -> String {
    format!(
        "{}
data_sources {{ config {{ name: \"linux.process_stats\" target_buffer: 0
  process_stats_config {{ scan_all_processes_on_start: true }} }} }}",
        test_config(
            16384,
            "RING_BUFFER",
            &format!("{STREAMING} duration_ms: {duration_ms}"),
            test_fields
        )
    )
}

#[test]
fn each_segment_is_a_complete_trace_and_together_they_lose_nothing() {
    let run = Run::new(&with_process_stats(
        3000,
        "message_count: 0 message_size: 100 seed: 9 max_messages_per_second: 5000",
    ));
    let dir = run.dir.path().join("segs");
    let mut c = run.command_to("io_uring", &dir.join(""));
    c.args(["--compress", "--rotate-size", "48K"]);
    let stderr = ok(&c.output().expect("runs"));
    assert!(stderr.contains("segments: "), "{stderr}");
    let files = segment_files(&dir);
    assert!(files.len() >= 3, "{files:?}\n{stderr}");
    let mut all: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut session = None;
    for (index, (path, partial)) in &files {
        assert!(!partial, "every segment was closed");
        let packets = closed_segment(path, *index);
        // Clock snapshots first (the initial one, then any queued), then
        // what a reader needs, in the service's order.
        let kinds: Vec<String> = packets.iter().map(kind).collect();
        let snapshots = kinds.iter().take_while(|k| *k == "ClockSnapshot").count();
        assert!(snapshots >= 1, "segment {index}: {kinds:?}");
        assert_eq!(
            kinds[snapshots..snapshots + 5],
            [
                "SynchronizationMarker",
                "TraceConfig",
                "TraceUuid",
                "trace_attributes",
                "SystemInfo"
            ],
            "segment {index} opens with what a reader needs"
        );
        assert!(
            packets.iter().any(|p| p.has_process_tree()),
            "segment {index} has its own process tree"
        );
        assert!(
            packets.iter().any(|p| p.has_trace_stats()),
            "segment {index}"
        );
        for (seq, c) in test_counters(&packets) {
            all.entry(seq).or_default().extend(c);
        }
        // Each segment opens on its own in trace processor.
        if let Some(tp) = trace_processor::check(path) {
            assert!(
                tp.query("select count(*) from process where pid != 0")
                    .scalar()
                    .int()
                    > 0,
                "segment {index}: its process tree in trace processor"
            );
        }
        let Some(py) = python_summary(path) else {
            continue;
        };
        assert_eq!(py["attributes"]["recorder.segment_index"], *index);
        let s = py["attributes"]["recorder.session_uuid"].clone();
        assert_eq!(s, sidecar(path).expect("sidecar")["session_uuid"]);
        assert_eq!(*session.get_or_insert(s.clone()), s, "one session");
        assert_eq!(py["first_kinds"][0], "clock_snapshot");
    }
    for (seq, c) in &all {
        assert_eq!(
            gaps(c),
            (0, 0),
            "sequence {seq}: no gap, no repeat across cuts"
        );
        assert_eq!(c.len() as u64, c.last().expect("counters") + 1);
    }
    // inspect DIR reads the set and finds nothing wrong at the cuts.
    let out = Command::new(recorder_bin())
        .args(["inspect", "--json"])
        .arg(&dir)
        .output()
        .expect("inspect");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let set: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(set["segments"].as_array().map(Vec::len), Some(files.len()));
    for cut in set["cuts"].as_array().expect("cuts") {
        assert_eq!(cut["counters_missing"], 0);
        assert_eq!(cut["counters_repeated"], 0);
        assert_eq!(cut["missing_segments"], 0);
    }
}

#[test]
fn max_segments_deletes_the_oldest_never_the_current() {
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        &format!("{STREAMING} duration_ms: 2500"),
        "message_count: 0 message_size: 200 max_messages_per_second: 8000",
    ));
    let dir = run.dir.path().join("ring");
    let mut c = run.command_to("pwritev", &dir.join(""));
    c.args(["--rotate-size", "64K", "--max-segments", "3"]);
    let stderr = ok(&c.output().expect("runs"));
    let files = segment_files(&dir);
    assert_eq!(files.len(), 3, "{files:?}\n{stderr}");
    let indices: Vec<u64> = files.keys().copied().collect();
    let last = *indices.last().expect("some");
    assert!(last >= 5, "{stderr}");
    assert_eq!(indices, vec![last - 2, last - 1, last], "the newest three");
    let mut prev_last = None;
    for (index, (path, _)) in &files {
        let packets = closed_segment(path, *index);
        // A rotation just before the stop may leave the newest segment with
        // only the trace's own packets when the writer thread is starved;
        // every segment cut by size holds data.
        let Some(c) = test_counters(&packets).into_values().next() else {
            assert_eq!(*index, last, "only the newest segment may lack data");
            continue;
        };
        assert_continues(&mut prev_last, &c);
    }
    let json_count = std::fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .count();
    assert_eq!(json_count, 3, "deleted segments take their sidecars along");
    assert!(
        stderr.contains(&format!("{} deleted by the budget", last - 2)),
        "{stderr}"
    );
}

/// SIGKILL mid-segment: the closed segments keep their sidecars, the open
/// one stays a valid trace under its `.partial` name, and what the buffers
/// held unread is saved by the process that outlived the recorder as the
/// next segment (final name, no sidecar): nothing lost, nothing twice.
#[test]
fn sigkill_mid_segment_keeps_closed_segments_and_a_valid_partial() {
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        STREAMING,
        "message_count: 0 message_size: 200 max_messages_per_second: 10000",
    ));
    let dir = run.dir.path().join("killed");
    let mut c = run.command_to("io_uring", &dir.join(""));
    // stderr stays open while the keeper or broker saves: its end says the
    // save is done.
    c.args(["--rotate-size", "100K"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("starts");
    wait_for_path(
        &dir.join("trace-000002.pftrace.json"),
        Duration::from_secs(30),
    );
    // Mid-segment: the fourth holds data past its head.
    wait_for_size(
        &dir.join("trace-000003.pftrace"),
        32 * 1024,
        Duration::from_secs(30),
    );
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("killed");
    let out = child.wait_with_output().expect("reaped");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let files = segment_files(&dir);
    let last = *files.keys().last().expect("some");
    let mut counters = Vec::new();
    for (index, (path, partial)) in &files {
        let packets = if *partial {
            assert_eq!(*index, last - 1, "only the one being written is open");
            assert!(sidecar(path).is_none());
            let data = std::fs::read(path).expect("partial");
            expand(&data).0
        } else if *index == last {
            // The save: a whole trace of its own, named as the next
            // segment, saying the recorder died.
            assert!(stderr.contains("its buffers were saved"), "{stderr}");
            assert!(sidecar(path).is_none());
            let data = std::fs::read(path).expect("saved segment");
            assert_eq!(whole_prefix(&data), data.len());
            trace_processor::check(path);
            expand(&data).0
        } else {
            closed_segment(path, *index)
        };
        counters.extend(test_counters(&packets).into_values().flatten());
    }
    assert!(files.values().filter(|(_, p)| !p).count() >= 4);
    assert_eq!(
        gaps(&counters),
        (0, 0),
        "closed + open + saved: everything, once"
    );
}

#[test]
fn enospc_while_rotating_stops_cleanly_and_keeps_closed_segments() {
    require!(need::root());
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        STREAMING,
        "message_count: 0 message_size: 100 max_messages_per_second: 20000",
    ));
    let mnt = run.dir.path().join("small");
    require!(need::small_tmpfs(&mnt, "1m"));
    let mut c = run.command_to("pwritev", &mnt.join("segs/"));
    c.args(["--rotate-size", "200K"]);
    let out = c.output().expect("runs");
    let files = segment_files(&mnt.join("segs"));
    let mut closed = 0;
    for (index, (path, _)) in &files {
        let data = std::fs::read(path).expect("segment");
        assert_eq!(whole_prefix(&data), data.len(), "segment {index} is valid");
        if let Some(car) = sidecar(path) {
            closed += 1;
            assert_eq!(car["sha256"], sha256_hex(&data), "segment {index}");
        }
    }
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(closed >= 2, "{files:?}");
}

#[test]
fn a_slow_or_failing_hook_does_not_stall_recording() {
    for (hook, want) in [("sleep 60; true", "not run"), ("exit 3", "failed")] {
        let run = Run::new(&test_config(
            16384,
            "RING_BUFFER",
            &format!("{STREAMING} duration_ms: 2000"),
            "message_count: 0 message_size: 100 max_messages_per_second: 5000",
        ));
        let dir = run.dir.path().join("hooked");
        let mut c = run.command_to("pwritev", &dir.join(""));
        c.args(["--rotate-period", "300ms", "--on-segment-closed", hook]);
        let t0 = Instant::now();
        let stderr = ok(&c.output().expect("runs"));
        // Queued commands get ten seconds at the end; a stuck one is left behind.
        assert!(t0.elapsed() < Duration::from_secs(40), "{:?}", t0.elapsed());
        assert!(stderr.contains(want), "{stderr}");
        let files = segment_files(&dir);
        assert!(files.len() >= 4, "{files:?}");
        let mut counters = Vec::new();
        for (index, (path, _)) in &files {
            counters.extend(
                test_counters(&closed_segment(path, *index))
                    .into_values()
                    .flatten(),
            );
        }
        assert_eq!(gaps(&counters), (0, 0), "{hook}: nothing lost while it ran");
        assert!(counters.len() > 5000, "{}", counters.len());
    }
}

#[test]
fn the_hook_gets_each_path_and_the_settings_file_works() {
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        &format!("{STREAMING} duration_ms: 1500"),
        "message_count: 0 message_size: 100 max_messages_per_second: 2000",
    ));
    let log = run.dir.path().join("shipped.log");
    std::fs::write(
        run.config.with_extension("segments.toml"),
        format!(
            "rotate_period = \"400ms\"\non_segment_closed = \"sh -c 'echo $0 $RECORDER_SEGMENT_NAME $RECORDER_SEGMENT_INDEX >> {}'\"\n",
            log.display()
        ),
    )
    .expect("write");
    let dir = run.dir.path().join("shipped");
    ok(&run
        .command_to("pwritev", &dir.join(""))
        .output()
        .expect("runs"));
    let files = segment_files(&dir);
    let text = std::fs::read_to_string(&log).expect("the hook ran");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), files.len(), "{text}");
    for (line, (index, (path, _))) in lines.iter().zip(&files) {
        // $1 is the segment's link in the runner's own directory, under
        // the segment's name.
        let name = path.file_name().expect("name").to_string_lossy();
        let (link, rest) = line.split_once(' ').expect("words");
        let link = Path::new(link);
        assert_eq!(link.file_name(), path.file_name(), "{line}");
        let parent = link.parent().expect("parent");
        assert_eq!(parent.parent(), Some(dir.as_path()), "{line}");
        assert!(
            parent
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".recorder-hook.")),
            "{line}"
        );
        assert_eq!(rest, format!("{name} {index}"));
    }
    // The links and their directory are gone with the session.
    let hidden: Vec<_> = std::fs::read_dir(&dir)
        .expect("ls")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
}

/// Runs the binary on ftrace config `cfg` into a segment directory with
/// `args`, calling `during` while it records; `None` when the kernel parts
/// are missing (skipped). Returns the temporary directory (kept alive), the
/// segment directory and the run's output.
fn ftrace_segments(
    cfg: &str,
    args: &[&str],
    during: impl FnOnce(),
) -> Option<(tempfile::TempDir, PathBuf, Output)> {
    let tracefs = Path::new("/sys/kernel/tracing/events/sched/sched_switch");
    require!(need::root().or_else(|| need::present(tracefs.exists(), "no tracefs")));
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("ftrace.cfg");
    std::fs::write(&cfg_path, cfg).expect("cfg");
    let out_dir = dir.path().join("segs");
    let child = Command::new(recorder_bin())
        .arg("--config")
        .arg(&cfg_path)
        .arg("-o")
        .arg(out_dir.join(""))
        .args(args)
        .env("RECORDER_RUNTIME_DIR", dir.path().join("run"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    during();
    let out = child.wait_with_output().expect("waits");
    Some((dir, out_dir, out))
}

#[test]
fn ftrace_segments_each_resolve_their_threads() {
    let Some((_dir, out_dir, out)) = ftrace_segments(
        &crate::harness::ftrace::sched_stream_config(3000),
        &["--compress", "--rotate-period", "700ms"],
        || {},
    ) else {
        return;
    };
    ok(&out);
    let files = segment_files(&out_dir);
    assert!(files.len() >= 3, "{files:?}");
    for (index, (path, _)) in &files {
        let packets = closed_segment(path, *index);
        // Every pid a sched event names has a name in this segment: from the
        // event itself (compact_sched interns next/waking comms per bundle)
        // or the process tree written into this segment.
        let mut named = std::collections::BTreeSet::new();
        let mut used = std::collections::BTreeSet::new();
        for p in &packets {
            if p.has_process_tree() {
                for t in &p.process_tree().threads {
                    named.insert(t.tid());
                }
                for pr in &p.process_tree().processes {
                    named.insert(pr.pid());
                }
            }
            if p.has_ftrace_events() {
                let b = p.ftrace_events();
                if let Some(cs) = b.compact_sched.as_ref() {
                    let n = cs.intern_table.len() as u32;
                    for (pid, comm) in cs.switch_next_pid.iter().zip(&cs.switch_next_comm_index) {
                        used.insert(*pid);
                        if *comm < n {
                            named.insert(*pid);
                        }
                    }
                    for (pid, comm) in cs.waking_pid.iter().zip(&cs.waking_comm_index) {
                        used.insert(*pid);
                        if *comm < n {
                            named.insert(*pid);
                        }
                    }
                }
            }
        }
        assert!(!used.is_empty(), "segment {index} has sched events");
        let unnamed: Vec<&i32> = used
            .iter()
            .filter(|p| **p != 0 && !named.contains(p))
            .collect();
        assert!(unnamed.is_empty(), "segment {index}: {unnamed:?}");
        assert!(
            packets.iter().any(|p| p.has_process_tree()),
            "segment {index}"
        );
        if let Some(tp) = trace_processor::check(path) {
            let unnamed = tp.query(
                "select count(*) from sched join thread using(utid) \
                 where utid != 0 and thread.name is null",
            );
            assert_eq!(
                unnamed.scalar().int(),
                0,
                "segment {index}: unnamed threads"
            );
        }
    }
}

#[test]
fn impossible_segment_settings_are_usage_errors() {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 100",
        "message_count: 1",
    ));
    for (args, out, says) in [
        (
            &["--max-segments", "3"][..],
            "t.pftrace",
            "--max-segments needs",
        ),
        (&["--rotate-size", "1M"], "-", "not stdout"),
        (
            &["--rotate-size", "1M", "--max-disk", "1M"],
            "d/",
            "at most half",
        ),
        (
            &["--rotate-size", "1M", "--max-segments", "1"],
            "d/",
            "at least 2",
        ),
        (&["--rotate-size", "lots"], "d/", "not a size"),
    ] {
        let out_path = if out == "-" {
            PathBuf::from("-")
        } else {
            run.dir.path().join(out)
        };
        let o = run
            .command_to("pwritev", &out_path)
            .args(args)
            .output()
            .expect("runs");
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn a_stop_trigger_ends_an_on_disk_flight_recorder_keeping_the_newest_segments() {
    // A STOP_TRACING flight recorder that does not stream by itself: with
    // segments it streams, the budget keeps the newest, the trigger ends it.
    let run = Run::new(
        r#"
buffers { size_kb: 16384 fill_policy: RING_BUFFER }
data_sources { config { name: "for_testing" target_buffer: 0
  for_testing { message_count: 0 message_size: 200 max_messages_per_second: 8000 } } }
trigger_config {
  trigger_mode: STOP_TRACING
  trigger_timeout_ms: 60000
  triggers { name: "crash" stop_delay_ms: 200 }
}
"#,
    );
    let dir = run.dir.path().join("flight");
    let mut c = run.command_to("pwritev", &dir.join(""));
    c.args(["--rotate-size", "256K", "--max-segments", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("starts");
    // Segments appear before any trigger (the default 5 s pass period).
    wait_for_path(
        &dir.join("trace-000004.pftrace.json"),
        Duration::from_secs(60),
    );
    let fire = std::process::Command::new(recorder_bin())
        .args(["trigger", "crash"])
        .env("RECORDER_RUNTIME_DIR", runtime(&run))
        .output()
        .expect("trigger runs");
    assert!(
        fire.status.success(),
        "{}",
        String::from_utf8_lossy(&fire.stderr)
    );
    let out = child.wait_with_output().expect("exits");
    let stderr = ok(&out);
    assert!(stderr.contains("stop trigger \"crash\""), "{stderr}");
    let files = segment_files(&dir);
    assert_eq!(
        files.len(),
        3,
        "the budget keeps three: {files:?}\n{stderr}"
    );
    let mut prev_last = None;
    let mut triggers = 0;
    for (index, (path, partial)) in &files {
        assert!(!partial, "every kept segment is closed");
        let packets = closed_segment(path, *index);
        triggers += packets.iter().filter(|p| p.has_trigger()).count();
        let c = test_counters(&packets)
            .into_values()
            .next()
            .expect("counters");
        assert_continues(&mut prev_last, &c);
    }
    assert_eq!(triggers, 1, "the trigger is in the newest segments");
}

/// The kernel loses events while segments rotate (one page per CPU, drained
/// rarely, under a pipe ping-pong): the sidecars together account for exactly the
/// loss the trace's own ftrace stats report, segment by segment.
#[test]
fn sidecars_account_for_the_events_the_kernel_lost() {
    // Two processes bouncing a byte through pipes for two seconds: far more
    // switches than one page per CPU holds between wake-ups.
    let pingpong = || {
        let script = "import os, time
r1, w1 = os.pipe(); r2, w2 = os.pipe()
end = time.monotonic() + 2
if os.fork() == 0:
    while os.read(r1, 1) == b'x':
        os.write(w2, b'x')
    os._exit(0)
while time.monotonic() < end:
    os.write(w1, b'x'); os.read(r2, 1)
os.write(w1, b'q')
";
        let status = Command::new("python3")
            .args(["-c", script])
            .status()
            .expect("python3 runs");
        assert!(status.success());
    };
    let Some((_dir, out_dir, out)) = ftrace_segments(
        r#"
buffers { size_kb: 16384 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" target_buffer: 0 ftrace_config {
  ftrace_events: "sched/sched_switch" ftrace_events: "sched/sched_waking"
  ftrace_events: "sched/sched_process_fork" ftrace_events: "sched/sched_process_exec"
  buffer_size_kb: 4 drain_period_ms: 1500 drain_buffer_percent: 100 } } }
write_into_file: true file_write_period_ms: 200 duration_ms: 2500
"#,
        &["--rotate-period", "600ms"],
        pingpong,
    ) else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files = segment_files(&out_dir);
    assert!(files.len() >= 3, "{files:?}");
    let mut per_segment = Vec::new();
    let (mut start, mut end) = (None, None);
    for (index, (path, _)) in &files {
        let packets = closed_segment(path, *index);
        let car = sidecar(path).expect("sidecar");
        let lost = car["loss"]["events_lost_upstream"]
            .as_u64()
            .expect("events_lost_upstream");
        if lost > 0 {
            let why = car["loss"]["why"].to_string();
            assert!(
                why.contains("linux.ftrace") && why.contains("buffer_size_kb"),
                "{why}"
            );
        }
        per_segment.push(lost);
        trace_processor::check(path);
        for p in packets.iter().filter(|p| p.has_ftrace_stats()) {
            let st = p.ftrace_stats();
            let total: u64 = st
                .cpu_stats
                .iter()
                .map(|c| c.overrun() + c.dropped_events())
                .sum();
            match st.phase() {
                perfetto_protos::ftrace_stats::ftrace_stats::Phase::START_OF_TRACE => {
                    start.get_or_insert(total);
                }
                perfetto_protos::ftrace_stats::ftrace_stats::Phase::END_OF_TRACE => {
                    end = Some(total)
                }
                _ => {}
            }
        }
    }
    let (start, end) = (start.expect("start stats"), end.expect("end stats"));
    assert!(
        end > start,
        "the kernel lost nothing: the test needs a loss"
    );
    assert_eq!(
        per_segment.iter().sum::<u64>(),
        end - start,
        "per segment: {per_segment:?}"
    );
}

/// The issue's hooks in one rotating session: each segment's command does
/// something else (see the script).
#[test]
fn hooks_run_bounded_in_their_own_group_and_the_summary_counts_them_exactly() {
    let run = Run::new(&test_config(
        16384,
        "RING_BUFFER",
        &format!("{STREAMING} duration_ms: 3000"),
        "message_count: 0 message_size: 100 max_messages_per_second: 3000",
    ));
    let note = run.dir.path().join("notes");
    let script = run.dir.path().join("hook.sh");
    // Segment 0: leaves a child holding the output pipe. 1: writes 800 MB
    // to stderr, noting the recorder's peak memory before and after.
    // 2: deletes its segment. 3: outlives its timeout. Others: nothing.
    std::fs::write(
        &script,
        format!(
            r#"notes={notes}
rec=$PPID
while [ "$(cat /proc/$rec/comm)" != recorder ]; do rec=$(awk '/^PPid/ {{print $2}}' /proc/$rec/status); done
case $RECORDER_SEGMENT_INDEX in
0) f() {{ (sleep 300 & echo "bg $!" >> $notes); }}; f ;;
1) echo "hwm0 $(awk '/^VmHWM/ {{print $2}}' /proc/$rec/status)" >> $notes
   head -c 800000000 /dev/zero >&2
   echo "hwm1 $(awk '/^VmHWM/ {{print $2}}' /proc/$rec/status)" >> $notes ;;
2) rm "$1" ;;
3) sleep 300 & echo "slow $!" >> $notes; wait ;;
esac
"#,
            notes = note.display()
        ),
    )
    .expect("script");
    std::fs::write(
        run.config.with_extension("segments.toml"),
        "hook_timeout = \"1s\"\n",
    )
    .expect("settings");
    let dir = run.dir.path().join("hooked");
    let mut c = run.command_to("pwritev", &dir.join(""));
    c.args(["--rotate-period", "300ms", "--on-segment-closed"])
        .arg(format!("sh {}", script.display()));
    let t0 = Instant::now();
    let out = c.output().expect("runs");
    let took = t0.elapsed();
    let notes = std::fs::read_to_string(&note).unwrap_or_default();
    let pid_of = |tag: &str| -> Option<i32> {
        notes
            .lines()
            .find_map(|l| l.strip_prefix(tag)?.trim().parse().ok())
    };
    let bg = pid_of("bg ");
    let bg_alive = bg.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
    if let Some(p) = bg.and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
    let stderr = ok(&out);
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(bg_alive, "segment 0's command left its child: {notes}");
    let slow = pid_of("slow ").expect("segment 3's command ran");
    let slow_stat = std::fs::read_to_string(format!("/proc/{slow}/stat")).unwrap_or_default();
    assert!(
        slow_stat.is_empty() || slow_stat.contains(") Z "),
        "the timed-out command's group was killed: {slow_stat}"
    );
    let (hwm0, hwm1) = (
        pid_of("hwm0 ").expect("hwm before"),
        pid_of("hwm1 ").expect("hwm after"),
    );
    assert!(
        hwm1 - hwm0 < 32 * 1024,
        "800 MB of output grew the recorder from {hwm0} to {hwm1} kB"
    );

    let files = segment_files(&dir);
    assert!(
        !files.contains_key(&2),
        "segment 2 was deleted by its command"
    );
    let total = files.keys().max().expect("segments") + 1;
    assert_eq!(files.len() as u64, total - 1, "{files:?}");
    let line = stderr
        .lines()
        .find(|l| l.contains("--on-segment-closed:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(
        line.trim(),
        format!(
            "--on-segment-closed: {total} ran, 1 failed (1 timed out), 0 not run; 1 segments deleted or moved by it"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("({} kept,", total - 1)),
        "a deleted segment is not kept: {stderr}"
    );
    for (index, (path, _)) in &files {
        closed_segment(path, *index);
    }
}

/// A 1 MiB tmpfs at `dir/small`, or None (skipped) when it cannot be mounted.
fn small_disk(dir: &Path) -> Option<PathBuf> {
    let mnt = dir.join("small");
    require!(need::small_tmpfs(&mnt, "1m"));
    Some(mnt)
}

/// A full disk under `--compress`, to one file and to segments, with each
/// sink: every file ends on a whole (compressed) packet, decodes, and holds
/// no gap; a segment closed by the failed write is either `.partial` or has
/// a sidecar that matches it.
#[test]
fn a_full_disk_with_compression_ends_on_a_whole_packet() {
    require!(need::root());
    for io in sinks() {
        for segments in [false, true] {
            let run = Run::new(&test_config(
                16384,
                "RING_BUFFER",
                STREAMING,
                // Random payloads: they compress poorly, so the disk fills.
                "message_count: 0 message_size: 600 max_messages_per_second: 20000 seed: 7",
            ));
            let Some(mnt) = small_disk(run.dir.path()) else {
                return;
            };
            let out_path = if segments {
                mnt.join("segs/")
            } else {
                mnt.join("trace.pftrace")
            };
            let mut c = run.command_to(io, &out_path);
            c.arg("--compress=1");
            if segments {
                c.args(["--rotate-size", "300K"]);
            }
            let out = c.output().expect("runs");
            let files: Vec<(PathBuf, bool)> = if segments {
                segment_files(&mnt.join("segs")).into_values().collect()
            } else {
                vec![(out_path.clone(), false)]
            };
            let mut kept = Vec::new();
            for (path, partial) in &files {
                let data = std::fs::read(path).expect("file");
                kept.push((path.clone(), *partial, data, sidecar(path)));
            }
            let _ = Command::new("umount").arg("-l").arg(&mnt).status();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{io}: {stderr}");
            assert!(stderr.contains("No space left"), "{io}: {stderr}");
            assert!(!kept.is_empty(), "{io} {segments}");
            let partials = kept.iter().filter(|k| k.1).count();
            assert!(
                partials <= 1,
                "{io}: only the last segment may stay .partial"
            );
            for (path, partial, data, car) in &kept {
                let what = format!("{io} segments={segments} {}", path.display());
                assert!(!data.is_empty(), "{what}");
                assert_eq!(
                    whole_prefix(data),
                    data.len(),
                    "{what}: ends on a whole packet"
                );
                let (packets, sizes) = expand(data);
                assert!(!sizes.is_empty(), "{what}: compressed");
                let counters: Vec<u64> = test_counters(&packets).into_values().flatten().collect();
                assert_eq!(gaps(&counters).0, 0, "{what}");
                if segments && !partial {
                    let car = car.as_ref().unwrap_or_else(|| panic!("{what}: no sidecar"));
                    assert_eq!(car["sha256"], sha256_hex(data), "{what}");
                }
                let copy = run.dir.path().join("kept.pftrace");
                std::fs::write(&copy, data).expect("copy");
                trace_processor::check(&copy);
            }
        }
    }
}
