//! `recorder serve` against Perfetto's own `perfetto` client (tracebox
//! v58.2): sessions recorded and read back through the consumer socket,
//! `--query`, concurrent clients, refusals the client prints, SDK apps and
//! traced_probes as producers, write_into_file, triggers and SIGTERM. Every
//! trace goes through both decoders and trace processor.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::serve::{SERVICE_UID, kinds};
use crate::harness::*;

const STATS_CONFIG: &str = r#"
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
duration_ms: 1500
data_sources { config { name: "linux.process_stats"
  process_stats_config { scan_all_processes_on_start: true proc_stats_poll_ms: 500 } } }
data_sources { config { name: "linux.sys_stats"
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE
                     stat_period_ms: 100 stat_counters: STAT_CPU_TIMES } } }
data_sources { config { name: "for_testing" for_testing { message_count: 200 message_size: 64 } } }
"#;

/// A client session of `sources` meant to last two minutes, so that
/// only what the test does ends it.
fn spawn_long(serve: &Serve, sources: &str) -> (Child, PathBuf) {
    let config = format!("buffers {{ size_kb: 1024 }}\nduration_ms: 120000\n{sources}");
    serve.spawn_client(None, "long", &config)
}

#[test]
fn the_stock_client_records_a_ring_buffer_session_through_serve() {
    require!(need::tracebox());
    let serve = Serve::start();
    let (o, out) = serve.record("ring", STATS_CONFIG);
    assert!(o.status.success(), "perfetto failed: {}", text(&o));
    let data = std::fs::read(&out).expect("trace");
    assert!(!data.is_empty(), "empty trace: {}", serve.log());

    // The Rust decoder: every for_testing packet, in order, on one sequence.
    let packets = decode(&data);
    let counters = test_counters(&packets);
    assert_eq!(counters.len(), 1, "{counters:?}");
    let seq = counters.values().next().expect("a sequence");
    assert_eq!(seq, &(0..200).collect::<Vec<u64>>());
    assert!(packets.iter().any(|p| p.has_trace_config()));
    assert!(packets.iter().any(|p| p.has_trace_stats()));
    assert!(packets.iter().any(|p| p.has_process_tree()));
    // The client's own edits to the config (its uuid) are the trace's.
    let cfg = packets
        .iter()
        .find(|p| p.has_trace_config())
        .expect("trace_config");
    let uuid = packets.iter().find(|p| p.has_trace_uuid()).expect("uuid");
    assert_eq!(
        cfg.trace_config().trace_uuid_lsb(),
        uuid.trace_uuid().lsb(),
        "the client's uuid"
    );

    // The Python decoder agrees.
    if let Some(k) = kinds(&out) {
        assert_eq!(k.get("for_testing").and_then(|v| v.as_u64()), Some(200));
        assert!(k.get("sys_stats").and_then(|v| v.as_u64()).unwrap_or(0) >= 5);
    }

    // Trace processor: no error stats, the tables the sources fill.
    if let Some(tp) = trace_processor::check(&out) {
        assert!(
            tp.query("select count(*) from counter").scalar().int() > 10,
            "counters"
        );
        assert!(
            tp.query("select count(*) from process").scalar().int() > 1,
            "processes"
        );
    }

    // Root drops to the service user before serving.
    if is_root() {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", serve.pid())).expect("status");
        let field = |k: &str| {
            status
                .lines()
                .find(|l| l.starts_with(k))
                .map(|l| l[k.len()..].trim().to_string())
                .unwrap_or_default()
        };
        let uid = SERVICE_UID.to_string();
        assert!(
            field("Uid:").split_whitespace().all(|u| u == uid),
            "{status}"
        );
        assert_eq!(field("CapEff:"), "0000000000000000");
        assert_eq!(field("CapPrm:"), "0000000000000000");
        assert_eq!(field("CapBnd:"), "0000000000000000");
        assert_eq!(field("NoNewPrivs:"), "1");
    }
}

