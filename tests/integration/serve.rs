//! `recorder serve` against Perfetto's own `perfetto` client (tracebox
//! v58.2): sessions recorded and read back through the consumer socket,
//! `--query`, concurrent clients, another uid, refusals the client prints.
//! Every trace goes through both decoders and trace processor.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, decode, kernel_required, python_summary, skip_unless, test_counters};
use crate::trace_processor;

/// The service user of root runs: neither root nor the attacker's nobody.
const SERVICE_UID: u32 = 61_234;
const NOBODY: &str = "65534";

/// Perfetto's all-in-one binary: `RECORDER_TRACEBOX`, else `tracebox` on
/// `$PATH`.
pub(crate) fn tracebox() -> Option<PathBuf> {
    match std::env::var_os("RECORDER_TRACEBOX") {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.exists()),
        None => common::on_path("tracebox"),
    }
}

/// Why the serve tests cannot run Perfetto's client and services, if they
/// cannot.
pub(crate) fn missing() -> Option<String> {
    tracebox()
        .is_none()
        .then(|| "no tracebox (set RECORDER_TRACEBOX, or put tracebox on PATH)".into())
}

/// A running `recorder serve` on private sockets; stopped with SIGTERM.
pub(crate) struct Serve {
    pub(crate) child: Option<Child>,
    pub(crate) dir: tempfile::TempDir,
}

impl Serve {
    pub(crate) fn start() -> Serve {
        Serve::start_with(&[])
    }

