//! linux.ftrace options on a real kernel: syscall filters, the tids to
//! trace, clocks, a preserved buffer, event choices and buffer bounds,
//! function graph and kprobes, incremental state, and sub-buffer sizes.

use std::collections::BTreeSet;
use std::time::Duration;

use perfetto_protos::ftrace_event::FtraceEvent;
use perfetto_protos::trace_packet::TracePacket;

use recorder::config::spec::{ByteSize, FtraceSpec};
use recorder::sources::ftrace::encode::{BundleEncoder, CpuCursor};
use recorder::sources::ftrace::tracefs::Tracefs;
use recorder::sources::ftrace::{
    FtraceOptions, FtraceSource, PrintFilter, SubbufSize, VecOutput, subbuf,
};

use crate::harness::ftrace::{
    KERNEL, SEQ, bundles, decode, encode, events, fixture_table, ping_pong, ping_pong_with, raw,
    subbuf_refused,
};
use crate::harness::*;

/// Records `spec` on the real kernel while `load` runs (given the instance
/// directory); returns the decoded packets and the summary.
pub(crate) fn record_spec(
    spec: FtraceSpec,
    load: impl FnOnce(&Tracefs),
) -> (Vec<TracePacket>, recorder::sources::ftrace::FtraceSummary) {
    let opts = FtraceOptions {
        spec,
        sequence_id: SEQ,
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    src.start().expect("start");
    let inst = src.tracefs_dir().expect("dir").clone();
    load(&inst);
    src.flush().expect("flush");
    let summary = src.stop().expect("stop");
    let out = src.take_output().expect("output");
    (decode(&out.bytes), summary)
}

/// `syscall_events`: raw_syscalls filtered in the kernel to the named
/// syscalls' numbers on this architecture; only those reach the trace, as
/// typed sys_enter/sys_exit events.
#[test]
fn real_kernel_syscall_events_are_filtered_in_the_kernel() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let nr = recorder::config::validate::syscall_number("sys_getppid").expect("getppid");
    let spec = FtraceSpec {
        syscall_events: vec![recorder::config::spec::Syscall {
            name: "sys_getppid".into(),
            number: nr,
        }],
        drain_period: Duration::from_millis(20),
        ..Default::default()
    };
    let me = rustix::thread::gettid().as_raw_nonzero().get();
    let (p, summary) = record_spec(spec, |inst| {
        assert_eq!(
            inst.read("events/raw_syscalls/sys_enter/filter")
                .expect("filter")
                .trim(),
            format!("id == {nr}")
        );
        for _ in 0..50 {
            let _ = rustix::process::getppid();
            // Other syscalls in between must not show.
            let _ = rustix::process::getpid();
            // Paced: the calls spread over a few milliseconds of reading.
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    assert!(summary.unknown_events.is_empty());
    let ev = events(&p);
    let enters: Vec<_> = ev.iter().filter(|e| e.has_sys_enter()).collect();
    let exits: Vec<_> = ev.iter().filter(|e| e.has_sys_exit()).collect();
    assert!(
        enters.iter().all(|e| e.sys_enter().id() == i64::from(nr))
            && exits.iter().all(|e| e.sys_exit().id() == i64::from(nr)),
        "only getppid passes the kernel filter"
    );
    let mine = enters.iter().filter(|e| e.pid() as i32 == me).count();
    assert!(mine >= 50, "{mine} getppid entries of this thread");
    assert!(exits.iter().filter(|e| e.pid() as i32 == me).count() >= 50);
    // A name this architecture does not know is refused, by name.
    let e = recorder::config::load_text(
        r#"buffers { size_kb: 64 } data_sources { config { name: "linux.ftrace" ftrace_config { syscall_events: "sys_nope" } } }"#,
        "t",
        false,
    )
    .and_then(|l| l.validate())
    .expect_err("unknown syscall")
    .to_string();
    assert!(
        e.contains(
            "data_sources[0].config.ftrace_config.syscall_events: unknown syscall \"sys_nope\""
        ),
        "{e}"
    );
}

/// `tids_to_trace` through the kernel's `set_event_pid` (Perfetto's
/// mechanism): only the listed thread's own events, sched_switch in or out
/// of it and wakeups of it reach the trace.
#[test]
fn real_kernel_tids_to_trace() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let me = rustix::thread::gettid().as_raw_nonzero().get();
    let spec = FtraceSpec {
        events: vec![
            "sched/sched_switch".into(),
            "sched/sched_waking".into(),
            "sched/sched_process_exit".into(),
        ],
        compact_sched: false,
        tids_to_trace: vec![me as u32],
        drain_period: Duration::from_millis(20),
        ..Default::default()
    };
    let mut other = 0;
    let (p, _) = record_spec(spec, |inst| {
        assert_eq!(
            inst.read("set_event_pid").expect("pids").trim(),
            me.to_string()
        );
        let (_, b) = ping_pong_with(500, true);
        other = b;
    });
    let ev = events(&p);
    assert!(!ev.is_empty());
    let mut saw_other_woken = false;
    for e in &ev {
        let about_me = e.pid() as i32 == me
            || (e.has_sched_switch()
                && (e.sched_switch().prev_pid() == me || e.sched_switch().next_pid() == me))
            || (e.has_sched_waking() && e.sched_waking().pid() == me);
        assert!(about_me, "an event of another thread: {e:?}");
        saw_other_woken |= e.has_sched_waking() && e.sched_waking().pid() == other;
    }
    // This thread woke the other one: its own event, kept.
    assert!(saw_other_woken, "the wakeups this thread caused");
    // A thread of another process, never about this one, is absent.
    assert!(
        ev.iter().all(|e| e.pid() as i32 != other
            || (e.has_sched_switch() && e.sched_switch().next_pid() == me)
            || (e.has_sched_waking() && e.sched_waking().pid() == me)),
        "events of the other thread about itself only"
    );
}

/// Where the kernel refuses `set_event_pid`, the encoder filters with the
/// same rule: the current thread, or a thread the event is about.
#[test]
fn tids_to_trace_in_user_space_keeps_what_the_kernel_would() {
    let (l, table) = fixture_table(false);
    let mut pages = raw("cpu0.raw");
    pages.extend(raw("cpu1.raw"));
    let (all, _) = encode(&pages, false, &PrintFilter::default());
    let all = events(&all);
    let tid = all
        .iter()
        .find(|e| e.has_sched_switch())
        .map(|e| e.sched_switch().next_pid())
        .expect("a switch");
    let mut out = VecOutput::new();
    let mut enc = BundleEncoder::new(SEQ, 16 * 1024);
    enc.set_tid_filter(&[tid as u32]);
    enc.encode_pages(
        &mut out,
        &table,
        &PrintFilter::default(),
        &l,
        &mut CpuCursor {
            cpu: 3,
            ..Default::default()
        },
        &pages,
    );
    let kept = events(&decode(&out.bytes));
    // The current thread, or a thread the event names.
    let about = |e: &FtraceEvent| {
        let named = [
            e.has_sched_switch().then(|| e.sched_switch().prev_pid()),
            e.has_sched_switch().then(|| e.sched_switch().next_pid()),
            e.has_sched_wakeup().then(|| e.sched_wakeup().pid()),
            e.has_sched_waking().then(|| e.sched_waking().pid()),
            e.has_sched_wakeup_new().then(|| e.sched_wakeup_new().pid()),
            e.has_sched_process_exit()
                .then(|| e.sched_process_exit().pid()),
            e.has_sched_process_free()
                .then(|| e.sched_process_free().pid()),
            e.has_sched_process_exec()
                .then(|| e.sched_process_exec().pid()),
            e.has_sched_process_fork()
                .then(|| e.sched_process_fork().parent_pid()),
            e.has_sched_process_fork()
                .then(|| e.sched_process_fork().child_pid()),
            e.has_task_newtask().then(|| e.task_newtask().pid()),
            e.has_task_rename().then(|| e.task_rename().pid()),
            e.has_sched_blocked_reason()
                .then(|| e.sched_blocked_reason().pid()),
            e.has_sched_process_wait()
                .then(|| e.sched_process_wait().pid()),
            e.has_sched_process_hang()
                .then(|| e.sched_process_hang().pid()),
            e.has_oom_score_adj_update()
                .then(|| e.oom_score_adj_update().pid()),
        ];
        e.pid() as i32 == tid || named.contains(&Some(tid))
    };
    let want: Vec<&FtraceEvent> = all.iter().filter(|e| about(e)).collect();
    assert!(!want.is_empty() && want.len() < all.len());
    assert_eq!(kept.len(), want.len());
    assert!(
        kept.iter()
            .zip(&want)
            .all(|(a, b)| a.to_string() == b.to_string())
    );
    assert_eq!(enc.stats.filtered_tids as usize, all.len() - want.len());
}

/// `use_monotonic_raw_clock`: the instance's trace_clock is mono_raw, every
/// bundle says so, and timestamps are CLOCK_MONOTONIC_RAW readings.
#[test]
fn real_kernel_monotonic_raw_clock() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let raw_now = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicRaw);
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    };
    let spec = FtraceSpec {
        events: vec!["sched/sched_switch".into()],
        compact_sched: false,
        use_monotonic_raw_clock: true,
        drain_period: Duration::from_millis(20),
        ..Default::default()
    };
    let mut window = (0, 0);
    let (p, _) = record_spec(spec, |inst| {
        assert!(
            inst.read("trace_clock")
                .expect("clock")
                .contains("[mono_raw]")
        );
        window.0 = raw_now();
        ping_pong(200);
        window.1 = raw_now();
    });
    let b = bundles(&p);
    assert!(!b.is_empty());
    assert!(b.iter().all(|b| b.ftrace_clock()
        == perfetto_protos::ftrace_event_bundle::FtraceClock::FTRACE_CLOCK_MONO_RAW));
    let ev = events(&p);
    let inside = ev
        .iter()
        .filter(|e| (window.0..=window.1).contains(&e.timestamp()))
        .count();

    assert!(
        inside >= 200,
        "{inside} switches inside the MONOTONIC_RAW window"
    );
}

