//! Config loading against independent oracles: rust-protobuf's generated
//! Perfetto schema (`perfetto_protos`) decodes our binary encodings, and
//! Python's protobuf `text_format` with the PyPI `perfetto` descriptors parses
//! the same text independently.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::*;
use perfetto_protos::trace_config::TraceConfig as PTraceConfig;
use protobuf::Message as _;
use recorder::config::{self, LoadOptions, ServiceFields, SourceKind, TriggerMode};

fn cfg_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("config dir readable")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cfg"))
        .collect();
    v.sort();
    v
}

/// Every test config at hand: the bundled ones, the tests' own and, where
/// present, Perfetto's.
fn all_cfg_files() -> Vec<PathBuf> {
    let mut files = cfg_files(&repo_root().join("configs"));
    files.extend(cfg_files(&own_test_configs()));
    if let Some(dir) = need::found(need::perfetto_test_configs()) {
        files.extend(cfg_files(&dir));
    }
    files
}

/// The tests' own configs load, and the two written to be refused are,
/// naming the field.
#[test]
fn own_test_configs_load_or_are_refused_precisely() {
    let files = cfg_files(&own_test_configs());
    assert!(files.len() >= 8, "{files:?}");
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let loaded = config::load_path(path, LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name} must parse: {e}"));
        let refused = loaded.validate().err().map(|e| e.to_string());
        match (name, refused) {
            ("bad_trigger_timeout.cfg", Some(msg)) => {
                assert!(msg.contains("trigger_config.trigger_timeout_ms"), "{msg}")
            }
            ("trace_filter.cfg", Some(msg)) => assert!(msg.contains("trace_filter"), "{msg}"),
            ("bad_trigger_timeout.cfg" | "trace_filter.cfg", None) => {
                panic!("{name} must be refused")
            }
            (_, Some(msg)) => panic!("{name} refused unexpectedly: {msg}"),
            (_, None) => {}
        }
    }
}

fn decode_independent(bytes: &[u8]) -> PTraceConfig {
    PTraceConfig::parse_from_bytes(bytes).expect("the independent decoder reads our encoding")
}

const PY_ENCODE: &str = r#"
import struct, sys
from google.protobuf import text_format
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
for path in sys.argv[1:]:
    m = pb.TraceConfig()
    with open(path) as f:
        text_format.Parse(f.read(), m)
    b = m.SerializeToString()
    sys.stdout.buffer.write(struct.pack("<Q", len(b)) + b)
"#;

/// Python with the `perfetto` and `protobuf` modules the oracles use.
fn python_reads_perfetto_protos() -> bool {
    Command::new("python3")
        .args([
            "-c",
            "import google.protobuf, perfetto.protos.perfetto.trace.perfetto_trace_pb2",
        ])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Python's text_format encoding of each file, or why it is unavailable.
fn python_encode(files: &[PathBuf]) -> Result<Vec<Vec<u8>>, String> {
    if !python_reads_perfetto_protos() {
        return Err("python3 with `perfetto` and `protobuf` (pip install perfetto protobuf) is not available".into());
    }
    let out = Command::new("python3")
        .args(["-c", PY_ENCODE])
        .args(files)
        .output()
        .map_err(|e| e.to_string())?;
    assert!(
        out.status.success(),
        "python text_format refused a config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rest = &out.stdout[..];
    let mut encodings = Vec::new();
    while rest.len() >= 8 {
        let (len, tail) = rest.split_at(8);
        let len = u64::from_le_bytes(len.try_into().expect("8 bytes")) as usize;
        let (one, tail) = tail.split_at(len);
        encodings.push(one.to_vec());
        rest = tail;
    }
    assert_eq!(encodings.len(), files.len());
    Ok(encodings)
}

/// Every Perfetto test config loads or is refused naming the unsupported part;
/// what loads encodes to what rust-protobuf's own text parser makes of it,
/// where that parser can read the file.
#[test]
fn perfetto_test_configs_load_or_are_refused_precisely() {
    let dir = require!(need::perfetto_test_configs());
    let files = cfg_files(&dir);
    assert_eq!(files.len(), 25, "the Perfetto test suite has 25 configs");
    let mut compared = 0;
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let loaded = config::load_path(path, LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name} must parse: {e}"));
        match loaded.validate() {
            Ok(_) => {
                assert!(
                    !["bad_config.cfg", "ftrace_with_filter.cfg"].contains(&name.as_str()),
                    "{name} must be refused"
                );
            }
            Err(e) => {
                let msg = e.to_string();
                match name.as_str() {
                    "bad_config.cfg" => {
                        assert!(msg.contains("trigger_config.trigger_timeout_ms"), "{msg}")
                    }
                    "ftrace_with_filter.cfg" => assert!(msg.contains("trace_filter"), "{msg}"),
                    _ => panic!("{name} refused unexpectedly: {msg}"),
                }
            }
        }
        let text = std::fs::read_to_string(path).expect("readable");
        if let Ok(theirs) = protobuf::text_format::parse_from_str::<PTraceConfig>(&text) {
            assert_eq!(
                decode_independent(&loaded.bytes),
                theirs,
                "{name}: encodings differ"
            );
            compared += 1;
        }
    }
    // Measured: rust-protobuf's narrower text parser reads 17 of the 25.
    assert!(compared >= 15, "only {compared} configs compared");
}

/// Our encodings against Python's text_format (which reads all 25 of
/// Perfetto's), for the tests' own configs and Perfetto's where present.
#[test]
fn test_configs_match_python_text_format() {
    let mut files = cfg_files(&own_test_configs());
    if let Some(dir) = need::found(need::perfetto_test_configs()) {
        files.extend(cfg_files(&dir));
    }
    let encodings = match python_encode(&files) {
        Ok(e) => e,
        Err(why) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI must have the Python oracle: {why}");
            }
            eprintln!("skipped: {why}");
            return;
        }
    };
    for (path, theirs) in files.iter().zip(encodings) {
        let ours = config::load_path(path, LoadOptions::default()).expect("parses");
        assert_eq!(
            decode_independent(&ours.bytes),
            decode_independent(&theirs),
            "{}: our encoding differs from Python's",
            path.display()
        );
    }
}

