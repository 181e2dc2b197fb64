//! Light mode: `recorder -o OUT -t 3s -b 8mb sched/sched_switch sched`, as
//! Perfetto's `perfetto` client takes it. The config it builds lands in the
//! trace's `trace_config`; the events it enables are read from our tracefs
//! instance while it records, and compared with what Perfetto's own
//! traced_probes enables for the same words (tracebox v58.2), through
//! traced and through `recorder serve`. Every trace goes through the
//! independent decoders and trace processor.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::harness::ftrace::{KERNEL, ping_pong};
use crate::harness::*;
use perfetto_protos::trace_config::TraceConfig;
use perfetto_protos::trace_packet::TracePacket;

const TRACEFS: &str = "/sys/kernel/tracing";

fn recorder(args: &[&str]) -> Command {
    let mut c = Command::new(recorder_bin());
    c.args(args).stdin(Stdio::null());
    c
}

fn run(args: &[&str]) -> Output {
    recorder(args).output().expect("recorder")
}

/// The `trace_config` packet's config.
fn trace_config(packets: &[TracePacket]) -> TraceConfig {
    let configs: Vec<&TraceConfig> = packets
        .iter()
        .filter(|p| p.has_trace_config())
        .map(|p| p.trace_config())
        .collect();
    assert_eq!(configs.len(), 1, "one trace_config packet");
    configs[0].clone()
}

/// The ftrace events and atrace categories a config asks for, and its data
/// sources' names (sorted).
fn asks(c: &TraceConfig) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let mut events = BTreeSet::new();
    let mut categories = BTreeSet::new();
    let mut sources = BTreeSet::new();
    for ds in &c.data_sources {
        sources.insert(ds.config.name().to_string());
        if let Some(f) = ds.config.ftrace_config.as_ref() {
            events.extend(f.ftrace_events.iter().cloned());
            categories.extend(f.atrace_categories.iter().cloned());
        }
    }
    (events, categories, sources)
}

/// How many of each ftrace event a trace holds, typed or compact.
fn event_counts(packets: &[TracePacket]) -> (usize, usize) {
    let (mut switches, mut wakings) = (0, 0);
    for p in packets.iter().filter(|p| p.has_ftrace_events()) {
        let b = p.ftrace_events();
        switches += b.event.iter().filter(|e| e.has_sched_switch()).count()
            + b.compact_sched.switch_timestamp.len();
        wakings += b.event.iter().filter(|e| e.has_sched_waking()).count()
            + b.compact_sched.waking_timestamp.len();
    }
    (switches, wakings)
}

/// Scheduling load (a ping-pong between two threads) until dropped.
struct Load(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Load {
    fn start() -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let h = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                ping_pong(200);
            }
        });
        Load(stop, Some(h))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

/// The events enabled in the tracefs directory `dir` (its `set_event`, as
/// `group/name`), once it is recording: `tracing_on` is 1 and the set is
/// not empty and the same on two reads around `tracing_on`. Waits for it
/// (while `alive` holds) up to 30 s.
fn enabled_while_recording(dir: &Path, mut alive: impl FnMut() -> bool) -> BTreeSet<String> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let set = |text: String| -> BTreeSet<String> {
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.replacen(':', "/", 1))
            .collect()
    };
    wait_until(
        format_args!("{} recording", dir.display()),
        Duration::from_secs(30),
        || {
            let before = set(read("set_event"));
            let on = read("tracing_on").trim() == "1";
            let after = set(read("set_event"));
            assert!(alive(), "the session ended before it was seen recording");
            (on && !before.is_empty() && before == after).then_some(after)
        },
    )
}

/// Whether `child` is still running.
fn running(child: &mut Child) -> bool {
    matches!(child.try_wait(), Ok(None))
}

/// Our session's tracefs instance, `recorder-PID` (PID: the process that
/// prepares it), once it exists.
fn instance_of(pid: u32, mut alive: impl FnMut() -> bool) -> PathBuf {
    let dir = Path::new(TRACEFS)
        .join("instances")
        .join(format!("recorder-{pid}"));
    wait_for(
        format_args!("{}", dir.display()),
        Duration::from_secs(30),
        || {
            assert!(alive(), "the session ended before its instance was seen");
            dir.join("set_event").exists()
        },
    );
    dir
}

