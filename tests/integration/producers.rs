//! Perfetto SDK apps recording into `recorder` over the producer socket and
//! shared memory. The app is `tests/sdk_producer`: the `perfetto-sdk` crate
//! (Google's bindings over the vendored C SDK, system backend), unmodified,
//! finding the recorder by the socket path alone. Every trace is decoded by
//! rust-protobuf's and Python's Perfetto schemas and opened in trace
//! processor.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

/// A recorder session listening on a socket of its own.
struct Session {
    run: Run,
    socket: PathBuf,
    child: Child,
}

impl Session {
    fn start(config: &str) -> Self {
        Self::start_with(config, &[])
    }

    /// With more arguments for the recorder (`--proto`, say).
    fn start_with(config: &str, args: &[&std::ffi::OsStr]) -> Self {
        let run = Run::new(config);
        let socket = run.dir.path().join("producer.sock");
        let child = run
            .command("pwritev")
            .args(args)
            .arg("--producer-socket")
            .arg(&socket)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("recorder starts");
        let s = Self { run, socket, child };
        s.wait_for_socket();
        s
    }

    fn wait_for_socket(&self) {
        wait_for_socket(&self.socket, Duration::from_secs(20));
    }

    /// App `name` as the session lists it, once it is listed.
    fn producer(&self, name: &str) -> Option<serde_json::Value> {
        let status = session_status(&self.run, self.child.id())?;
        status["producers"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
    }

    /// Waits until `packets` of app `name`'s committed packets reached the
    /// session.
    fn wait_for_packets(&self, name: &str, packets: u64) {
        wait_for(
            format_args!("{packets} packets of {name} in the session"),
            Duration::from_secs(20),
            || {
                self.producer(name)
                    .is_some_and(|p| p["packets"].as_u64() >= Some(packets))
            },
        )
    }

    /// Waits until the session has seen app `name` go.
    fn wait_gone(&self, name: &str) {
        wait_for(
            format_args!("{name} gone from the session"),
            Duration::from_secs(20),
            || self.producer(name).is_none_or(|p| p["connected"] != true),
        )
    }

    /// An SDK app named `name` (its argv[0], which the SDK reports as its
    /// producer name).
    fn app(&self, name: &str, args: &[&str]) -> App {
        App::spawn(&self.socket, name, args)
    }

    /// A scripted producer (`tests/producer/NAME`) of the test data source
    /// on this session's socket, with `args`; its output piped.
    fn script(&self, name: &str, args: &[&str]) -> Child {
        Command::new("python3")
            .arg(repo_root().join("tests/producer").join(name))
            .arg(&self.socket)
            .arg(SEQUENCE_DS)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs")
    }

    /// What `recorder query` says of the session.
    fn query(&self) -> String {
        let q = Command::new(recorder_bin())
            .arg("query")
            .env("RECORDER_RUNTIME_DIR", self.run.dir.path().join("run"))
            .output()
            .expect("query runs");
        String::from_utf8_lossy(&q.stdout).into_owned()
    }

    /// SIGINT, then the exit status and stderr.
    fn stop(mut self) -> (Run, String) {
        sigint(&self.child);
        let out = wait_exit(&mut self.child, Duration::from_secs(30));
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        assert!(out.success(), "recorder failed: {out:?}\n{err}");
        (self.run, err)
    }
}

/// What a scripted producer wrote on stderr.
fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    err
}

/// Met unless a scripted producer's stderr says Python has no `perfetto`
/// package.
fn python_perfetto(err: &str) -> Option<need::Missing> {
    need::present(
        !err.contains("No module named"),
        &format!("python perfetto package missing: {err}"),
    )
}

fn sigint(child: &Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
    }
}

fn config(extra: &str) -> String {
    format!(
        "buffers {{ size_kb: 16384 fill_policy: DISCARD }}\n\
         data_sources {{ config {{ name: \"{SEQUENCE_DS}\" legacy_config: \"custom bytes for the app\" }} }}\n\
         data_sources {{ config {{ name: \"track_event\" track_event_config {{ enabled_categories: \"*\" }} }} }}\n\
         {extra}"
    )
}