    /// [`Serve::start`] with extra environment.
    pub(crate) fn start_with(env: &[(&str, &str)]) -> Serve {
        let dir = tempfile::tempdir().expect("tempdir");
        // The dropped service user and other test users reach the sockets.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .expect("chmod");
        let mut c = Command::new(common::recorder_bin());
        c.arg("serve")
            .arg("--consumer-socket")
            .arg(dir.path().join("consumer.sock"))
            .arg("--producer-socket")
            .arg(dir.path().join("producer.sock"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).expect("log"))
            .env("RUST_LOG", "info")
            .envs(env.iter().copied());
        if is_root() {
            c.arg("--user").arg(SERVICE_UID.to_string());
        }
        let child = c.spawn().expect("spawn recorder serve");
        let s = Serve {
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(s.consumer()).is_err() {
            assert!(
                Instant::now() < deadline,
                "serve did not listen: {}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    fn consumer(&self) -> PathBuf {
        self.dir.path().join("consumer.sock")
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// `perfetto ARGS` against this service, as `uid` (setpriv) or as us.
    pub(crate) fn perfetto(&self, uid: Option<&str>, args: &[&str]) -> Command {
        let tb = tracebox().expect("tracebox");
        let mut c = match uid {
            Some(u) => crate::hardening::as_user(u, tb),
            None => Command::new(tb),
        };
        c.arg("perfetto")
            .args(args)
            .env("PERFETTO_CONSUMER_SOCK_NAME", self.consumer())
            .env("PERFETTO_PRODUCER_SOCK_NAME", self.path("producer.sock"))
            .stdin(Stdio::null());
        c
    }

    /// Writes `config` (text) as NAME.pbtx, readable by every client uid.
    fn write_config(&self, name: &str, config: &str) -> PathBuf {
        let cfg = self.path(&format!("{name}.pbtx"));
        std::fs::write(&cfg, config).expect("config");
        std::fs::set_permissions(&cfg, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .expect("chmod");
        cfg
    }

    /// Writes `config` (text) as NAME.pbtx and starts `perfetto --txt -c
    /// NAME.pbtx -o NAME.pftrace`, as `uid` or as us.
    pub(crate) fn spawn_client(
        &self,
        uid: Option<&str>,
        name: &str,
        config: &str,
    ) -> (Child, PathBuf) {
        let cfg = self.write_config(name, config);
        let out = self.path(&format!("{name}.pftrace"));
        let child = self
            .perfetto(uid, &["--txt", "-c"])
            .arg(&cfg)
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("perfetto");
        (child, out)
    }

    /// Writes `config` (text) and runs `perfetto --txt -c CFG -o OUT`.
    fn record(&self, name: &str, config: &str) -> (Output, PathBuf) {
        self.record_as(None, name, config)
    }

    /// [`record`](Self::record) as `uid` (None: as us).
    fn record_as(&self, uid: Option<&str>, name: &str, config: &str) -> (Output, PathBuf) {
        let cfg = self.write_config(name, config);
        let out = self.path(&format!("{name}.pftrace"));
        let o = output_within(
            self.perfetto(uid, &["--txt", "-c"])
                .arg(&cfg)
                .arg("-o")
                .arg(&out),
            Duration::from_secs(60),
        );
        (o, out)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&c),
                rustix::process::Signal::TERM,
            );
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn output_within(c: &mut Command, limit: Duration) -> Output {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_within(child, limit)
}

pub(crate) fn wait_within(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().expect("output");
            panic!(
                "did not finish within {limit:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sched_switch events of a trace, typed or in the compact form
/// (traced_probes and compact_sched configs write the latter).
pub(crate) fn sched_switches(packets: &[perfetto_protos::trace_packet::TracePacket]) -> usize {
    packets
        .iter()
        .filter(|p| p.has_ftrace_events())
        .map(|p| {
            let b = p.ftrace_events();
            b.event.iter().filter(|e| e.has_sched_switch()).count()
                + b.compact_sched.switch_timestamp.len()
        })
        .sum()
}

pub(crate) fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The packet kinds the Python decoder counts.
fn kinds(path: &Path) -> Option<serde_json::Map<String, serde_json::Value>> {
    python_summary(path).map(|s| s["kinds"].as_object().cloned().unwrap_or_default())
}

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

#[test]
fn the_stock_client_records_a_ring_buffer_session_through_serve() {
    if common::skip_unless_peer(missing()) {
        return;
    }
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
    if common::skip_unless_peer(missing()) {
        return;
    }
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
    if common::skip_unless_peer(missing()) || skip_unless(common::need_root()) {
        return;
    }
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
    let deadline = Instant::now() + Duration::from_secs(10);
    let root_view = loop {
        let o = output_within(
            &mut serve.perfetto(None, &["--query"]),
            Duration::from_secs(10),
        );
        let t = text(&o);
        if t.contains("roots_session") || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
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
    // Nor can it reach that session: attaching is refused, and the same
    // unique name is taken.
    let o = output_within(
        &mut serve.perfetto(Some(NOBODY), &["--attach=roots_session", "--stop"]),
        Duration::from_secs(10),
    );
    assert!(!o.status.success(), "attach by another uid: {}", text(&o));
    let (o, _) = serve.record_as(
        Some(NOBODY),
        "theirs",
        "buffers { size_kb: 64 }\nduration_ms: 500\nunique_session_name: \"roots_session\"\n\
         data_sources { config { name: \"for_testing\" } }\n",
    );
    assert!(
        text(&o).contains("already running"),
        "a taken unique_session_name: {}",
        text(&o)
    );

    // Root's session ran to its end with all its data.
    let o = wait_within(long, Duration::from_secs(60));
    assert!(o.status.success(), "root's session: {}", text(&o));
    let packets = decode(&std::fs::read(&out).expect("trace"));
    assert_eq!(
        test_counters(&packets)
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        20
    );
    trace_processor::check(&out);
}

#[test]
fn ctrl_c_on_the_client_ends_the_session_with_its_data() {
    if common::skip_unless_peer(missing()) {
        return;
    }
    let serve = Serve::start();
    let started = Instant::now();
    let (child, out) = serve.spawn_client(
        None,
        "long",
        r#"
buffers { size_kb: 1024 }
duration_ms: 120000
data_sources { config { name: "for_testing" for_testing { message_count: 50 message_size: 16 } } }
data_sources { config { name: "linux.sys_stats"
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE } } }
"#,
    );
    std::thread::sleep(Duration::from_millis(1500));
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
    assert_eq!(
        test_counters(&packets)
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        50
    );
    assert!(packets.iter().filter(|p| p.has_sys_stats()).count() >= 5);
    trace_processor::check(&out);
}

#[test]
fn what_serve_refuses_the_client_prints() {
    if common::skip_unless_peer(missing()) {
        return;
    }
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
    if common::skip_unless_peer(missing()) {
        return;
    }
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
    std::thread::sleep(Duration::from_millis(200));
    let (o, _) = if is_root() {
        // Root's idle connections do not keep nobody out.
        serve.record_as(
            Some(NOBODY),
            "n",
            "buffers { size_kb: 64 }\nduration_ms: 300\ndata_sources { config { name: \"for_testing\" for_testing { message_count: 5 } } }\n",
        )
    } else {
        drop(idle);
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
    if common::skip_unless_peer(missing()) {
        return;
    }
    let app_bin = crate::producers::sdk_app();
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
    let mut app = Command::new(app_bin)
        .args(["--packets", &N.to_string(), "--shmem-kb", "4096"])
        .env("PERFETTO_PRODUCER_SOCK_NAME", serve.path("producer.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("SDK app");
    let app_pid = app.id();
    let mut lines = std::io::BufReader::new(app.stdout.take().expect("stdout"));
    let mut wrote = false;
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut lines, &mut line).unwrap_or(0) > 0 {
        if line.starts_with(&format!("wrote {N}")) {
            wrote = true;
            break;
        }
        line.clear();
    }
    assert!(wrote, "the app did not write: {}", serve.log());
    // While the session runs, --query lists the app and its data source.
    let q = output_within(
        &mut serve.perfetto(None, &["--query"]),
        Duration::from_secs(10),
    );
    assert!(text(&q).contains("recorder.test.sequence"), "{}", text(&q));
    let o = wait_within(client, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    let _ = app.kill();
    let _ = app.wait();
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
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn traced_probes_records_ftrace_as_a_producer_of_serve() {
    if common::skip_unless_peer(missing()) || skip_unless(common::need_root()) {
        return;
    }
    let tracefs = Path::new("/sys/kernel/tracing");
    if skip_unless((!tracefs.join("instances").is_dir()).then(|| "no tracefs".to_string())) {
        return;
    }
    let name = format!("recorder-serve-test-{}", std::process::id());
    let instance = Instance(tracefs.join("instances").join(&name));
    std::fs::create_dir(&instance.0).expect("tracefs instance");
    let serve = Serve::start();
    let probes_log = std::fs::File::create(serve.path("probes.log")).expect("log");
    let mut probes = Command::new(tracebox().expect("tracebox"))
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
    if common::skip_unless_peer(missing()) {
        return;
    }
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
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        sizes.push(std::fs::metadata(&out).map_or(0, |m| m.len()));
    }
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
    let child = serve
        .perfetto(None, &["--txt", "-c"])
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perfetto");
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
        packets.iter().filter(|p| common::is_padding(p)).count(),
    )
}

#[test]
fn a_write_into_file_session_onto_a_disk_file_bypasses_the_page_cache() {
    if common::skip_unless_peer(missing()) {
        return;
    }
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
    if common::skip_unless_peer(missing()) {
        return;
    }
    if skip_unless((!Path::new("/dev/shm").is_dir()).then(|| "no /dev/shm".to_string())) {
        return;
    }
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
    if common::skip_unless_peer(missing()) {
        return;
    }
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
    std::thread::sleep(Duration::from_millis(1000));
    let t = output_within(
        Command::new(tracebox().expect("tracebox"))
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
    assert_eq!(
        test_counters(&packets)
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        30
    );
    if let Some(tp) = trace_processor::check(&out) {
        let names: Vec<String> = tp.triggers().into_iter().map(|t| t.0).collect();
        assert_eq!(names, ["serve_test_stop"]);
    }
}

#[test]
fn sigterm_to_the_service_ends_running_sessions_with_their_data() {
    if common::skip_unless_peer(missing()) {
        return;
    }
    let mut serve = Serve::start();
    let (child, out) = serve.spawn_client(
        None,
        "long",
        r#"
buffers { size_kb: 1024 }
duration_ms: 120000
data_sources { config { name: "for_testing" for_testing { message_count: 40 } } }
"#,
    );
    std::thread::sleep(Duration::from_millis(1500));
    let mut service = serve.child.take().expect("serve");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&service),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    let o = wait_within(child, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o));
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = service.try_wait().expect("wait") {
            break st;
        }
        assert!(Instant::now() < deadline, "serve did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}: {}", serve.log());
    assert!(!serve.consumer().exists(), "the consumer socket is removed");
    assert!(!serve.path("producer.sock").exists());
    let packets = decode(&std::fs::read(&out).expect("trace"));
    assert_eq!(
        test_counters(&packets)
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        40
    );
    trace_processor::check(&out);
}

#[test]
fn a_uids_session_quota_refuses_only_that_uid() {
    if common::skip_unless_peer(missing()) || skip_unless(common::need_root()) {
        return;
    }
    let serve = Serve::start();
    let clients: Vec<Child> = (0..recorder::consumer::MAX_SESSIONS_PER_UID)
        .map(|i| {
            serve
                .spawn_client(
                    None,
                    &format!("q{i}"),
                    "buffers { size_kb: 256 }\nduration_ms: 60000\n\
                     data_sources { config { name: \"for_testing\" for_testing { message_count: 3 } } }\n",
                )
                .0
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = output_within(
            &mut serve.perfetto(None, &["--query"]),
            Duration::from_secs(10),
        );
        let started = text(&o).matches("STARTED").count();
        if started >= recorder::consumer::MAX_SESSIONS_PER_UID {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sessions did not start: {}",
            text(&o)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // (The queries' connections are let go of first: they count against
    // root's connection quota until their threads end.)
    std::thread::sleep(Duration::from_millis(500));
    // One more for root is refused, with the reason.
    let (o, _) = serve.record(
        "sixth",
        "buffers { size_kb: 64 }\nduration_ms: 300\ndata_sources { config { name: \"for_testing\" } }\n",
    );
    assert!(
        text(&o).contains("too many concurrent tracing sessions for uid 0"),
        "{}",
        text(&o)
    );
    // Another uid is not affected.
    let (o, theirs) = serve.record_as(
        Some(NOBODY),
        "theirs",
        "buffers { size_kb: 64 }\nduration_ms: 300\n\
         data_sources { config { name: \"for_testing\" for_testing { message_count: 7 } } }\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        test_counters(&decode(&std::fs::read(&theirs).expect("trace")))
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        7
    );
    // Root's sessions end on Ctrl-C with their data.
    for (i, c) in clients.into_iter().enumerate() {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&c),
            rustix::process::Signal::INT,
        )
        .expect("SIGINT");
        let o = wait_within(c, Duration::from_secs(30));
        assert!(o.status.success(), "{}", text(&o));
        let p = decode(&std::fs::read(serve.path(&format!("q{i}.pftrace"))).expect("trace"));
        assert_eq!(test_counters(&p).values().map(Vec::len).sum::<usize>(), 3);
    }
}

/// The ConsumerPort spoken by hand, as the Perfetto UI and other consumer
/// API users speak it: frames over a byte transport (the consumer socket,
/// or the websocket bridge in front of it).
mod port {
    use prost::Message;
    use recorder::ipc::frame::{FrameDecoder, encode_frame};
    use recorder::protos::{self, IpcFrame, ipc_frame::Msg};
    use std::collections::HashMap;

    /// Moves whole messages of bytes each way.
    pub trait Transport {
        fn send(&mut self, bytes: &[u8]);
        /// The next bytes the peer sent; panics on a closed transport.
        fn recv(&mut self) -> Vec<u8>;
    }

    impl Transport for std::os::unix::net::UnixStream {
        fn send(&mut self, bytes: &[u8]) {
            std::io::Write::write_all(self, bytes).expect("send");
        }
        fn recv(&mut self) -> Vec<u8> {
            let mut buf = vec![0u8; 256 * 1024];
            let n = std::io::Read::read(self, &mut buf).expect("read");
            assert!(n > 0, "the service closed the connection");
            buf.truncate(n);
            buf
        }
    }

    /// A reply to one method call.
    #[derive(Debug)]
    pub struct Reply {
        pub success: bool,
        pub has_more: bool,
        pub proto: Vec<u8>,
    }

    pub struct Consumer<T: Transport> {
        pub t: T,
        dec: FrameDecoder,
        next: u64,
        methods: HashMap<String, u32>,
        service: u32,
        /// Replies that arrived for a request other than the awaited one.
        early: Vec<(u64, Reply)>,
    }

    impl<T: Transport> Consumer<T> {
        /// Binds the ConsumerPort over `t`.
        pub fn bind(t: T) -> Self {
            let mut c = Consumer {
                t,
                dec: FrameDecoder::new(),
                next: 0,
                methods: HashMap::new(),
                service: 0,
                early: Vec::new(),
            };
            let id = c.frame(Msg::MsgBindService(protos::ipc_frame::BindService {
                service_name: Some("ConsumerPort".into()),
            }));
            let f = c.next_frame();
            assert_eq!(f.request_id, Some(id));
            let Some(Msg::MsgBindServiceReply(r)) = f.msg else {
                panic!("not a bind reply: {f:?}");
            };
            assert_eq!(r.success, Some(true));
            c.service = r.service_id.unwrap_or(0);
            for m in r.methods {
                c.methods
                    .insert(m.name.unwrap_or_default(), m.id.unwrap_or(0));
            }
            c
        }

        fn frame(&mut self, msg: Msg) -> u64 {
            self.next += 1;
            let f = IpcFrame {
                request_id: Some(self.next),
                msg: Some(msg),
                data_for_testing: Vec::new(),
            };
            let bytes = encode_frame(&f).expect("encode");
            self.t.send(&bytes);
            self.next
        }

        fn next_frame(&mut self) -> IpcFrame {
            loop {
                if let Some(f) = self.dec.next_frame().expect("a well-formed frame") {
                    return f;
                }
                let b = self.t.recv();
                self.dec.feed(&b);
            }
        }

        /// Sends `method(args)`; returns the request id.
        pub fn call(&mut self, method: &str, args: &impl Message) -> u64 {
            let method_id = *self
                .methods
                .get(method)
                .expect("the service has the method");
            self.frame(Msg::MsgInvokeMethod(protos::ipc_frame::InvokeMethod {
                service_id: Some(self.service),
                method_id: Some(method_id),
                args_proto: Some(args.encode_to_vec()),
                drop_reply: None,
            }))
        }

        /// The next reply to request `id`.
        pub fn reply(&mut self, id: u64) -> Reply {
            if let Some(i) = self.early.iter().position(|(r, _)| *r == id) {
                return self.early.remove(i).1;
            }
            loop {
                let f = self.next_frame();
                let Some(Msg::MsgInvokeMethodReply(r)) = f.msg else {
                    panic!("not a method reply: {f:?}");
                };
                let reply = Reply {
                    success: r.success == Some(true),
                    has_more: r.has_more == Some(true),
                    proto: r.reply_proto.unwrap_or_default(),
                };
                if f.request_id == Some(id) {
                    return reply;
                }
                self.early.push((f.request_id.unwrap_or(0), reply));
            }
        }

        /// Calls and waits for the (single) reply.
        pub fn ask(&mut self, method: &str, args: &impl Message) -> Reply {
            let id = self.call(method, args);
            self.reply(id)
        }

        /// ReadBuffers: every packet returned, as `0x0a <len> <packet>`
        /// records (what the `perfetto` client writes).
        pub fn read_buffers(&mut self) -> Vec<u8> {
            let id = self.call("ReadBuffers", &protos::ReadBuffersRequest {});
            let mut out = Vec::new();
            let mut packet = Vec::new();
            loop {
                let r = self.reply(id);
                assert!(r.success, "ReadBuffers failed");
                let rb = protos::ReadBuffersResponse::decode(r.proto.as_slice()).expect("reply");
                for s in rb.slices {
                    packet.extend_from_slice(s.data());
                    if s.last_slice_for_packet() {
                        out.extend(recorder::wire::framing::record(&packet));
                        packet.clear();
                    }
                }
                if !r.has_more {
                    assert!(packet.is_empty(), "a packet left unfinished");
                    return out;
                }
            }
        }
    }
}

/// The SDK test app, started against `serve`'s producer socket with
/// `args`; returns it once it said `wrote N`.
fn sdk_app_wrote(serve: &Serve, args: &[&str]) -> Child {
    let mut app = Command::new(crate::producers::sdk_app())
        .args(args)
        .env("PERFETTO_PRODUCER_SOCK_NAME", serve.path("producer.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("SDK app");
    let mut lines = std::io::BufReader::new(app.stdout.take().expect("stdout"));
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut lines, &mut line).unwrap_or(0) > 0 {
        if line.starts_with("wrote ") {
            // The rest of its output is not needed; keep the pipe drained.
            std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
            return app;
        }
        line.clear();
    }
    let _ = app.kill();
    let _ = app.wait();
    panic!("the app did not write: {}", serve.log());
}

/// A text TraceConfig as the bytes a consumer sends (Perfetto's schema,
/// through the independent decoder's text format).
fn text_config(s: &str) -> Vec<u8> {
    let c: perfetto_protos::trace_config::TraceConfig =
        protobuf::text_format::parse_from_str(s).expect("a text config");
    protobuf::Message::write_to_bytes(&c).expect("encode")
}

#[test]
fn a_running_session_is_flushed_and_read_while_it_records() {
    const N: u64 = 300;
    if common::skip_unless_peer(missing()) {
        return;
    }
    use prost::Message;
    use recorder::protos;
    let serve = Serve::start();
    let mut c = port::Consumer::bind(
        std::os::unix::net::UnixStream::connect(serve.consumer()).expect("connect"),
    );
    let cfg = text_config(
        r#"
buffers { size_kb: 8192 fill_policy: RING_BUFFER }
flush_timeout_ms: 5000
data_sources { config { name: "recorder.test.sequence" } }
data_sources { config { name: "for_testing"
  for_testing { message_count: 100000 max_messages_per_second: 20 } } }
"#,
    );
    let enable = c.call(
        "EnableTracing",
        &protos::EnableTracingRequest {
            trace_config: Some(cfg),
            attach_notification_only: None,
        },
    );
    // The app's packets stay in its open chunks: only the service's flush
    // (its acks and the scrape that ends it) brings them to the buffer.
    let mut app = sdk_app_wrote(
        &serve,
        &[
            "--packets",
            &N.to_string(),
            "--no-commit",
            "--on-flush",
            "--linger-secs",
            "30",
            "--wait-secs",
            "30",
        ],
    );
    let app_pid = app.id();
    let r = c.ask(
        "Flush",
        &protos::FlushRequest {
            timeout_ms: Some(5000),
            flags: None,
        },
    );
    assert!(r.success, "the flush failed: {}", serve.log());
    let first = c.read_buffers();
    let p1 = decode(&first);
    let from_app: Vec<u64> = p1
        .iter()
        .filter(|p| p.has_for_testing() && p.trusted_pid() as u32 == app_pid)
        .map(|p| p.for_testing().counter())
        .collect();
    assert_eq!(from_app, (0..N).collect::<Vec<_>>(), "{}", serve.log());
    let builtin = |ps: &[perfetto_protos::trace_packet::TracePacket]| -> Vec<u64> {
        ps.iter()
            .filter(|p| p.has_for_testing() && p.trusted_pid() as u32 != app_pid)
            .map(|p| p.for_testing().counter())
            .collect()
    };
    let b1 = builtin(&p1);
    assert!(!b1.is_empty(), "the built-in source writes");
    // A second read goes on where the first ended: only what came since.
    std::thread::sleep(Duration::from_millis(700));
    let second = c.read_buffers();
    let p2 = decode(&second);
    let b2 = builtin(&p2);
    assert!(!b2.is_empty(), "nothing new in the second read");
    assert_eq!(b2[0], b1.last().map_or(0, |l| l + 1), "{b1:?} then {b2:?}");
    assert!(!p2.iter().any(|p| p.has_trace_config()), "the head again");
    // The end: the held EnableTracing reply, then the rest.
    let r = c.ask("DisableTracing", &protos::DisableTracingRequest {});
    assert!(r.success);
    let r = c.reply(enable);
    let resp = protos::EnableTracingResponse::decode(r.proto.as_slice()).expect("reply");
    assert_eq!(resp.error, None);
    let last = c.read_buffers();
    let _ = app.kill();
    let _ = app.wait();
    let mut all = first;
    all.extend(second);
    all.extend(last);
    let out = serve.path("read_while_running.pftrace");
    std::fs::write(&out, &all).expect("write");
    let packets = decode(&all);
    assert_eq!(
        packets.iter().filter(|p| p.has_trace_config()).count(),
        1,
        "one head"
    );
    assert!(packets.iter().rev().any(|p| p.has_trace_stats()));
    let b = builtin(&packets);
    assert_eq!(
        b,
        (0..b.len() as u64).collect::<Vec<_>>(),
        "no gap, no repeat"
    );
    if let Some(k) = kinds(&out) {
        assert!(k.get("for_testing").and_then(|v| v.as_u64()).unwrap_or(0) >= N);
    }
    trace_processor::check(&out);
}

#[test]
fn a_detached_session_outlives_its_client_and_only_its_uid_attaches() {
    if common::skip_unless_peer(missing()) || skip_unless(common::need_root()) {
        return;
    }
    let serve = Serve::start();
    let cfg = serve.path("detach.pbtx");
    std::fs::write(
        &cfg,
        r#"
buffers { size_kb: 1024 }
duration_ms: 60000
write_into_file: true
file_write_period_ms: 500
unique_session_name: "detached_one"
data_sources { config { name: "for_testing"
  for_testing { message_count: 100000 max_messages_per_second: 20 } } }
"#,
    )
    .expect("config");
    let out = serve.path("detach.pftrace");
    let started = Instant::now();
    let o = output_within(
        serve
            .perfetto(None, &["--detach=k1", "--txt", "-c"])
            .arg(&cfg)
            .arg("-o")
            .arg(&out),
        Duration::from_secs(20),
    );
    assert!(o.status.success(), "--detach: {}", text(&o));
    // The client is gone; the session records on.
    std::thread::sleep(Duration::from_millis(1500));
    let q = output_within(
        &mut serve.perfetto(None, &["--query"]),
        Duration::from_secs(10),
    );
    assert!(text(&q).contains("detached_one"), "{}", text(&q));
    let grown = std::fs::metadata(&out).map_or(0, |m| m.len());
    assert!(grown > 0, "the detached session writes its file");
    let o = output_within(
        &mut serve.perfetto(None, &["--is_detached=k1"]),
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(0), "is detached: {}", text(&o));
    // Keys are per uid: another uid finds nothing under this key, and
    // cannot stop the session.
    for args in [&["--is_detached=k1"][..], &["--attach=k1", "--stop"][..]] {
        let o = output_within(
            &mut serve.perfetto(Some(NOBODY), args),
            Duration::from_secs(10),
        );
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?} by another uid: {}",
            text(&o)
        );
    }
    // An unknown key of our own: not found either.
    let o = output_within(
        &mut serve.perfetto(None, &["--is_detached=k2"]),
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // The owner attaches and stops it: flush, disable, the end.
    let o = output_within(
        &mut serve.perfetto(None, &["--attach=k1", "--stop"]),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "--attach --stop: {}", text(&o));
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "stopped, not ended"
    );
    let o = output_within(
        &mut serve.perfetto(None, &["--is_detached=k1"]),
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(2), "attached and gone: {}", text(&o));
    let packets = decode(&std::fs::read(&out).expect("trace"));
    let counters = test_counters(&packets);
    let seq = counters.values().next().cloned().unwrap_or_default();
    assert!(seq.len() >= 20, "{seq:?}");
    assert_eq!(seq, (0..seq.len() as u64).collect::<Vec<_>>());
    assert!(packets.iter().rev().any(|p| p.has_trace_stats()));
    if let Some(k) = kinds(&out) {
        assert_eq!(
            k.get("for_testing").and_then(|v| v.as_u64()),
            Some(seq.len() as u64)
        );
    }
    trace_processor::check(&out);
}

#[test]
fn clone_copies_a_running_session_that_records_on() {
    if common::skip_unless_peer(missing()) || skip_unless(common::need_root()) {
        return;
    }
    use prost::Message;
    use recorder::protos;
    let serve = Serve::start();
    let (orig, orig_out) = serve.spawn_client(
        None,
        "orig",
        r#"
buffers { size_kb: 2048 fill_policy: RING_BUFFER }
duration_ms: 60000
unique_session_name: "to_clone"
data_sources { config { name: "for_testing"
  for_testing { message_count: 100000 max_messages_per_second: 20 } } }
data_sources { config { name: "linux.sys_stats"
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE } } }
"#,
    );
    std::thread::sleep(Duration::from_millis(1500));
    let counted = |path: &Path| -> Vec<u64> {
        let packets = decode(&std::fs::read(path).expect("trace"));
        assert!(packets.iter().any(|p| p.has_trace_config()), "a head");
        assert!(packets.iter().rev().any(|p| p.has_trace_stats()));
        assert!(packets.iter().any(|p| p.has_sys_stats()));
        let seq = test_counters(&packets)
            .values()
            .next()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            seq,
            (0..seq.len() as u64).collect::<Vec<_>>(),
            "from 0, whole"
        );
        seq
    };
    // By name, with the stock client.
    let c1 = serve.path("clone1.pftrace");
    let o = output_within(
        serve
            .perfetto(None, &["--clone-by-name", "to_clone", "-o"])
            .arg(&c1),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let first = counted(&c1);
    assert!(!first.is_empty(), "{}", serve.log());
    trace_processor::check(&c1);
    // By id (as --query lists it), later: the original recorded on, and
    // the first clone took nothing away from it.
    let mut q = port::Consumer::bind(
        std::os::unix::net::UnixStream::connect(serve.consumer()).expect("connect"),
    );
    let r = q.ask(
        "QueryServiceState",
        &protos::QueryServiceStateRequest {
            sessions_only: Some(true),
        },
    );
    let st = protos::QueryServiceStateResponse::decode(r.proto.as_slice())
        .expect("state")
        .service_state
        .expect("service_state");
    let id = st
        .tracing_sessions
        .iter()
        .find(|s| s.unique_session_name.as_deref() == Some("to_clone"))
        .and_then(|s| s.id)
        .expect("listed");
    drop(q);
    std::thread::sleep(Duration::from_millis(500));
    let c2 = serve.path("clone2.pftrace");
    let o = output_within(
        serve
            .perfetto(None, &["--clone", &id.to_string(), "-o"])
            .arg(&c2),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let second = counted(&c2);
    assert!(
        second.len() > first.len(),
        "{} then {}",
        first.len(),
        second.len()
    );
    if let Some(k) = kinds(&c2) {
        assert_eq!(
            k.get("for_testing").and_then(|v| v.as_u64()),
            Some(second.len() as u64)
        );
    }
    trace_processor::check(&c2);
    // Another uid finds nothing to clone.
    let theirs = serve.path("theirs.pftrace");
    let o = output_within(
        serve
            .perfetto(Some(NOBODY), &["--clone-by-name", "to_clone", "-o"])
            .arg(&theirs),
        Duration::from_secs(30),
    );
    assert!(
        text(&o).contains("no running tracing session"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::metadata(&theirs).map_or(0, |m| m.len()), 0);
    // The original ends with everything from the start.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&orig),
        rustix::process::Signal::INT,
    )
    .expect("SIGINT");
    let o = wait_within(orig, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o));
    let all = counted(&orig_out);
    assert!(all.len() > second.len());
    trace_processor::check(&orig_out);
}

/// A minimal websocket client (RFC 6455): what the Perfetto UI's record
/// page opens to `websocket_bridge`, whose `/traced` endpoint passes each
/// binary message's bytes to the consumer socket and back.
struct Websocket {
    tcp: std::net::TcpStream,
    /// Bytes read and not yet parsed as frames.
    pending: Vec<u8>,
}

impl Websocket {
    fn connect(addr: &str, path: &str) -> std::io::Result<Websocket> {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(addr)?;
        // The key must be 16 bytes in base64: the bridge refuses others.
        tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: cmVjb3JkZXItc2VydmUtMQ==\r\nSec-WebSocket-Version: 13\r\n\
             Origin: https://ui.perfetto.dev\r\n\r\n"
        )?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if tcp.read(&mut byte)? == 0 {
                return Err(std::io::Error::other("closed during the handshake"));
            }
            head.push(byte[0]);
        }
        let status = String::from_utf8_lossy(&head);
        if !status.starts_with("HTTP/1.1 101") {
            return Err(std::io::Error::other(format!("no upgrade: {status}")));
        }
        Ok(Websocket {
            tcp,
            pending: Vec::new(),
        })
    }
}

impl port::Transport for Websocket {
    /// One binary message, masked as a client must.
    fn send(&mut self, bytes: &[u8]) {
        let mask: [u8; 4] = rand_mask();
        let mut f = vec![0x82];
        match bytes.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= 0xffff => {
                f.push(0x80 | 126);
                f.extend((n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend((n as u64).to_be_bytes());
            }
        }
        f.extend(mask);
        f.extend(bytes.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        std::io::Write::write_all(&mut self.tcp, &f).expect("websocket send");
    }

    /// The payload of the next data frame (control frames skipped; a close
    /// frame is the end).
    fn recv(&mut self) -> Vec<u8> {
        loop {
            if let Some((opcode, payload, used)) = parse_ws_frame(&self.pending) {
                self.pending.drain(..used);
                match opcode {
                    0x0..=0x2 => return payload,
                    0x8 => panic!("the bridge closed the websocket"),
                    _ => continue,
                }
            }
            let mut buf = [0u8; 65536];
            let n = std::io::Read::read(&mut self.tcp, &mut buf).expect("websocket read");
            assert!(n > 0, "the bridge closed the connection");
            self.pending.extend_from_slice(&buf[..n]);
        }
    }
}

fn rand_mask() -> [u8; 4] {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    t.to_le_bytes()
}

/// (opcode, payload, bytes used) of the first whole frame in `b`.
fn parse_ws_frame(b: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    if b.len() < 2 {
        return None;
    }
    let opcode = b[0] & 0x0f;
    let masked = b[1] & 0x80 != 0;
    let (len, mut at) = match b[1] & 0x7f {
        126 => (u16::from_be_bytes([*b.get(2)?, *b.get(3)?]) as usize, 4),
        127 => (
            u64::from_be_bytes(b.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    let mask = if masked {
        let m: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        at += 4;
        Some(m)
    } else {
        None
    };
    let data = b.get(at..at + len)?;
    let payload = match mask {
        Some(m) => data.iter().enumerate().map(|(i, x)| x ^ m[i % 4]).collect(),
        None => data.to_vec(),
    };
    Some((opcode, payload, at + len))
}

/// `tracebox websocket_bridge` in front of `serve`; killed on drop. Its
/// port is fixed (8037), so one bridge at a time.
struct Bridge(Child);

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const BRIDGE: &str = "127.0.0.1:8037";

#[test]
fn the_ui_records_through_websocket_bridge() {
    if common::skip_unless_peer(missing()) {
        return;
    }
    if std::net::TcpStream::connect(BRIDGE).is_ok() {
        // Someone else's bridge would talk to someone else's service.
        assert!(
            !kernel_required(),
            "port 8037 is taken: the bridge cannot start"
        );
        eprintln!("skipped: port 8037 is taken");
        return;
    }
    use prost::Message;
    use recorder::protos;
    let serve = Serve::start();
    let _bridge = Bridge(
        Command::new(tracebox().expect("tracebox"))
            .arg("websocket_bridge")
            .env("PERFETTO_CONSUMER_SOCK_NAME", serve.consumer())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("websocket_bridge"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(BRIDGE).is_err() {
        assert!(Instant::now() < deadline, "the bridge did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let ws = || port::Consumer::bind(Websocket::connect(BRIDGE, "/traced").expect("websocket"));
    let mut ui = ws();
    // What the record page asks first: the service and its data sources.
    let r = ui.ask(
        "QueryServiceState",
        &protos::QueryServiceStateRequest::default(),
    );
    let st = protos::QueryServiceStateResponse::decode(r.proto.as_slice())
        .expect("state")
        .service_state
        .expect("service_state");
    let names: Vec<String> = st
        .data_sources
        .iter()
        .filter_map(|d| d.ds_descriptor.as_ref()?.name.clone())
        .collect();
    assert!(names.iter().any(|n| n == "linux.sys_stats"), "{names:?}");
    let cfg = text_config(
        r#"
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
duration_ms: 60000
unique_session_name: "from_the_ui"
data_sources { config { name: "linux.process_stats"
  process_stats_config { scan_all_processes_on_start: true } } }
data_sources { config { name: "linux.sys_stats"
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE
                     stat_period_ms: 100 stat_counters: STAT_CPU_TIMES } } }
data_sources { config { name: "for_testing"
  for_testing { message_count: 100000 max_messages_per_second: 50 } } }
"#,
    );
    let enable = ui.call(
        "EnableTracing",
        &protos::EnableTracingRequest {
            trace_config: Some(cfg),
            attach_notification_only: None,
        },
    );
    // The page polls the buffers' use while it records.
    let mut used = 0;
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(300));
        let r = ui.ask("GetTraceStats", &protos::GetTraceStatsRequest {});
        assert!(r.success, "GetTraceStats: {}", serve.log());
        let ts = protos::GetTraceStatsResponse::decode(r.proto.as_slice())
            .expect("stats")
            .trace_stats
            .expect("trace_stats");
        assert_eq!(ts.buffer_stats.len(), 1);
        assert_eq!(ts.buffer_stats[0].buffer_size, Some(4096 * 1024));
        used = ts.buffer_stats[0].bytes_written.unwrap_or(0);
    }
    assert!(used > 0, "nothing written in 1.2 s");
    // Its snapshot button: a clone by name, on a second connection.
    let mut snap = ws();
    let r = snap.ask(
        "CloneSession",
        &protos::CloneSessionRequest {
            unique_session_name: Some("from_the_ui".into()),
            ..Default::default()
        },
    );
    let cr = protos::CloneSessionResponse::decode(r.proto.as_slice()).expect("clone");
    assert_eq!(cr.success, Some(true), "{:?}", cr.error);
    let snapshot = snap.read_buffers();
    drop(snap);
    // Stop: Flush (initiator perfetto_cmd, reason trace stop), then
    // DisableTracing; the held EnableTracing reply; ReadBuffers.
    let r = ui.ask(
        "Flush",
        &protos::FlushRequest {
            timeout_ms: None,
            flags: Some((2 << 4) | 2),
        },
    );
    assert!(r.success, "Flush: {}", serve.log());
    let r = ui.ask("DisableTracing", &protos::DisableTracingRequest {});
    assert!(r.success);
    let r = ui.reply(enable);
    let resp = protos::EnableTracingResponse::decode(r.proto.as_slice()).expect("reply");
    assert_eq!(resp.error, None);
    let trace = ui.read_buffers();
    for (name, data) in [("ui.pftrace", &trace), ("ui_snapshot.pftrace", &snapshot)] {
        let out = serve.path(name);
        std::fs::write(&out, data).expect("write");
        let packets = decode(data);
        let counters = test_counters(&packets);
        let seq = counters.values().next().cloned().unwrap_or_default();
        assert!(!seq.is_empty(), "{name}: no for_testing packets");
        assert_eq!(seq, (0..seq.len() as u64).collect::<Vec<_>>(), "{name}");
        assert!(packets.iter().any(|p| p.has_process_tree()), "{name}");
        if let Some(k) = kinds(&out) {
            assert_eq!(
                k.get("for_testing").and_then(|v| v.as_u64()),
                Some(seq.len() as u64),
                "{name}"
            );
        }
        if let Some(tp) = trace_processor::check(&out) {
            assert!(
                tp.query("select count(*) from counter").scalar().int() > 5,
                "{name}"
            );
            assert!(
                tp.query("select count(*) from process").scalar().int() > 1,
                "{name}"
            );
        }
    }
    assert!(trace.len() > snapshot.len());
}

#[test]
fn the_systemd_unit_verifies_and_its_command_line_parses() {
    let unit = common::repo_root().join("contrib/recorder-serve.service");
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
    let o = Command::new(common::recorder_bin())
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
            &common::recorder_bin().display().to_string(),
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

#[test]
fn a_clone_snapshot_session_is_cloned_by_the_client_at_each_trigger() {
    if common::skip_unless_peer(missing()) {
        return;
    }
    let serve = Serve::start();
    let (client, out) = serve.spawn_client(
        None,
        "snap",
        r#"
buffers { size_kb: 1024 fill_policy: RING_BUFFER }
trigger_config { trigger_mode: CLONE_SNAPSHOT trigger_timeout_ms: 6000
  triggers { name: "serve_snap" stop_delay_ms: 100 } }
data_sources { config { name: "for_testing"
  for_testing { message_count: 100000 max_messages_per_second: 20 } } }
"#,
    );
    let trigger = || {
        let t = output_within(
            Command::new(tracebox().expect("tracebox"))
                .arg("trigger_perfetto")
                .arg("serve_snap")
                .env("PERFETTO_PRODUCER_SOCK_NAME", serve.path("producer.sock")),
            Duration::from_secs(20),
        );
        assert!(t.status.success(), "{}", text(&t));
    };
    std::thread::sleep(Duration::from_millis(1500));
    trigger();
    std::thread::sleep(Duration::from_millis(1500));
    trigger();
    let o = wait_within(client, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    // The session's own file stays empty; each hit is a clone beside it.
    assert_eq!(std::fs::metadata(&out).map_or(0, |m| m.len()), 0);
    let mut lens = Vec::new();
    for n in 0..2 {
        let snap = serve.path(&format!("snap.pftrace.{n}"));
        let data = std::fs::read(&snap)
            .unwrap_or_else(|e| panic!("{}: {e}: {}\n{}", snap.display(), text(&o), serve.log()));
        let packets = decode(&data);
        // The trigger that asked for it, as traced writes it in a clone.
        let trig: Vec<_> = packets
            .iter()
            .filter(|p| p.has_clone_snapshot_trigger())
            .collect();
        assert_eq!(trig.len(), 1, "snapshot {n}: its trigger");
        assert_eq!(
            trig[0].clone_snapshot_trigger().trigger_name(),
            "serve_snap"
        );
        let seq = test_counters(&packets)
            .values()
            .next()
            .cloned()
            .unwrap_or_default();
        assert!(!seq.is_empty(), "snapshot {n}");
        assert_eq!(seq, (0..seq.len() as u64).collect::<Vec<_>>());
        if let Some(k) = kinds(&snap) {
            assert_eq!(
                k.get("for_testing").and_then(|v| v.as_u64()),
                Some(seq.len() as u64)
            );
        }
        trace_processor::check(&snap);
        lens.push(seq.len());
    }
    assert!(lens[1] > lens[0], "{lens:?}");
}
