//! Apps under `recorder serve`: one producer socket for every session. Two
//! stock `perfetto` clients (tracebox v58.2) whose configs both name the SDK
//! app's data source each get the app's packets in their own trace, and only
//! theirs; one session's end leaves the other recording; a producer that
//! commits chunks for another session's buffer ids puts nothing there.
//! Every trace goes through both decoders and trace processor.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;
use perfetto_protos::trace_packet::TracePacket;

/// A local user who is neither root, nor nobody, nor the service user.
const BYSTANDER_UID: u32 = 65_533;
/// The attacker's data source, named by one session only.
const FOREIGN_DS: &str = "recorder.test.foreign";

impl Serve {
    /// `perfetto --txt -c NAME.pbtx -o NAME.pftrace`, running.
    fn client(&self, name: &str, config: &str) -> (Child, PathBuf) {
        self.client_as(name, config, None)
    }

    /// [`Self::client`], run as `uid` when given.
    fn client_as(&self, name: &str, config: &str, uid: Option<u32>) -> (Child, PathBuf) {
        self.spawn_client(uid.map(|u| u.to_string()).as_deref(), name, config)
    }

    /// What `perfetto --query` prints.
    fn query(&self) -> String {
        let child = self
            .perfetto(None, &["--query"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("perfetto --query");
        text(&wait_within(child, Duration::from_secs(20)))
    }

    /// The SDK app, writing a marked packet every few milliseconds into
    /// every instance it has until killed.
    fn app(&self) -> App {
        let mut child = Command::new(sdk_app())
            .args([
                "--forever",
                "--interval-ms",
                "4",
                "--mark",
                "--shmem-kb",
                "1024",
            ])
            .env("PERFETTO_PRODUCER_SOCK_NAME", self.path("producer.sock"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("SDK app");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        App { child, out }
    }
}

struct App {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl App {
    /// Reads the app's lines until one starts with `what`.
    fn expect(&mut self, what: &str) {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap_or(0);
            assert!(n > 0, "the app ended before {what:?}");
            if line.starts_with(what) {
                return;
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The app's packets of a trace: (marker, counter), in file order.
fn app_packets(packets: &[TracePacket], pid: u32) -> Vec<(String, u64)> {
    packets
        .iter()
        .filter(|p| p.has_for_testing() && p.trusted_pid() as u32 == pid)
        .map(|p| (p.for_testing().str().to_string(), p.for_testing().counter()))
        .collect()
}

/// A client's trace, decoded, once the client ended well.
fn finished(client: Child, out: &Path, serve: &Serve) -> Vec<TracePacket> {
    let o = wait_within(client, Duration::from_secs(60));
    assert!(o.status.success(), "{}\n{}", text(&o), serve.log());
    decode(&std::fs::read(out).expect("trace"))
}

/// The one marker of a session's app packets, and their counters, each
/// once and without a gap (the app writes one every few milliseconds into
/// every instance it has).
fn one_instance(packets: &[(String, u64)], who: &str) -> (String, Vec<u64>) {
    assert!(!packets.is_empty(), "{who}: no packet of the app");
    let mark = packets[0].0.clone();
    assert!(mark.starts_with("session "), "{who}: {mark:?}");
    let strays: Vec<_> = packets.iter().filter(|(m, _)| *m != mark).collect();
    assert!(
        strays.is_empty(),
        "{who}: packets of another instance: {:?}",
        &strays[..strays.len().min(5)]
    );
    let mut counters: Vec<u64> = packets.iter().map(|(_, c)| *c).collect();
    counters.sort_unstable();
    let (first, last) = (counters[0], counters[counters.len() - 1]);
    assert_eq!(
        counters,
        (first..=last).collect::<Vec<_>>(),
        "{who}: every packet once"
    );
    (mark, counters)
}

/// The hostile peer, as nobody and a producer of FOREIGN_DS on `serve`'s
/// producer socket, commits a chunk for every buffer id 1..=`last` but its
/// own; returns once it says it got them through.
fn foreign_chunks_get_through(serve: &Serve, last: &str) {
    let script = repo_root().join("tests/attacker/hostile_peer.py");
    let socket = serve.path("producer.sock");
    let mut hostile = as_nobody(python())
        .arg(script)
        .args(["foreign", &socket.to_string_lossy(), FOREIGN_DS, "1", last])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("attacker starts");
    let mut said = String::new();
    let mut lines = BufReader::new(hostile.stdout.take().expect("stdout"));
    while lines.read_line(&mut said).unwrap_or(0) > 0 && !said.ends_with("done\n") {}
    let _ = hostile.kill();
    let o = hostile.wait_with_output().expect("attacker");
    assert!(
        said.contains("done"),
        "the attacker did not get through: {said}{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        serve.log()
    );
}

#[test]
fn two_clients_naming_an_apps_data_source_each_get_its_packets_and_only_theirs() {
    require!(need::tracebox());
    let serve = Serve::start();
    let mut app = serve.app();
    let long = format!(
        r#"
buffers {{ size_kb: 8192 fill_policy: DISCARD }}
duration_ms: 7000
data_sources {{ config {{ name: "{SEQUENCE_DS}" }} }}
data_sources {{ config {{ name: "for_testing" for_testing {{ message_count: 20 }} }} }}
"#
    );
    let short = format!(
        r#"
buffers {{ size_kb: 1024 }}
buffers {{ size_kb: 8192 fill_policy: DISCARD }}
duration_ms: 2000
data_sources {{ config {{ name: "{SEQUENCE_DS}" target_buffer: 1 }} }}
"#
    );
    let (a, a_out) = serve.client("long", &long);
    app.expect("started");
    let (b, b_out) = serve.client("short", &short);
    let pb = finished(b, &b_out, &serve);
    let ended = Instant::now();
    let pa = finished(a, &a_out, &serve);
    assert!(ended.elapsed() > Duration::from_millis(1500), "a ran on");

    let (mark_a, ca) = one_instance(&app_packets(&pa, app.pid()), "long");
    let (mark_b, cb) = one_instance(&app_packets(&pb, app.pid()), "short");
    assert_ne!(mark_a, mark_b, "each session has an instance of its own");
    // The short session ran inside the long one, which kept recording
    // after it ended.
    assert!(ca[0] < cb[0], "{:?} {:?}", ca[0], cb[0]);
    let b_last = cb[cb.len() - 1];
    assert!(
        ca[ca.len() - 1] > b_last + 100,
        "the long session recorded on: {} after {b_last}",
        ca[ca.len() - 1]
    );
    // Each client's own config, and its own buffers.
    let built_in = pa
        .iter()
        .filter(|p| p.has_for_testing() && p.trusted_pid() as u32 != app.pid())
        .count();
    assert_eq!(built_in, 20);
    assert!(
        !pb.iter()
            .any(|p| p.has_for_testing() && p.trusted_pid() as u32 != app.pid())
    );
    assert_eq!(last_trace_stats(&pa).buffer_stats.len(), 1);
    let sb = last_trace_stats(&pb);
    assert_eq!(sb.buffer_stats.len(), 2);
    assert!(
        sb.buffer_stats[1].bytes_written() > sb.buffer_stats[0].bytes_written(),
        "the app wrote into the short session's second buffer: {sb:?}"
    );
    for out in [&a_out, &b_out] {
        trace_processor::check(out);
    }
}

#[test]
fn a_producer_cannot_put_chunks_into_another_sessions_buffers() {
    require!(need::tracebox(), need::attacker());
    let serve = Serve::start();
    let mut app = serve.app();
    // The attacker's session names its data source; the victim's does not.
    let attacker_cfg = format!(
        r#"
buffers {{ size_kb: 2048 }}
duration_ms: 8000
data_sources {{ config {{ name: "{FOREIGN_DS}" }} }}
"#
    );
    let victim_cfg = format!(
        r#"
buffers {{ size_kb: 1024 }}
buffers {{ size_kb: 4096 fill_policy: DISCARD }}
buffers {{ size_kb: 1024 }}
duration_ms: 8000
data_sources {{ config {{ name: "{SEQUENCE_DS}" target_buffer: 1 }} }}
"#
    );
    let (victim, victim_out) = serve.client("victim", &victim_cfg);
    let (attacker, attacker_out) = serve.client("attacker", &attacker_cfg);
    app.expect("started");
    foreign_chunks_get_through(&serve, "64");
    let pv = finished(victim, &victim_out, &serve);
    let pa = finished(attacker, &attacker_out, &serve);

    // Not a byte of the attacker's in the victim's session; the app's
    // packets are all there.
    assert!(
        !pv.iter().any(|p| p.trusted_uid() as u32 == NOBODY_UID),
        "the attacker's packets reached another session"
    );
    assert!(
        !pv.iter()
            .any(|p| p.has_for_testing() && p.for_testing().counter() == 4242)
    );
    one_instance(&app_packets(&pv, app.pid()), "victim");
    // Its own session took the one chunk for its own buffer, nothing else.
    let own: Vec<u64> = pa
        .iter()
        .filter(|p| p.has_for_testing() && p.trusted_uid() as u32 == NOBODY_UID)
        .map(|p| p.for_testing().counter())
        .collect();
    assert_eq!(own, vec![4343], "{}", serve.log());
    // The refusals are charged to the attacker's uid.
    let key = format!("recorder.quota.uid.{NOBODY_UID}.foreign_buffer_chunks");
    if let Some(py) = python_summary(&attacker_out) {
        let n = py["attributes"][&key].as_i64().unwrap_or(0);
        assert!(n >= 63, "{key} = {n}");
    }
    for out in [&victim_out, &attacker_out] {
        trace_processor::check(out);
    }
}

#[test]
fn an_app_connected_before_any_session_is_served_by_each_and_its_end_ends_its_instances_in_all() {
    require!(need::tracebox());
    let serve = Serve::start();
    // The app connects before any session runs, and stays listed.
    let mut first = serve.app();
    wait_for_text(SEQUENCE_DS, Duration::from_secs(20), || serve.query());
    let cfg = |kb: u32| {
        format!(
            r#"
buffers {{ size_kb: {kb} fill_policy: DISCARD }}
duration_ms: 5000
data_sources {{ config {{ name: "{SEQUENCE_DS}" }} }}
"#
        )
    };
    let (a, a_out) = serve.client("a", &cfg(4096));
    let (b, b_out) = serve.client("b", &cfg(8192));
    first.expect("started");
    // The app writes into both sessions a while before it ends.
    std::thread::sleep(Duration::from_millis(1500));
    let first_pid = first.pid();
    drop(first);
    let mut second = serve.app();
    second.expect("started");
    let pa = finished(a, &a_out, &serve);
    let pb = finished(b, &b_out, &serve);
    for (who, packets) in [("a", &pa), ("b", &pb)] {
        // What the first app committed before it was killed stays; the
        // second app gets an instance in each session.
        let (m1, _) = one_instance(&app_packets(packets, first_pid), who);
        let (m2, _) = one_instance(&app_packets(packets, second.pid()), who);
        assert_eq!(
            m1, m2,
            "{who}: both apps wrote for the same session and buffer"
        );
    }
    let mark = |p: &[TracePacket]| one_instance(&app_packets(p, second.pid()), "").0;
    assert_ne!(mark(&pa), mark(&pb));
    for out in [&a_out, &b_out] {
        trace_processor::check(out);
    }
}

/// Whether a trace holds a quota figure of `uid`: in the bytes (the key is
/// a plain string in the file) and by the Python decoder.
fn quota_rows(trace: &Path, uid: u32) -> (bool, Vec<String>) {
    let prefix = format!("recorder.quota.uid.{uid}.");
    let bytes = std::fs::read(trace).expect("trace");
    let in_bytes = bytes.windows(prefix.len()).any(|w| w == prefix.as_bytes());
    let py = python_summary(trace).expect("the Python decoder reads the trace");
    let keys = py["attributes"]
        .as_object()
        .map(|m| {
            m.keys()
                .filter(|k| k.starts_with(&prefix))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    (in_bytes, keys)
}

#[test]
fn a_served_session_shows_the_quota_hits_of_its_own_uid_only_unless_root() {
    require!(need::tracebox(), need::attacker());
    let serve = Serve::start();
    // nobody's session names the attacker's data source; the bystander's
    // and root's name an app's, so that they attach to the producers too.
    let cfg = |ds: &str| {
        format!(
            r#"
buffers {{ size_kb: 1024 }}
duration_ms: 6000
data_sources {{ config {{ name: "{ds}" }} }}
"#
        )
    };
    let (own, own_out) = serve.client_as("own", &cfg(FOREIGN_DS), Some(NOBODY_UID));
    let (other, other_out) = serve.client_as("other", &cfg(SEQUENCE_DS), Some(BYSTANDER_UID));
    let (root, root_out) = serve.client("root", &cfg(SEQUENCE_DS));
    // nobody commits chunks for buffers not its own: foreign_buffer_chunks.
    foreign_chunks_get_through(&serve, "8");
    for (client, out) in [(own, &own_out), (other, &other_out), (root, &root_out)] {
        finished(client, out, &serve);
    }

    // nobody sees its own hits, root sees every uid's.
    let key = format!("recorder.quota.uid.{NOBODY_UID}.foreign_buffer_chunks");
    for out in [&own_out, &root_out] {
        let (in_bytes, keys) = quota_rows(out, NOBODY_UID);
        assert!(
            in_bytes && keys.contains(&key),
            "{}: {keys:?}",
            out.display()
        );
    }
    // Another local user's session shows none of them.
    let (in_bytes, keys) = quota_rows(&other_out, NOBODY_UID);
    assert!(
        !in_bytes && keys.is_empty(),
        "uid {NOBODY_UID}'s quota figures in uid {BYSTANDER_UID}'s trace: {keys:?}"
    );
    for out in [&own_out, &other_out, &root_out] {
        trace_processor::check(out);
    }
}

/// Restarts of the app's track_event sequence in a trace
/// (`SEQ_INCREMENTAL_STATE_CLEARED`), with the number of its packets.
fn track_event_restarts(packets: &[TracePacket], pid: u32) -> (usize, usize) {
    const CLEARED: u32 = 1; // SEQ_INCREMENTAL_STATE_CLEARED
    let seqs: std::collections::BTreeSet<u32> = packets
        .iter()
        .filter(|p| p.has_track_event() && p.trusted_pid() as u32 == pid)
        .map(|p| p.trusted_packet_sequence_id())
        .collect();
    assert_eq!(
        seqs.len(),
        1,
        "one track_event sequence of the app: {seqs:?}"
    );
    let seq = *seqs.first().expect("one");
    let of_seq: Vec<_> = packets
        .iter()
        .filter(|p| p.trusted_packet_sequence_id() == seq)
        .collect();
    let restarts = of_seq
        .iter()
        .filter(|p| p.sequence_flags() & CLEARED != 0)
        .count();
    (restarts, of_seq.len())
}

#[test]
fn a_sessions_clear_period_restarts_only_its_own_instance_of_an_apps_state() {
    require!(need::tracebox());
    let serve = Serve::start();
    let mut app = serve.app();
    let cfg = |extra: &str| {
        format!(
            r#"
buffers {{ size_kb: 16384 fill_policy: DISCARD }}
duration_ms: 3000
flush_period_ms: 100
data_sources {{ config {{ name: "{SEQUENCE_DS}" }} }}
data_sources {{ config {{ name: "track_event" track_event_config {{ enabled_categories: "*" }} }} }}
{extra}
"#
        )
    };
    let (a, a_out) = serve.client(
        "clearing",
        &cfg("incremental_state_config { clear_period_ms: 250 }"),
    );
    let (b, b_out) = serve.client("steady", &cfg(""));
    app.expect("started");
    let pa = finished(a, &a_out, &serve);
    let pb = finished(b, &b_out, &serve);

    // The clearing session's instance starts its interned state again each
    // period; the other instance of the same app and thread never does
    // after its first packet.
    let (cleared, na) = track_event_restarts(&pa, app.pid());
    let (steady, nb) = track_event_restarts(&pb, app.pid());
    assert!(cleared >= 4, "{cleared} restarts in 3 s ({na} packets)");
    assert_eq!(steady, 1, "{steady} restarts ({nb} packets)");
    assert!(
        nb > 100,
        "the steady session recorded the app: {nb} packets"
    );
    for out in [&a_out, &b_out] {
        if let Some(tp) = trace_processor::check(out) {
            let unnamed = tp
                .query("select count(*) as n from slice where name is null")
                .scalar()
                .int();
            assert_eq!(unnamed, 0, "{}", out.display());
        }
    }
}