/// A typed field from the user's own `.proto` (configs/custom, with
/// `--proto`) reaches the app inside its DataSourceConfig exactly as
/// protobuf encodes it (the expected bytes are built here by hand from the
/// `.proto`'s field numbers, with prost's varints), and the app reads it with
/// its own generated code.
#[test]
fn a_typed_custom_field_from_the_users_proto_reaches_the_app() {
    let root = repo_root();
    let proto = root.join("configs/custom/acme/audio.proto");
    let include = root.join("configs/custom");
    let s = Session::start_with(
        &format!(
            "buffers {{ size_kb: 4096 }}\n\
             data_sources {{ config {{ name: \"{SEQUENCE_DS}\" \
             [acme.audio.audio_config] {{ sample_rate_hz: 48000 taps: [1, -2] }} }} }}\n"
        ),
        &[
            "--proto".as_ref(),
            proto.as_os_str(),
            "--proto-path".as_ref(),
            include.as_os_str(),
        ],
    );
    let mut app = s.app("sdk_app", &["--packets", "10"]);
    app.expect("started");
    let cfg = app.expect("config ");
    // The app decodes it with its own generated message code.
    assert_eq!(
        app.expect("audio_config "),
        "audio_config sample_rate_hz=48000 taps=[1, -2]"
    );
    app.expect("wrote 10");
    let (run, _err) = s.stop();
    assert_eq!(app.finish(), Some(0));
    // The trace (its trace_config carrying the field) reads cleanly.
    trace_processor::check(&run.out);

    // AudioConfig { sample_rate_hz (1): 48000, taps (4, unpacked int32): 1, -2 }
    let mut inner = Vec::new();
    for (field, v) in [(1u64, 48_000u64), (4, 1), (4, (-2i64) as u64)] {
        prost::encoding::encode_varint(field << 3, &mut inner);
        prost::encoding::encode_varint(v, &mut inner);
    }
    // DataSourceConfig's extension audio_config = 10000001, length-delimited.
    let mut field = Vec::new();
    prost::encoding::encode_varint((10_000_001u64 << 3) | 2, &mut field);
    prost::encoding::encode_varint(inner.len() as u64, &mut field);
    field.extend_from_slice(&inner);
    let hex: String = field.iter().map(|b| format!("{b:02x}")).collect();
    assert!(cfg.contains(&hex), "{cfg} lacks {hex}");
}

#[test]
fn an_sdk_app_records_complete_and_in_order_by_the_socket_path_alone() {
    const N: u64 = 3000;
    let s = Session::start(&config(""));
    // A shared memory large enough for the burst: with the default 256 KiB
    // a loaded machine can make the SDK drop (counted, marked), which is
    // not what this test is about.
    let mut app = s.app(
        "sdk_app",
        &["--packets", &N.to_string(), "--shmem-kb", "4096"],
    );
    app.expect("started");
    let cfg = app.expect("config ");
    app.expect(&format!("wrote {N}"));
    let pid = app.pid();
    // `recorder query` lists the app beside the buffers.
    let q = s.query();
    assert!(
        q.contains("producer \"sdk_app\"") && q.contains("producer socket:"),
        "{q}"
    );
    let (run, err) = s.stop();
    assert_eq!(app.finish(), Some(0), "the app saw its data source stop");

    // The custom field reached the app byte for byte (legacy_config, 1000).
    let custom = b"custom bytes for the app";
    let mut field = vec![0xC2, 0x3E, custom.len() as u8];
    field.extend_from_slice(custom);
    let hex: String = field.iter().map(|b| format!("{b:02x}")).collect();
    assert!(cfg.contains(&hex), "{cfg} lacks {hex}");

    let data = run.trace();
    let packets = decode(&data);
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid.len(), 1, "{by_pid:?}");
    let (seq, got_pid, counters) = &by_pid[0];
    assert!(*seq >= 2);
    assert_eq!(*got_pid, pid, "trusted_pid is the app's");
    assert_eq!(
        counters,
        &(0..N).collect::<Vec<_>>(),
        "complete and in order"
    );
    let uid = rustix::process::getuid().as_raw() as i32;
    assert!(
        packets
            .iter()
            .filter(|p| p.trusted_pid() as u32 == pid)
            .all(|p| p.trusted_uid() == uid),
        "trusted_uid is the app's"
    );
    let track_events = packets.iter().filter(|p| p.has_track_event()).count() as u64;
    assert!(track_events >= 3 * N, "{track_events} track events");

    let py = python_summary(&run.out);
    if let Some(py) = py {
        let c = &py["sequences"][seq.to_string()]["counters"];
        let c: Vec<u64> = serde_json::from_value(c.clone()).expect("counters");
        assert_eq!(c, (0..N).collect::<Vec<_>>(), "python agrees");
    }
    if let Some(tp) = trace_processor::open(&run.out) {
        let n = tp
            .query("select count(*) as n from slice where name = 'work'")
            .scalar()
            .int();
        assert_eq!(n, N as i64, "trace processor sees every slice");
        let c = tp
            .query(
                "select count(*) as n from counter c join counter_track t on c.track_id = t.id \
                 where t.name = 'recorder_test_counter'",
            )
            .scalar()
            .int();
        assert_eq!(c, N as i64, "trace processor sees every counter value");
    }
    assert!(err.contains("producer \"sdk_app\" connected"), "{err}");
}

#[test]
fn packets_larger_than_a_chunk_arrive_whole() {
    const N: u64 = 200;
    let s = Session::start(&config(""));
    let mut app = s.app(
        "sdk_big",
        &[
            "--packets",
            &N.to_string(),
            "--payload",
            "9000",
            // Room for the burst: a full SMB makes the SDK drop, as it
            // would with Perfetto's service.
            "--shmem-kb",
            "8192",
        ],
    );
    app.expect(&format!("wrote {N}"));
    let (run, _) = s.stop();
    app.finish();
    let packets = decode(&run.trace());
    let big: Vec<_> = packets.iter().filter(|p| p.has_for_testing()).collect();
    assert_eq!(
        big.iter()
            .map(|p| p.for_testing().counter())
            .collect::<Vec<_>>(),
        (0..N).collect::<Vec<_>>()
    );
    assert!(big.iter().all(|p| p.for_testing().str().len() == 9000));
}

