//! `recorder serve` as one service: what a hostile local user (uid 65534,
//! tests/attacker/hostile_consumer.py) tries against it costs that user
//! only, and the service scales past traced's limits on the threads of
//! one. Each attack asserts its bound and that a victim session of another
//! uid records everything and ends on time.

use crate::harness::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant};

/// Threads of process `pid`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// Resident memory of process `pid`, in KiB.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) of process `pid` so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15, the 12th and 13th after ")".
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    let hz = rustix::param::clock_ticks_per_second();
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// A binary TraceConfig made from `text`, in a file every uid can read.
fn binary_config(serve: &Serve, name: &str, text: &str) -> PathBuf {
    let loaded = recorder::config::load_text(text, name, false).expect("config");
    let p = serve.path(&format!("{name}.bin"));
    std::fs::write(&p, loaded.canonical_bytes()).expect("write");
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    p
}

/// The hostile consumer, as uid 65534, in a process group of its own (its
/// children go with it); its stdout lines.
struct Attacker {
    child: Child,
    lines: std::io::Lines<BufReader<ChildStdout>>,
}

impl Attacker {
    fn start(args: &[&str]) -> Attacker {
        Attacker::start_as(NOBODY, args)
    }

    fn start_as(uid: &str, args: &[&str]) -> Attacker {
        let script = repo_root().join("tests/attacker/hostile_consumer.py");
        let mut c = as_user(uid, python());
        c.arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        let mut child = c.spawn().expect("attacker");
        let out = child.stdout.take().expect("stdout");
        Attacker {
            child,
            lines: BufReader::new(out).lines(),
        }
    }