/// text → binary → text → binary is stable, for every config we can read.
#[test]
fn text_binary_round_trips_are_stable() {
    for path in all_cfg_files() {
        let first = config::load_path(&path, LoadOptions::default()).expect("loads");
        let bin1 = first.bytes.clone();
        let from_bin = config::load_binary(&bin1, "bin").expect("our binary loads");
        let text2 = from_bin.to_text();
        let second = config::load_text(&text2, "printed", false)
            .unwrap_or_else(|e| panic!("{}: printed text must parse back: {e}", path.display()));
        assert_eq!(second.bytes, bin1, "{}", path.display());
        assert_eq!(second.to_text(), text2);
    }
}

#[test]
fn bundled_configs_load() {
    let dir = repo_root().join("configs");
    let files = cfg_files(&dir);
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(String::from))
        .collect();
    for want in [
        "long_trace.cfg",
        "flight_recorder.cfg",
        "buffer_policies.cfg",
        "quickstart.cfg",
    ] {
        assert!(names.iter().any(|n| n == want), "configs/{want} is missing");
    }
    for path in &files {
        let spec = config::load_spec(path, LoadOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            spec.warnings.is_empty(),
            "{}: {:?}",
            path.display(),
            spec.warnings
        );
    }
    let fr =
        config::load_spec(&dir.join("flight_recorder.cfg"), LoadOptions::default()).expect("valid");
    assert_eq!(
        fr.trigger.as_ref().map(|t| t.mode),
        Some(TriggerMode::StopTracing)
    );
    let bp =
        config::load_spec(&dir.join("buffer_policies.cfg"), LoadOptions::default()).expect("valid");
    assert_eq!(bp.buffers.len(), 2);
    assert_eq!(bp.data_sources[1].target_buffer.0, 1);
    assert!(matches!(bp.data_sources[0].kind, SourceKind::ForTesting(_)));
    let qs = config::load_spec(&dir.join("quickstart.cfg"), LoadOptions::default()).expect("valid");
    assert!(qs.file.is_some());
    assert!(
        qs.data_sources
            .iter()
            .all(|d| !matches!(d.kind, SourceKind::Ftrace(_)))
    );
}

fn text_error(src: &str) -> String {
    match config::load_text(src, "t.cfg", false) {
        Ok(_) => panic!("must not parse: {src}"),
        Err(e) => e.to_string(),
    }
}

/// One case per error class: message, line and column, the line itself and
/// the caret under the token.
#[test]
fn text_errors_point_at_the_token() {
    let cases: &[(&str, &str)] = &[
        (
            "buffers {\n  size_kb: 1024\n  fill_polcy: RING_BUFFER\n}\n",
            "t.cfg:3:3: error: unknown field 'fill_polcy' in BufferConfig\n  fill_polcy: RING_BUFFER\n  ^~~~~~~~~~\nnote: did you mean 'fill_policy'?",
        ),
        (
            "buffers { fill_policy: RING }",
            "t.cfg:1:24: error: unknown value 'RING' for enum FillPolicy (field 'fill_policy')\nbuffers { fill_policy: RING }\n                       ^~~~\nnote: valid values: UNSPECIFIED, RING_BUFFER, DISCARD",
        ),
        (
            "duration_ms: \"ten\"",
            "t.cfg:1:14: error: expected an integer for 'duration_ms', found a string\nduration_ms: \"ten\"\n             ^~~~~",
        ),
        (
            "duration_ms: 1\n\tduration_ms: 2",
            "t.cfg:2:2: error: field 'duration_ms' is set twice (it is not repeated)\n\tduration_ms: 2\n\t^~~~~~~~~~~",
        ),
        (
            "duration_ms: 4294967296",
            "t.cfg:1:14: error: 4294967296 is out of range for uint32 field 'duration_ms'\nduration_ms: 4294967296\n             ^~~~~~~~~~",
        ),
        (
            "write_into_file: yes",
            "t.cfg:1:18: error: expected true or false for 'write_into_file', found 'yes'\nwrite_into_file: yes\n                 ^~~",
        ),
        (
            "buffers {\n  size_kb: 1\n",
            "t.cfg:1:9: error: '{' is never closed: expected '}' before end of input\nbuffers {\n        ^",
        ),
        (
            "unique_session_name: \"abc\n",
            "t.cfg:1:22: error: unterminated string\nunique_session_name: \"abc\n                     ^~~~",
        ),
        (
            "duration_ms 5",
            "t.cfg:1:13: error: expected ':' after 'duration_ms', found '5'\nduration_ms 5\n            ^",
        ),
        (
            "duration_ms: 1__0",
            "t.cfg:1:14: error: '1__0' is not an integer (decimal, 0x hex or 0 octal, '_' between digits)\nduration_ms: 1__0\n             ^~~~",
        ),
    ];
    for (src, want) in cases {
        assert_eq!(&text_error(src), want, "for input {src:?}");
    }
    // A oneof set twice.
    let e = text_error(
        "trace_attributes { attribute { key: \"k\" long_value: 1 string_value: \"s\" } }",
    );
    assert!(e.contains("only one of oneof 'value'"), "{e}");
    assert!(e.starts_with("t.cfg:1:55: error:"), "{e}");
}

#[test]
fn text_features_parse() {
    let src = r#"
        # comment
        buffers: { size_kb: 0x400; fill_policy: DISCARD },
        buffers < size_kb: 02000 >
        duration_ms: 1_000
        unique_session_name: "a\tb" 'c' "\x41\101"
        data_sources { config { name: "linux.ftrace" ftrace_config { ftrace_events: ["sched/sched_switch", "power/cpu_idle"] } } }
        write_into_file: true
    "#;
    let l = config::load_text(src, "t", false).expect("parses");
    let p = decode_independent(&l.bytes);
    assert_eq!(p.buffers[0].size_kb(), 1024);
    assert_eq!(p.buffers[1].size_kb(), 1024, "octal 02000");
    assert_eq!(p.duration_ms(), 1000);
    assert_eq!(p.unique_session_name(), "a\tbcAA");
    assert_eq!(
        p.data_sources[0].config.ftrace_config.ftrace_events,
        vec![
            "sched/sched_switch".to_string(),
            "power/cpu_idle".to_string()
        ]
    );
}

