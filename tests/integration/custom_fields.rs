//! Users' own DataSourceConfig fields (extensions declared in their .proto
//! files): our compile (protox) and text format checked against protoc's
//! descriptors and Python's `text_format`, the bytes each data source is
//! handed, and the `trace_config` packet of a recorded trace.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use recorder::config::{self, LoadOptions, Schema, ServiceFields, UserProtos, wire};

use crate::common;

/// The example of the README: `configs/custom/`.
fn example_dir() -> PathBuf {
    common::repo_root().join("configs/custom")
}

fn example_protos() -> UserProtos {
    UserProtos {
        files: vec![example_dir().join("acme/audio.proto")],
        include_paths: vec![example_dir()],
        descriptor_sets: Vec::new(),
    }
}

fn example_schema() -> Schema {
    Schema::load(&example_protos()).unwrap_or_else(|e| panic!("{e}"))
}

const AUDIO_CONFIG: u32 = 400_000_001;
const SESSION_TAG: u32 = 400_000_002;

fn oracle() -> PathBuf {
    common::repo_root().join("tests/oracle/custom_config.py")
}

/// Whether protoc (grpcio-tools) and protobuf are there for Python; a skip
/// fails under CI.
fn python_ready() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import grpc_tools.protoc, google.protobuf"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            !common::kernel_required(),
            "python oracle missing under CI: pip install grpcio-tools protobuf"
        );
        eprintln!("python oracle skipped: no grpc_tools/protobuf modules");
    }
    ok
}