/// Runs light mode with `words`, returning the trace and the events our
/// instance had enabled while recording.
fn record_light(out: &Path, words: &[&str]) -> (Vec<TracePacket>, BTreeSet<String>) {
    let _load = Load::start();
    let mut child = recorder(&["-o", out.to_str().expect("utf-8")])
        .args(words)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder");
    let pid = child.id();
    let dir = instance_of(pid, || running(&mut child));
    let enabled = enabled_while_recording(&dir, || running(&mut child));
    let o = wait_within(child, Duration::from_secs(60));
    assert!(o.status.success(), "{}", stderr(&o));
    let packets = decode(&std::fs::read(out).expect("trace"));
    (packets, enabled)
}

#[test]
fn light_mode_records_the_named_events_for_its_time_in_its_buffer() {
    require!(need::kernel_tracing());
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("light.pftrace");
    let words = [
        "-t",
        "3s",
        "-b",
        "8mb",
        "sched/sched_switch",
        "sched/sched_waking",
    ];
    let (packets, enabled) = record_light(&out, &words);
    let c = trace_config(&packets);
    assert_eq!(c.duration_ms(), 3000);
    assert_eq!(c.buffers.len(), 1);
    assert_eq!(c.buffers[0].size_kb(), 8192);
    let (events, categories, sources) = asks(&c);
    assert_eq!(
        events,
        BTreeSet::from(["sched/sched_switch".into(), "sched/sched_waking".into()])
    );
    assert!(categories.is_empty());
    assert_eq!(
        sources,
        BTreeSet::from([
            "linux.ftrace".into(),
            "linux.process_stats".into(),
            "linux.system_info".into()
        ])
    );
    assert_eq!(enabled, events, "the instance's set_event");
    let (switches, wakings) = event_counts(&packets);
    assert!(
        switches > 0 && wakings > 0,
        "{switches} sched_switch, {wakings} sched_waking"
    );
    // Process data beside the events, as Perfetto's light mode records it.
    assert!(packets.iter().any(|p| p.has_process_tree()), "process_tree");
    if let Some(s) = python_summary(&out) {
        let kinds = &s["kinds"];
        assert_eq!(kinds["trace_config"], 1, "{s}");
        assert!(kinds["ftrace_events"].as_u64().unwrap_or(0) > 0, "{s}");
    }
    if let Some(tp) = trace_processor::check(&out) {
        assert!(tp.query("select count(*) from sched").scalar().int() > 0);
    }
}

#[test]
fn categories_enable_the_kernel_events_perfetto_adds_for_them() {
    require!(need::kernel_tracing());
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("categories.pftrace");
    let (packets, enabled) = record_light(&out, &["-t", "2s", "sched", "freq", "idle"]);
    let c = trace_config(&packets);
    assert_eq!(c.duration_ms(), 2000);
    assert_eq!(c.buffers[0].size_kb(), 32 * 1024);
    let (events, categories, _) = asks(&c);
    assert!(events.is_empty());
    assert_eq!(
        categories,
        BTreeSet::from(["freq".into(), "idle".into(), "sched".into()])
    );
    // Every event of the three categories this kernel has, and no other.
    let kernel: BTreeSet<String> =
        recorder::config::categories::events_of(["sched", "freq", "idle"])
            .into_iter()
            .filter(|e| {
                Path::new(TRACEFS)
                    .join("events")
                    .join(e)
                    .join("format")
                    .is_file()
            })
            .map(str::to_string)
            .collect();
    assert_eq!(enabled, kernel);
    for e in [
        "sched/sched_switch",
        "sched/sched_waking",
        "power/cpu_frequency",
        "power/cpu_idle",
    ] {
        if Path::new(TRACEFS).join("events").join(e).is_dir() {
            assert!(enabled.contains(e), "{e}: {enabled:?}");
        }
    }
    let (switches, _) = event_counts(&packets);
    assert!(switches > 0, "sched_switch recorded");
    // A category's event the kernel lacks is not unknown.
    for p in packets.iter().filter(|p| p.has_ftrace_stats()) {
        assert!(
            p.ftrace_stats().unknown_ftrace_events.is_empty(),
            "{:?}",
            p.ftrace_stats().unknown_ftrace_events
        );
    }
    if let Some(tp) = trace_processor::check(&out) {
        assert!(tp.query("select count(*) from sched").scalar().int() > 0);
    }
}