#[test]
fn lossy_mode_skips_and_lists_unknown_fields() {
    let src = "buffers { size_kb: 64 brand_new { x: 1 } }\nfuture_field: 3\nduration_ms: 10";
    assert!(config::load_text(src, "t", false).is_err());
    let l = config::load_text(src, "t", true).expect("lossy parses");
    assert_eq!(
        l.skipped_fields,
        vec!["buffers.brand_new".to_string(), "future_field".to_string()]
    );
    let spec = l.validate().expect("valid");
    assert!(
        spec.warnings[0]
            .message
            .contains("buffers.brand_new, future_field")
    );
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn ld(out: &mut Vec<u8>, field: u32, payload: &[u8]) {
    varint(out, (u64::from(field) << 3) | 2);
    varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// A binary config with fields our schema lacks, inside a data source config
/// and its sub-config, reaches the data source byte-identical; only the
/// service-owned fields change when they are rewritten.
#[test]
fn unknown_fields_reach_the_data_source_untouched() {
    let mut for_testing = Vec::new();
    for_testing.extend_from_slice(&[0x08, 0x05]); // message_count: 5
    ld(&mut for_testing, 77, b"future sub-config field");
    let mut dsc = Vec::new();
    ld(&mut dsc, 1, b"for_testing");
    dsc.extend_from_slice(&[0x10, 0x00]); // target_buffer: 0
    varint(&mut dsc, 5000 << 3); // unknown varint field 5000
    varint(&mut dsc, 123_456);
    ld(&mut dsc, 1001, &for_testing);
    ld(&mut dsc, 6000, &[1, 2, 3]);
    let mut ds = Vec::new();
    ld(&mut ds, 1, &dsc);
    let mut buf = Vec::new();
    buf.extend_from_slice(&[0x08, 0x80, 0x08]); // size_kb: 1024
    let mut tc = Vec::new();
    ld(&mut tc, 1, &buf);
    ld(&mut tc, 2, &ds);
    tc.extend_from_slice(&[0x18, 0xe8, 0x07]); // duration_ms: 1000
    varint(&mut tc, (49_999 << 3) | 2); // unknown top-level field
    varint(&mut tc, 1);
    tc.push(0x2a);

    let loaded = config::load_bytes(&tc, "x.pb", LoadOptions::default()).expect("binary loads");
    assert_eq!(loaded.form, config::ConfigForm::Binary);
    let spec = loaded.validate().expect("valid");
    assert_eq!(spec.data_sources[0].raw_config, dsc);
    assert_eq!(spec.config_bytes, tc);
    assert_eq!(
        spec.unknown_fields,
        vec![
            "#49999".to_string(),
            "data_sources[0].config.#5000".to_string(),
            "data_sources[0].config.#6000".to_string(),
            "data_sources[0].config.for_testing.#77".to_string(),
        ]
    );
    let SourceKind::ForTesting(t) = &spec.data_sources[0].kind else {
        panic!("for_testing kind");
    };
    assert_eq!(t.message_count, 5);

    let svc = ServiceFields {
        target_buffer: Some(7),
        trace_duration_ms: Some(1000),
        tracing_session_id: Some(99),
        stop_timeout_ms: Some(5000),
        ..Default::default()
    };
    let rewritten = spec.data_sources[0]
        .config_for_source(&svc)
        .expect("well-formed");
    // The independent decoder sees the new core fields and the old sub-config.
    let p = perfetto_protos::data_source_config::DataSourceConfig::parse_from_bytes(&rewritten)
        .expect("decodes");
    assert_eq!(p.target_buffer(), 7);
    assert_eq!(p.trace_duration_ms(), 1000);
    assert_eq!(p.tracing_session_id(), 99);
    assert_eq!(p.for_testing.message_count(), 5);
    // Everything but the rewritten fields is the original byte sequence.
    let without_target: Vec<u8> = {
        let mut v = Vec::new();
        ld(&mut v, 1, b"for_testing");
        v.extend_from_slice(&dsc[15..]);
        v
    };
    assert!(rewritten.starts_with(&without_target));

    // The check command lists what it did not understand.
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("x.pb");
    std::fs::write(&f, &tc).expect("write");
    let out = Command::new(recorder_bin())
        .args(["config", "check"])
        .arg(&f)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("fields not understood"), "{stdout}");
    assert!(
        stdout.contains("data_sources[0].config.for_testing.#77"),
        "{stdout}"
    );
}

#[test]
fn semantic_errors_name_the_field_path() {
    let cases: &[(&str, &str)] = &[
        ("duration_ms: 1", "buffers: at least one buffer is required"),
        (
            "buffers { size_kb: 1 } buffers { size_kb: 0 }",
            "buffers[1].size_kb: must be > 0",
        ),
        (
            "buffers { size_kb: 4194304 }",
            "buffers[0].size_kb: 4194304 KiB is 4 GiB or more",
        ),
        (
            "buffers { size_kb: 1 } data_sources { config { name: \"linux.ftrace\" target_buffer: 1 } }",
            "data_sources[0].config.target_buffer: buffer 1 does not exist; valid: 0..=0",
        ),
        (
            "buffers { size_kb: 1 } data_sources { config { name: \"for_testing\" target_buffer_name: \"x\" } }",
            "data_sources[0].config.target_buffer_name: no buffer is named \"x\"",
        ),
        (
            "buffers { size_kb: 1 } trigger_config { trigger_mode: STOP_TRACING triggers { name: \"a\" } }",
            "trigger_config.trigger_timeout_ms: required with a trigger mode",
        ),
        (
            "buffers { size_kb: 1 } duration_ms: 5 trigger_config { trigger_mode: START_TRACING trigger_timeout_ms: 5 triggers { name: \"a\" } }",
            "duration_ms: must be 0",
        ),
        (
            "buffers { size_kb: 1 } write_into_file: true trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 5 triggers { name: \"a\" } }",
            "STOP_TRACING and CLONE_SNAPSHOT cannot be combined with write_into_file",
        ),
        (
            "buffers { size_kb: 1 } trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 5 triggers { name: \"a\" } triggers { name: \"a\" } }",
            "trigger_config.triggers[1].name: trigger name \"a\" is used twice",
        ),
        (
            "buffers { size_kb: 1 } trigger_config { trigger_timeout_ms: 5 triggers { name: \"a\" } }",
            "trigger_config.trigger_mode: triggers are listed but trigger_mode is UNSPECIFIED",
        ),
        (
            "buffers { size_kb: 1 } trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 5 triggers { name: \"a\" producer_name_regex: \"(\" } }",
            "trigger_config.triggers[0].producer_name_regex: invalid regular expression",
        ),
        (
            "buffers { size_kb: 1 } data_sources { config { name: \"x\" } producer_name_regex_filter: \"[\" }",
            "data_sources[0].producer_name_regex_filter[0]: invalid regular expression",
        ),
        (
            "buffers { size_kb: 1 name: \"a\" } buffers { size_kb: 1 name: \"a\" }",
            "buffers[1].name: buffer name \"a\" is used twice",
        ),
        (
            "buffers { size_kb: 1 } trigger_config { trigger_mode: START_TRACING use_clone_snapshot_if_available: true trigger_timeout_ms: 5 }",
            "trigger_config.use_clone_snapshot_if_available: only valid with trigger_mode: STOP_TRACING",
        ),
    ];
    for (src, want) in cases {
        let l = config::load_text(src, "t", false).expect("parses");
        let e = l.validate().expect_err(src).to_string();
        assert!(e.contains(want), "for {src:?}:\n{e}\nwanted {want:?}");
    }
}

#[test]
fn service_rules_with_defaults_and_warnings() {
    let src = "buffers { size_kb: 1 } write_into_file: true file_write_period_ms: 50 flush_period_ms: 1000 \
               data_sources { config { name: \"android.log\" } } \
               data_sources { config { name: \"android.perfetto.FakeProducer\" for_testing { seed: 3 } } }";
    let spec = config::load_text(src, "t", false)
        .expect("parses")
        .validate()
        .expect("valid");
    assert_eq!(
        spec.file.as_ref().map(|f| f.write_period.as_millis()),
        Some(100)
    );
    let w: Vec<String> = spec.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        w.iter()
            .any(|w| w.starts_with("file_write_period_ms: 50 ms")),
        "{w:?}"
    );
    assert!(
        w.iter().any(|w| w.starts_with("flush_period_ms: ignored")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|w| w.contains("\"android.log\" exists only on Android")),
        "{w:?}"
    );
    assert!(matches!(spec.data_sources[1].kind, SourceKind::ForTesting(ref t) if t.seed == 3));
    let spec = config::load_text("buffers { size_kb: 1 } write_into_file: true", "t", false)
        .expect("parses")
        .validate()
        .expect("valid");
    assert_eq!(
        spec.file.as_ref().map(|f| f.write_period.as_millis()),
        Some(5000)
    );
    let snap = config::load_spec(
        &own_test_configs().join("snapshot.cfg"),
        LoadOptions::default(),
    )
    .expect("valid");
    assert_eq!(
        snap.trigger.map(|t| t.mode),
        Some(TriggerMode::CloneSnapshot)
    );
}