#[test]
fn producer_filters_pick_which_apps_and_built_in_sources_take_part() {
    let cfg = format!(
        "buffers {{ size_kb: 8192 fill_policy: DISCARD }}\n\
         data_sources {{ config {{ name: \"{SEQUENCE_DS}\" }} producer_name_regex_filter: \"app_a.*\" }}\n\
         data_sources {{ config {{ name: \"linux.sys_stats\" sys_stats_config {{ meminfo_period_ms: 100 }} }} \
           producer_name_filter: \"app_alpha\" }}\n\
         data_sources {{ config {{ name: \"linux.process_stats\" process_stats_config {{ scan_all_processes_on_start: true }} }} producer_name_filter: \"perfetto.traced_probes\" }}\n"
    );
    let s = Session::start(&cfg);
    let mut alpha = s.app("app_alpha", &["--packets", "500"]);
    let mut beta = s.app("app_beta", &["--packets", "500", "--wait-secs", "3"]);
    alpha.expect("wrote 500");
    beta.expect("never started");
    let alpha_pid = alpha.pid();
    assert_eq!(beta.finish(), Some(3));
    s.wait_gone("app_beta");
    let (run, err) = s.stop();
    alpha.finish();
    assert!(
        err.contains("producer \"app_beta\" connected"),
        "beta did connect: {err}"
    );
    let packets = decode(&run.trace());
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid.len(), 1, "only alpha took part: {by_pid:?}");
    assert_eq!(by_pid[0].1, alpha_pid);
    assert_eq!(by_pid[0].2, (0..500).collect::<Vec<_>>());
    assert!(
        !packets.iter().any(|p| p.has_sys_stats()),
        "sys_stats is filtered to app_alpha, not the built-in producer"
    );
    assert!(
        packets.iter().any(|p| p.has_process_tree()),
        "process_stats names perfetto.traced_probes and runs"
    );
}

#[test]
fn an_app_started_before_the_session_connects_when_the_socket_appears() {
    let run_dir = tempfile::tempdir().expect("tempdir");
    let socket = run_dir.path().join("producer.sock");
    let mut app = App::spawn(&socket, "early_app", &["--packets", "100"]);
    // The app is waiting (it retries and watches the directory) for a
    // while before the socket appears: that wait is what is under test.
    std::thread::sleep(Duration::from_millis(300));
    let run = Run::new(&config(""));
    let mut child = run
        .command("pwritev")
        .arg("--producer-socket")
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder starts");
    app.expect("wrote 100");
    sigint(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(30)).success());
    app.finish();
    let packets = decode(&run.trace());
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid.len(), 1);
    assert_eq!(by_pid[0].2, (0..100).collect::<Vec<_>>());
}

#[test]
fn a_producer_killed_mid_run_keeps_what_it_committed() {
    let s = Session::start(&config(""));
    let mut app = s.app("doomed_app", &["--forever"]);
    app.expect("started");
    s.wait_for_packets("doomed_app", 100);
    let mut child = app.child;
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    s.wait_gone("doomed_app");
    let (run, err) = s.stop();
    assert!(err.contains("disconnected"), "{err}");
    let packets = decode(&run.trace());
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid.len(), 1);
    let c = &by_pid[0].2;
    assert!(c.len() > 10, "{} packets kept", c.len());
    assert_eq!(
        c,
        &(0..c.len() as u64).collect::<Vec<_>>(),
        "a whole prefix, in order"
    );
    if let Some(tp) = trace_processor::open(&run.out) {
        tp.assert_no_errors();
    }
}

/// A connection that speaks garbage is dropped; the session and a real app
/// beside it carry on.
#[test]
fn hostile_frames_are_refused_and_the_session_keeps_its_data() {
    let s = Session::start(&config(""));
    let mut huge = UnixStream::connect(&s.socket).expect("connect");
    huge.write_all(&u32::MAX.to_le_bytes()).expect("write");
    let mut garbage = UnixStream::connect(&s.socket).expect("connect");
    garbage
        .write_all(&[5, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF])
        .expect("write");
    let mut app = s.app("good_app", &["--packets", "300"]);
    app.expect("wrote 300");
    // Both hostile connections were closed by the recorder.
    for mut c in [huge, garbage] {
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut b = [0u8; 16];
        assert!(matches!(c.read(&mut b), Ok(0) | Err(_)));
    }
    let (run, _) = s.stop();
    app.finish();
    let packets = decode(&run.trace());
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid.len(), 1);
    assert_eq!(by_pid[0].2, (0..300).collect::<Vec<_>>());
}

#[test]
fn a_live_listener_on_the_path_is_refused_naming_the_override() {
    let run = Run::new(&config(""));
    let socket = run.dir.path().join("taken.sock");
    let _holder = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    let out = run
        .command("pwritev")
        .arg("--producer-socket")
        .arg(&socket)
        .output()
        .expect("recorder runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--producer-socket"), "{err}");
    assert!(!run.out.exists() || std::fs::metadata(&run.out).map(|m| m.len()).unwrap_or(0) == 0);
}