#[test]
fn two_clients_at_once_get_their_own_sessions() {
    require!(need::tracebox());
    let serve = Serve::start();
    let a_cfg = r#"
buffers { size_kb: 1024 }
duration_ms: 2000
data_sources { config { name: "for_testing" for_testing { message_count: 300 message_size: 32 max_messages_per_second: 200 } } }
"#;
    let b_cfg = r#"
buffers { size_kb: 2048 }
buffers { size_kb: 1024 }
duration_ms: 1500
data_sources { config { name: "linux.sys_stats" target_buffer: 1
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE } } }
"#;
    let a = std::thread::scope(|s| {
        let a = s.spawn(|| serve.record("a", a_cfg));
        let (ob, b_out) = serve.record("b", b_cfg);
        assert!(ob.status.success(), "b: {}", text(&ob));
        let b = decode(&std::fs::read(&b_out).expect("b"));
        assert!(b.iter().any(|p| p.has_sys_stats()));
        assert!(!b.iter().any(|p| p.has_for_testing()), "a's packets in b");
        let stats = b
            .iter()
            .rev()
            .find(|p| p.has_trace_stats())
            .expect("trace_stats");
        assert_eq!(stats.trace_stats().buffer_stats.len(), 2, "b's own buffers");
        trace_processor::check(&b_out);
        a.join().expect("a")
    });
    let (oa, a_out) = a;
    assert!(oa.status.success(), "a: {}", text(&oa));
    let pa = decode(&std::fs::read(&a_out).expect("a"));
    assert!(!pa.iter().any(|p| p.has_sys_stats()), "b's packets in a");
    let counters = test_counters(&pa);
    assert_eq!(counters.values().map(Vec::len).sum::<usize>(), 300);
    let stats = pa
        .iter()
        .rev()
        .find(|p| p.has_trace_stats())
        .expect("trace_stats");
    assert_eq!(stats.trace_stats().buffer_stats.len(), 1);
    if let Some(k) = kinds(&a_out) {
        assert_eq!(k.get("for_testing").and_then(|v| v.as_u64()), Some(300));
    }
    trace_processor::check(&a_out);
}

#[test]
fn query_lists_the_built_in_sources_and_only_the_callers_sessions() {
    require!(need::tracebox(), need::root());
    let serve = Serve::start();
    let (long, out) = serve.spawn_client(
        None,
        "long",
        r#"
buffers { size_kb: 1024 }
duration_ms: 4000
unique_session_name: "roots_session"
data_sources { config { name: "for_testing" for_testing { message_count: 20 message_size: 16 } } }
"#,
    );
    // The session is listed once it runs.
    let root_view = poll(Duration::from_secs(10), || {
        Some(serve.query_text()).filter(|t| t.contains("roots_session"))
    })
    .unwrap_or_else(|| serve.query_text());
    for name in [
        "for_testing",
        "linux.process_stats",
        "linux.sys_stats",
        "linux.system_info",
        "perfetto.traced_probes",
    ] {
        assert!(root_view.contains(name), "{name} missing: {root_view}");
    }
    assert!(root_view.contains("roots_session"), "{root_view}");
    assert!(root_view.contains("STARTED"), "{root_view}");

    // Another uid sees the service, not root's session.
    let o = output_within(
        &mut serve.perfetto(Some(NOBODY), &["--query"]),
        Duration::from_secs(10),
    );
    let theirs = text(&o);
    assert!(o.status.success(), "{theirs}");
    assert!(theirs.contains("for_testing"), "{theirs}");
    assert!(!theirs.contains("roots_session"), "{theirs}");
    // Nor can it reach that session: attaching is refused. Unique names are
    // each uid's own: its session of the same name runs beside root's
    // (traced's are global, so there another user could take root's name),
    // while root's own second one of that name is refused.
    let o = output_within(
        &mut serve.perfetto(Some(NOBODY), &["--attach=roots_session", "--stop"]),
        Duration::from_secs(10),
    );
    assert!(!o.status.success(), "attach by another uid: {}", text(&o));
    let same_name = "buffers { size_kb: 64 }\nduration_ms: 500\nunique_session_name: \"roots_session\"\n\
         data_sources { config { name: \"for_testing\" } }\n";
    let (o, theirs) = serve.record_as(Some(NOBODY), "theirs", same_name);
    assert!(o.status.success(), "another uid's own name: {}", text(&o));
    assert!(!decode(&std::fs::read(&theirs).expect("trace")).is_empty());
    let (o, _) = serve.record_as(None, "roots_again", same_name);
    assert!(
        text(&o).contains("already running"),
        "root's name, taken by root: {}",
        text(&o)
    );

    // Root's session ran to its end with all its data.
    let o = wait_within(long, Duration::from_secs(60));
    assert!(o.status.success(), "root's session: {}", text(&o));
    let packets = decode(&std::fs::read(&out).expect("trace"));
    assert_eq!(for_testing_count(&packets), 20);
    trace_processor::check(&out);
}

