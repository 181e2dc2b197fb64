//! The segment writer against real files: naming, the partial → final
//! rename, sidecars (sha256 checked by reading the file back), the budget.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::ringbuf::{BufferParams, FillPolicy};

fn record(payload: &[u8]) -> Vec<u8> {
    crate::wire::framing::record(payload)
}

fn writer(dir: &std::path::Path, policy: RotationPolicy) -> SegmentWriter {
    let buffer = Buffer::new(BufferParams::new(1 << 16, FillPolicy::RingBuffer)).expect("buffer");
    test_writer(&dir.join("t.pftrace"), policy, vec![Arc::clone(&buffer)])
}

/// Segments named after `out` of `buffers`, by pwritev, with a fixed
/// identity: what tests here and the event loop's record into.
pub(crate) fn test_writer(
    out: &std::path::Path,
    policy: RotationPolicy,
    buffers: Vec<Arc<Buffer>>,
) -> SegmentWriter {
    SegmentWriter::create(
        SegmentNames::from_output(out),
        policy,
        OpenOptions {
            no_clobber: true,
            io: crate::storage::IoChoice::Pwritev,
            direct: false,
        },
        SegmentIdentity {
            host: "host".into(),
            boot_id: "boot".into(),
            session_uuid: (1, 2),
            compression: "none".into(),
        },
        buffers,
    )
    .expect("creates")
}

fn write(w: &mut SegmentWriter, payloads: &[&[u8]]) {
    let recs: Vec<Vec<u8>> = payloads.iter().map(|p| record(p)).collect();
    let iov: Vec<IoSlice<'_>> = recs.iter().map(|r| IoSlice::new(r)).collect();
    w.write_all(&iov).expect("writes");
    w.record_pass(&PassReport {
        packets: recs.len() as u64,
        input_bytes: recs.iter().map(|r| r.len() as u64).sum(),
        ..Default::default()
    });
}

fn sha256_of(path: &std::path::Path) -> String {
    hex(&Sha256::digest(std::fs::read(path).expect("reads")))
}

#[test]
fn rotation_closes_renames_and_describes_each_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(
        dir.path(),
        RotationPolicy {
            size: Some(20),
            ..Default::default()
        },
    );
    let names = SegmentNames::from_output(&dir.path().join("t.pftrace"));
    assert!(names.partial(0).exists());
    write(&mut w, &[b"0123456789"]);
    assert_eq!(w.rotation_due(), None);
    write(&mut w, &[b"abcdefghij"]);
    assert_eq!(w.rotation_due(), Some(RotateReason::Size));
    w.rotate(&[record(b"tail")], RotateReason::Size)
        .expect("rotates");
    assert!(!names.partial(0).exists());
    assert!(names.partial(1).exists());
    let car = Sidecar::read(&names.sidecar(0)).expect("sidecar");
    assert_eq!(car.index, 0);
    assert_eq!(car.packets, 3);
    assert_eq!(car.bytes, 12 + 12 + 6);
    assert_eq!(car.closed_by, "size");
    assert_eq!(car.sha256, sha256_of(&names.path(0)));
    assert_eq!(car.session_uuid, sidecar::uuid_text(1, 2));
    assert_eq!(car.trace_uuid, sidecar::uuid_text(1, 2));
    assert_eq!(w.trace_uuid(), (1, 3));
    write(&mut w, &[b"x"]);
    w.finish(&[]).expect("finishes");
    let car1 = Sidecar::read(&names.sidecar(1)).expect("sidecar");
    assert_eq!(car1.closed_by, "end");
    assert_eq!(car1.sha256, sha256_of(&names.path(1)));
    assert!(car1.first_timestamp_ns >= car.last_timestamp_ns);
    // The wall-clock times keep the BOOTTIME span and fall around now.
    let now = crate::clock::BuiltinClock::Realtime.now_ns();
    let (Some(first), Some(last)) = (car1.first_realtime_ns, car1.last_realtime_ns) else {
        panic!("wall-clock times in {car1:?}");
    };
    assert_eq!(
        last - first,
        car1.last_timestamp_ns - car1.first_timestamp_ns
    );
    assert!(
        last <= now && now - last < 60_000_000_000,
        "{last} vs {now}"
    );
    let st = w.status();
    assert_eq!(st.segments.len(), 2);
    assert!(
        st.segments
            .iter()
            .all(|s| s.kept && !s.closed_by.is_empty())
    );
}

#[test]
fn a_directory_holding_segments_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), RotationPolicy::default());
    w.finish(&[]).expect("finishes");
    let again = SegmentWriter::create(
        SegmentNames::from_output(&dir.path().join("t.pftrace")),
        RotationPolicy::default(),
        OpenOptions::default(),
        SegmentIdentity::default(),
        Vec::new(),
    );
    assert!(matches!(again, Err(SegmentError::Exists { .. })));
}

