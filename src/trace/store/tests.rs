use super::*;
use crate::storage::segment::sidecar::{SIDECAR_VERSION, SegmentLoss, uuid_text};
use sha2::Digest;

/// Writes segment `index` of `session` (with `data`) and its sidecar into `dir`.
fn segment(dir: &Path, host: &str, session: i64, index: u64, data: &[u8]) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    let file = format!("trace-{index:06}.pftrace");
    let path = dir.join(&file);
    std::fs::write(&path, data).expect("write");
    let car = Sidecar {
        version: SIDECAR_VERSION,
        file,
        index,
        host: host.into(),
        boot_id: "b00t".into(),
        session_uuid: uuid_text(session, 0),
        trace_uuid: uuid_text(session, index as i64),
        first_timestamp_ns: 1000 * index,
        last_timestamp_ns: 1000 * index + 999,
        first_realtime_ns: Some(1_700_000_000_000_000_000 + 1000 * index),
        last_realtime_ns: Some(1_700_000_000_000_000_999 + 1000 * index),
        packets: 1,
        bytes: data.len() as u64,
        uncompressed_bytes: data.len() as u64,
        compression: "none".into(),
        loss: SegmentLoss::default(),
        closed_by: "size".into(),
        sha256: sha2::Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    };
    let od = crate::storage::create::OutputDir::open(dir).expect("dir");
    car.write_atomically(&od, &format!("trace-{index:06}.pftrace.json"))
        .expect("sidecar");
    path
}

fn statuses(r: &StoreReport) -> Vec<(String, u64, &'static str)> {
    r.rows
        .iter()
        .map(|r| (r.path.clone(), r.index, r.status.name()))
        .collect()
}

#[test]
fn a_whole_store_is_one_table_of_ok_rows() {
    let store = tempfile::tempdir().expect("tempdir");
    let s1 = uuid_text(1, 0);
    let s2 = uuid_text(2, 0);
    let a = store.path().join("host-a/b00t").join(&s1);
    let b = store.path().join("host-b/b00t").join(&s2);
    for i in 0..3 {
        segment(&a, "host-a", 1, i, format!("a{i}").as_bytes());
    }
    segment(&b, "host-b", 2, 0, b"b0");
    std::fs::write(b.join("trace-000001.pftrace.partial"), b"open").expect("write");
    std::fs::write(b.join("notes.txt"), b"x").expect("write");
    let r = scan(store.path()).expect("scans");
    assert_eq!(r.verdict(), Ok(()));
    assert_eq!(r.rows.len(), 4, "{r:#?}");
    let first = &r.rows[0];
    assert_eq!(first.host.as_deref(), Some("host-a"));
    assert_eq!(first.path, format!("host-a/b00t/{s1}/trace-000000.pftrace"));
    assert_eq!(first.store_path.as_deref(), Some(first.path.as_str()));
    assert_eq!(first.first_realtime_ns, Some(1_700_000_000_000_000_000));
    assert_eq!(r.rows[3].host.as_deref(), Some("host-b"));
    assert_eq!(r.rows[3].session_uuid.as_deref(), Some(s2.as_str()));
    let text = r.to_string();
    assert!(
        text.contains("4 segments of 2 sessions from 2 hosts; 4 ok"),
        "{text}"
    );
    assert!(text.contains("2023-11-14T22:13:20Z"), "{text}");
}

#[test]
fn missing_corrupt_duplicated_and_unchecked_segments_are_named() {
    let store = tempfile::tempdir().expect("tempdir");
    let a = store.path().join("h/b/s");
    for i in 0..6 {
        segment(&a, "h", 1, i, format!("segment {i}").as_bytes());
    }
    // 1: the sidecar without its segment; 2: neither (a gap);
    // 3: flipped bytes; 4: a second copy elsewhere; 5: no sidecar.
    std::fs::remove_file(a.join("trace-000001.pftrace")).expect("rm");
    std::fs::remove_file(a.join("trace-000002.pftrace")).expect("rm");
    std::fs::remove_file(a.join("trace-000002.pftrace.json")).expect("rm");
    std::fs::write(a.join("trace-000003.pftrace"), b"segment X").expect("write");
    let copy = store.path().join("z-copies");
    std::fs::create_dir_all(&copy).expect("mkdir");
    for f in ["trace-000004.pftrace", "trace-000004.pftrace.json"] {
        std::fs::copy(a.join(f), copy.join(f)).expect("copy");
    }
    std::fs::remove_file(a.join("trace-000005.pftrace.json")).expect("rm");
    let r = scan(store.path()).expect("scans");
    let want = [
        ("h/b/s/trace-000000.pftrace", 0, "ok"),
        ("h/b/s/trace-000001.pftrace", 1, "missing"),
        ("h/b/s/trace-000002.pftrace", 2, "missing"),
        ("h/b/s/trace-000003.pftrace", 3, "corrupt"),
        ("h/b/s/trace-000004.pftrace", 4, "ok"),
        ("z-copies/trace-000004.pftrace", 4, "duplicated"),
        // No sidecar: no host, so it sorts first.
        ("h/b/s/trace-000005.pftrace", 5, "no_sidecar"),
    ];
    let mut got = statuses(&r);
    got.rotate_left(1);
    assert_eq!(
        got,
        want.map(|(p, i, s)| (p.to_string(), i, s)).to_vec(),
        "{r:#?}"
    );
    let gap = r.rows.iter().find(|r| r.index == 2).expect("gap row");
    assert_eq!(gap.host.as_deref(), Some("h"));
    assert!(
        gap.problem
            .as_deref()
            .is_some_and(|p| p.contains("neither"))
    );
    assert_eq!(
        r.verdict().map_err(|e| e.to_string()),
        Err("segments not ok: 2 missing, 1 corrupt, 1 duplicated, 1 no_sidecar".into())
    );
    let text = r.to_string();
    for p in [
        "missing     h/b/s/trace-000002.pftrace",
        "corrupt",
        "a second copy",
    ] {
        assert!(text.contains(p), "{p}: {text}");
    }
    // An unreadable sidecar makes its segment corrupt, not a crash.
    std::fs::write(a.join("trace-000000.pftrace.json"), b"{").expect("write");
    let r = scan(store.path()).expect("scans");
    let zero = r.rows.iter().find(|r| r.index == 0).expect("row");
    assert_eq!(zero.status, Status::Corrupt);
}

