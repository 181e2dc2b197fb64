//! Flight recorders whose rings outlive them: the config, a tmpfs for the
//! ring files, and the checks every saved or recovered trace passes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use recorder::ringbuf::image::RingImage;

use super::decode::{decode, gaps, python_summary, test_counters, whole_prefix};
use super::trace_processor;
use super::wait::{described, wait_for};

/// A flight recorder: a 1 MiB ring, `for_testing` at 2000 packets/s, and a
/// STOP trigger that never fires.
pub fn flight_recorder_config(buffer_kb: u32) -> String {
    format!(
        r#"
buffers {{ size_kb: {buffer_kb} fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "for_testing" target_buffer: 0
  for_testing {{ message_count: 0 max_messages_per_second: 2000 message_size: 200 }} }} }}
trigger_config {{ trigger_mode: STOP_TRACING trigger_timeout_ms: 600000
  triggers {{ name: "never-fires" stop_delay_ms: 0 }} }}
"#
    )
}

/// A directory on tmpfs when there is one (`/dev/shm`), else a plain one.
pub fn tmpfs_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let on_tmpfs = rustix::fs::statfs(shm).is_ok_and(|s| s.f_type == 0x0102_1994);
    if on_tmpfs {
        tempfile::tempdir_in(shm).expect("tempdir on tmpfs")
    } else {
        eprintln!("note: /dev/shm is not a tmpfs here: the rings go to a plain directory");
        tempfile::tempdir().expect("tempdir")
    }
}

/// The for_testing counters of sequence 2, checked strictly increasing and
/// gap-free after the first; returns them.
pub fn contiguous_counters(data: &[u8]) -> Vec<u64> {
    let packets = decode(data);
    let counters = test_counters(&packets);
    let c = counters.get(&2).cloned().unwrap_or_default();
    let (missing, _) = gaps(&c);
    assert_eq!(missing, 0, "the kept run has no hole");
    c
}

/// Whether a service event of `packets` says the recorder died.
pub fn says_recorder_died(packets: &[perfetto_protos::trace_packet::TracePacket]) -> bool {
    packets.iter().any(|p| {
        p.has_service_event()
            && p.service_event()
                .special_fields
                .unknown_fields()
                .get(recorder::wire::tracing_service_event::RECORDER_DIED)
                .is_some()
    })
}

/// The checks every recovered or saved trace passes: whole packets, the
/// Python oracle, trace processor with no error stat, and the recorder's
/// own word that it died.
pub fn check_saved(path: &Path) {
    let data = std::fs::read(path).expect("the trace");
    assert!(!data.is_empty(), "{} is empty", path.display());
    assert_eq!(whole_prefix(&data), data.len(), "{}", path.display());
    let packets = decode(&data);
    assert!(
        says_recorder_died(&packets),
        "a service event says the recorder died"
    );
    assert!(packets.iter().any(|p| p.has_trace_config()));
    assert!(packets.iter().any(|p| p.has_trace_stats()));
    if let Some(summary) = python_summary(path) {
        assert!(
            summary["packets"].as_u64().unwrap_or(0) >= packets.len() as u64,
            "{summary}"
        );
    }
    trace_processor::check(path);
}

/// The shared buffers of process `pid`: its `recorder-ring` memfds, as
/// /proc paths another process may open (root, or the same user).
pub fn ring_fds(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    std::fs::read_link(p)
                        .is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:recorder-ring"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Packets buffer 0 of process `pid` says were written so far (its
/// counters, mirrored at region hand-overs), read through its memfd.
pub fn written(pid: u32) -> u64 {
    ring_fds(pid)
        .first()
        .and_then(|p| std::fs::File::open(p).ok())
        .and_then(|f| RingImage::read(&f).ok())
        .and_then(|i| i.stats)
        .map_or(0, |s| s.packets_written)
}

/// Waits until buffer 0 of process `pid` has had `packets` written.
pub fn wait_written(pid: u32, packets: u64) {
    wait_for(
        described(|| format!("{packets} packets written (so far {})", written(pid))),
        Duration::from_secs(60),
        || written(pid) >= packets,
    );
}