#[test]
fn ctrl_c_on_the_client_ends_the_session_with_its_data() {
    require!(need::tracebox());
    let serve = Serve::start();
    let started = Instant::now();
    let (child, out) = spawn_long(
        &serve,
        r#"
data_sources { config { name: "for_testing" for_testing { message_count: 50 message_size: 16 } } }
data_sources { config { name: "linux.sys_stats"
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE } } }
"#,
    );
    serve.wait_started(1);
    // Five sys_stats ticks (100 ms apart) at least before the Ctrl-C.
    std::thread::sleep(Duration::from_millis(1000));
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .expect("SIGINT");
    let o = wait_within(child, Duration::from_secs(30));
    assert!(
        o.status.success() || o.status.signal().is_none(),
        "{}",
        text(&o)
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let packets = decode(&std::fs::read(&out).expect("trace"));
    assert_eq!(for_testing_count(&packets), 50);
    assert!(packets.iter().filter(|p| p.has_sys_stats()).count() >= 5);
    trace_processor::check(&out);
}

#[test]
fn what_serve_refuses_the_client_prints() {
    require!(need::tracebox());
    let serve = Serve::start();
    // Perfetto's rule: a duration beside a trigger mode.
    let (o, out) = serve.record(
        "dur_trigger",
        r#"
buffers { size_kb: 64 }
duration_ms: 1000
trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 5000
  triggers { name: "t" stop_delay_ms: 0 } }
data_sources { config { name: "for_testing" } }
"#,
    );
    // The client prints the service's error (its exit status stays 0, as
    // against traced) and keeps no trace.
    let t = text(&o);
    assert!(t.contains("Service error"), "{t}");
    assert!(t.contains("duration_ms"), "the reason is printed: {t}");
    assert!(std::fs::metadata(&out).map_or(0, |m| m.len()) == 0);

    // More of Perfetto's rules, each with its reason.
    for (name, cfg, reason) in [
        (
            "stop_wif",
            "buffers { size_kb: 64 }\nwrite_into_file: true\n\
             trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 1000 triggers { name: \"t\" } }\n\
             data_sources { config { name: \"for_testing\" } }\n",
            "write_into_file",
        ),
        (
            "twice",
            "buffers { size_kb: 64 }\n\
             trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 1000\n\
               triggers { name: \"t\" } triggers { name: \"t\" } }\n\
             data_sources { config { name: \"for_testing\" } }\n",
            "used twice",
        ),
        (
            "no_timeout",
            "buffers { size_kb: 64 }\n\
             trigger_config { trigger_mode: STOP_TRACING triggers { name: \"t\" } }\n\
             data_sources { config { name: \"for_testing\" } }\n",
            "trigger_timeout_ms",
        ),
    ] {
        let (o, out) = serve.record(name, cfg);
        let t = text(&o);
        assert!(
            t.contains("Service error") && t.contains(reason),
            "{name}: {t}"
        );
        assert_eq!(std::fs::metadata(&out).map_or(0, |m| m.len()), 0, "{name}");
    }

    // The service creates no file for a client: output_path is refused.
    let cfg = serve.path("output_path.pbtx");
    std::fs::write(
        &cfg,
        format!(
            "buffers {{ size_kb: 64 }}\nduration_ms: 500\nwrite_into_file: true\n\
             output_path: \"{}\"\ndata_sources {{ config {{ name: \"for_testing\" }} }}\n",
            serve.path("elsewhere.pftrace").display()
        ),
    )
    .expect("config");
    let o = output_within(
        serve.perfetto(None, &["--txt", "-c"]).arg(&cfg),
        Duration::from_secs(20),
    );
    let t = text(&o);
    assert!(t.contains("does not create files for clients"), "{t}");
    assert!(!serve.path("elsewhere.pftrace").exists());

    // Cloning a session that is not there: the service's reason.
    // (Never -o /dev/null: the client unlinks its output on an error.)
    let clone_out = serve.path("clone.pftrace");
    let o = output_within(
        serve
            .perfetto(None, &["--clone", "77", "-o"])
            .arg(&clone_out),
        Duration::from_secs(20),
    );
    let t = text(&o);
    assert!(t.contains("no running tracing session 77"), "{t}");

    // The service keeps serving after every refusal.
    let (o, out) = serve.record(
        "after",
        "buffers { size_kb: 64 }\nduration_ms: 300\ndata_sources { config { name: \"for_testing\" for_testing { message_count: 5 } } }\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        test_counters(&decode(&std::fs::read(&out).expect("trace")))
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        5
    );
}