/// `preserve_ftrace_buffer`: what an existing instance recorded before the
/// session starts is kept (and FtraceStats says so); by default it is
/// cleared.
#[test]
fn real_kernel_preserve_ftrace_buffer() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let top = Tracefs::discover().expect("tracefs");
    for preserve in [true, false] {
        let name = format!("recorder-preserve-test-{}", std::process::id());
        let inst = top.instance(&name);
        std::fs::create_dir(inst.root()).expect("instance");
        inst.write("trace_clock", "boot").expect("clock");
        inst.write("tracing_on", "1").expect("on");
        inst.write("trace_marker", "before the session")
            .expect("marker");
        let spec = FtraceSpec {
            events: vec!["ftrace/print".into()],
            instance_name: Some(name.clone()),
            preserve_ftrace_buffer: preserve,
            ..Default::default()
        };
        let (p, _) = record_spec(spec, |inst| {
            inst.write("trace_marker", "during the session")
                .expect("marker");
        });
        std::fs::remove_dir(inst.root()).expect("instance removed");
        let prints: Vec<String> = events(&p)
            .iter()
            .filter(|e| e.has_print())
            .map(|e| e.print().buf().to_string())
            .collect();
        assert!(
            prints.contains(&"during the session\n".to_string()),
            "{prints:?}"
        );
        assert_eq!(
            prints.contains(&"before the session\n".to_string()),
            preserve,
            "preserve {preserve}: {prints:?}"
        );
        let stats = p.iter().find(|p| p.has_ftrace_stats()).expect("stats");
        assert_eq!(stats.ftrace_stats().preserve_ftrace_buffer(), preserve);
    }
}

