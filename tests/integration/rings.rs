//! Rings that live in files (`--ring-dir`) and `recorder recover`, on the
//! built binary: a flight recorder whose every process is SIGKILLed is
//! recovered from its ring files into a valid trace holding its last
//! seconds; damage is left out and reported (exit 3); names planted in a
//! shared directory are refused, never opened; a clean end removes the
//! files. Every trace is checked by the independent decoders and, where
//! present, trace processor.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use recorder::ringbuf::image::RingImage;

use crate::harness::*;

/// Starts `run` with `--ring-dir dir` in a process group of its own, so
/// that every process of the session can be killed at once.
fn spawn_in_group(run: &Run, dir: &Path, extra: &[&str]) -> Child {
    let mut c = run.command("auto");
    c.arg("--ring-dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    c.spawn().expect("recorder starts")
}

/// The for_testing packets buffer 0's ring file says were written so far
/// (its counters, mirrored at each region hand-over); 0 before the file
/// holds a ring.
fn packets_written(ring: &Path) -> u64 {
    std::fs::File::open(ring)
        .ok()
        .and_then(|f| RingImage::read(&f).ok())
        .and_then(|i| i.stats)
        .map_or(0, |s| s.packets_written)
}

/// Waits until the ring holds `packets` written, or panics after `limit`.
fn wait_written(ring: &Path, packets: u64, limit: Duration) {
    wait_for(
        described(|| {
            format!(
                "{packets} packets written (so far {})",
                packets_written(ring)
            )
        }),
        limit,
        || packets_written(ring) >= packets,
    );
}

/// SIGKILLs every process of `child`'s group (the recorder and its broker
/// or keeper) in one call, and reaps the recorder.
fn kill_group(child: &mut Child) {
    let pgid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL)
        .expect("the group is signalled");
    let _ = child.wait();
    // The other members are not our children: wait until they are gone.
    wait_for("the group gone", Duration::from_secs(10), || {
        group_members(pgid.as_raw_nonzero().get()).is_empty()
    });
}

/// The live processes of process group `pgid` (from /proc: a zombie has
/// left it in all but name).
pub fn group_members(pgid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // pid (comm) state ppid pgrp ...: after the last ')'.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let mut f = rest.split_whitespace();
            let state = f.next();
            let pgrp = f.nth(1).and_then(|g| g.parse::<i32>().ok());
            pgrp == Some(pgid) && state != Some("Z")
        })
        .collect()
}

pub fn recover(dir: &Path, out: &Path) -> Output {
    Command::new(recorder_bin())
        .arg("recover")
        .arg(dir)
        .arg("-o")
        .arg(out)
        .output()
        .expect("recover runs")
}

#[test]
fn a_flight_recorder_killed_with_all_its_processes_is_recovered_from_its_ring_files() {
    let run = Run::new(&flight_recorder_config(1024));
    let rings = tmpfs_dir();
    let mut child = spawn_in_group(&run, rings.path(), &[]);
    let ring = rings.path().join("buffer-000.ring");
    // Five seconds at 2000/s: the 1 MiB ring has wrapped.
    wait_written(&ring, 10_000, Duration::from_secs(60));
    kill_group(&mut child);
    assert!(ring.exists(), "the ring file outlives its session");
    let out = run.dir.path().join("recovered.pftrace");
    let o = recover(rings.path(), &out);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("packets"), "{stderr}");
    check_saved(&out);
    let counters = contiguous_counters(&std::fs::read(&out).expect("read"));
    // The last seconds: a ring's worth (about 4,500 packets of 230 bytes),
    // ending at what was written last.
    assert!(counters.len() > 3000, "{} packets", counters.len());
    assert!(
        *counters.last().expect("some") >= 10_000,
        "{:?}",
        counters.last()
    );
    // The session's trace itself holds nothing: it was killed waiting.
    assert_eq!(std::fs::metadata(&run.out).map(|m| m.len()).unwrap_or(0), 0);
}

#[test]
fn four_kib_of_damage_is_left_out_and_reported_and_the_rest_recovered() {
    let run = Run::new(&flight_recorder_config(1024));
    let rings = tmpfs_dir();
    let mut child = spawn_in_group(&run, rings.path(), &[]);
    let ring = rings.path().join("buffer-000.ring");
    wait_written(&ring, 6_000, Duration::from_secs(60));
    kill_group(&mut child);
    let clean_out = run.dir.path().join("clean.pftrace");
    assert_eq!(recover(rings.path(), &clean_out).status.code(), Some(0));
    let clean = contiguous_counters(&std::fs::read(&clean_out).expect("read"));

    // 4 KiB of random bytes in the middle of the chunks.
    let mut bytes = std::fs::read(&ring).expect("ring");
    let h = recorder::ringbuf::layout::CoreHeader::decode(&bytes).expect("header");
    let at = h.data as usize + (h.chunk_count as usize * h.chunk_size as usize) / 2 + 123;
    let noise: Vec<u8> = (0..4096).map(|_| rand::random::<u8>()).collect();
    bytes[at..at + 4096].copy_from_slice(&noise);
    std::fs::write(&ring, &bytes).expect("damage");
    let out = run.dir.path().join("damaged.pftrace");
    let o = recover(rings.path(), &out);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "damage is exit 3: {stderr}");
    assert!(stderr.contains("damage"), "{stderr}");
    let data = std::fs::read(&out).expect("read");
    assert_eq!(whole_prefix(&data), data.len());
    let c = test_counters(&decode(&data)).remove(&2).expect("packets");
    let (missing, _) = gaps(&c);
    assert!(missing > 0, "the damaged packets are left out");
    assert!(
        c.len() as u64 + missing >= clean.len() as u64 - 1,
        "only the damaged part is lost: kept {} of {}",
        c.len(),
        clean.len()
    );
    let attrs = decode(&data)
        .into_iter()
        .last()
        .expect("attributes last")
        .special_fields
        .unknown_fields()
        .get(126)
        .is_some();
    assert!(attrs, "the damage is in the trace's attributes");
    trace_processor::check(&out);

    // The first header copy gone: the second is used, and said so.
    bytes[..4096].copy_from_slice(&noise);
    std::fs::write(&ring, &bytes).expect("damage");
    let o = recover(rings.path(), &out);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("a header copy damaged"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!contiguous_counters_lenient(&std::fs::read(&out).expect("read")).is_empty());
}

