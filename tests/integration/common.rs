//! Shared helpers for the integration tests.

#![allow(dead_code)]

use std::path::PathBuf;

/// The built `recorder` binary.
pub fn recorder_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_recorder"))
}

/// Whether kernel features are required (CI): a test that would skip fails.
pub fn kernel_required() -> bool {
    std::env::var_os("RECORDER_REQUIRE_KERNEL").is_some_and(|v| v == "1")
}

/// Skips (returns true) when `missing` is Some, unless kernel features are
/// required, in which case it panics with the reason.
pub fn skip_unless(missing: Option<String>) -> bool {
    match missing {
        None => false,
        Some(why) if kernel_required() => panic!("RECORDER_REQUIRE_KERNEL=1 but: {why}"),
        Some(why) => {
            eprintln!("skipped: {why}");
            true
        }
    }
}

/// Why root-only tests cannot run, if they cannot.
pub fn need_root() -> Option<String> {
    if rustix::process::geteuid().is_root() {
        None
    } else {
        Some("needs root".to_string())
    }
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether the peers are required (CI): Perfetto's own test configs and its
/// trace processor, which the repository does not carry. A test that would
/// skip for want of one fails instead.
pub fn peers_required() -> bool {
    std::env::var_os("RECORDER_REQUIRE_PEERS").is_some_and(|v| v == "1")
}

/// Skips (returns true) when a peer is missing, unless peers are required,
/// in which case it panics with the reason.
pub fn skip_unless_peer(missing: Option<String>) -> bool {
    match missing {
        None => false,
        Some(why) if peers_required() => panic!("RECORDER_REQUIRE_PEERS=1 but: {why}"),
        Some(why) => {
            eprintln!("skipped: {why}");
            true
        }
    }
}

/// Perfetto's own test configs (its `test/configs`, 25 files), which the
/// repository cannot carry: `$RECORDER_PERFETTO_TEST_CONFIGS` names them.
/// None (with the reason printed) when unset or absent; a panic instead
/// under `RECORDER_REQUIRE_PEERS=1`.
pub fn perfetto_test_configs() -> Option<PathBuf> {
    let Some(p) = std::env::var_os("RECORDER_PERFETTO_TEST_CONFIGS").map(PathBuf::from) else {
        skip_unless_peer(Some(
            "RECORDER_PERFETTO_TEST_CONFIGS is not set (Perfetto's test/configs directory)".into(),
        ));
        return None;
    };
    let missing = (!p.is_dir()).then(|| {
        format!(
            "Perfetto's test configs are not at {} (RECORDER_PERFETTO_TEST_CONFIGS)",
            p.display()
        )
    });
    (!skip_unless_peer(missing)).then_some(p)
}

/// `program` as the shell would find it on `$PATH`, if it is there.
pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// The test configs the repository carries (`tests/fixtures/configs`),
/// covering the fields the tests check in Perfetto's.
pub fn own_test_configs() -> PathBuf {
    repo_root().join("tests/fixtures/configs")
}

use perfetto_protos::trace_packet::TracePacket;
use protobuf::Message;

/// Length of the prefix of `data` made of whole `0x0a <len> <packet>`
/// records; panics on a record that is not a packet (corruption).
pub fn whole_prefix(data: &[u8]) -> usize {
    let mut pos = 0;
    while pos < data.len() {
        assert_eq!(data[pos], 0x0a, "corrupt record at byte {pos}");
        let mut len: u64 = 0;
        let mut shift = 0;
        let mut p = pos + 1;
        loop {
            let Some(&b) = data.get(p) else { return pos };
            p += 1;
            len |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        if p as u64 + len > data.len() as u64 {
            return pos;
        }
        pos = p + len as usize;
    }
    pos
}

/// Decodes a trace with the independent decoder (Perfetto's schema through
/// rust-protobuf); a torn tail is ignored, corruption panics.
pub fn decode(data: &[u8]) -> Vec<TracePacket> {
    let whole = whole_prefix(data);
    let trace =
        perfetto_protos::trace::Trace::parse_from_bytes(&data[..whole]).expect("trace decodes");
    trace.packet.into_iter().collect()
}

/// The `for_testing` counters of each sequence, in file order.
pub fn test_counters(packets: &[TracePacket]) -> std::collections::BTreeMap<u32, Vec<u64>> {
    let mut m = std::collections::BTreeMap::new();
    for p in packets {
        if p.has_for_testing() {
            m.entry(p.trusted_packet_sequence_id())
                .or_insert_with(Vec::new)
                .push(p.for_testing().counter());
        }
    }
    m
}

/// Checks a sequence's counters are strictly increasing (in order, no
/// duplicates) and returns how many were missing between first and last,
/// and how many before the first.
pub fn gaps(counters: &[u64]) -> (u64, u64) {
    let mut missing = 0;
    for w in counters.windows(2) {
        assert!(
            w[1] > w[0],
            "counters out of order or duplicated: {} then {}",
            w[0],
            w[1]
        );
        missing += w[1] - w[0] - 1;
    }
    (missing, counters.first().copied().unwrap_or(0))
}

/// The Python oracle's summary of a trace (perfetto_trace_pb2), or None
/// when Python lacks the `perfetto` package (a failure under CI).
pub fn python_summary(path: &std::path::Path) -> Option<serde_json::Value> {
    let script = repo_root().join("tests/oracle/trace_summary.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(path)
        .output();
    match out {
        Ok(o) if o.status.success() => {
            Some(serde_json::from_slice(&o.stdout).expect("oracle prints JSON"))
        }
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            if err.contains("No module named") {
                assert!(!kernel_required(), "python oracle missing under CI: {err}");
                eprintln!("python oracle skipped: {err}");
                None
            } else {
                panic!("python oracle failed: {err}");
            }
        }
        Err(e) => {
            assert!(!kernel_required(), "python3 missing under CI: {e}");
            None
        }
    }
}

/// `TracePacket.zstd_compressed_packets` (newer than the decoder's schema:
/// read as an unknown field).
pub const ZSTD_FIELD: u32 = 133;

/// The packets of a trace with every compressed packet replaced by the
/// packets it holds; also the sizes of the compressed packets.
pub fn expand(data: &[u8]) -> (Vec<TracePacket>, Vec<usize>) {
    use protobuf::UnknownValueRef;
    let mut out = Vec::new();
    let mut sizes = Vec::new();
    for p in decode(data) {
        match p.special_fields.unknown_fields().get(ZSTD_FIELD) {
            Some(UnknownValueRef::LengthDelimited(frame)) => {
                sizes.push(p.compute_size() as usize);
                let inner = zstd::stream::decode_all(frame).expect("a zstd frame");
                let trace = perfetto_protos::trace::Trace::parse_from_bytes(&inner)
                    .expect("the payload is a Trace");
                out.extend(trace.packet);
            }
            _ => out.push(p),
        }
    }
    (out, sizes)
}

/// A padding packet of an O_DIRECT stream (recorder::storage::packets):
/// nothing in it but, perhaps, the reserved field 55.
pub fn is_padding(p: &TracePacket) -> bool {
    let unknown = p.special_fields.unknown_fields();
    p.data.is_none()
        && !p.has_timestamp()
        && p.optional_trusted_packet_sequence_id.is_none()
        && unknown
            .iter()
            .all(|(f, _)| f == recorder::storage::packets::PADDING_FIELD)
}

/// The `name: value` lines of a /proc status file (`/proc/PID/status`,
/// `/proc/PID/task/TID/status`), values trimmed; empty once the process or
/// thread is gone.
pub fn proc_status(
    path: impl AsRef<std::path::Path>,
) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// Waits until process `pid` catches `signal` (its bit in `SigCgt` of
/// /proc/PID/status): a signal sent before the handler is installed takes
/// the default action, which is not what a test of the handler means to
/// send. Panics after 20 s or when the process is gone.
pub fn wait_catches(pid: u32, signal: rustix::process::Signal) {
    let bit = 1u64 << (signal.as_raw() - 1);
    let t0 = std::time::Instant::now();
    loop {
        let status = proc_status(format!("/proc/{pid}/status"));
        let caught = status
            .get("SigCgt")
            .and_then(|m| u64::from_str_radix(m, 16).ok())
            .unwrap_or_else(|| panic!("process {pid} is gone: {status:?}"));
        if caught & bit != 0 {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "process {pid} never caught signal {}",
            signal.as_raw()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