fn run(args: &[&str], stdin: Option<&[u8]>) -> (i32, Vec<u8>, String) {
    let mut child = Command::new(recorder_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("recorder runs");
    if let Some(s) = stdin {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(s)
            .expect("stdin");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("waits");
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_convert_check_and_exit_codes() {
    let lt = repo_root().join("configs/long_trace.cfg");
    let lt = lt.to_str().expect("utf-8 path");
    let (code, bin, err) = run(&["config", "convert", lt, "--to", "binary"], None);
    assert_eq!(code, 0, "{err}");
    let p = decode_independent(&bin);
    assert!(p.write_into_file());
    // Binary in on stdin, text out, which parses back to the same bytes.
    let (code, text, err) = run(&["config", "convert", "-"], Some(&bin));
    assert_eq!(code, 0, "{err}");
    let back =
        config::load_text(std::str::from_utf8(&text).expect("utf-8"), "t", false).expect("parses");
    assert_eq!(back.bytes, bin);
    // `config check -` reads stdin and explains the plan.
    let (code, out, err) = run(&["config", "check", "-"], Some(&bin));
    assert_eq!(code, 0, "{err}");
    assert!(String::from_utf8_lossy(&out).contains("linux.ftrace"));
    // A config error is exit code 2 with the positioned message.
    let (code, _, err) = run(&["--config", "-", "--txt"], Some(b"buffers { sizekb: 1 }"));
    assert_eq!(code, 2);
    assert!(
        err.contains("<stdin>:1:11: error: unknown field 'sizekb'"),
        "{err}"
    );
    let bad = own_test_configs().join("bad_trigger_timeout.cfg");
    let (code, _, err) = run(&["config", "check", bad.to_str().expect("utf-8")], None);
    assert_eq!(code, 2);
    assert!(err.contains("trigger_timeout_ms"), "{err}");
    let (code, out, _) = run(&["--help"], None);
    assert_eq!(code, 0);
    let help = String::from_utf8_lossy(&out);
    assert!(
        help.contains("Exit codes:") && help.contains("2  usage or config error"),
        "{help}"
    );
    let (code, _, _) = run(&[], None);
    assert_eq!(code, 2);
}

mod generated {
    //! Property: TraceConfigs written as text by a generator parse, and the
    //! independent decoder reads back exactly the generated values.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    struct Buf {
        size_kb: u32,
        policy: u8,
        name: Option<String>,
    }

    /// (mode index, timeout, [(name, stop delay, skip probability)]).
    type GenTrigger = (u8, u32, Vec<(String, u32, f64)>);

    #[derive(Debug, Clone)]
    struct Gen {
        buffers: Vec<Buf>,
        duration_ms: Option<u32>,
        write_into_file: Option<bool>,
        max_file_size_bytes: Option<u64>,
        events: Vec<String>,
        session_name: Option<String>,
        trigger: Option<GenTrigger>,
    }

    fn quote(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    fn int_text(v: u64, style: u8) -> String {
        match style % 4 {
            0 => v.to_string(),
            1 => format!("0x{v:x}"),
            2 if v > 0 => format!("0{v:o}"),
            _ => {
                // Digit separators every three digits.
                let s = v.to_string();
                let mut out = String::new();
                for (i, c) in s.chars().enumerate() {
                    if i > 0 && (s.len() - i).is_multiple_of(3) {
                        out.push('_');
                    }
                    out.push(c);
                }
                out
            }
        }
    }

    fn render(g: &Gen, style: u8) -> String {
        let mut s = String::new();
        let sep = if style & 1 == 0 { "\n" } else { "; " };
        for b in &g.buffers {
            s.push_str(&format!(
                "buffers{} {{ size_kb: {}",
                if style & 2 == 0 { "" } else { ":" },
                int_text(u64::from(b.size_kb), style)
            ));
            s.push_str(&format!(
                "{sep}fill_policy: {}",
                ["UNSPECIFIED", "RING_BUFFER", "DISCARD"][b.policy as usize]
            ));
            if let Some(n) = &b.name {
                s.push_str(&format!("{sep}name: {}", quote(n)));
            }
            s.push_str(" }\n");
        }
        if let Some(d) = g.duration_ms {
            s.push_str(&format!(
                "duration_ms: {}\n",
                int_text(u64::from(d), style >> 2)
            ));
        }
        if let Some(w) = g.write_into_file {
            s.push_str(&format!("write_into_file: {w}\n"));
        }
        if let Some(m) = g.max_file_size_bytes {
            s.push_str(&format!(
                "max_file_size_bytes: {}\n",
                int_text(m, style >> 3)
            ));
        }
        if !g.events.is_empty() {
            s.push_str("data_sources { config { name: \"linux.ftrace\" ftrace_config {\n");
            for e in &g.events {
                s.push_str(&format!("  ftrace_events: {}\n", quote(e)));
            }
            s.push_str("} } }\n");
        }
        if let Some(n) = &g.session_name {
            s.push_str(&format!("unique_session_name: {}\n", quote(n)));
        }
        if let Some((mode, timeout, triggers)) = &g.trigger {
            s.push_str(&format!(
                "trigger_config {{ trigger_mode: {} trigger_timeout_ms: {timeout}\n",
                [
                    "UNSPECIFIED",
                    "START_TRACING",
                    "STOP_TRACING",
                    "CLONE_SNAPSHOT"
                ][*mode as usize]
            ));
            for (name, delay, p) in triggers {
                s.push_str(&format!(
                    "  triggers {{ name: {} stop_delay_ms: {delay} skip_probability: {p:?} }}\n",
                    quote(name)
                ));
            }
            s.push_str("}\n");
        }
        s
    }

    fn gen_strategy() -> impl Strategy<Value = Gen> {
        let buf = (
            any::<u32>(),
            0u8..3,
            proptest::option::of("[a-z\"\\\\ \n]{0,8}"),
        )
            .prop_map(|(size_kb, policy, name)| Buf {
                size_kb,
                policy,
                name,
            });
        (
            proptest::collection::vec(buf, 0..4),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<u64>()),
            proptest::collection::vec("[a-z_]{1,8}/[a-z_*]{1,12}", 0..5),
            proptest::option::of("\\PC{0,12}"),
            proptest::option::of((
                0u8..4,
                any::<u32>(),
                proptest::collection::vec(("[a-z-]{1,10}", any::<u32>(), 0.0f64..1.0), 0..3),
            )),
        )
            .prop_map(|t| Gen {
                buffers: t.0,
                duration_ms: t.1,
                write_into_file: t.2,
                max_file_size_bytes: t.3,
                events: t.4,
                session_name: t.5,
                trigger: t.6,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn generated_configs_decode_independently(g in gen_strategy(), style in any::<u8>()) {
            let text = render(&g, style);
            let l = config::load_text(&text, "gen", false).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
            let p = decode_independent(&l.bytes);
            prop_assert_eq!(p.buffers.len(), g.buffers.len());
            for (pb, gb) in p.buffers.iter().zip(&g.buffers) {
                prop_assert_eq!(pb.size_kb(), gb.size_kb);
                prop_assert_eq!(pb.fill_policy() as u8, gb.policy);
                // BufferConfig.name is newer than v51: covered by the round trip below.
            }
            prop_assert_eq!(p.duration_ms, g.duration_ms);
            prop_assert_eq!(p.write_into_file, g.write_into_file);
            prop_assert_eq!(p.max_file_size_bytes, g.max_file_size_bytes);
            prop_assert_eq!(p.unique_session_name.clone(), g.session_name.clone());
            if g.events.is_empty() {
                prop_assert!(p.data_sources.is_empty());
            } else {
                prop_assert_eq!(&p.data_sources[0].config.ftrace_config.ftrace_events, &g.events);
            }
            match &g.trigger {
                None => prop_assert!(p.trigger_config.is_none()),
                Some((mode, timeout, triggers)) => {
                    let t = &p.trigger_config;
                    let want_mode = [0, 1, 2, 4][*mode as usize];
                    prop_assert_eq!(t.trigger_mode() as i32, want_mode);
                    prop_assert_eq!(t.trigger_timeout_ms(), *timeout);
                    prop_assert_eq!(t.triggers.len(), triggers.len());
                    for (pt, (name, delay, prob)) in t.triggers.iter().zip(triggers) {
                        prop_assert_eq!(pt.name(), name.as_str());
                        prop_assert_eq!(pt.stop_delay_ms(), *delay);
                        prop_assert_eq!(pt.skip_probability(), *prob);
                    }
                }
            }
            // And our printer's text reads back to the same bytes.
            let printed = l.to_text();
            let again = config::load_text(&printed, "printed", false).map_err(|e| TestCaseError::fail(format!("{e}\n{printed}")))?;
            prop_assert_eq!(again.bytes, l.bytes);
        }
    }
}

/// FtraceConfig's print_filter and drain_buffer_percent reach the spec; a
/// rule that matches nothing and a percentage over 100 are warned about by
/// field path.
#[test]
fn ftrace_print_filter_and_drain_percent() {
    use recorder::config::spec::{PrintMatch, PrintRule};
    let src = r#"buffers { size_kb: 64 }
data_sources { config { name: "linux.ftrace" ftrace_config {
  ftrace_events: "ftrace/print"
  drain_buffer_percent: 150
  print_filter {
    rules { prefix: "drop" allow: false }
    rules { allow: true }
    rules { atrace_msg { type: "C" prefix: "counter" } allow: true }
  }
} } }"#;
    let spec = config::load_text(src, "t", false)
        .expect("parses")
        .validate()
        .expect("valid");
    let SourceKind::Ftrace(f) = &spec.data_sources[0].kind else {
        panic!("ftrace");
    };
    assert_eq!(f.drain_buffer_percent, 100);
    assert_eq!(
        f.print_filter.rules,
        [
            PrintRule {
                matches: PrintMatch::Prefix("drop".into()),
                allow: false
            },
            PrintRule {
                matches: PrintMatch::Atrace {
                    kind: "C".into(),
                    prefix: "counter".into()
                },
                allow: true
            },
        ]
    );
    let w: Vec<String> = spec.warnings.iter().map(|w| w.to_string()).collect();
    let has = |p: &str| w.iter().any(|w| w.starts_with(p));
    assert!(
        has("data_sources[0].config.ftrace_config.drain_buffer_percent: 150 is over 100"),
        "{w:?}"
    );
    assert!(
        has(
            "data_sources[0].config.ftrace_config.print_filter.rules[1]: ignored: rule has neither"
        ),
        "{w:?}"
    );
}

const PY_PATHS: &str = r#"
import sys
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor as F
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
def walk(m, path, out):
    for fd, v in m.ListFields():
        p = fd.name if not path else path + "." + fd.name
        rep = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == F.LABEL_REPEATED
        if fd.type == F.TYPE_MESSAGE:
            items = list(v) if rep else [v]
            for i, item in enumerate(items):
                q = p + "[%d]" % i if rep else p
                out.append(q)
                walk(item, q, out)
        else:
            out.append(p)
for path in sys.argv[1:]:
    m = pb.TraceConfig()
    with open(path) as f:
        text_format.Parse(f.read(), m)
    out = []
    walk(m, "", out)
    print(path + "\t" + "\t".join(out))
"#;

/// `recorder config check --explain` on every config in `configs/`, the
/// tests' own and (where present) Perfetto's, through the binary: every field the config
/// sets is accounted for, by path, as applied, applied with changes or
/// ignored — checked against the set fields Python's `text_format` (with
/// Perfetto's own descriptors) finds in the same file — and a few entries
/// are checked exactly.
#[test]
fn explain_accounts_for_every_field_by_path() {
    let peer_dir = need::found(need::perfetto_test_configs());
    let mut files = cfg_files(&repo_root().join("configs"));
    files.extend(cfg_files(&own_test_configs()));
    if let Some(dir) = &peer_dir {
        files.extend(cfg_files(dir));
    }
    let run = |path: &std::path::Path| {
        let out = Command::new(recorder_bin())
            .args(["-q", "config", "check", "--explain"])
            .arg(path)
            .output()
            .expect("recorder runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let mut explained = std::collections::BTreeMap::new();
    for path in &files {
        let (code, stdout) = run(path);
        if code != Some(0) {
            // Refused configs say why on stderr (tested above); nothing to explain.
            assert_eq!(code, Some(2), "{}", path.display());
            continue;
        }
        let lines: Vec<(String, String)> = stdout
            .split_once("\nfields:\n")
            .unwrap_or_else(|| panic!("{}: no fields section:\n{stdout}", path.display()))
            .1
            .lines()
            .map(|l| {
                let l = l.strip_prefix("  ").expect("indented");
                let (p, rest) = l.split_once(" = ").expect("PATH = VALUE: STATUS");
                (p.to_string(), rest.to_string())
            })
            .collect();
        for (p, rest) in &lines {
            let status = rest.split(": ").skip(1).collect::<Vec<_>>().join(": ");
            assert!(
                status == "applied"
                    || status.starts_with("applied (")
                    || status.starts_with("applied with changes (")
                    || status.starts_with("ignored ("),
                "{}: {p} = {rest}",
                path.display()
            );
        }
        explained.insert(path.clone(), lines);
    }
    // All but the two refused of the tests' own, and 23 of Perfetto's 25.
    let own = cfg_files(&own_test_configs()).len() - 2;
    let bundled = cfg_files(&repo_root().join("configs")).len();
    let want = bundled + own + if peer_dir.is_some() { 23 } else { 0 };
    assert_eq!(explained.len(), want, "configs explained");

    // Exact entries.
    let entry = |path: &std::path::Path, p: &str| -> String {
        explained
            .get(path)
            .and_then(|v| v.iter().find(|(q, _)| q == p))
            .map(|(_, rest)| rest.clone())
            .unwrap_or_else(|| panic!("{}: no {p}", path.display()))
    };
    let own = |file: &str| own_test_configs().join(file);
    assert_eq!(
        entry(&own("periodic_file.cfg"), "flush_period_ms"),
        "20000: ignored (with write_into_file it counts only with write_flush_mode WRITE_FLUSH_DISABLED, as in Perfetto)"
    );
    assert_eq!(
        entry(&own("periodic_file.cfg"), "file_write_period_ms"),
        "2500: applied"
    );
    assert_eq!(
        entry(&own("android_fields.cfg"), "bugreport_score"),
        "50: ignored (Android only)"
    );
    assert_eq!(
        entry(
            &own("fast_polls.cfg"),
            "data_sources[1].config.process_stats_config.proc_stats_poll_ms"
        ),
        "10: applied with changes (10 ms is under the 100 ms minimum; raised to 100)"
    );
    assert_eq!(
        entry(
            &own("android_fields.cfg"),
            "data_sources[1].config.android_power_config"
        ),
        "{…}: applied (passed as written to the producer of \"android.power\")"
    );
    assert!(
        entry(
            &own("rss_throttle.cfg"),
            "data_sources[0].config.ftrace_config.throttle_rss_stat"
        )
        .starts_with("true: applied (kmem/rss_stat_throttled where the kernel has it")
    );
    if let Some(dir) = &peer_dir {
        assert_eq!(
            entry(&dir.join("long_trace.cfg"), "flush_period_ms"),
            "20000: ignored (with write_into_file it counts only with write_flush_mode WRITE_FLUSH_DISABLED, as in Perfetto)"
        );
        assert_eq!(
            entry(&dir.join("bugreport.cfg"), "bugreport_score"),
            "100: ignored (Android only)"
        );
        assert_eq!(
            entry(
                &dir.join("android_syshealth.cfg"),
                "data_sources[5].config.android_power_config"
            ),
            "{…}: applied (passed as written to the producer of \"android.power\")"
        );
    }
    let bundled_long = repo_root().join("configs/long_trace.cfg");
    assert_eq!(entry(&bundled_long, "buffers[0].size_kb"), "65536: applied");

    // Against Python's reading of the same files: each listed path is a
    // field the file sets, and each field it sets is listed (or inside a
    // message listed whole).
    if !python_reads_perfetto_protos() {
        assert!(!kernel_required(), "python oracle missing under CI");
        eprintln!("python oracle skipped: no perfetto/protobuf modules");
        return;
    }
    let names: Vec<&PathBuf> = explained.keys().collect();
    let out = Command::new("python3")
        .args(["-c", PY_PATHS])
        .args(&names)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut parts = line.split('\t');
        let file = PathBuf::from(parts.next().expect("path"));
        let set: Vec<&str> = parts.collect();
        let ours: Vec<&str> = explained[&file].iter().map(|(p, _)| p.as_str()).collect();
        for p in &ours {
            assert!(
                set.contains(p),
                "{}: {p} is not a field the file sets",
                file.display()
            );
        }
        for s in &set {
            let has_children = set.iter().any(|t| t.starts_with(&format!("{s}.")));
            if has_children {
                continue;
            }
            assert!(
                ours.iter().any(|p| s == p
                    || s.starts_with(&format!("{p}."))
                    || s.starts_with(&format!("{p}["))),
                "{}: {s} is set but not explained: {ours:?}",
                file.display()
            );
        }
    }
}

/// A `write_into_file` config's `output_path` is the trace file when no -o
/// is given (a new file only, as Perfetto's service creates it); with -o as
/// well the run is refused.
#[test]
fn output_path_from_the_config() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("from_config.pftrace");
    let cfg = dir.path().join("c.cfg");
    std::fs::write(
        &cfg,
        format!(
            r#"buffers {{ size_kb: 1024 }}
data_sources {{ config {{ name: "for_testing" for_testing {{ message_count: 10 }} }} }}
duration_ms: 300
write_into_file: true
output_path: "{}""#,
            out.display()
        ),
    )
    .expect("cfg");
    let run = |extra: &[&str]| {
        Command::new(recorder_bin())
            .arg("--config")
            .arg(&cfg)
            .args(extra)
            .output()
            .expect("recorder runs")
    };
    let both = run(&["-o", "elsewhere.pftrace"]);
    assert_eq!(both.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both.stderr).contains("sets output_path"));
    let ok = run(&[]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let trace =
        perfetto_protos::trace::Trace::parse_from_bytes(&std::fs::read(&out).expect("trace"))
            .expect("decodes");
    assert_eq!(
        trace.packet.iter().filter(|p| p.has_for_testing()).count(),
        10
    );
    // The file exists now: a second run refuses to overwrite it.
    let again = run(&[]);
    assert!(!again.status.success());
}

/// The `trace_config` packet records the flushing the session does: a
/// streaming config gets the flush plan's period in `flush_period_ms`
/// (trace processor otherwise reports `config_write_into_file_no_flush`);
/// everything else, unknown fields included, is the config as loaded.
#[test]
fn recorded_config_carries_the_flush_period_a_streaming_session_uses() {
    let recorded = |src: &str| {
        let spec = config::load_text(src, "t", false)
            .expect("parses")
            .validate()
            .expect("valid");
        let p = decode_independent(&spec.config_bytes);
        (spec, p)
    };
    let base = "buffers { size_kb: 64 } write_into_file: true ";
    // AUTO with a short write period: flushed every 5 s.
    let (spec, p) = recorded(&format!("{base} file_write_period_ms: 1000"));
    assert_eq!(
        spec.flush,
        config::FlushPlan::Periodic(std::time::Duration::from_secs(5))
    );
    assert_eq!(p.flush_period_ms(), 5000);
    assert_eq!(p.file_write_period_ms(), 1000);
    // An ignored flush_period_ms records the period used instead.
    let (_, p) = recorded(&format!(
        "{base} file_write_period_ms: 2500 flush_period_ms: 20000"
    ));
    assert_eq!(p.flush_period_ms(), 5000);
    // A long write period flushes before each pass.
    let (spec, p) = recorded(&format!("{base} file_write_period_ms: 30000"));
    assert_eq!(spec.flush, config::FlushPlan::BeforeEachWritePass);
    assert_eq!(p.flush_period_ms(), 30000);
    // WRITE_FLUSH_DISABLED honours flush_period_ms, as written.
    let (_, p) = recorded(&format!(
        "{base} write_flush_mode: WRITE_FLUSH_DISABLED flush_period_ms: 700"
    ));
    assert_eq!(p.flush_period_ms(), 700);
    // ... and without one nothing is flushed until stop: nothing recorded,
    // and a warning says what trace processor will make of it.
    let (spec, p) = recorded(&format!("{base} write_flush_mode: WRITE_FLUSH_DISABLED"));
    assert_eq!(spec.flush, config::FlushPlan::AtStop);
    assert!(!p.has_flush_period_ms());
    assert!(
        spec.warnings
            .iter()
            .any(|w| w.to_string().contains("config_write_into_file_no_flush")),
        "{:?}",
        spec.warnings
    );
    // Not streaming: the config as loaded, byte for byte.
    let src = "buffers { size_kb: 64 } duration_ms: 10";
    let loaded = config::load_text(src, "t", false).expect("parses");
    assert_eq!(loaded.validate().expect("valid").config_bytes, loaded.bytes);
}

/// Config errors and the plan never put the config's control bytes on the
/// terminal (escape sequences are shown escaped), and a 200 KB token gives
/// an error of a few hundred bytes, for `config check` and for a recording.
#[test]
fn config_errors_escape_control_bytes_and_stay_small() {
    let d = tempfile::tempdir().expect("tempdir");
    let huge = "x".repeat(200_000);
    let cases: [(&str, String, Option<i32>); 4] = [
        (
            "escape.cfg",
            "buffers { size_kb: 64 }\n\x1b]0;pwned\x07bad\x1b[2J: 2\n".to_string(),
            Some(2),
        ),
        (
            "token.cfg",
            format!("buffers {{ size_kb: 64 }}\n{huge}: 1\n"),
            Some(2),
        ),
        (
            "string.cfg",
            format!(
                "buffers {{ size_kb: 64 }}\nunique_session_name: \"{huge}\\033\"\nduration_ms: \"x\"\n"
            ),
            Some(2),
        ),
        (
            "name.cfg",
            "buffers { size_kb: 64 }\ndata_sources { config { name: \"x\\033[2J\\007\" } }\n"
                .to_string(),
            Some(0),
        ),
    ];
    for (name, text, want) in cases {
        let cfg = d.path().join(name);
        std::fs::write(&cfg, &text).expect("write");
        for args in [
            vec![
                "config".to_string(),
                "check".into(),
                cfg.display().to_string(),
            ],
            vec![
                "--config".into(),
                cfg.display().to_string(),
                "-o".into(),
                d.path().join("t.pftrace").display().to_string(),
            ],
        ] {
            if want == Some(0) && args[0] == "--config" {
                continue;
            }
            let t0 = std::time::Instant::now();
            let out = Command::new(recorder_bin())
                .args(&args)
                .stdin(std::process::Stdio::null())
                .output()
                .expect("runs");
            assert_eq!(out.status.code(), want, "{name} {args:?}");
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(3),
                "{name}: {:?}",
                t0.elapsed()
            );
            for (what, bytes) in [("stderr", &out.stderr), ("stdout", &out.stdout)] {
                assert!(
                    !bytes.iter().any(|&b| b == 0x1b || b == 0x07),
                    "{name} {args:?} {what}: {}",
                    String::from_utf8_lossy(bytes)
                );
                assert!(bytes.len() < 6000, "{name} {what}: {} bytes", bytes.len());
            }
        }
    }
}

/// A 1 MiB config full of producer_name_regex_filter patterns checks in
/// seconds: a pattern repeated is compiled once, costly ones stop at the
/// size limit, and past 64 distinct patterns the config is refused.
#[test]
fn a_config_of_regular_expressions_checks_in_seconds() {
    let d = tempfile::tempdir().expect("tempdir");
    let make = |name: &str, pattern: &dyn Fn(usize) -> String| {
        let mut text = String::from("buffers { size_kb: 64 }\n");
        let mut i = 0;
        while text.len() < 1_000_000 {
            let filters: Vec<String> = (0..100)
                .map(|j| format!("producer_name_regex_filter: \"{}\"", pattern(i * 100 + j)))
                .collect();
            text.push_str(&format!(
                "data_sources {{ config {{ name: \"track_event\" }} {} }}\n",
                filters.join(" ")
            ));
            i += 1;
        }
        let p = d.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let same = make("same.cfg", &|_| "com\\\\.example\\\\.[a-z_]+".to_string());
    let distinct = make("distinct.cfg", &|n| format!("app_{n}_[a-z]+"));
    let costly = make("costly.cfg", &|n| format!("(\\\\w+){{20}}x{}", n % 8));
    for (cfg, want, says) in [
        (&same, Some(0), "valid text config"),
        (
            &distinct,
            Some(2),
            "more than 64 distinct regular expressions",
        ),
        (&costly, Some(2), "exceeds size limit"),
    ] {
        let t0 = std::time::Instant::now();
        let out = Command::new(recorder_bin())
            .args(["config", "check"])
            .arg(cfg)
            .stdin(Stdio::null())
            .output()
            .expect("runs");
        let took = t0.elapsed();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), want, "{}", &text[..text.len().min(2000)]);
        assert!(text.contains(says), "{}", &text[..text.len().min(2000)]);
        assert!(took < std::time::Duration::from_secs(30), "{took:?}");
    }
}

/// More writers than a buffer has chunks: `config check` says so, with the
/// numbers (each holds a chunk while it writes).
#[test]
fn config_check_warns_when_writers_outnumber_the_chunks() {
    let d = tempfile::tempdir().expect("tempdir");
    let mut text = String::from("buffers { size_kb: 1024 fill_policy: DISCARD }\n");
    for _ in 0..300 {
        text.push_str(
            "data_sources { config { name: \"for_testing\" for_testing { message_count: 1 } } }\n",
        );
    }
    let cfg = d.path().join("many.cfg");
    std::fs::write(&cfg, &text).expect("write");
    let check = || {
        Command::new(recorder_bin())
            .args(["config", "check"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .output()
            .expect("runs")
    };
    let out = check();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("300 data sources write into this 1048576-byte buffer, and each holds at least a 4096-byte chunk"),
        "{all}"
    );
    // Within the chunks: no warning.
    let few = text.lines().take(101).collect::<Vec<_>>().join("\n");
    std::fs::write(&cfg, few).expect("write");
    let out = check();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("each holds at least"));
}
