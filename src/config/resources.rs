//! Checks of a config against what a session can hold: the buffers are
//! mapped and prefaulted at start, so together they must fit in the memory
//! this machine has available (else the kernel kills the process while it
//! prefaults, with no word said); and `max_file_size_bytes` must leave room
//! for the recorder's own packets at the head of the trace, or the file
//! would stay empty.

use std::path::Path;

use super::spec::{BufferSpec, FileSpec};
use super::validate::Invalid;

/// Room the head of a trace takes besides the config itself (clock
/// snapshot, sync marker, uuid, system info, service events: about 1 KiB,
/// doubled for margin).
pub(crate) const HEAD_BYTES_BESIDES_CONFIG: u64 = 2048;

/// Memory a session may map now: `MemAvailable`, lowered by the cgroup's
/// own limit when there is one. `None` when it cannot be read.
pub(crate) fn available_memory(proc_root: &Path, cgroup_root: &Path) -> Option<u64> {
    let meminfo = std::fs::read_to_string(proc_root.join("meminfo")).ok()?;
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let mut avail = kb.saturating_mul(1024);
    if let Some(room) = cgroup_room(proc_root, cgroup_root) {
        avail = avail.min(room);
    }
    Some(avail)
}

/// `memory.max - memory.current` of this process's cgroup (v2), if limited.
fn cgroup_room(proc_root: &Path, cgroup_root: &Path) -> Option<u64> {
    let me = std::fs::read_to_string(proc_root.join("self/cgroup")).ok()?;
    let rel = me.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = cgroup_root.join(rel.trim_start_matches('/'));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?;
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The problems of `buffers` and `file` given `available` bytes of memory
/// and a config of `config_bytes` bytes (written into the trace unless
/// `trace_config_written` is false).
pub(crate) fn check(
    buffers: &[BufferSpec],
    file: Option<&FileSpec>,
    available: Option<u64>,
    config_bytes: usize,
    trace_config_written: bool,
) -> Vec<Invalid> {
    let mut out = Vec::new();
    let total: u64 = buffers.iter().map(|b| b.size.0).sum();
    if let Some(avail) = available
        && total > avail
    {
        out.push(Invalid {
            path: "buffers".into(),
            message: format!(
                "the buffers add up to {} ({total} bytes) but this machine has {} available (MemAvailable, and the cgroup limit if any): they are mapped and filled at start, so the kernel would kill the recorder. Lower size_kb",
                gib(total),
                gib(avail)
            ),
        });
    }
    if let Some(cap) = file.and_then(|f| f.max_size) {
        let head = HEAD_BYTES_BESIDES_CONFIG
            + if trace_config_written {
                config_bytes as u64
            } else {
                0
            };
        if cap.0 <= head {
            out.push(Invalid {
                path: "max_file_size_bytes".into(),
                message: format!(
                    "{} bytes cannot hold even the recorder's own packets at the head of the trace (about {head} bytes{}): nothing would be written. Allow more than {head} bytes",
                    cap.0,
                    if trace_config_written {
                        ", the config itself included"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::spec::{BufferId, ByteSize, FillPolicy};
    use std::time::Duration;

    fn buf(kb: u64) -> BufferSpec {
        BufferSpec {
            id: BufferId(0),
            name: None,
            size: ByteSize::from_kb(kb),
            fill_policy: FillPolicy::RingBuffer,
            transfer_on_clone: false,
            clear_before_clone: false,
        }
    }

    #[test]
    fn buffers_beyond_available_memory_are_refused_with_the_numbers() {
        let bufs: Vec<BufferSpec> = (0..128).map(|_| buf(4_194_303)).collect();
        let e = check(&bufs, None, Some(16 << 30), 100, true);
        assert_eq!(e.len(), 1);
        assert!(e[0].message.contains("512.0 GiB"), "{}", e[0].message);
        assert!(e[0].message.contains("16.0 GiB"), "{}", e[0].message);
        assert!(check(&[buf(1024)], None, Some(16 << 30), 100, true).is_empty());
        assert!(check(&bufs, None, None, 100, true).is_empty());
    }

    #[test]
    fn a_size_cap_below_the_head_is_refused() {
        let file = |cap| FileSpec {
            write_period: Duration::from_secs(5),
            max_size: Some(ByteSize(cap)),
            fdatasync_each_pass: false,
            output_path: None,
        };
        assert_eq!(check(&[], Some(&file(100)), None, 500, true).len(), 1);
        assert_eq!(check(&[], Some(&file(2500)), None, 500, true).len(), 1);
        assert!(check(&[], Some(&file(2600)), None, 500, false).is_empty());
        assert!(check(&[], Some(&file(1 << 20)), None, 500, true).is_empty());
    }

    #[test]
    fn this_machine_reports_its_memory() {
        let avail = available_memory(Path::new("/proc"), Path::new("/sys/fs/cgroup"));
        assert!(avail.is_some_and(|a| a > 0), "{avail:?}");
    }
}