/// `throttle_rss_stat` records kmem/rss_stat where the kernel has no
/// throttled variant; `disable_generic_events` leaves events without a
/// typed message disabled; `tracefs_options` set for the session and put
/// back; `buffer_size_lower_bound` keeps the default size when larger.
#[test]
fn real_kernel_event_choice_options_and_buffer_bound() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let top = Tracefs::discover().expect("tracefs");
    let throttled = top.path("events/kmem/rss_stat_throttled").is_dir();
    let spec = FtraceSpec {
        events: vec![
            "kmem/rss_stat".into(),
            "sched/sched_switch".into(),
            "sched/sched_stat_runtime".into(),
        ],
        throttle_rss_stat: true,
        disable_generic_events: true,
        tracefs_options: vec![("event-fork".into(), true)],
        buffer_size: Some(ByteSize::from_kb(64)),
        buffer_size_lower_bound: true,
        ..Default::default()
    };
    let (p, _) = record_spec(spec, |inst| {
        let on = |e: &str| {
            inst.read(&format!("events/{e}/enable"))
                .expect("enable")
                .trim()
                == "1"
        };
        assert_eq!(on("kmem/rss_stat"), !throttled);
        assert!(on("sched/sched_switch"));
        assert!(!on("sched/sched_stat_runtime"), "generic events stay off");
        assert_eq!(inst.read("options/event-fork").expect("option").trim(), "1");
        let kb: u32 = inst
            .read("buffer_size_kb")
            .expect("size")
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .expect("kb");
        assert!(
            kb >= 4096,
            "the default size wins over a 64 KiB lower bound: {kb}"
        );
        let v: Vec<u8> = vec![7; 8 << 20];
        std::hint::black_box(v);
    });
    assert!(events(&p).iter().all(|e| !e.has_generic()));
    // A trace option the kernel lacks is refused by name.
    let mut src = FtraceSource::new(
        FtraceOptions {
            spec: FtraceSpec {
                events: vec!["sched/sched_switch".into()],
                tracefs_options: vec![("no-such-option".into(), true)],
                ..Default::default()
            },
            ..Default::default()
        },
        VecOutput::new(),
    )
    .expect("source");
    let e = src.start().expect_err("refused").to_string();
    assert!(e.contains("no trace option \"no-such-option\""), "{e}");
}