#[test]
fn an_apps_trigger_stops_a_flight_recorder() {
    let cfg = config(
        "trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 30000 \
         triggers { name: \"app_saw_a_bug\" producer_name_regex: \"trig.*\" stop_delay_ms: 0 } }\n",
    );
    let mut s = Session::start(&cfg);
    let mut app = s.app(
        "trig_app",
        &["--packets", "200", "--trigger", "app_saw_a_bug"],
    );
    app.expect("wrote 200");
    app.expect("triggered");
    // The trigger alone ends the session.
    let st = wait_exit(&mut s.child, Duration::from_secs(30));
    assert!(st.success());
    assert_eq!(app.finish(), Some(0), "the app saw its data source stop");
    let packets = decode(&s.run.trace());
    let triggers: Vec<_> = packets.iter().filter(|p| p.has_trigger()).collect();
    assert_eq!(triggers.len(), 1);
    assert_eq!(triggers[0].trigger().trigger_name(), "app_saw_a_bug");
    assert_eq!(triggers[0].trigger().producer_name(), "trig_app");
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid.len(), 1);
    assert_eq!(by_pid[0].2, (0..200).collect::<Vec<_>>());
    if let Some(tp) = trace_processor::open(&s.run.out) {
        let t = tp.triggers();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].0, "app_saw_a_bug");
        assert_eq!(t[0].2, "trig_app");
    }
}

/// A producer that breaks the shared-memory ABI every way it can
/// (tests/producer/hostile_producer.py) beside a real app: its one good
/// packet is kept with its trusted pid, everything else is refused and
/// counted, and the app's data and the recorder's own are intact.
#[test]
fn a_hostile_producer_cannot_touch_the_sessions_data() {
    let s = Session::start(&config(""));
    let mut app = s.app("honest_app", &["--packets", "1000"]);
    app.expect("started");
    let mut hostile = s.script("hostile_producer.py", &[]);
    let hostile_pid = hostile.id();
    let mut out = String::new();
    hostile
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    let st = wait_exit(&mut hostile, Duration::from_secs(30));
    let err = stderr_of(&mut hostile);
    require!(python_perfetto(&err));
    assert!(st.success() && out.contains("done"), "{out}\n{err}");
    app.expect("wrote 1000");
    // `recorder query` names the hostile producer and why its data was lost.
    let q = s.query();
    assert!(
        q.contains(&format!("producer \"hostile\" (pid {hostile_pid}"))
            && q.contains("ABI violations")
            && q.contains("chunks refused"),
        "{q}"
    );
    let (run, summary) = s.stop();
    app.finish();

    let packets = decode(&run.trace());
    let by_pid = counters_by_pid(&packets);
    let honest: Vec<_> = by_pid
        .iter()
        .filter(|(_, pid, _)| *pid != hostile_pid)
        .collect();
    assert_eq!(honest.len(), 1, "{by_pid:?}");
    assert_eq!(
        honest[0].2,
        (0..1000).collect::<Vec<_>>(),
        "the app's data is whole"
    );
    let hostile_kept: Vec<_> = by_pid
        .iter()
        .filter(|(_, pid, _)| *pid == hostile_pid)
        .collect();
    assert_eq!(hostile_kept.len(), 1, "{by_pid:?}");
    assert_eq!(hostile_kept[0].2, vec![7777], "only its well-formed packet");
    assert!(
        packets.iter().any(|p| p.has_trace_config()),
        "the recorder's own packets are there"
    );

    let stats = packets
        .iter()
        .rfind(|p| p.has_trace_stats())
        .expect("trace_stats")
        .trace_stats()
        .clone();
    assert!(stats.invalid_packets() >= 1, "the forged packet is counted");
    assert!(
        stats.chunks_discarded() >= 3,
        "bad chunks are counted: {stats:?}"
    );
    assert!(stats.patches_discarded() >= 1, "{stats:?}");
    assert!(stats.buffer_stats[0].abi_violations() >= 2, "{stats:?}");
    assert!(
        summary.contains("producer \"hostile\"") && summary.contains("ABI violations"),
        "{summary}"
    );
    if let Some(tp) = trace_processor::open(&run.out) {
        assert!(tp.stat("traced_buf_abi_violations", Some(0)) >= 2);
    }
}

/// An app whose data source handles flushes is asked to flush periodically
/// and at the stop, and its acks complete those flushes: the session notes
/// `all_data_sources_flushed` each time (a flush that timed out would not).
#[test]
fn flushes_reach_an_app_and_its_acks_complete_them() {
    let cfg = config("flush_period_ms: 300\nflush_timeout_ms: 30000\n");
    let s = Session::start(&cfg);
    let mut app = s.app("flushing_app", &["--packets", "100", "--on-flush"]);
    app.expect("wrote 100");
    app.expect("flushed");
    app.expect("flushed");
    let (run, _) = s.stop();
    app.finish();
    let packets = decode(&run.trace());
    let flushed = packets
        .iter()
        .filter(|p| p.has_service_event() && p.service_event().all_data_sources_flushed())
        .count();
    assert!(flushed >= 2, "{flushed} complete flushes noted");
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid[0].2, (0..100).collect::<Vec<_>>());
}