/// Counters of sequence 2, in order, gaps allowed.
fn contiguous_counters_lenient(data: &[u8]) -> Vec<u64> {
    let c = test_counters(&decode(data)).remove(&2).unwrap_or_default();
    gaps(&c);
    c
}

#[test]
fn recover_refuses_a_directory_without_rings_and_an_output_that_is_a_ring() {
    let d = tempfile::tempdir().expect("tempdir");
    let out = d.path().join("out.pftrace");
    let o = recover(d.path(), &out);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no ring files"));
    // Not a ring at all: refused, not guessed at.
    std::fs::write(d.path().join("buffer-000.ring"), vec![0x0Au8; 50_000]).expect("write");
    let o = recover(d.path(), &out);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a ring buffer"));

    let run = Run::new(&flight_recorder_config(256));
    let rings = tmpfs_dir();
    let mut child = spawn_in_group(&run, rings.path(), &[]);
    let ring = rings.path().join("buffer-000.ring");
    wait_written(&ring, 200, Duration::from_secs(60));
    kill_group(&mut child);
    let before = std::fs::read(&ring).expect("ring");
    let o = recover(rings.path(), &ring);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert_eq!(std::fs::read(&ring).expect("ring"), before, "untouched");
}

#[test]
fn a_clean_end_removes_the_ring_files_and_the_trace_has_everything() {
    let run = Run::new(&test_config(
        1024,
        "RING_BUFFER",
        "duration_ms: 1000",
        "message_count: 0 max_messages_per_second: 1000 message_size: 100",
    ));
    let rings = tmpfs_dir();
    let mut c = run.command("auto");
    c.arg("--ring-dir").arg(rings.path());
    c.args(["--ring-sync", "100ms"]);
    let o = c.output().expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let left: Vec<PathBuf> = std::fs::read_dir(rings.path())
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "ring files removed: {left:?}");
    let c = contiguous_counters(&run.trace());
    assert!(c.len() > 500, "{}", c.len());
    trace_processor::check(&run.out);
}

#[test]
fn a_ring_dir_holding_an_earlier_sessions_ring_is_refused_untouched() {
    let run = Run::new(&flight_recorder_config(256));
    let rings = tmpfs_dir();
    let earlier = rings.path().join("buffer-000.ring");
    std::fs::write(&earlier, b"evidence").expect("write");
    let o = run
        .command("auto")
        .arg("--ring-dir")
        .arg(rings.path())
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("recorder recover"), "{stderr}");
    assert_eq!(std::fs::read(&earlier).expect("kept"), b"evidence");
    // --ring-sync means nothing without --ring-dir.
    let o = run
        .command("auto")
        .args(["--ring-sync", "1s"])
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn links_and_fifos_planted_at_the_ring_names_in_a_sticky_directory_are_refused() {
    require!(need::root());
    let run = Run::new(&flight_recorder_config(256));
    std::fs::set_permissions(run.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let shared = dir_with_mode(&run.dir.path().join("shared"), 0o1777);
    let victim = run.dir.path().join("victim");
    std::fs::write(&victim, b"precious\n").expect("victim");
    let before = std::fs::metadata(&victim).expect("meta");
    for what in ["symlink", "hardlink", "fifo"] {
        let name = shared.join("buffer-000.ring");
        plant(&name, what, &victim);
        let o = run
            .command("auto")
            .arg("--ring-dir")
            .arg(&shared)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {stderr}");
        assert!(stderr.contains("buffer-000.ring"), "{what}: {stderr}");
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious\n");
        let now = std::fs::metadata(&victim).expect("meta");
        assert_eq!(
            std::os::unix::fs::MetadataExt::mtime_nsec(&now),
            std::os::unix::fs::MetadataExt::mtime_nsec(&before)
        );
        // recover opens no such entry either: a FIFO is never waited on.
        let o = recover(&shared, &run.dir.path().join("r.pftrace"));
        assert_eq!(o.status.code(), Some(1), "{what}: {o:?}");
        std::fs::remove_file(&name).expect("unplant");
    }
    // The sticky directory itself is fine once nothing is planted.
    let mut child = spawn_in_group(&run, &shared, &[]);
    wait_written(
        &shared.join("buffer-000.ring"),
        100,
        Duration::from_secs(60),
    );
    kill_group(&mut child);
    let out = run.dir.path().join("r.pftrace");
    assert_eq!(recover(&shared, &out).status.code(), Some(0));
    check_saved(&out);
}