#[test]
fn garbage_and_floods_on_the_consumer_socket_cost_their_sender_only() {
    require!(need::tracebox());
    let serve = Serve::start();
    // An oversized frame header closes that connection.
    let mut s = std::os::unix::net::UnixStream::connect(serve.consumer()).expect("connect");
    s.write_all(&u32::MAX.to_le_bytes()).expect("write");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut buf = [0u8; 16];
    let n = std::io::Read::read(&mut s, &mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the connection is closed");
    // Idle connections beyond one uid's quota are refused; another
    // client still records.
    let idle: Vec<_> = (0..40)
        .filter_map(|_| std::os::unix::net::UnixStream::connect(serve.consumer()).ok())
        .collect();
    wait_for_text(
        "too many consumer connections",
        Duration::from_secs(10),
        || serve.log(),
    );
    let (o, _) = if is_root() {
        // Root's idle connections do not keep nobody out.
        serve.record_as(
            Some(NOBODY),
            "n",
            "buffers { size_kb: 64 }\nduration_ms: 300\ndata_sources { config { name: \"for_testing\" for_testing { message_count: 5 } } }\n",
        )
    } else {
        drop(idle);
        // The service lets the closed connections go, which nothing
        // outside shows.
        std::thread::sleep(Duration::from_millis(200));
        serve.record(
            "after_flood",
            "buffers { size_kb: 64 }\nduration_ms: 300\ndata_sources { config { name: \"for_testing\" } }\n",
        )
    };
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        serve.log().contains("too many consumer connections"),
        "{}",
        serve.log()
    );
    if kernel_required() {
        assert!(is_root(), "RECORDER_REQUIRE_KERNEL=1 runs these as root");
    }
}