#[test]
fn max_segments_deletes_the_oldest_never_the_open_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(
        dir.path(),
        RotationPolicy {
            size: Some(1),
            max_segments: Some(3),
            ..Default::default()
        },
    );
    let names = SegmentNames::from_output(&dir.path().join("t.pftrace"));
    for i in 0..6u8 {
        write(&mut w, &[&[i]]);
        w.rotate(&[], RotateReason::Size).expect("rotates");
        let on_disk: Vec<u64> = (0..=u64::from(i) + 1)
            .filter(|k| names.path(*k).exists() || names.partial(*k).exists())
            .collect();
        assert!(on_disk.len() <= 3, "{on_disk:?}");
        assert!(
            names.partial(u64::from(i) + 1).exists(),
            "the open one stays"
        );
    }
    // Kept: the two newest closed ones (4, 5) and the open one (6).
    assert!(!names.path(3).exists() && !names.sidecar(3).exists());
    assert!(names.path(4).exists() && names.path(5).exists());
    let st = w.status();
    assert_eq!(st.deleted, 4);
    assert_eq!(st.segments.iter().filter(|s| s.kept).count(), 3);
}

#[test]
fn max_disk_keeps_room_for_the_next_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(
        dir.path(),
        RotationPolicy {
            size: Some(1000),
            max_disk: Some(4000),
            ..Default::default()
        },
    );
    let big = vec![7u8; 1000];
    for _ in 0..6 {
        write(&mut w, &[&big]);
        w.rotate(&[], RotateReason::Size).expect("rotates");
        let st = w.status();
        assert!(
            st.bytes_on_disk + 1000 <= 4000 + 1000,
            "{}",
            st.bytes_on_disk
        );
    }
    let st = w.status();
    assert!(st.deleted >= 3, "{st:?}");
    let closed_kept = st
        .segments
        .iter()
        .filter(|s| s.kept && !s.closed_by.is_empty())
        .count();
    assert!(closed_kept >= 1);
}

#[test]
fn the_hook_gets_each_closed_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("hook.log");
    let mut w = writer(
        dir.path(),
        RotationPolicy {
            size: Some(1),
            on_closed: Some(format!(
                "f() {{ echo \"$(basename \"$1\") $(cat)\" >> {}; }}; f",
                log.display()
            )),
            ..Default::default()
        },
    );
    write(&mut w, &[b"a"]);
    w.rotate(&[], RotateReason::Size).expect("rotates");
    write(&mut w, &[b"b"]);
    w.finish(&[]).expect("finishes");
    let text = std::fs::read_to_string(&log).expect("log");
    // Each one's link, with the segment on stdin (its records: 0x0A, 1, the byte).
    assert_eq!(
        text,
        "t-000000.pftrace \n\u{1}a\nt-000001.pftrace \n\u{1}b\n"
    );
    assert_eq!(w.status().hook.map(|h| (h.ran, h.failed)), Some((2, 0)));
}

#[test]
fn a_period_rotation_is_due_once_the_segment_is_old_enough() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(
        dir.path(),
        RotationPolicy {
            period: Some(Duration::from_millis(1)),
            ..Default::default()
        },
    );
    assert_eq!(w.rotation_due(), None, "empty segments are not cut");
    write(&mut w, &[b"a"]);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(w.rotation_due(), Some(RotateReason::Period));
}

#[test]
fn each_sidecar_counts_the_upstream_loss_that_grew_while_it_was_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), RotationPolicy::default());
    let names = SegmentNames::from_output(&dir.path().join("t.pftrace"));
    write(&mut w, &[b"a"]);
    w.note_upstream_loss("linux.ftrace", 5, "raise buffer_size_kb");
    w.rotate(&[], RotateReason::Size).expect("rotates");
    write(&mut w, &[b"b"]);
    w.note_upstream_loss("linux.ftrace", 5, "raise buffer_size_kb");
    w.rotate(&[], RotateReason::Size).expect("rotates");
    write(&mut w, &[b"c"]);
    w.note_upstream_loss("linux.ftrace", 12, "raise buffer_size_kb");
    w.note_upstream_loss("other", 0, "-");
    w.finish(&[]).expect("finishes");
    let loss: Vec<SegmentLoss> = (0..3)
        .map(|i| Sidecar::read(&names.sidecar(i)).expect("sidecar").loss)
        .collect();
    assert_eq!(
        loss.iter()
            .map(|l| l.events_lost_upstream)
            .collect::<Vec<_>>(),
        [5, 0, 7]
    );
    assert!(loss[1].is_empty() && loss[1].why.is_empty());
    assert_eq!(
        loss[2].why,
        ["linux.ftrace: 7 events were lost before they reached the buffer: raise buffer_size_kb"]
    );
}

#[test]
fn a_sidecar_from_before_upstream_loss_still_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = writer(dir.path(), RotationPolicy::default());
    write(&mut w, &[b"a"]);
    w.finish(&[]).expect("finishes");
    let names = SegmentNames::from_output(&dir.path().join("t.pftrace"));
    let path = names.sidecar(0);
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("reads")).expect("json");
    v["loss"]
        .as_object_mut()
        .expect("loss")
        .remove("events_lost_upstream");
    std::fs::write(&path, serde_json::to_vec(&v).expect("json")).expect("writes");
    assert_eq!(
        Sidecar::read(&path)
            .expect("reads")
            .loss
            .events_lost_upstream,
        0
    );
}