/// A FileDescriptorSet written by protoc (`--include_imports`).
fn protoc_set(out: &Path, includes: &[PathBuf], files: &[PathBuf]) -> PathBuf {
    let mut cmd = Command::new("python3");
    cmd.arg(oracle()).arg("compile").arg(out);
    for i in includes {
        cmd.arg(format!("-I{}", i.display()));
    }
    cmd.arg("--").args(files);
    let o = cmd.output().expect("python3 runs");
    assert!(
        o.status.success(),
        "protoc refused: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.to_path_buf()
}

/// The set the Python side reads: the example and our TraceConfig.
fn python_set(dir: &Path) -> PathBuf {
    let protos = common::repo_root().join("protos");
    protoc_set(
        &dir.join("set.pb"),
        &[protos.clone(), example_dir()],
        &[
            example_dir().join("acme/audio.proto"),
            protos.join("trace_config.proto"),
        ],
    )
}

fn py(set: &Path, args: &[&str], stdin: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("python3")
        .arg(oracle())
        .arg(args[0])
        .arg(set)
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin)
        .expect("stdin");
    let o = child.wait_with_output().expect("python3 ends");
    assert!(
        o.status.success(),
        "python oracle failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

fn py_encode(set: &Path, text: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.cfg");
    std::fs::write(&f, text).expect("write");
    let out = py(set, &["encode", &f.display().to_string()], b"");
    assert_eq!(
        u64::from_le_bytes(out[..8].try_into().expect("8 bytes")) as usize,
        out.len() - 8
    );
    out[8..].to_vec()
}

/// The value bytes of field `number` at the top of `msg` (the last one).
fn field_bytes(msg: &[u8], number: u32) -> Option<Vec<u8>> {
    let fields = wire::fields(msg).expect("well-formed");
    fields
        .iter()
        .rfind(|f| f.number == number)
        .map(|f| msg[f.value.0..f.value.1].to_vec())
}

#[test]
fn text_binary_text_round_trips_agree_with_protoc_and_text_format() {
    let schema = example_schema();
    let cfg = example_dir().join("audio.cfg");
    let ours = config::load_path_in(&cfg, LoadOptions::default(), &schema)
        .unwrap_or_else(|e| panic!("{e}"));
    // Binary → text with the .proto → binary.
    let printed = ours.to_text();
    assert!(
        printed.contains("[acme.audio.audio_config] {") && printed.contains("mode: LOW_LATENCY"),
        "{printed}"
    );
    let again = config::load_text_in(&printed, "printed", false, &schema)
        .unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(again.bytes, ours.bytes);
    // Without the .proto the custom fields are kept by number, and read back
    // to the same bytes, with or without the .proto.
    let plain = config::load_binary(&ours.bytes, "bin").expect("loads");
    let by_number = plain.to_text();
    assert!(
        by_number.contains(&format!("{AUDIO_CONFIG}: \""))
            && by_number.contains(&format!("{SESSION_TAG}: 18446744073709551615")),
        "{by_number}"
    );
    let back = config::load_text(&by_number, "by number", false).expect("parses");
    assert_eq!(back.bytes, ours.bytes);
    let typed = config::load_text_in(&by_number, "by number", false, &schema).expect("parses");
    assert_eq!(typed.bytes, ours.bytes);
    assert_eq!(typed.to_text(), printed);

    if !python_ready() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let set = python_set(dir.path());
    let src = std::fs::read_to_string(&cfg).expect("config");
    // The same text, encoded independently: the same bytes.
    assert_eq!(
        py_encode(&set, &src),
        ours.bytes,
        "text_format encodes differently"
    );
    // Our printed text, parsed independently: the same bytes.
    assert_eq!(py_encode(&set, &printed), ours.bytes);
    // Python's printed text, parsed by us: the same bytes.
    let theirs = String::from_utf8(py(&set, &["print"], &ours.bytes)).expect("utf-8");
    let parsed = config::load_text_in(&theirs, "python", false, &schema)
        .unwrap_or_else(|e| panic!("{e}\n{theirs}"));
    assert_eq!(parsed.bytes, ours.bytes);
}

#[test]
fn descriptor_sets_written_by_protoc_load_like_the_proto_files() {
    if !python_ready() {
        return;
    }
    let schema = example_schema();
    let cfg = example_dir().join("audio.cfg");
    let want = config::load_path_in(&cfg, LoadOptions::default(), &schema)
        .expect("loads")
        .bytes;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = common::repo_root();
    // As built against recorder's protos/ (-I protos): our file names.
    let a = protoc_set(
        &dir.path().join("a.pb"),
        &[root.join("protos"), example_dir()],
        &[example_dir().join("acme/audio.proto")],
    );
    // As built from the repository root: protos/data_source_config.proto.
    let elsewhere = dir.path().join("src");
    std::fs::create_dir_all(elsewhere.join("acme")).expect("mkdir");
    let audio = std::fs::read_to_string(example_dir().join("acme/audio.proto"))
        .expect("read")
        .replace(
            "import \"data_source_config.proto\"",
            "import \"protos/data_source_config.proto\"",
        );
    std::fs::write(elsewhere.join("acme/audio.proto"), audio).expect("write");
    std::fs::copy(
        example_dir().join("acme/units.proto"),
        elsewhere.join("acme/units.proto"),
    )
    .expect("copy");
    let b = protoc_set(
        &dir.path().join("b.pb"),
        &[root.clone(), root.join("protos"), elsewhere.clone()],
        &[elsewhere.join("acme/audio.proto")],
    );
    for set in [a, b] {
        let schema = Schema::load(&UserProtos {
            descriptor_sets: vec![set.clone()],
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{}: {e}", set.display()));
        let l = config::load_path_in(&cfg, LoadOptions::default(), &schema)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.bytes, want, "{}", set.display());
    }
    let junk = dir.path().join("junk.pb");
    std::fs::write(&junk, b"\x0a\xff").expect("write");
    let e = Schema::load(&UserProtos {
        descriptor_sets: vec![junk],
        ..Default::default()
    })
    .expect_err("refused")
    .to_string();
    assert!(e.contains("junk.pb: not a FileDescriptorSet"), "{e}");
}

/// What a producer will be handed: the data source's config bytes keep the
/// custom fields byte for byte, as Python encodes them, through the rewrite
/// of the service-owned fields.
#[test]
fn custom_fields_reach_the_data_source_byte_for_byte() {
    let schema = example_schema();
    let cfg = example_dir().join("audio.cfg");
    let loaded = config::load_path_in(&cfg, LoadOptions::default(), &schema).expect("loads");
    let spec = loaded.validate().unwrap_or_else(|e| panic!("{e}"));
    let ds = &spec.data_sources[0];
    assert_eq!(ds.name, "com.acme.audio");
    assert_eq!(spec.custom_fields.len(), 2);
    assert_eq!(spec.custom_fields[0].data_source, "com.acme.audio");
    assert_eq!(
        spec.custom_fields[0].path,
        "data_sources[0].config.[acme.audio.audio_config]"
    );
    let handed = ds
        .config_for_source(&ServiceFields {
            target_buffer: Some(0),
            tracing_session_id: Some(7),
            trace_duration_ms: Some(2000),
            ..Default::default()
        })
        .expect("well-formed");
    let audio = field_bytes(&handed, AUDIO_CONFIG).expect("audio_config");
    assert_eq!(
        field_bytes(&ds.raw_config, AUDIO_CONFIG),
        Some(audio.clone())
    );
    // The config as recorded in the trace carries them as well.
    let recorded = wire::data_source_configs(&spec.config_bytes).expect("well-formed");
    assert_eq!(field_bytes(&recorded[0], AUDIO_CONFIG), Some(audio.clone()));
    // The other data source has none.
    assert_eq!(
        field_bytes(&spec.data_sources[1].raw_config, AUDIO_CONFIG),
        None
    );
    if !python_ready() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let set = python_set(dir.path());
    let src = std::fs::read_to_string(&cfg).expect("config");
    let theirs = py_encode(&set, &src);
    let ext = String::from_utf8(py(&set, &["extensions", "0"], &theirs)).expect("utf-8");
    let audio_hex: String = audio.iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        ext.lines()
            .any(|l| l == format!("acme.audio.audio_config {audio_hex}")),
        "{ext}\nours: {audio_hex}"
    );
}