#[test]
fn an_sdk_apps_packets_reach_the_clients_session() {
    const N: u64 = 500;
    require!(need::tracebox());
    // Built before the service starts.
    sdk_app();
    let serve = Serve::start();
    let (client, out) = serve.spawn_client(
        None,
        "sdk",
        r#"
buffers { size_kb: 16384 fill_policy: DISCARD }
duration_ms: 6000
data_sources { config { name: "recorder.test.sequence" } }
data_sources { config { name: "for_testing" for_testing { message_count: 10 } } }
"#,
    );
    let mut app = App::spawn(
        &serve.path("producer.sock"),
        "sdk_producer",
        &["--packets", &N.to_string(), "--shmem-kb", "4096"],
    );
    let app_pid = app.pid();
    app.expect(&format!("wrote {N}"));
    // While the session runs, --query lists the app and its data source.
    let q = output_within(
        &mut serve.perfetto(None, &["--query"]),
        Duration::from_secs(10),
    );
    assert!(text(&q).contains("recorder.test.sequence"), "{}", text(&q));
    let o = wait_within(client, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    app.kill();
    let packets = decode(&std::fs::read(&out).expect("trace"));
    let from_app: Vec<u64> = packets
        .iter()
        .filter(|p| p.has_for_testing() && p.trusted_pid() as u32 == app_pid)
        .map(|p| p.for_testing().counter())
        .collect();
    assert_eq!(from_app, (0..N).collect::<Vec<_>>(), "{}", serve.log());
    // The built-in source beside it, on its own sequence.
    let builtin = packets
        .iter()
        .filter(|p| p.has_for_testing() && p.trusted_pid() as u32 != app_pid)
        .count();
    assert_eq!(builtin, 10);
    if let Some(k) = kinds(&out) {
        assert_eq!(k.get("for_testing").and_then(|v| v.as_u64()), Some(N + 10));
    }
    trace_processor::check(&out);
}

/// A tracefs instance of the test's own, removed at the end, so Perfetto's
/// `traced_probes` never touches the top-level instance others use.
struct Instance(PathBuf);

impl Drop for Instance {
    fn drop(&mut self) {
        // Removable once traced_probes has let it go.
        poll(Duration::from_secs(5), || {
            (std::fs::remove_dir(&self.0).is_ok() || !self.0.exists()).then_some(())
        });
    }
}

#[test]
fn traced_probes_records_ftrace_as_a_producer_of_serve() {
    require!(need::tracebox(), need::root());
    let tracefs = Path::new("/sys/kernel/tracing");
    require!((!tracefs.join("instances").is_dir()).then(|| "no tracefs".to_string()));
    let name = format!("recorder-serve-test-{}", std::process::id());
    let instance = Instance(tracefs.join("instances").join(&name));
    std::fs::create_dir(&instance.0).expect("tracefs instance");
    let serve = Serve::start();
    let probes_log = std::fs::File::create(serve.path("probes.log")).expect("log");
    let mut probes = Command::new(need::tracebox_path().expect("tracebox"))
        .arg("traced_probes")
        .env("PERFETTO_PRODUCER_SOCK_NAME", serve.path("producer.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(probes_log)
        .spawn()
        .expect("traced_probes");
    let (o, out) = serve.record(
        "ftrace",
        &format!(
            r#"
buffers {{ size_kb: 8192 }}
duration_ms: 2000
data_sources {{ config {{ name: "linux.ftrace" ftrace_config {{
  ftrace_events: "sched/sched_switch" ftrace_events: "sched/sched_waking"
  instance_name: "{name}" }} }} }}
"#
        ),
    );
    let _ = probes.kill();
    let _ = probes.wait();
    let probes_said = std::fs::read_to_string(serve.path("probes.log")).unwrap_or_default();
    assert!(o.status.success(), "{}\n{probes_said}", text(&o));
    assert!(
        serve.log().contains("perfetto.traced_probes"),
        "traced_probes never connected: {}",
        serve.log()
    );
    let packets = decode(&std::fs::read(&out).expect("trace"));
    assert!(
        sched_switches(&packets) > 0,
        "no sched_switch: {probes_said}"
    );
    if let Some(k) = kinds(&out) {
        assert!(k.get("ftrace_events").and_then(|v| v.as_u64()).unwrap_or(0) > 0);
    }
    if let Some(tp) = trace_processor::check(&out) {
        assert!(tp.query("select count(*) from sched").scalar().int() > 0);
    }
    drop(instance);
}

#[test]
fn a_write_into_file_session_grows_the_clients_file_while_it_runs() {
    require!(need::tracebox());
    let serve = Serve::start();
    let (mut child, out) = serve.spawn_client(
        None,
        "wif",
    r#"
buffers { size_kb: 1024 }
duration_ms: 4000
write_into_file: true
file_write_period_ms: 500
data_sources { config { name: "for_testing" for_testing { message_count: 300 max_messages_per_second: 100 } } }
data_sources { config { name: "linux.sys_stats"
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE } } }
"#,
    );
    // Passes land in the client's file while the session runs (watched
    // until the client is done: under load the start may come late).
    let mut sizes = Vec::new();
    poll(Duration::from_secs(60), || {
        sizes.push(file_size(&out));
        child.try_wait().expect("wait")
    });
    let o = wait_within(child, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    let end = std::fs::metadata(&out).expect("trace").len();
    let running: Vec<u64> = sizes.into_iter().filter(|&n| n > 0 && n < end).collect();
    assert!(
        running.len() >= 2,
        "the file did not grow while running: {running:?} / {end}"
    );
    assert!(running.windows(2).any(|w| w[1] > w[0]), "{running:?}");
    let packets = decode(&std::fs::read(&out).expect("trace"));
    let counters = test_counters(&packets);
    assert_eq!(
        counters.values().next().cloned().unwrap_or_default(),
        (0..300).collect::<Vec<u64>>()
    );
    if let Some(k) = kinds(&out) {
        assert_eq!(k.get("for_testing").and_then(|v| v.as_u64()), Some(300));
    }
    trace_processor::check(&out);
}

/// Records a write_into_file session through serve into a file in `dir`
/// and checks it as a whole trace; returns the service's log and how many
/// padding packets (which only O_DIRECT passes write) the file holds.
fn write_into_file_in(dir: &Path, env: &[(&str, &str)]) -> (String, usize) {
    let serve = Serve::start_with(env);
    let cfg = serve.path("wif_dir.pbtx");
    // Enough per pass (20k messages of 64 bytes a second, 500 ms passes)
    // that passes are long enough for O_DIRECT.
    std::fs::write(
        &cfg,
        r#"
buffers { size_kb: 8192 }
duration_ms: 3000
write_into_file: true
file_write_period_ms: 500
data_sources { config { name: "for_testing" for_testing {
  message_count: 40000 max_messages_per_second: 20000 message_size: 64 } } }
"#,
    )
    .expect("config");
    let out = dir.join("wif_dir.pftrace");
    let child = serve.spawn_perfetto(None, &cfg, &out);
    let o = wait_within(child, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    let packets = decode(&std::fs::read(&out).expect("trace"));
    let counters = test_counters(&packets);
    assert_eq!(
        counters.values().next().cloned().unwrap_or_default(),
        (0..40000).collect::<Vec<u64>>(),
        "{}",
        serve.log()
    );
    if let Some(k) = kinds(&out) {
        assert_eq!(k.get("for_testing").and_then(|v| v.as_u64()), Some(40000));
    }
    trace_processor::check(&out);
    (
        serve.log(),
        packets.iter().filter(|p| is_padding(p)).count(),
    )
}

#[test]
fn a_write_into_file_session_onto_a_disk_file_bypasses_the_page_cache() {
    require!(need::tracebox());
    // The repo's target dir: a disk file system, not tmpfs.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (log, padding) = write_into_file_in(dir.path(), &[]);
    assert!(
        log.contains("passed trace file: O_DIRECT, 4096-byte blocks"),
        "{log}"
    );
    assert!(padding > 0, "no pass was written in blocks: {log}");
    // RECORDER_DIRECT_IO=off keeps it in the page cache, as for the recorder.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (log, padding) = write_into_file_in(dir.path(), &[("RECORDER_DIRECT_IO", "off")]);
    assert!(!log.contains("passed trace file: O_DIRECT"), "{log}");
    assert_eq!(padding, 0, "{log}");
}

#[test]
fn a_write_into_file_session_onto_tmpfs_stays_in_the_page_cache() {
    require!(need::tracebox());
    require!((!Path::new("/dev/shm").is_dir()).then(|| "no /dev/shm".to_string()));
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir");
    let (log, padding) = write_into_file_in(dir.path(), &[]);
    assert_eq!(padding, 0, "{log}");
    assert!(
        log.contains("passed trace file: through the page cache, O_DIRECT unused (its file system keeps files in memory)"),
        "{log}"
    );
    assert!(!log.contains("passed trace file: O_DIRECT"), "{log}");
}

#[test]
fn trigger_perfetto_ends_a_stop_tracing_session() {
    require!(need::tracebox());
    let serve = Serve::start();
    let started = Instant::now();
    let (child, out) = serve.spawn_client(
        None,
        "trig",
        r#"
buffers { size_kb: 1024 }
trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 30000
  triggers { name: "serve_test_stop" stop_delay_ms: 200 } }
data_sources { config { name: "for_testing" for_testing { message_count: 30 } } }
"#,
    );
    serve.wait_started(1);
    let t = output_within(
        Command::new(need::tracebox_path().expect("tracebox"))
            .arg("trigger_perfetto")
            .arg("serve_test_stop")
            .env("PERFETTO_PRODUCER_SOCK_NAME", serve.path("producer.sock")),
        Duration::from_secs(20),
    );
    assert!(t.status.success(), "{}", text(&t));
    let o = wait_within(child, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the trigger, not the timeout, ended it"
    );
    let packets = decode(&std::fs::read(&out).expect("trace"));
    let trig: Vec<_> = packets.iter().filter(|p| p.has_trigger()).collect();
    assert_eq!(trig.len(), 1, "{}", serve.log());
    assert_eq!(trig[0].trigger().trigger_name(), "serve_test_stop");
    assert_eq!(for_testing_count(&packets), 30);
    if let Some(tp) = trace_processor::check(&out) {
        let names: Vec<String> = tp.triggers().into_iter().map(|t| t.0).collect();
        assert_eq!(names, ["serve_test_stop"]);
    }
}

#[test]
fn sigterm_to_the_service_ends_running_sessions_with_their_data() {
    require!(need::tracebox());
    let mut serve = Serve::start();
    let (child, out) = spawn_long(
        &serve,
        r#"
data_sources { config { name: "for_testing" for_testing { message_count: 40 } } }
"#,
    );
    serve.wait_started(1);
    let mut service = serve.child.take().expect("serve");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&service),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    let o = wait_within(child, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o));
    let status = wait_exit(&mut service, Duration::from_secs(20));
    assert!(status.success(), "{status:?}: {}", serve.log());
    assert!(!serve.consumer().exists(), "the consumer socket is removed");
    assert!(!serve.path("producer.sock").exists());
    let packets = decode(&std::fs::read(&out).expect("trace"));
    assert_eq!(for_testing_count(&packets), 40);
    trace_processor::check(&out);
}

#[test]
fn the_systemd_unit_verifies_and_its_command_line_parses() {
    let unit = repo_root().join("contrib/recorder-serve.service");
    let written = std::fs::read_to_string(&unit).expect("the unit");
    let exec = written
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/recorder"));
    let args: Vec<&str> = words.collect();
    assert_eq!(args.first(), Some(&"serve"), "{exec}");
    // The arguments are the ones serve takes (an unknown user is the
    // first thing it would refuse, after parsing them all).
    let o = Command::new(recorder_bin())
        .args(&args)
        .arg("--help")
        .output()
        .expect("recorder");
    assert!(o.status.success(), "{}", text(&o));
    // systemd reads it as written, with the command where it is installed
    // replaced by this build.
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(!kernel_required(), "systemd-analyze is needed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("recorder-serve.service");
    std::fs::write(
        &copy,
        written.replace(
            "/usr/local/bin/recorder",
            &recorder_bin().display().to_string(),
        ),
    )
    .expect("copy");
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze");
    assert!(o.status.success(), "{}", text(&o));
}