/// Counters, `work` slices and their Python and trace processor views for
/// an app that wrote `n` packets of each kind.
fn assert_every_packet_once(run: &Run, n: u64) {
    let packets = decode(&run.trace());
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid.len(), 1, "{by_pid:?}");
    assert_eq!(
        by_pid[0].2,
        (0..n).collect::<Vec<_>>(),
        "each packet once, in order"
    );
    if let Some(py) = python_summary(&run.out) {
        let c = &py["sequences"][by_pid[0].0.to_string()]["counters"];
        let c: Vec<u64> = serde_json::from_value(c.clone()).expect("counters");
        assert_eq!(c, (0..n).collect::<Vec<_>>(), "python agrees");
    }
    if let Some(tp) = trace_processor::check(&run.out) {
        let slices = tp
            .query("select count(*) as n from slice where name = 'work'")
            .scalar()
            .int();
        if slices != n as i64 {
            panic!(
                "trace processor sees {slices} of {n} `work` slices\n{}",
                explain_missing_slices(run, &tp, &packets)
            );
        }
    }
}

/// What a trace with slices missing in trace processor says about them: the
/// `work` slices it kept (by their `seq` argument), its info stats, each
/// sequence's loss markers, the trace's own stats; and where the trace was
/// kept for a look.
fn explain_missing_slices(
    run: &Run,
    tp: &trace_processor::Tp,
    packets: &[perfetto_protos::trace_packet::TracePacket],
) -> String {
    let kept = tp.query(
        "select min(a.int_value) as lo, max(a.int_value) as hi from slice s \
         join args a on a.arg_set_id = s.arg_set_id and a.key = 'debug.seq' \
         where s.name = 'work'",
    );
    let mut by_seq: std::collections::BTreeMap<u32, (usize, usize, usize)> = Default::default();
    for p in packets {
        let e = by_seq.entry(p.trusted_packet_sequence_id()).or_default();
        e.0 += 1;
        e.1 += usize::from(p.has_track_event());
        e.2 += usize::from(p.previous_packet_dropped());
    }
    // A new file of its own under the build's directory, not a name in the
    // shared /tmp.
    let copy = tempfile::Builder::new()
        .prefix("recorder-failed-")
        .suffix(".pftrace")
        .tempfile_in(env!("CARGO_TARGET_TMPDIR"))
        .and_then(|mut f| {
            std::io::copy(&mut std::fs::File::open(&run.out)?, &mut f)?;
            f.keep().map_err(|e| e.error)
        });
    let kept_at = match copy {
        Ok((_, path)) => path.display().to_string(),
        Err(e) => format!("not kept: {e}"),
    };
    format!(
        "kept slices' seq (lo, hi): {:?}\ninfo stats: {:?}\n\
         sequences (packets, track events, loss markers): {by_seq:?}\n\
         trace_stats: {:?}\ntrace kept at {kept_at}",
        kept.rows,
        tp.stats("info"),
        last_trace_stats(packets)
    )
}