#[test]
fn unknown_words_are_refused_with_the_nearest_category_event_or_command() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("never.pftrace");
    let o = out.to_str().expect("utf-8");
    for (words, want) in [
        (&["shced"][..], "did you mean \"sched\"?"),
        (&["sched_switch"], "did you mean \"sched/sched_switch\"?"),
        (&["inspekt"], "did you mean \"inspect\"?"),
        (&["sched/../x"], "is not an event"),
        (&["hyp"], "pKVM"),
    ] {
        let r = recorder(&["-o", o, "-t", "1s"])
            .args(words)
            .output()
            .expect("recorder");
        assert_eq!(r.status.code(), Some(2), "{words:?}: {}", stderr(&r));
        assert!(stderr(&r).contains(want), "{words:?}: {}", stderr(&r));
        assert!(!out.exists(), "{words:?}: nothing written");
    }
    // An event this kernel lacks, where tracefs can be read.
    if need::root().is_none() && Path::new(TRACEFS).join("events/sched").is_dir() {
        let r = run(&["-o", o, "sched/sched_swtich"]);
        assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
        assert!(
            stderr(&r).contains("did you mean \"sched/sched_switch\"?"),
            "{}",
            stderr(&r)
        );
    }
    // Light mode and a config do not mix; bad units are usage errors.
    for args in [
        &["-c", "x.cfg", "-t", "1s"][..],
        &["-c", "x.cfg", "sched"],
        &["-t", "10", "-o", o],
        &["-b", "1tb", "-o", o],
        &["-t", "1s", "query"],
    ] {
        let r = run(args);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", stderr(&r));
    }
}