/// function_graph and kprobes: where the kernel has them they record; where
/// it does not (this machine: no function_graph tracer, no kprobe_events,
/// set_ftrace_filter refused) the source says exactly which part and why,
/// and tracefs is left as found.
#[test]
fn real_kernel_function_graph_and_kprobes_work_or_say_why() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let top = Tracefs::discover().expect("tracefs");
    let tracers = top.read("available_tracers").unwrap_or_default();
    let spec = FtraceSpec {
        enable_function_graph: true,
        function_filters: vec!["vfs_read".into()],
        ..Default::default()
    };
    let mut src = FtraceSource::new(
        FtraceOptions {
            spec,
            ..Default::default()
        },
        VecOutput::new(),
    )
    .expect("source");
    match src.start() {
        Ok(()) => {
            assert!(tracers.contains("function_graph"));
            let _ = std::fs::read("/proc/self/stat");
            let _ = src.stop();
        }
        Err(e) => {
            let e = e.to_string();
            if tracers.split_whitespace().any(|t| t == "function_graph") {
                assert!(e.starts_with("function_filters: "), "{e}");
            } else {
                assert!(
                    e.contains("enable_function_graph: this kernel has no function_graph tracer (available_tracers: "),
                    "{e}"
                );
            }
        }
    }
    drop(src);
    let spec = FtraceSpec {
        events: vec!["sched/sched_switch".into()],
        kprobe_events: vec![recorder::config::spec::KprobeSpec {
            function: "vfs_read".into(),
            kind: recorder::config::spec::KprobeKind::Kprobe,
        }],
        ..Default::default()
    };
    let (p, summary) = record_spec(spec, |_| {
        let _ = std::fs::read("/proc/self/stat");
    });
    let group = format!("recorder_{}", std::process::id());
    if top.path("kprobe_events").is_file() {
        assert!(
            summary.failed_events.is_empty(),
            "{:?}",
            summary.failed_events
        );
        assert!(events(&p).iter().any(|e| e.has_generic()), "kprobe hits");
        assert!(
            !top.read("kprobe_events")
                .unwrap_or_default()
                .contains(&group)
        );
    } else {
        assert_eq!(summary.failed_events, [format!("{group}/vfs_read")]);
        let end = p
            .iter()
            .rev()
            .find(|p| p.has_ftrace_stats())
            .expect("end stats");
        assert_eq!(
            end.ftrace_stats().failed_ftrace_events,
            [format!("{group}/vfs_read")]
        );
    }
}