/// An app that writes a few packets and never fills or commits its chunks
/// (SDK apps leave them open until full: TrackEvent is never asked to
/// flush): the stop reads them out of its shared memory, since the SDK
/// enables scraping, and they are in the trace.
#[test]
fn packets_left_in_open_chunks_are_scraped_at_the_stop() {
    let s = Session::start(&config(""));
    let mut app = s.app(
        "lazy_app",
        &["--packets", "5", "--no-commit", "--linger-secs", "30"],
    );
    app.expect("wrote 5");
    let pid = app.pid();
    let (run, err) = s.stop();
    app.expect("stopped");
    app.kill();
    assert_every_packet_once(&run, 5);
    let stats = last_trace_stats(&decode(&run.trace()));
    assert_eq!(stats.chunks_discarded(), 0, "{stats:?}");
    assert!(err.contains("scraped"), "the summary says so: {err}");
    // `recorder inspect` groups the app's sequences under its pid and uid.
    let out = Command::new(recorder_bin())
        .arg("inspect")
        .arg(&run.out)
        .output()
        .expect("inspect runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let uid = rustix::process::getuid().as_raw();
    assert!(
        text.contains("producers (by trusted pid")
            && text.contains(&format!("pid {pid:<8} uid {uid:<6}")),
        "{text}"
    );
}

/// Periodic flushes scrape the chunk the app is writing, again and again as
/// it grows, and then the app commits each chunk once it is full: every
/// packet is stored exactly once and in order.
#[test]
fn chunks_scraped_at_flushes_are_not_stored_twice_when_committed() {
    const N: u64 = 400;
    let s = Session::start(&config("flush_period_ms: 100\n"));
    let mut app = s.app(
        "slow_app",
        &[
            "--packets",
            &N.to_string(),
            "--no-commit",
            "--interval-ms",
            "4",
            "--linger-secs",
            "30",
        ],
    );
    app.expect(&format!("wrote {N}"));
    let (run, _) = s.stop();
    app.expect("stopped");
    app.kill();
    assert_every_packet_once(&run, N);
    let stats = last_trace_stats(&decode(&run.trace()));
    let b = &stats.buffer_stats[0];
    assert_eq!(b.chunks_committed_out_of_order(), 0, "{stats:?}");
    assert_eq!(b.abi_violations(), 0, "{stats:?}");
}

/// A scrape that finds a chunk it read in part now complete, its commit not
/// yet come, and the next chunk already holding the end of a packet begun
/// in it (tests/producer/late_commit_producer.py plays that, flush by
/// flush): the rest of the first chunk is read before the next, and the
/// late commit stores nothing twice. Every packet once, in order, no loss
/// marked, in our decoder, Python's and trace processor.
#[test]
fn a_commit_later_than_the_scrape_of_the_next_chunk_loses_nothing() {
    let s = Session::start(&config("flush_period_ms: 100\n"));
    let mut late = s.script("late_commit_producer.py", &[]);
    let mut lines = BufReader::new(late.stdout.take().expect("stdout"));
    let mut out = String::new();
    while !out.contains("done") {
        let mut line = String::new();
        if lines.read_line(&mut line).expect("read") == 0 {
            break;
        }
        out.push_str(&line);
    }
    if !out.contains("done") {
        let _ = wait_exit(&mut late, Duration::from_secs(10));
        let err = stderr_of(&mut late);
        require!(python_perfetto(&err));
        panic!("the producer did not finish: {out}\n{err}");
    }
    let (run, summary) = s.stop();
    let _ = late.kill();
    let _ = late.wait();
    let packets = decode(&run.trace());
    let by_pid = counters_by_pid(&packets);
    assert_eq!(by_pid.len(), 1, "{by_pid:?}\n{summary}");
    assert_eq!(by_pid[0].2, vec![1, 2, 3], "each packet once, in order");
    let ours: Vec<_> = packets
        .iter()
        .filter(|p| p.trusted_packet_sequence_id() == by_pid[0].0)
        .collect();
    assert!(
        ours.iter().all(|p| !p.previous_packet_dropped()),
        "no loss marked: {ours:?}"
    );
    let stats = last_trace_stats(&packets);
    let b = &stats.buffer_stats[0];
    assert_eq!(b.chunks_committed_out_of_order(), 0, "{stats:?}");
    assert_eq!(b.abi_violations(), 0, "{stats:?}");
    if let Some(py) = python_summary(&run.out) {
        let c = &py["sequences"][by_pid[0].0.to_string()]["counters"];
        let c: Vec<u64> = serde_json::from_value(c.clone()).expect("counters");
        assert_eq!(c, vec![1, 2, 3], "python agrees");
    }
    if let Some(tp) = trace_processor::check(&run.out) {
        assert_eq!(tp.stat("traced_buf_sequence_packet_loss", Some(0)), 0);
    }
}

/// Service events of a trace by name, with their timestamps.
fn service_events_named(
    packets: &[perfetto_protos::trace_packet::TracePacket],
    pick: impl Fn(&perfetto_protos::tracing_service_event::TracingServiceEvent) -> bool,
) -> Vec<u64> {
    packets
        .iter()
        .filter(|p| p.has_service_event() && pick(p.service_event()))
        .map(|p| p.timestamp())
        .collect()
}

/// Data sources that promise to acknowledge their start
/// (`will_notify_on_start`: every SDK data source, and the hostile
/// producer's) are set up before the start and started with it; the session
/// notes `all_data_sources_started` only once every ack came (here one comes
/// 700 ms late). A producer that never acknowledges holds nothing up: the
/// session records, stops on request at once, and the trace has no
/// `all_data_sources_started` (Perfetto names the slow ones only after its
/// fixed 20 s).
#[test]
fn the_start_waits_for_start_acks_and_a_producer_that_never_acks_stalls_nothing() {
    for ack in ["700", "never"] {
        let s = Session::start(&config("deferred_start: true\n"));
        let mut slow = s.script("hostile_producer.py", &["--start-ack", ack]);
        let mut slow_out = BufReader::new(slow.stdout.take().expect("stdout"));
        let mut line = String::new();
        let mut next_line = |want: &str| {
            line.clear();
            slow_out.read_line(&mut line).expect("read");
            line.trim() == want
        };
        if !next_line("setup") {
            let err = stderr_of(&mut slow);
            let _ = slow.kill();
            let _ = slow.wait();
            require!(python_perfetto(&err));
            panic!("the slow producer was not set up: {err}");
        }
        let mut app = s.app("sdk_app", &["--packets", "50"]);
        // Set up before the start: `recorder query` lists its data sources.
        let runtime = s.run.dir.path().join("run");
        wait_for_text("track_event", Duration::from_secs(20), || {
            let q = recorder(&s.run, &["query"]);
            let q = String::from_utf8_lossy(&q.stdout).to_string();
            if q.contains("producer \"sdk_app\"") {
                q
            } else {
                String::new()
            }
        });
        let before_start = recorder::clock::boottime_ns();
        let st = Command::new(recorder_bin())
            .args(["start", &s.child.id().to_string()])
            .env("RECORDER_RUNTIME_DIR", &runtime)
            .status()
            .expect("start runs");
        assert!(st.success());
        app.expect("wrote 50");
        assert!(next_line("started"));
        if ack != "never" {
            assert!(next_line("acked"));
        }
        s.wait_for_packets("sdk_app", 1);
        let stopping = Instant::now();
        let (run, err) = s.stop();
        assert!(
            stopping.elapsed() < Duration::from_secs(10),
            "the stop is not held up: {:?}",
            stopping.elapsed()
        );
        assert_eq!(app.finish(), Some(0));
        assert!(next_line("stopped"), "{line}");
        let _ = wait_exit(&mut slow, Duration::from_secs(10));

        let packets = decode(&run.trace());
        let by_pid = counters_by_pid(&packets);
        assert_eq!(by_pid.len(), 1, "{by_pid:?}");
        assert_eq!(by_pid[0].2, (0..50).collect::<Vec<_>>());
        let all_started = service_events_named(&packets, |e| e.all_data_sources_started());
        if ack == "never" {
            assert!(all_started.is_empty(), "{all_started:?}\n{err}");
        } else {
            assert_eq!(all_started.len(), 1, "{err}");
            assert!(
                all_started[0] >= before_start + 700_000_000,
                "noted after the late ack"
            );
        }
        trace_processor::check(&run.out);
    }
}

/// Rotating the output (`--rotate-period`) clears producers' incremental
/// state at each cut: the SDK app's track_event writer starts again with
/// `SEQ_INCREMENTAL_STATE_CLEARED` and re-emits its interned names, so each
/// segment opens alone in trace processor with the slice names resolved.
#[test]
fn each_rotated_segment_resolves_an_apps_interned_names_on_its_own() {
    let run = Run::new(&config(
        "write_into_file: true file_write_period_ms: 150 flush_period_ms: 150\n",
    ));
    let socket = run.dir.path().join("producer.sock");
    let out_dir = run.dir.path().join("segs");
    let mut child = run
        .command_to("pwritev", &out_dir.join(""))
        .args(["--rotate-period", "800ms", "--producer-socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder starts");
    wait_for_socket(&socket, Duration::from_secs(20));
    let mut app = App::spawn(&socket, "rotating_app", &["--forever"]);
    app.expect("started");
    // Four cuts at least, each after the app wrote.
    wait_for("five segments", Duration::from_secs(60), || {
        std::fs::read_dir(&out_dir).map_or(0, |d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "pftrace"))
                .count()
        }) >= 5
    });
    sigint(&child);
    let st = wait_exit(&mut child, Duration::from_secs(30));
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(st.success(), "{err}");
    app.kill();

    let mut files: Vec<PathBuf> = std::fs::read_dir(&out_dir)
        .expect("segments")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pftrace"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    let mut checked = 0;
    // The first segment holds the app's first packets anyway; the later
    // ones show the clear at the cut. Packets written before the app saw
    // the clear may land after a cut (the last segment may hold only
    // those): trace processor drops them as they lack their state, so no
    // slice it shows is unnamed.
    for path in &files[1..] {
        let packets = decode(&std::fs::read(path).expect("segment"));
        if !packets.iter().any(|p| p.has_track_event()) {
            continue;
        }
        let Some(tp) = trace_processor::open(path) else {
            return;
        };
        let work = tp
            .query("select count(*) as n from slice where name = 'work'")
            .scalar()
            .int();
        let unnamed = tp
            .query("select count(*) as n from slice where name is null")
            .scalar()
            .int();
        assert_eq!(unnamed, 0, "{}", path.display());
        if work == 0 {
            continue;
        }
        const CLEARED: u32 = 1; // SEQ_INCREMENTAL_STATE_CLEARED
        assert!(
            packets.iter().any(|p| p.sequence_flags() & CLEARED != 0)
                && packets.iter().any(|p| p.interned_data.is_some()),
            "{}: the app started its state again in this segment",
            path.display()
        );
        checked += 1;
    }
    assert!(checked >= 2, "{checked} segments with the app's slices");
}