#[test]
fn dry_run_prints_a_config_that_runs_and_its_plan() {
    let dir = tempfile::tempdir().expect("tmp");
    let o = run(&[
        "--dry-run",
        "-t",
        "3s",
        "-b",
        "8mb",
        "-s",
        "100mb",
        "sched/sched_switch",
        "sched",
        "disk",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).expect("utf-8");
    for want in [
        "duration_ms: 3000",
        "size_kb: 8192",
        "write_into_file: true",
        "max_file_size_bytes: 104857600",
        "ftrace_events: \"sched/sched_switch\"",
        "atrace_categories: \"sched\"",
        "atrace_categories: \"disk\"",
        "diskstat_period_ms: 1000",
        "name: \"linux.process_stats\"",
        "name: \"linux.system_info\"",
        // The plan, as config check prints it, in comments.
        "# light mode: valid config",
        "#   #0: 8 MiB RING_BUFFER",
        "#   records for 3 s",
    ] {
        assert!(text.contains(want), "{want}:\n{text}");
    }
    // What it prints is a config recorder runs as it is.
    let cfg = dir.path().join("light.cfg");
    std::fs::write(&cfg, &text).expect("write");
    let check = run(&["config", "check", cfg.to_str().expect("utf-8")]);
    assert!(check.status.success(), "{}", stderr(&check));
    // --dry-run of a config file prints it the same way.
    let again = run(&["--dry-run", "-c", cfg.to_str().expect("utf-8")]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("duration_ms: 3000"));
}

#[test]
fn background_and_compression_work_with_light_mode() {
    // No events: process data and system info alone need no root.
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("bg.pftrace");
    let o = run(&[
        "-d",
        "--compress",
        "-t",
        "1s",
        "-b",
        "1mb",
        "-o",
        out.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let pid: i32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("the pid");
    wait_for(
        "the background session's end",
        Duration::from_secs(30),
        || !Path::new(&format!("/proc/{pid}")).exists(),
    );
    let (packets, compressed) = expand(&std::fs::read(&out).expect("trace"));
    assert!(!compressed.is_empty(), "compressed packets");
    assert_eq!(trace_config(&packets).duration_ms(), 1000);
}

/// With `-s` the session streams (a write pass every 5 s, at wall-clock
/// multiples), so a 6 s session makes at least two passes, and a segment
/// is cut after a pass once it is 1 s old.
#[test]
fn light_mode_streams_into_segments() {
    require!(need::kernel_tracing());
    let dir = tempfile::tempdir().expect("tmp");
    let seg = dir.path().join("segments");
    let _load = Load::start();
    let o = run(&[
        "-t",
        "6s",
        "-b",
        "4mb",
        "-s",
        "100mb",
        "--rotate-period",
        "1s",
        "-o",
        &format!("{}/", seg.display()),
        "sched/sched_switch",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&seg)
        .expect("segments")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pftrace"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 2, "{segments:?}\n{}", stderr(&o));
    let mut switches = 0;
    for s in &segments {
        let packets = decode(&std::fs::read(s).expect("segment"));
        let c = trace_config(&packets);
        assert_eq!(c.duration_ms(), 6000, "{}", s.display());
        assert_eq!(c.max_file_size_bytes(), 100 * 1024 * 1024);
        assert!(c.write_into_file());
        switches += event_counts(&packets).0;
    }
    assert!(switches > 0, "sched_switch in the segments");
}

/// Perfetto's own `perfetto` client, given the same words: the event set
/// traced_probes enables through traced (read from the top-level instance
/// while it records) is the one recorder enables, alone and as `recorder
/// serve` for that same client; the trace_configs ask alike.
#[test]
fn perfettos_client_in_light_mode_enables_the_same_events_as_recorder() {
    require!(need::tracebox(), need::kernel_tracing());
    // The top-level instance is shared with the other real-kernel tests.
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let words = ["-t", "2s", "sched", "freq", "idle", "sched/sched_switch"];
    let top = Path::new(TRACEFS);
    wait_for(
        "the top-level instance free of someone else's events",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(top.join("set_event"))
                .unwrap_or_default()
                .trim()
                .is_empty()
        },
    );
    let dir = tempfile::tempdir().expect("tmp");
    let _load = Load::start();
    let (theirs, their_config) = {
        let traced = Traced::start(dir.path());
        let out = dir.path().join("traced.pftrace");
        let mut client = Command::new(need::tracebox_path().expect("tracebox"))
            .arg("perfetto")
            .arg("-o")
            .arg(&out)
            .args(words)
            .env(
                "PERFETTO_CONSUMER_SOCK_NAME",
                dir.path().join("consumer.sock"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("perfetto");
        let enabled = enabled_while_recording(top, || running(&mut client));
        let o = wait_within(client, Duration::from_secs(60));
        assert!(o.status.success(), "perfetto: {}", stderr(&o));
        drop(traced);
        trace_processor::check(&out);
        (
            enabled,
            trace_config(&decode(&std::fs::read(&out).expect("trace"))),
        )
    };
    let out = dir.path().join("recorder.pftrace");
    let (packets, ours) = record_light(&out, &words);
    let our_config = trace_config(&packets);
    eprintln!("traced: {theirs:?}\nrecorder: {ours:?}");
    assert_eq!(ours, theirs, "the events enabled");
    assert_eq!(
        asks(&our_config),
        asks(&their_config),
        "what the configs ask"
    );
    assert_eq!(our_config.duration_ms(), their_config.duration_ms());
    assert_eq!(
        our_config.buffers[0].size_kb(),
        their_config.buffers[0].size_kb()
    );
    assert_eq!(our_config.flush_period_ms(), their_config.flush_period_ms());

    // The same client against `recorder serve`: its broker's instance.
    let serve = Serve::start();
    let broker = serve.broker();
    let out = serve.path("light.pftrace");
    let mut client = serve
        .perfetto(None, &["-o", out.to_str().expect("utf-8")])
        .args(words)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perfetto");
    let instance = instance_of(broker, || running(&mut client));
    let served = enabled_while_recording(&instance, || running(&mut client));
    let o = wait_within(client, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "perfetto: {}\n{}",
        stderr(&o),
        serve.log()
    );
    assert_eq!(served, theirs, "the events enabled by serve");
    let packets = decode(&std::fs::read(&out).expect("trace"));
    assert_eq!(asks(&trace_config(&packets)), asks(&their_config));
    trace_processor::check(&out);
}