/// clear_incremental_state on the running source: the next bundle (and
/// only it) carries SEQ_INCREMENTAL_STATE_CLEARED, and every bundle before
/// and after decodes whole, compact_sched intern tables resolving within
/// their own bundle.
#[test]
fn real_kernel_ftrace_clears_incremental_state() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let opts = FtraceOptions {
        spec: FtraceSpec {
            events: vec!["sched/sched_switch".into(), "sched/sched_waking".into()],
            drain_period: Duration::from_secs(30),
            ..Default::default()
        },
        sequence_id: SEQ,
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    src.start().expect("start");
    ping_pong(300);
    src.flush().expect("flush");
    src.clear_incremental_state().expect("clear");
    ping_pong(300);
    src.flush().expect("flush");
    src.stop().expect("stop");
    let p = decode(&src.take_output().expect("output").bytes);
    let flagged: Vec<usize> = p
        .iter()
        .enumerate()
        .filter(|(_, p)| p.sequence_flags() & 1 != 0)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(flagged.len(), 1, "one bundle says the state was cleared");
    let first_bundle = p
        .iter()
        .position(|p| p.has_ftrace_events())
        .expect("bundles");
    assert!(
        flagged[0] > first_bundle,
        "after the bundles of the first drain"
    );
    assert!(p[flagged[0]].has_ftrace_events());
    for b in bundles(&p) {
        let cs = &b.compact_sched;
        let n = cs.intern_table.len() as u32;
        assert!(cs.switch_next_comm_index.iter().all(|i| *i < n));
        assert!(cs.waking_comm_index.iter().all(|i| *i < n));
    }
}

/// tracefs where the kernel has `buffer_subbuf_size_kb` (Linux 6.8+), or
/// `None` having said why the test skips.
fn subbuf_tracefs() -> Option<Tracefs> {
    require!(need::kernel_tracing());
    let top = Tracefs::discover().expect("tracefs");
    require!(need::present(
        top.read("buffer_subbuf_size_kb").is_ok(),
        "this kernel has no buffer_subbuf_size_kb (Linux 6.8+)",
    ));
    Some(top)
}