/// `incremental_state_config { clear_period_ms }` reaches the SDK app as
/// ClearIncrementalState: its track_event writer starts its interned state
/// again each period (SEQ_INCREMENTAL_STATE_CLEARED), and trace processor
/// resolves every slice.
#[test]
fn the_clear_period_makes_an_app_start_its_interned_state_again() {
    let s = Session::start(&config(
        "incremental_state_config { clear_period_ms: 250 }\nflush_period_ms: 100\n",
    ));
    let mut app = s.app("clearing_app", &["--forever"]);
    app.expect("started");
    // The session runs through several clear periods.
    std::thread::sleep(Duration::from_millis(2000));
    let (run, _) = s.stop();
    app.kill();
    let packets = decode(&run.trace());
    let te_seqs: std::collections::BTreeSet<u32> = packets
        .iter()
        .filter(|p| p.has_track_event())
        .map(|p| p.trusted_packet_sequence_id())
        .collect();
    assert_eq!(te_seqs.len(), 1, "{te_seqs:?}");
    let seq = *te_seqs.first().expect("one");
    const CLEARED: u32 = 1; // SEQ_INCREMENTAL_STATE_CLEARED
    let clears = packets
        .iter()
        .filter(|p| p.trusted_packet_sequence_id() == seq && p.sequence_flags() & CLEARED != 0)
        .count();
    assert!(
        clears >= 4,
        "{clears} restarts of the interned state in 2 s"
    );
    if let Some(tp) = trace_processor::check(&run.out) {
        let unnamed = tp
            .query("select count(*) as n from slice where name is null")
            .scalar()
            .int();
        assert_eq!(unnamed, 0);
    }
}