#[test]
fn what_a_store_lacks_is_listed_for_shipping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = dir.path().join("out");
    let store = dir.path().join("store/h/b00t").join(uuid_text(1, 0));
    for i in 0..3 {
        segment(&local, "h", 1, i, format!("s{i}").as_bytes());
    }
    for i in 0..2 {
        for f in [
            format!("trace-{i:06}.pftrace"),
            format!("trace-{i:06}.pftrace.json"),
        ] {
            std::fs::create_dir_all(&store).expect("mkdir");
            std::fs::copy(local.join(&f), store.join(&f)).expect("copy");
        }
    }
    // A torn copy of 1 in the store does not count as shipped.
    std::fs::write(store.join("trace-000001.pftrace"), b"s").expect("write");
    let l = scan(&local).expect("local");
    let s = scan(&dir.path().join("store")).expect("store");
    let left: Vec<u64> = l.missing_from(&s).iter().map(|r| r.index).collect();
    assert_eq!(left, vec![1, 2]);
}

#[test]
fn one_segment_is_read_by_its_path_or_its_sidecars() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = segment(dir.path(), "a/b", 7, 3, b"x");
    segment(dir.path(), "a/b", 7, 4, b"y");
    for arg in [p.clone(), dir.path().join("trace-000003.pftrace.json")] {
        let r = scan(&arg).expect("scans");
        assert_eq!(r.rows.len(), 1);
        assert_eq!(r.rows[0].index, 3);
        assert_eq!(r.rows[0].path, "trace-000003.pftrace");
        assert_eq!(r.rows[0].status, Status::Ok);
        // The host's slash cannot make another directory level.
        assert_eq!(
            r.rows[0].store_path,
            Some(format!("a_b/b00t/{}/trace-000003.pftrace", uuid_text(7, 0)))
        );
    }
    // A deleted segment (and sidecar) is an error, not a row.
    std::fs::remove_file(dir.path().join("trace-000004.pftrace")).expect("rm");
    std::fs::remove_file(dir.path().join("trace-000004.pftrace.json")).expect("rm");
    assert!(matches!(
        scan(&dir.path().join("trace-000004.pftrace")),
        Err(StoreError::Read { .. })
    ));
    let other = dir.path().join("notes.txt");
    std::fs::write(&other, b"x").expect("write");
    assert!(matches!(scan(&other), Err(StoreError::NotASegment(_))));
    assert!(matches!(
        scan(&dir.path().join("absent")),
        Err(StoreError::Read { .. })
    ));
}

#[test]
fn path_parts_are_plain_names() {
    assert_eq!(path_part("host-1.example"), "host-1.example");
    assert_eq!(path_part(".."), "_");
    assert_eq!(path_part(""), "_");
    assert_eq!(path_part("../x y"), ".._x_y");
}

#[test]
fn fields_name_every_field_of_a_row() {
    let r = empty_row(0, "p".into(), Status::Missing, "why".into());
    let v = serde_json::to_value(&r).expect("json");
    let keys: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut want = FIELDS.to_vec();
    want.sort_unstable();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(keys, want);
}

#[test]
fn a_planted_fifo_and_escape_codes_neither_block_nor_reach_the_terminal() {
    let store = tempfile::tempdir().expect("tempdir");
    let d = store.path().join("x");
    segment(&d, "evil\u{1b}[2J\nhost", 1, 0, b"data");
    let fifo = d.join("trace-000001.pftrace");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    // A fifo is not a segment: read, it would block the scan.
    let r = scan(store.path()).expect("scans");
    assert_eq!(r.rows.len(), 1, "{r:#?}");
    let text = r.to_string();
    assert!(
        !text.contains('\u{1b}') && text.contains("evil?[2J?host"),
        "{text}"
    );
    assert_eq!(
        r.rows[0]
            .store_path
            .as_deref()
            .map(|p| p.split('/').count()),
        Some(4)
    );
}
