//! `recorder serve` started as root records `linux.ftrace` itself: its
//! root broker prepares a tracefs instance per session (a typed, bounded
//! request, never the TraceConfig) and hands the descriptors to the
//! unprivileged service, which arms, reads and stops through them. Driven by
//! Perfetto's own `perfetto` client (tracebox v58.2); every trace goes
//! through the independent decoder and trace processor.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use crate::harness::*;

const TRACEFS: &str = "/sys/kernel/tracing";

/// The broker's limit (src/privilege/broker.rs MAX_INSTANCES_PER_UID).
const INSTANCES_PER_UID: usize = 4;

impl Serve {
    /// The broker: the service's one child. The consumer socket listens
    /// before the broker is forked, so it is waited for.
    pub(crate) fn broker(&self) -> u32 {
        let pid = self.child.as_ref().map_or(0, Child::id);
        let kids = || -> Vec<u32> {
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        };
        wait_for("the broker", Duration::from_secs(10), || !kids().is_empty());
        let kids = kids();
        assert_eq!(kids.len(), 1, "the broker only: {kids:?}");
        kids[0]
    }
}

/// The tracefs instances the broker `pid` made (`recorder-PID[-N]`).
fn instances_of(pid: u32) -> Vec<String> {
    let mine = format!("recorder-{pid}");
    std::fs::read_dir(Path::new(TRACEFS).join("instances"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| *n == mine || n.starts_with(&format!("{mine}-")))
        .collect()
}

const SCHED: &str = r#"
buffers { size_kb: 8192 }
duration_ms: 2000
data_sources { config { name: "linux.ftrace" ftrace_config {
  ftrace_events: "sched/sched_switch" } } }
"#;

#[test]
fn the_stock_client_records_sched_switch_through_the_builtin_ftrace_of_serve() {
    require!(need::tracebox(), need::tracefs_instances());
    let serve = Serve::start();
    let broker = serve.broker();
    // The service lists linux.ftrace among its own data sources.
    let q = serve
        .perfetto(None, &["--query"])
        .output()
        .expect("perfetto --query");
    let listing = String::from_utf8_lossy(&q.stdout);
    assert!(listing.contains("linux.ftrace"), "--query: {listing}");
    let (client, out) = serve.spawn_client(None, "sched", SCHED);
    let o = wait_within(client, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "perfetto failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        serve.log()
    );
    let log = serve.log();
    assert!(log.contains("broker: ftrace instance"), "{log}");
    let packets = decode(&std::fs::read(&out).expect("trace"));
    assert!(sched_switches(&packets) > 0, "no sched_switch: {log}");
    if let Some(tp) = trace_processor::check(&out) {
        assert!(
            tp.query("select count(*) from ftrace_event").scalar().int() > 0,
            "ftrace_event rows"
        );
    }
    // The session ended: the broker tore its instance down.
    wait_for("the instance removed", Duration::from_secs(10), || {
        instances_of(broker).is_empty()
    });
}

#[test]
fn one_uids_clients_cannot_make_the_broker_hold_more_than_its_limit_and_sigkill_tears_down() {
    require!(need::tracebox(), need::tracefs_instances());
    let serve = Serve::start();
    let broker = serve.broker();
    let long = SCHED
        .replace("duration_ms: 2000", "duration_ms: 30000")
        .replace("size_kb: 8192", "size_kb: 1024");
    let mut clients = Vec::new();
    for i in 0..=INSTANCES_PER_UID {
        clients.push(serve.spawn_client(Some(NOBODY), &format!("n{i}"), &long).0);
    }
    wait_for_text(
        "ftrace instances, the most a uid may",
        Duration::from_secs(30),
        || serve.log(),
    );
    assert_eq!(
        instances_of(broker).len(),
        INSTANCES_PER_UID,
        "{}",
        serve.log()
    );
    // The service killed: the broker sees its end close and tears down.
    if let Some(c) = serve.child.as_ref() {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(c),
            rustix::process::Signal::KILL,
        )
        .expect("SIGKILL");
    }
    wait_for(
        "every instance removed after SIGKILL",
        Duration::from_secs(15),
        || instances_of(broker).is_empty(),
    );
    for mut c in clients {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// One config for both services: ftrace with compact_sched, process and
/// system stats, system info, in two buffers.
const EQUIVALENT: &str = r#"
buffers { size_kb: 16384 }
buffers { size_kb: 2048 }
duration_ms: 3000
data_sources { config { name: "linux.ftrace" target_buffer: 0 ftrace_config {
  ftrace_events: "sched/sched_switch"
  ftrace_events: "sched/sched_wakeup"
  ftrace_events: "sched/sched_process_exit"
  ftrace_events: "task/task_newtask"
  compact_sched { enabled: true } } } }
data_sources { config { name: "linux.process_stats" target_buffer: 1
  process_stats_config { scan_all_processes_on_start: true proc_stats_poll_ms: 1000 } } }
data_sources { config { name: "linux.sys_stats" target_buffer: 1 sys_stats_config {
  meminfo_period_ms: 500
  meminfo_counters: MEMINFO_MEM_TOTAL
  meminfo_counters: MEMINFO_MEM_FREE
  meminfo_counters: MEMINFO_MEM_AVAILABLE
  vmstat_period_ms: 500
  vmstat_counters: VMSTAT_NR_FREE_PAGES
  stat_period_ms: 500
  stat_counters: STAT_CPU_TIMES } } }
data_sources { config { name: "linux.system_info" target_buffer: 1 } }
"#;

/// What trace processor makes of a trace, for the comparison: the row count
/// of each table the config fills, and the names of its counter tracks.
fn tables(
    tp: &trace_processor::Tp,
) -> (Vec<(&'static str, i64)>, std::collections::BTreeSet<String>) {
    let counts = [
        ("sched", "select count(*) from sched"),
        ("thread_state", "select count(*) from thread_state"),
        ("thread", "select count(*) from thread where tid != 0"),
        ("process", "select count(*) from process where pid != 0"),
        (
            "process names",
            "select count(*) from process where name is not null",
        ),
        ("counter", "select count(*) from counter"),
        ("cpu", "select count(*) from cpu"),
    ]
    .into_iter()
    .map(|(name, sql)| (name, tp.query(sql).scalar().int()))
    .collect();
    let names = tp
        .query(
            "select distinct hex(t.name) as n from counter c \
             join counter_track t on c.track_id = t.id where t.name is not null",
        )
        .column("n")
        .iter()
        .map(|v| trace_processor::unhex(v.text()))
        .collect();
    (counts, names)
}

#[test]
fn the_same_config_through_traced_and_through_serve_fills_the_same_tables() {
    require!(need::tracebox(), need::tracefs_instances());
    let theirs = {
        let dir = tempfile::tempdir().expect("tempdir");
        let traced = Traced::start(dir.path());
        let out = traced.record(EQUIVALENT);
        drop(traced);
        let Some(tp) = trace_processor::open(&out) else {
            return;
        };
        tables(&tp)
    };
    let serve = Serve::start();
    let (client, out) = serve.spawn_client(None, "equivalent", EQUIVALENT);
    let o = wait_within(client, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "perfetto against serve: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        serve.log()
    );
    let Some(tp) = trace_processor::check(&out) else {
        return;
    };
    let ours = tables(&tp);
    eprintln!("traced: {theirs:?}\nserve:  {ours:?}");
    // Every table traced's trace fills, serve's fills too.
    for ((name, t), (_, o)) in theirs.0.iter().zip(&ours.0) {
        assert!(
            *t == 0 || *o > 0,
            "{name}: {t} rows through traced, none through serve ({:?} against {:?})",
            theirs.0,
            ours.0
        );
    }
    // And the same counters: every counter track traced's has (the
    // meminfo, vmstat, cpu time and process counters), by trace
    // processor's name.
    let missing: Vec<&String> = theirs.1.difference(&ours.1).collect();
    assert!(
        missing.is_empty(),
        "counter tracks only through traced: {missing:?} (serve: {:?})",
        ours.1
    );
}