    /// Its next line (the reader blocks; the script always says something).
    fn line(&mut self) -> String {
        self.lines
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("the attacker ended without a word"))
    }

    fn json(&mut self) -> serde_json::Value {
        let l = self.line();
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}"))
    }

    /// Kills the client alone; what it forked lives on.
    fn kill_client(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let pg = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(pg, rustix::process::Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A victim: root's session of `n` for_testing packets at `rate` per
/// second, recorded through the stock client.
fn victim(serve: &Serve, name: &str, n: u32, rate: u32) -> (Child, PathBuf) {
    let config = format!(
        "buffers {{ size_kb: 1024 }}\nduration_ms: {}\n\
         data_sources {{ config {{ name: \"for_testing\" for_testing {{ message_count: {n} \
         max_messages_per_second: {rate} }} }} }}\n",
        n * 1000 / rate + 1500
    );
    serve.spawn_client(None, name, &config)
}

/// The victim ended on time with every one of its `n` packets.
fn victim_complete(child: Child, out: &Path, n: u32, limit: Duration) {
    let o = wait_within(child, limit);
    assert!(o.status.success(), "the victim's client: {}", text(&o));
    let packets = decode(&std::fs::read(out).expect("victim trace"));
    let counters: usize = for_testing_count(&packets);
    assert_eq!(counters, n as usize, "the victim lost packets");
}

/// The sessions of `uid` root sees through `perfetto --query`.
fn sessions_of(serve: &Serve, uid: u32) -> usize {
    let o = output_within(
        &mut serve.perfetto(None, &["--query-raw"]),
        Duration::from_secs(10),
    );
    let st = <recorder::protos::TracingServiceState as prost::Message>::decode(&*o.stdout)
        .expect("TracingServiceState");
    st.tracing_sessions
        .iter()
        .filter(|s| s.consumer_uid == Some(uid as i32))
        .count()
}

#[test]
fn three_thousand_observers_cost_no_thread_and_the_session_still_stops() {
    require!(need::tracebox(), need::root());
    let serve = Serve::start();
    let pid = serve.pid();
    let (victim_child, victim_out) = victim(&serve, "victim", 300, 100);
    // A session that never starts, and 3000 watches of its start.
    let cfg = binary_config(
        &serve,
        "deferred",
        "buffers { size_kb: 256 }\ndeferred_start: true\nflush_timeout_ms: 1000\n\
         data_source_stop_timeout_ms: 1000\n\
         data_sources { config { name: \"for_testing\" } }\n",
    );
    let before = threads(pid);
    let mut a = Attacker::start(&[
        "observe",
        serve.consumer().to_str().expect("path"),
        cfg.to_str().expect("path"),
        "3000",
    ]);
    let r = a.json();
    // A connection may wait for a session's start a few times, not 3000.
    assert!(
        r["refused"].as_u64().unwrap_or(0) >= 3000 - 16,
        "observers beyond the bound are refused: {r}"
    );
    assert_eq!(r["ended"], true, "DisableTracing still ends it: {r}");
    assert!(
        r["seconds"].as_f64().unwrap_or(99.0) < 5.0,
        "the stop was not stuck behind the flood: {r}"
    );
    assert!(
        threads(pid) <= before,
        "no thread per request: {} threads, {before} before",
        threads(pid)
    );
    victim_complete(victim_child, &victim_out, 300, Duration::from_secs(30));
}

#[test]
fn a_client_gone_with_its_output_blocked_is_aborted_and_frees_its_quota() {
    require!(need::tracebox(), need::root());
    let serve = Serve::start();
    let pid = serve.pid();
    let (victim_child, victim_out) = victim(&serve, "victim", 400, 100);
    // The victim's is session 1, the attacker's session 2.
    wait_for_text("session 1 for uid 0", Duration::from_secs(20), || {
        serve.log()
    });
    // Streams into a pipe nobody reads (its read end held by a child the
    // client forked), 1 MB/s: the pipe fills, the session's backlog grows.
    let cfg = binary_config(
        &serve,
        "stuck",
        "buffers { size_kb: 16384 }\nwrite_into_file: true\nfile_write_period_ms: 100\n\
         flush_timeout_ms: 1000\ndata_source_stop_timeout_ms: 1000\n\
         data_sources { config { name: \"for_testing\" for_testing { \
         max_messages_per_second: 1000 message_size: 1000 } } }\n",
    );
    let rss_before = rss_kb(pid);
    let mut a = Attacker::start(&[
        "enable",
        serve.consumer().to_str().expect("path"),
        cfg.to_str().expect("path"),
        "--pipe",
    ]);
    assert_eq!(a.line(), "ready");
    wait_for("the attacker's session", Duration::from_secs(10), || {
        sessions_of(&serve, 65534) == 1
    });
    // The session records into the pipe a while, until it fills.
    std::thread::sleep(Duration::from_secs(2));
    // The client goes; its pipe stays, unread.
    a.kill_client();
    let gone = Instant::now();
    // Its flush and stop timeouts (2 s) and the grace (5 s): then aborted,
    // its quota and buffers given back.
    wait_for(
        "the abandoned session's end",
        Duration::from_secs(15),
        || sessions_of(&serve, 65534) == 0,
    );
    let took = gone.elapsed();
    assert!(
        took <= Duration::from_secs(12),
        "ended {took:?} after its client"
    );
    let log = serve.log();
    // Its final pass waits in the backlog for a reader that never comes:
    // the deadline ends it.
    assert!(
        log.contains("session 2 of uid 65534: it did not end within its flush and stop timeouts"),
        "the log says why it ended: {log}"
    );
    // The uid's whole quota is free again: a session of its full 512 MiB
    // would not fit beside a session still charged.
    let (o, _) = serve.record_as(
        Some(NOBODY),
        "after",
        "buffers { size_kb: 520000 }\nduration_ms: 200\n\
         data_sources { config { name: \"for_testing\" for_testing { message_count: 3 } } }\n",
    );
    assert!(o.status.success(), "the quota was freed: {}", text(&o));
    assert!(
        rss_kb(pid) < rss_before + 32 * 1024,
        "its memory went back: {} KiB, {rss_before} KiB before",
        rss_kb(pid)
    );
    victim_complete(victim_child, &victim_out, 400, Duration::from_secs(30));
}

#[test]
fn a_config_of_1025_sources_through_the_consumer_socket_is_refused() {
    require!(need::tracebox(), need::root());
    let serve = Serve::start();
    let many = "data_sources { config { name: \"for_testing\" } }\n".repeat(1025);
    let (o, _) = serve.record_as(
        Some(NOBODY),
        "many",
        &format!("buffers {{ size_kb: 64 }}\nduration_ms: 1000\n{many}"),
    );
    // The client prints the service's refusal (its exit status stays 0).
    assert!(
        text(&o).contains("1025 data_sources; at most 1024"),
        "the cap is named: {}",
        text(&o)
    );
}

#[test]
fn refused_connections_and_long_attach_keys_log_a_bounded_amount() {
    require!(need::tracebox(), need::root());
    let serve = Serve::start();
    let (victim_child, victim_out) = victim(&serve, "victim", 300, 100);
    let before = serve.log().len();
    let mut flood = Attacker::start(&["connect", serve.consumer().to_str().expect("path"), "4"]);
    // Another user: the flood holds every connection nobody may have.
    let mut keys = Attacker::start_as(
        "65533",
        &[
            "attach",
            serve.consumer().to_str().expect("path"),
            "300",
            "120000",
        ],
    );
    let attempts = flood.json()["attempts"].as_u64().unwrap_or(0);
    assert!(attempts > 100, "the flood tried: {attempts}");
    assert_eq!(keys.json()["failed"], 300);
    let log = serve.log();
    let grown = log.len() - before;
    // 20 lines a uid at once, then one a second: a few KiB, not MiBs.
    assert!(
        grown < 32 * 1024,
        "{grown} bytes of log for {attempts} refused connections and 300 keys"
    );
    assert!(
        log.lines().all(|l| l.len() < 1024),
        "a peer's text is cut in the log"
    );
    assert!(log.contains("left out"), "what was left out is counted");
    victim_complete(victim_child, &victim_out, 300, Duration::from_secs(30));
}

#[test]
fn a_producers_name_cannot_forge_a_log_line() {
    require!(need::tracebox(), need::root());
    let serve = Serve::start();
    let script = repo_root().join("tests/attacker/hostile_consumer.py");
    let o = output_within(
        as_user(NOBODY, python())
            .arg(script)
            .arg("producer")
            .arg(serve.path("producer.sock")),
        Duration::from_secs(20),
    );
    assert!(o.status.success(), "{}", text(&o));
    wait_for("the producer's line", Duration::from_secs(10), || {
        serve.log().contains("FORGED")
    });
    let log = serve.log();
    assert!(
        !log.lines()
            .any(|l| l.starts_with("FORGED") || l.contains("] FORGED")),
        "a newline in a producer's name or SDK version started a line: {log}"
    );
}

/// A small sys_stats session for the scale tests.
fn small_session(duration_ms: u32) -> String {
    format!(
        "buffers {{ size_kb: 256 }}\nduration_ms: {duration_ms}\n\
         data_sources {{ config {{ name: \"linux.sys_stats\" sys_stats_config {{ \
         meminfo_period_ms: 500 meminfo_counters: MEMINFO_MEM_AVAILABLE }} }} }}\n"
    )
}

#[test]
fn a_hundred_sessions_of_ten_uids_are_complete_on_the_threads_of_one() {
    require!(need::tracebox(), need::root());
    let serve = Serve::start_full(
        &[],
        &["--max-sessions", "100", "--max-sessions-per-uid", "10"],
    );
    let pid = serve.pid();
    // One session: the service's threads and memory with it.
    let (first, first_out) = serve.spawn_client(Some("65500"), "s0", &small_session(20_000));
    wait_for("the first session", Duration::from_secs(10), || {
        sessions_of(&serve, 65500) == 1
    });
    let (threads_one, rss_one) = (threads(pid), rss_kb(pid));
    let mut clients = vec![(first, first_out)];
    for i in 1..100 {
        let uid = (65500 + i % 10).to_string();
        clients.push(serve.spawn_client(Some(&uid), &format!("s{i}"), &small_session(12_000)));
    }
    wait_for("a hundred sessions", Duration::from_secs(60), || {
        (65500..65510)
            .map(|u| sessions_of(&serve, u))
            .sum::<usize>()
            == 100
    });
    let (threads_all, rss_all) = (threads(pid), rss_kb(pid));
    assert!(
        threads_all <= threads_one + 4,
        "{threads_all} threads at 100 sessions, {threads_one} at 1"
    );
    // Each session: its 256 KiB of buffers, plus at most 1 MiB.
    let bound = rss_one + 99 * (256 + 1024);
    assert!(
        rss_all <= bound,
        "{rss_all} KiB at 100 sessions, {rss_one} at 1 (bound {bound})"
    );
    for (i, (child, out)) in clients.into_iter().enumerate() {
        let o = wait_within(child, Duration::from_secs(90));
        assert!(o.status.success(), "session {i}: {}", text(&o));
        let packets = decode(&std::fs::read(&out).expect("trace"));
        let samples = packets.iter().filter(|p| p.has_sys_stats()).count();
        assert!(samples >= 10, "session {i}: {samples} sys_stats samples");
        if i % 33 == 0 {
            trace_processor::check(&out);
        }
    }
}

#[test]
fn an_idle_service_with_ten_idle_sessions_uses_under_half_a_percent_of_a_core() {
    require!(need::tracebox(), need::root());
    let serve = Serve::start();
    let pid = serve.pid();
    // Ten sessions waiting for a start trigger that does not come, two of
    // them with sys_stats sampling every 10 s once started.
    let mut clients = Vec::new();
    for i in 0..10 {
        let uid = (65500 + i % 3).to_string();
        clients.push(serve.spawn_client(
            Some(&uid),
            &format!("idle{i}"),
            "buffers { size_kb: 64 }\n\
             trigger_config { trigger_mode: START_TRACING trigger_timeout_ms: 60000 \
             triggers { name: \"never\" stop_delay_ms: 100 } }\n\
             data_sources { config { name: \"linux.sys_stats\" sys_stats_config { \
             meminfo_period_ms: 10000 } } }\n",
        ));
    }
    wait_for("ten sessions", Duration::from_secs(20), || {
        (65500..65503)
            .map(|u| sessions_of(&serve, u))
            .sum::<usize>()
            == 10
    });
    let (t0, c0) = (Instant::now(), cpu_time(pid));
    // The service's own CPU time over a stretch of idleness is the figure
    // under test: time itself is what is measured.
    std::thread::sleep(Duration::from_secs(10));
    let share = (cpu_time(pid) - c0).as_secs_f64() / t0.elapsed().as_secs_f64();
    assert!(share < 0.005, "{:.3}% of a core", share * 100.0);
    for (mut c, _) in clients {
        let _ = c.kill();
        let _ = c.wait();
    }
}