/// The producer benchmark's path (scripts/bench_producer.py driving the
/// app's `bench` mode into the recorder and into Perfetto's in-process
/// service) runs in its test mode: one short round per size with a shared
/// memory that holds every packet, so both traces must be complete. Not a
/// measurement: it keeps the benchmark from rotting.
#[test]
fn the_producer_benchmark_runs_both_backends_in_test_mode() {
    let keep = tempfile::tempdir().expect("tempdir");
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/bench_producer.py"))
        .arg("--test")
        .arg("--keep")
        .arg(keep.path())
        .env("RECORDER_BIN", recorder_bin())
        .env("SDK_PRODUCER_BIN", sdk_app())
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("test: every packet arrived"), "{stdout}");
    for size in [64, 1024] {
        assert!(
            stdout.contains(&format!("| {size} B | recorder |")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("| {size} B | perfetto |")),
            "{stdout}"
        );
        for side in ["recorder", "perfetto"] {
            let path = keep.path().join(format!("{side}-{size}.pftrace"));
            let packets = decode(&std::fs::read(&path).expect("trace kept"));
            let counters = test_counters(&packets);
            assert_eq!(counters.len(), 1, "{side} {size}: {counters:?}");
            let seq = counters.values().next().expect("one sequence");
            assert_eq!(seq, &(0..2000).collect::<Vec<u64>>(), "{side} {size}");
            let sized = packets.iter().find(|p| p.has_for_testing()).expect("one");
            assert!(
                sized.for_testing().str().len() + 20 > size,
                "{side}: packets of about {size} B"
            );
            if let Some(py) = python_summary(&path) {
                let n: usize = py["sequences"]
                    .as_object()
                    .expect("sequences")
                    .values()
                    .map(|s| s["counters"].as_array().map_or(0, Vec::len))
                    .sum();
                assert_eq!(n, 2000, "python agrees ({side} {size})");
            }
            if side == "recorder" {
                trace_processor::check(&path);
            } else if let Some(tp) = trace_processor::open(&path) {
                tp.assert_no_errors();
            }
        }
    }
}

/// The slice (ns) each thread of `pid` runs with, from
/// /proc/PID/task/TID/sched (`se.slice`, kernels with EEVDF).
fn thread_slices(pid: u32) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let text = std::fs::read_to_string(t.path().join("sched")).unwrap_or_default();
        if let Some(slice) = text
            .lines()
            .find(|l| l.starts_with("se.slice"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().parse().ok())
        {
            out.push((tid, slice));
        }
    }
    out
}

/// Why a thread cannot ask for its own slice here, if it cannot: custom
/// slices for SCHED_OTHER came with Linux 6.12.
fn need_custom_slices() -> Option<String> {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy().into_owned();
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (6, 12) {
        return Some(format!(
            "kernel {release}: no custom scheduler slices before 6.12"
        ));
    }
    let own = std::fs::read_to_string("/proc/self/sched").unwrap_or_default();
    (!own.contains("se.slice")).then(|| "/proc/self/sched shows no se.slice".into())
}

/// The thread that frees an app's chunks runs with a 0.1 ms slice (so it
/// runs soon after a commit wakes it on a busy machine); the recorder's
/// other threads keep the kernel's default, and the app's packets arrive.
#[test]
fn the_thread_serving_apps_asks_for_a_short_slice_and_only_it() {
    require!(need_custom_slices());
    let s = Session::start(&config(""));
    let mut app = s.app("sliced_app", &["--forever"]);
    app.expect("started");
    let pid = s.child.id();
    let slices = wait_until(
        "a thread with a 0.1 ms slice",
        Duration::from_secs(10),
        || {
            let slices = thread_slices(pid);
            slices
                .iter()
                .any(|(_, ns)| *ns == 100_000)
                .then_some(slices)
        },
    );
    assert!(
        slices.iter().any(|(_, ns)| *ns != 100_000),
        "every thread took the short slice: {slices:?}"
    );
    s.wait_for_packets("sliced_app", 1);
    let mut child = app.child;
    let _ = child.kill();
    let _ = child.wait();
    let (run, _) = s.stop();
    let packets = decode(&run.trace());
    assert_eq!(counters_by_pid(&packets).len(), 1, "the app's packets");
    trace_processor::check(&run.out);
}