/// A sub-buffer size the kernel refuses (this one takes at most 512 KiB) is
/// an error naming the setting when it was asked for, and nothing is left
/// behind; the recorder's own choice never asks for more than 16 KiB.
#[test]
fn real_kernel_a_refused_sub_buffer_size_is_a_clear_error() {
    let Some(top) = subbuf_tracefs() else {
        return;
    };
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let before: BTreeSet<String> = std::fs::read_dir(top.path("instances"))
        .expect("instances")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let opts = FtraceOptions {
        spec: FtraceSpec {
            events: vec!["sched/sched_switch".into()],
            buffer_size: Some(ByteSize::from_kb(8192)),
            ..Default::default()
        },
        sequence_id: SEQ,
        subbuf: SubbufSize::Kb(subbuf::MAX_SUBBUF_KB),
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    let err = match src.start() {
        Ok(()) => {
            let _ = src.stop();
            // A kernel that takes it has nothing to refuse.
            assert!(
                !kernel_required(),
                "this kernel takes {} KiB sub-buffers: the test needs another size",
                subbuf::MAX_SUBBUF_KB
            );
            return;
        }
        Err(e) => e.to_string(),
    };
    assert!(err.contains("buffer_subbuf_size_kb"), "{err}");
    drop(src);
    let after: BTreeSet<String> = std::fs::read_dir(top.path("instances"))
        .expect("instances")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            before.contains(n) || n.starts_with(&format!("recorder-{}", std::process::id()))
        })
        .collect();
    assert!(after.is_subset(&before), "instances left: {after:?}");
}

/// A named instance that already existed keeps its own sub-buffer size: the
/// recording changes it and puts it back, and leaves the instance there.
#[test]
fn real_kernel_a_named_instance_gets_its_sub_buffer_size_back() {
    let Some(top) = subbuf_tracefs() else {
        return;
    };
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = subbuf_refused(&top) {
        eprintln!("skipped: {why}: no size to put back");
        return;
    }
    let name = format!("named-subbuf-{}", std::process::id());
    let inst = top.instance(&name);
    std::fs::create_dir(inst.root()).expect("make the instance");
    // Removed however the test ends.
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _gone = Gone(inst.root().to_path_buf());
    inst.write("buffer_subbuf_size_kb", "8").expect("8 KiB");
    let opts = FtraceOptions {
        spec: FtraceSpec {
            events: vec!["sched/sched_switch".into()],
            buffer_size: Some(ByteSize::from_kb(4096)),
            instance_name: Some(name.clone()),
            compact_sched: false,
            ..Default::default()
        },
        sequence_id: SEQ,
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    src.start().expect("start");
    let during = inst.read("buffer_subbuf_size_kb").expect("during");
    let _ = ping_pong(200);
    src.stop().expect("stop");
    let events = events(&decode(&src.take_output().expect("output").bytes)).len();
    let after = inst.read("buffer_subbuf_size_kb").expect("after");
    let _ = std::fs::remove_dir(inst.root());
    assert_eq!(during.trim(), subbuf::DEFAULT_SUBBUF_KB.to_string());
    assert_eq!(after.trim(), "8", "the instance's own size is put back");
    assert!(events > 0, "recorded in the named instance");
}

/// Item 19 of round 4: `config check` says whether this kernel takes the
/// sub-buffer size, and a session on a kernel that refuses it says in its
/// summary that it recorded with the kernel's own (and records).
#[test]
fn real_kernel_the_sub_buffer_fallback_is_reported() {
    let Some(top) = subbuf_tracefs() else {
        return;
    };
    let refused = subbuf_refused(&top);
    let run = Run::new(
        "buffers { size_kb: 8192 }\nduration_ms: 300\n\
         data_sources { config { name: \"linux.ftrace\" ftrace_config { ftrace_events: \"sched/sched_switch\" } } }\n",
    );
    let check = std::process::Command::new(recorder_bin())
        .args(["config", "check"])
        .arg(&run.config)
        .output()
        .expect("config check");
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{plan}");
    let o = run.run("pwritev");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!decode(&run.trace()).is_empty());
    match refused {
        Some(why) => {
            eprintln!("{why}");
            assert!(
                plan.contains("this kernel refuses buffer_subbuf_size_kb"),
                "{plan}"
            );
            assert!(
                err.contains("the kernel refused 16 KiB sub-buffers")
                    && err.contains("recorded with its own size"),
                "{err}"
            );
        }
        None => {
            assert!(plan.contains("this kernel takes the setting"), "{plan}");
            assert!(!err.contains("the kernel refused"), "{err}");
        }
    }
}
