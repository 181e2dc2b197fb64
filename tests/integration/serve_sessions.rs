//! Sessions of `recorder serve` beyond one client's run: per-uid quotas,
//! sessions flushed and read while they record, detached and reattached,
//! cloned while running and at each trigger. Driven by Perfetto's `perfetto`
//! client and the ConsumerPort spoken by hand; every trace goes through
//! both decoders and trace processor.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::consumer_port as port;
use crate::harness::serve::{kinds, text_config};
use crate::harness::*;

#[test]
fn a_uids_session_quota_refuses_only_that_uid() {
    require!(need::tracebox(), need::root());
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
    serve.wait_started(recorder::consumer::MAX_SESSIONS_PER_UID);
    // The queries' connections count against root's connection quota until
    // their threads end, which nothing outside shows.
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
        assert_eq!(for_testing_count(&p), 3);
    }
}

/// The SDK test app, started against `serve`'s producer socket with
/// `args`; returns it once it said `wrote N`.
fn sdk_app_wrote(serve: &Serve, args: &[&str]) -> Child {
    let mut app = Command::new(sdk_app())
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

#[test]
fn a_running_session_is_flushed_and_read_while_it_records() {
    const N: u64 = 300;
    require!(need::tracebox());
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
    let written = c.bytes_written();
    wait_for(
        "more written after the first read",
        Duration::from_secs(20),
        || c.bytes_written() > written,
    );
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
    require!(need::tracebox(), need::root());
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
    // The client is gone; the session records on a while without it.
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
    require!(need::tracebox(), need::root());
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
    // The original records a while (sys_stats every 100 ms, 20 packets a
    // second) before its clones.
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
    // Its connection counts against root's quota until its thread ends,
    // which nothing outside shows.
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

#[test]
fn a_clone_snapshot_session_is_cloned_by_the_client_at_each_trigger() {
    require!(need::tracebox());
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
            Command::new(need::tracebox_path().expect("tracebox"))
                .arg("trigger_perfetto")
                .arg("serve_snap")
                .env("PERFETTO_PRODUCER_SOCK_NAME", serve.path("producer.sock")),
            Duration::from_secs(20),
        );
        assert!(t.status.success(), "{}", text(&t));
    };
    serve.wait_started(1);
    // Each snapshot holds a stretch of recording of its own.
    std::thread::sleep(Duration::from_millis(1500));
    trigger();
    // And the second one a stretch after the first.
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
