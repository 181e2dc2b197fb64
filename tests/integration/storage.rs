//! File sinks on real files, a real io_uring and a real full disk (tmpfs).

use std::io::IoSlice;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use recorder::storage::{
    FileSink, IOV_MAX, IoChoice, OpenOptions, OutputPath, SinkKind, StorageError, StreamSink,
    WriteList, WriteProgress, cut_at_packet_boundary, io_uring_available, open_output,
};

use crate::harness::*;

/// A scratch directory on the work filesystem (not tmpfs).
fn scratch() -> tempfile::TempDir {
    // Inside the build's target directory: on the work filesystem, and
    // writable wherever the checkout is (a CI clone's parent may not be).
    let base = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).expect("scratch base creatable");
    tempfile::tempdir_in(base).expect("scratch dir")
}

/// The positioned sinks this machine can run; io_uring is skipped with a
/// reason (or fails under RECORDER_REQUIRE_KERNEL=1) when blocked.
fn choices() -> Vec<IoChoice> {
    let mut v = vec![IoChoice::Pwritev];
    if need::met(need::io_uring()) {
        v.push(IoChoice::IoUring);
    }
    v
}

fn open(path: &Path, io: IoChoice) -> Box<dyn FileSink> {
    let sink = open_output(
        OutputPath::File(path.to_path_buf()),
        OpenOptions {
            no_clobber: false,
            io,
            direct: false,
        },
    )
    .expect("output opens");
    let want = match io {
        IoChoice::IoUring => SinkKind::IoUring,
        _ => SinkKind::Pwritev,
    };
    assert_eq!(sink.kind(), want);
    sink
}

/// Deterministic pseudo-random bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Cuts `data` into slices of the given sizes (cycled), empty ones included.
fn split<'a>(data: &'a [u8], sizes: &[usize]) -> Vec<IoSlice<'a>> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < data.len() {
        let n = sizes[i % sizes.len()].min(data.len() - at);
        out.push(IoSlice::new(&data[at..at + n]));
        at += n;
        i += 1;
    }
    out
}

#[test]
fn sinks_write_scattered_iovecs_in_order() {
    for io in choices() {
        let dir = scratch();
        let path = dir.path().join("t.pftrace");
        let mut sink = open(&path, io);
        let mut expect = Vec::new();
        // Large calls go through the ring; calls of at most 64 KiB, in between,
        // through one pwritev at the same offset counter.
        for (round, (len, sizes)) in [
            (300_000, &[1usize, 0, 4095, 7, 65536][..]),
            (2_000, &[1, 0, 7]),
            (1_300_003, &[3]),
            (65_536, &[4096]),
            (2_300_006, &[1 << 20, 0, 0, 17]),
        ]
        .iter()
        .enumerate()
        {
            let data = pattern(*len, round as u64);
            let bufs = split(&data, sizes);
            let n = sink.write_all(&bufs).expect("write");
            assert_eq!(n, data.len() as u64, "{io:?}");
            expect.extend_from_slice(&data);
            assert_eq!(sink.bytes_written(), expect.len() as u64);
        }
        assert_eq!(sink.write_all(&[]).expect("empty write"), 0);
        sink.sync_data().expect("fdatasync");
        drop(sink);
        assert!(
            std::fs::read(&path).expect("read back") == expect,
            "{io:?}: file differs"
        );
    }
}

#[test]
fn sinks_take_batches_larger_than_iov_max_and_big_slices() {
    for io in choices() {
        let dir = scratch();
        let path = dir.path().join("big.pftrace");
        let mut sink = open(&path, io);
        // 3.5 × IOV_MAX small iovecs, then slices bigger than one request's byte cap.
        let small = pattern(IOV_MAX * 7 / 2 * 33, 9);
        let big = pattern(9 << 20, 10);
        let mut bufs = split(&small, &[33]);
        assert!(bufs.len() > 3 * IOV_MAX);
        bufs.extend(split(&big, &[(9 << 20) - 5, 5]));
        let n = sink.write_all(&bufs).expect("write");
        assert_eq!(n, (small.len() + big.len()) as u64);
        sink.sync_data().expect("fdatasync");
        drop(sink);
        let got = std::fs::read(&path).expect("read back");
        assert!(
            got[..small.len()] == small[..] && got[small.len()..] == big[..],
            "{io:?}"
        );
    }
}

#[test]
fn output_is_mode_0600_and_truncated() {
    let dir = scratch();
    let path = dir.path().join("old.pftrace");
    std::fs::write(&path, b"previous contents").expect("seed file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut sink = open(&path, IoChoice::Pwritev);
    sink.write_all(&[IoSlice::new(b"new")]).expect("write");
    drop(sink);
    assert_eq!(std::fs::read(&path).expect("read"), b"new");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let fresh = dir.path().join("fresh.pftrace");
    drop(open(&fresh, IoChoice::Pwritev));
    let mode = std::fs::metadata(&fresh)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn no_clobber_refuses_an_existing_file() {
    let dir = scratch();
    let path = dir.path().join("keep.pftrace");
    std::fs::write(&path, b"keep me").expect("seed file");
    let opts = OpenOptions {
        no_clobber: true,
        io: IoChoice::Auto,
        direct: false,
    };
    match open_output(OutputPath::File(path.clone()), opts) {
        Err(StorageError::Exists { path: p }) => assert_eq!(p, path),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("no-clobber replaced an existing file"),
    }
    assert_eq!(std::fs::read(&path).expect("read"), b"keep me");
    let new = dir.path().join("new.pftrace");
    let mut sink = open_output(OutputPath::File(new.clone()), opts).expect("new file opens");
    sink.write_all(&[IoSlice::new(b"x")]).expect("write");
    assert_eq!(std::fs::read(&new).expect("read"), b"x");
}

#[test]
fn missing_directory_is_an_open_error() {
    let dir = scratch();
    let path = dir.path().join("no/such/dir/t.pftrace");
    let r = open_output(OutputPath::File(path), OpenOptions::default());
    assert!(matches!(r, Err(StorageError::Open { .. })), "{:?}", r.err());
}

#[test]
fn io_uring_probe_agrees_with_forced_choice() {
    let dir = scratch();
    let r = open_output(
        OutputPath::File(dir.path().join("u.pftrace")),
        OpenOptions {
            no_clobber: false,
            io: IoChoice::IoUring,
            direct: false,
        },
    );
    match io_uring_available() {
        Ok(()) => assert_eq!(r.expect("io_uring sink").kind(), SinkKind::IoUring),
        Err(why) => {
            assert!(matches!(r, Err(StorageError::IoUringUnavailable(_))));
            need::skip(need::Missing::kernel(format!("io_uring: {why}")));
        }
    }
}

#[test]
fn stream_sink_writes_through_a_pipe() {
    let (rd, wr) = rustix::pipe::pipe().expect("pipe");
    let data = pattern(3 << 20, 5); // larger than a pipe's buffer
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::from(rd);
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut got).expect("read pipe");
        got
    });
    let mut sink = StreamSink::new(wr, false);
    assert_eq!(sink.kind(), SinkKind::Stream);
    let bufs = split(&data, &[1000, 0, 70_000]);
    assert_eq!(sink.write_all(&bufs).expect("write"), data.len() as u64);
    sink.sync_data().expect("no-op on a pipe");
    drop(sink);
    assert!(reader.join().expect("reader thread") == data);
}

#[test]
fn stream_sink_poisons_on_a_closed_pipe() {
    let (rd, wr) = rustix::pipe::pipe().expect("pipe");
    drop(rd);
    let mut sink = StreamSink::new(wr, false);
    // The test harness ignores SIGPIPE like every Rust program: EPIPE.
    let e = sink.write_all(&[IoSlice::new(b"abc")]).expect_err("EPIPE");
    assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
    assert_eq!(
        sink.write_all(&[IoSlice::new(b"d")]).expect_err("poisoned"),
        e
    );
    assert_eq!(sink.sync_data().expect_err("poisoned"), e);
}

const CHILD_ENV: &str = "RECORDER_STORAGE_TEST_CHILD";
const BEGIN: &[u8] = b"<<<STREAM-BEGIN>>>";
const END: &[u8] = b"<<<STREAM-END>>>";

/// Runs `child_entry` in a fresh copy of this test binary with `mode`.
fn run_child(
    mode: &str,
    stdout: std::process::Stdio,
    extra_env: &[(&str, &str)],
) -> std::process::Output {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "storage::child_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, mode)
    .stdout(stdout);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("child runs");
    assert!(
        out.status.success(),
        "child {mode} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The body of the child processes; a no-op in a normal run.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    match mode.as_str() {
        "stdout" => {
            let mut sink =
                open_output(OutputPath::Stdout, OpenOptions::default()).expect("stdout sink");
            assert_eq!(sink.kind(), SinkKind::Stream);
            let data = pattern(200_000, 3);
            let bufs = [IoSlice::new(BEGIN), IoSlice::new(&data), IoSlice::new(END)];
            sink.write_all(&bufs).expect("write to stdout");
            sink.sync_data().expect("sync stdout");
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn stdout_sink_streams_to_a_pipe_and_to_a_file() {
    let out = run_child("stdout", std::process::Stdio::piped(), &[]);
    let b = find(&out.stdout, BEGIN).expect("stream begins") + BEGIN.len();
    let e = find(&out.stdout, END).expect("stream ends");
    assert!(out.stdout[b..e] == pattern(200_000, 3)[..]);

    let dir = scratch();
    let path = dir.path().join("stdout.pftrace");
    let file = std::fs::File::create(&path).expect("stdout file");
    run_child("stdout", file.into(), &[]);
    let got = std::fs::read(&path).expect("read");
    let b = find(&got, BEGIN).expect("stream begins") + BEGIN.len();
    let e = find(&got, END).expect("stream ends");
    assert!(got[b..e] == pattern(200_000, 3)[..]);
}

/// `RECORDER_IO` (and `RECORDER_DIRECT_IO`) are read once, by the main job:
/// `RECORDER_IO=pwritev` forces that sink
/// (the log says which sink writes), an unknown value exits 2 before any
/// file is made.
#[test]
fn recorder_io_env_chooses_the_sink_and_refuses_unknown_values() {
    let run = Run::new(
        "buffers { size_kb: 256 } duration_ms: 100 \
         data_sources { config { name: \"for_testing\" for_testing { message_count: 10 } } }",
    );
    let out = run.command("pwritev").arg("-v").output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("trace file: pwritev"), "{stderr}");
    assert_eq!(
        test_counters(&decode(&std::fs::read(&run.out).expect("trace")))
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        10
    );
    trace_processor::check(&run.out);

    std::fs::remove_file(&run.out).expect("rm");
    let out = run.command("uring").output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("RECORDER_IO=uring: expected io_uring, pwritev or auto"),
        "{stderr}"
    );
    assert!(!run.out.exists(), "nothing is made before the refusal");
    let mut c = run.command("pwritev");
    let out = c.env("RECORDER_DIRECT_IO", "maybe").output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("RECORDER_DIRECT_IO=maybe: expected off, on or auto"),
        "{stderr}"
    );
    assert!(!run.out.exists(), "nothing is made before the refusal");
}

/// A 1 MiB tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> Option<SmallDisk> {
        let dir = scratch();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir.path())
            .status()
            .ok()?;
        st.success().then_some(SmallDisk { dir })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("full.pftrace")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // A closed io_uring releases its file asynchronously, so the mount
        // can still be busy: detach it lazily then (freed once released).
        let ok = Command::new("umount")
            .arg(self.dir.path())
            .stderr(std::process::Stdio::null())
            .status();
        if !ok.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// Frames `payload` as one `0x0A <len> <payload>` record.
fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x0A];
    let mut v = payload.len() as u64;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out.extend_from_slice(payload);
    out
}

#[test]
fn full_disk_poisons_the_sink_and_keeps_whole_calls() {
    require!(need::root());
    // 3 packets a call (30 KB: the io_uring sink's small-write path) and 12
    // (120 KB: through the ring).
    for (io, per_call) in choices()
        .into_iter()
        .flat_map(|io| [(io, 3usize), (io, 12)])
    {
        let disk = SmallDisk::mount();
        require!(disk.is_none().then(|| "cannot mount a tmpfs".to_string()));
        let disk = disk.expect("mounted");
        let path = disk.path();
        let mut sink = open(&path, io);
        let mut expect = Vec::new();
        let mut err = None;
        let mut failed_call: Vec<Vec<u8>> = Vec::new();
        for i in 0..100u64 {
            // Each call is a "pass" of several whole packets over many iovecs.
            let packets: Vec<Vec<u8>> = (0..per_call)
                .map(|k| framed(&pattern(10_000 + k * 7, i * 100 + k as u64)))
                .collect();
            let bufs: Vec<IoSlice<'_>> = packets
                .iter()
                .flat_map(|p| split(p, &[100, 3000]))
                .collect();
            match sink.write_all(&bufs) {
                Ok(n) => {
                    assert_eq!(n, packets.iter().map(|p| p.len() as u64).sum::<u64>());
                    packets.iter().for_each(|p| expect.extend_from_slice(p));
                }
                Err(e) => {
                    err = Some(e);
                    failed_call = packets;
                    break;
                }
            }
        }
        let e = err.expect("a 1 MiB disk fills up");
        assert!(e.is_disk_full(), "{io:?} {per_call}: {e}");
        assert_eq!(
            sink.write_all(&[IoSlice::new(b"\x0a\x00")])
                .expect_err("poisoned"),
            e
        );
        assert_eq!(sink.sync_data().expect_err("poisoned"), e);
        // The failed call was cut after its last whole packet that fit:
        // the file is the whole calls, then those packets.
        let whole_calls = expect.len();
        let mut kept_of_failed = 0;
        for p in &failed_call {
            if sink.bytes_written() >= (expect.len() + p.len()) as u64 {
                expect.extend_from_slice(p);
                kept_of_failed += 1;
            }
        }
        assert_eq!(sink.bytes_written(), expect.len() as u64, "{io:?}");
        assert!(
            kept_of_failed < per_call,
            "{io:?}: the failed call did not fit"
        );
        drop(sink);
        let got = std::fs::read(&path).expect("read back");
        assert_eq!(got.len(), expect.len(), "{io:?}");
        assert!(got == expect, "{io:?}: content differs");
        eprintln!(
            "{io:?} {per_call}: {whole_calls} bytes of whole calls, then {kept_of_failed} packets of the failed one"
        );
        let report = recorder::trace::inspect::report(&got);
        assert_eq!(report.torn_tail_bytes, 0);
        assert!(report.corruption.is_none());
    }
}

#[test]
fn cut_then_write_keeps_the_file_under_the_cap() {
    let dir = scratch();
    let path = dir.path().join("cap.pftrace");
    let mut sink = open(&path, IoChoice::Pwritev);
    let packets: Vec<Vec<u8>> = (0..50)
        .map(|k| framed(&pattern(k * 37 % 500, k as u64)))
        .collect();
    let all: Vec<u8> = packets.concat();
    let bufs = split(&all, &[64, 1, 999]);
    let cap = 7_000u64;
    let (kept, cut) = cut_at_packet_boundary(&bufs, cap);
    assert!(cut.cut && cut.kept_bytes < cap);
    sink.write_all(&kept).expect("write");
    drop(sink);
    let got = std::fs::read(&path).expect("read");
    assert_eq!(got.len() as u64, cut.kept_bytes);
    let report = recorder::trace::inspect::report(&got);
    assert!(report.corruption.is_none() && report.torn_tail_bytes == 0);
    assert!(cap - cut.kept_bytes <= packets.iter().map(|p| p.len() as u64).max().unwrap_or(0));
}

/// A small ext4 filesystem in a file, loop-mounted for one test (O_DIRECT
/// needs a block filesystem; tmpfs refuses it), unmounted when dropped.
struct Ext4Disk {
    dir: tempfile::TempDir,
}

impl Ext4Disk {
    fn mount(size_mib: u64) -> Result<Ext4Disk, String> {
        let dir = scratch();
        let image = dir.path().join("disk.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        let f = std::fs::File::create(&image).map_err(|e| e.to_string())?;
        f.set_len(size_mib << 20).map_err(|e| e.to_string())?;
        let run = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            out.status
                .success()
                .then_some(())
                .ok_or_else(|| format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
        };
        // No journal and no reserved blocks: the whole image is data space.
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "^has_journal", "-m", "0"])
            .arg(&image))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt))?;
        Ok(Ext4Disk { dir })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("mnt").join("direct.pftrace")
    }
}

impl Drop for Ext4Disk {
    fn drop(&mut self) {
        let mnt = self.dir.path().join("mnt");
        let ok = Command::new("umount").arg(&mnt).status();
        if !ok.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&mnt).status();
        }
    }
}

/// An O_DIRECT sink (the probe must pass on the work filesystem, ext4).
fn open_direct(path: &Path, io: IoChoice) -> Box<dyn FileSink> {
    let sink = open_output(
        OutputPath::File(path.to_path_buf()),
        OpenOptions {
            no_clobber: false,
            io,
            direct: true,
        },
    )
    .expect("output opens");
    assert_eq!(
        sink.direct_alignment(),
        Some(recorder::storage::direct::DIRECT_ALIGN),
        "{io:?}: O_DIRECT on {}",
        path.display()
    );
    sink
}

/// Writes one pass as the write pass does for an O_DIRECT sink.
fn write_aligned(
    sink: &mut dyn FileSink,
    bufs: &[IoSlice<'_>],
) -> Result<u64, recorder::storage::SinkError> {
    let align = sink.direct_alignment().expect("a direct sink");
    let pass = recorder::storage::direct::AlignedPass::new(bufs, align, true).expect("laid out");
    sink.write_all(&pass.slices())
}

/// The packets of a file, padding packets left out.
/// A for_testing packet (field 900) whose TestEvent.str is `len` letters.
fn for_testing_packet(len: usize, seed: u64) -> Vec<u8> {
    let letters: Vec<u8> = pattern(len, seed).iter().map(|b| b'a' + b % 26).collect();
    let mut body = vec![0xA2, 0x38];
    body.extend(&framed(&framed(&letters))[1..]);
    body
}

/// The file at `path` holds exactly the packets `want`, in order, padding
/// aside, and opens in trace processor with no error or data-loss stat.
/// Syncs and closes `sink`, then checks its file as
/// [`assert_holds_packets`] does.
fn assert_synced_holds_packets(
    mut sink: Box<dyn FileSink>,
    path: &Path,
    want: &[Vec<u8>],
    io: IoChoice,
) {
    sink.sync_data().expect("fdatasync");
    drop(sink);
    assert_holds_packets(path, want, io);
}

fn assert_holds_packets(path: &Path, want: &[Vec<u8>], io: IoChoice) {
    let got = packets_without_padding(&std::fs::read(path).expect("read back"));
    assert_eq!(got.len(), want.len(), "{io:?}");
    assert!(got == want, "{io:?}: packets differ");
    if let Some(tp) = trace_processor::open(path) {
        assert_eq!(tp.assert_no_errors(), vec![], "{io:?}: no data loss either");
    }
}

fn packets_without_padding(data: &[u8]) -> Vec<Vec<u8>> {
    let report = recorder::trace::inspect::report(data);
    assert_eq!(report.torn_tail_bytes, 0, "whole packets only");
    assert!(report.corruption.is_none());
    recorder::trace::reader::frames(data)
        .map(|f| f.packet)
        .filter(|p| {
            !(p.is_empty() || p.starts_with(&[0xBA, 0x03]) || p.iter().all(|&b| b & 0x7F == 0))
        })
        .map(<[u8]>::to_vec)
        .collect()
}

/// Packets laid out in a page-aligned mapping as a ring holds them, handed
/// over as scattered ranges (some starting on a block, most not, one
/// packet split over none): every packet reaches the O_DIRECT file once, in
/// order, with padding packets between, and the file opens in trace
/// processor.
#[test]
fn direct_sinks_write_scattered_ranges_in_order() {
    for io in choices() {
        let dir = scratch();
        let path = dir.path().join("direct.pftrace");
        let mut sink = open_direct(&path, io);
        let mut ring = memmap2::MmapMut::map_anon(8 << 20).expect("map");
        let mut want: Vec<Vec<u8>> = Vec::new();
        for round in 0..6u64 {
            // Ranges of whole packets: (start, end) in the mapping.
            let mut ranges = Vec::new();
            let mut round_packets = Vec::new();
            let mut at = ((round as usize) * 4096) % (1 << 20);
            for r in 0..40u64 {
                let start = at;
                for k in 0..(1 + r % 9) {
                    let len = [3usize, 200, 4093, 4096, 70_000][((r + k) % 5) as usize];
                    let body = for_testing_packet(len, round * 1000 + r * 10 + k);
                    let p = framed(&body);
                    ring[at..at + p.len()].copy_from_slice(&p);
                    at += p.len();
                    round_packets.push(body);
                }
                ranges.push((start, at));
                // Skip to the next block now and then (a new region).
                if r % 3 == 0 {
                    at = at.next_multiple_of(4096);
                }
            }
            // A service packet first, as a pass starts.
            let head = framed(&[0x40, 1]);
            let mut bufs = vec![IoSlice::new(&head)];
            bufs.extend(ranges.iter().map(|&(s, e)| IoSlice::new(&ring[s..e])));
            want.push(vec![0x40, 1]);
            want.extend(round_packets);
            let n = write_aligned(sink.as_mut(), &bufs).expect("write");
            assert_eq!(n % 4096, 0, "{io:?}: whole blocks");
            assert_eq!(sink.bytes_written() % 4096, 0);
        }
        assert_synced_holds_packets(sink, &path, &want, io);
    }
}

/// A full disk under O_DIRECT (a 4 MiB loop-mounted ext4): the sink is
/// poisoned with ENOSPC, and the file keeps whole packets only — every pass
/// that fit, then the packets of the failed one that fit, padding between —
/// so it opens as a trace.
#[test]
fn direct_full_disk_poisons_the_sink_and_keeps_whole_packets() {
    require!(need::root());
    for (io, per_call) in choices()
        .into_iter()
        .flat_map(|io| [(io, 3usize), (io, 12)])
    {
        let disk = Ext4Disk::mount(4);
        require!(disk.as_ref().err().map(|e| format!("no loop ext4: {e}")));
        let disk = disk.expect("mounted");
        let path = disk.path();
        let mut sink = open_direct(&path, io);
        let mut written: Vec<Vec<u8>> = Vec::new();
        let mut failed_call: Vec<Vec<u8>> = Vec::new();
        let mut err = None;
        for i in 0..1000u64 {
            let packets: Vec<Vec<u8>> = (0..per_call)
                .map(|k| framed(&pattern(10_000 + k * 7, i * 100 + k as u64)))
                .collect();
            let bufs: Vec<IoSlice<'_>> = packets.iter().map(|p| IoSlice::new(p)).collect();
            if let Err(e) = write_aligned(sink.as_mut(), &bufs) {
                err = Some(e);
                failed_call = packets;
                break;
            }
            written.extend(packets.iter().map(|p| p[3..].to_vec()));
        }
        let e = err.expect("a 4 MiB disk fills up");
        assert!(e.is_disk_full(), "{io:?} {per_call}: {e}");
        assert_eq!(sink.sync_data().expect_err("poisoned"), e);
        let in_file = sink.bytes_written();
        drop(sink);
        let data = std::fs::read(&path).expect("read back");
        assert_eq!(data.len() as u64, in_file, "{io:?}");
        let got = packets_without_padding(&data);
        // Every whole pass, then a prefix of the failed one.
        assert!(got.len() >= written.len(), "{io:?}");
        assert!(
            got[..written.len()] == written[..],
            "{io:?}: whole passes differ"
        );
        let rest = &got[written.len()..];
        assert!(rest.len() < per_call, "{io:?}: the failed pass did not fit");
        for (g, p) in rest.iter().zip(&failed_call) {
            assert_eq!(g[..], p[3..], "{io:?}");
        }
    }
}

/// The `FileSink` methods a test's wrapper passes on to its `inner` sink.
macro_rules! pass_on_to_inner {
    () => {
        fn kind(&self) -> SinkKind {
            self.inner.kind()
        }

        fn sync_data(&mut self) -> Result<(), recorder::storage::SinkError> {
            self.inner.sync_data()
        }

        fn bytes_written(&self) -> u64 {
            self.inner.bytes_written()
        }

        fn direct_alignment(&self) -> Option<usize> {
            self.inner.direct_alignment()
        }

        fn end_direct(&mut self) -> Result<(), recorder::storage::SinkError> {
            self.inner.end_direct()
        }
    };
}

/// A sink over a real file that writes each call in steps of `step` bytes;
/// after each step it reports the progress, tells the test how far it got
/// and waits for the test's go-ahead: a write pass held in flight.
struct SteppedSink {
    inner: Box<dyn FileSink>,
    step: usize,
    done_tx: std::sync::mpsc::Sender<u64>,
    go_rx: std::sync::mpsc::Receiver<()>,
}

impl FileSink for SteppedSink {
    pass_on_to_inner!();

    fn write_list(
        &mut self,
        list: &mut WriteList<'_, '_>,
    ) -> Result<u64, recorder::storage::SinkError> {
        let mut done = 0u64;
        loop {
            let step = list.peek(usize::MAX, self.step);
            if step.is_empty() {
                break;
            }
            let n = self.inner.write_all(step)?;
            done += n;
            list.advance(n as usize);
            list.written(done);
            self.done_tx.send(done).expect("the test listens");
            self.go_rx.recv().expect("the test answers");
        }
        Ok(done)
    }
}

/// A real sink that notes how much of its buffer is still held after each
/// write it is given.
struct WatchedSink {
    inner: Box<dyn FileSink>,
    buffer: std::sync::Arc<recorder::ringbuf::Buffer>,
    held: Vec<u64>,
}

impl FileSink for WatchedSink {
    pass_on_to_inner!();

    fn write_list(
        &mut self,
        list: &mut WriteList<'_, '_>,
    ) -> Result<u64, recorder::storage::SinkError> {
        let n = self.inner.write_list(list)?;
        self.held.push(self.buffer.stats().bytes_buffered);
        Ok(n)
    }
}

/// An O_DIRECT pass whose copies outgrow its bounce limit is laid out and
/// written a group of regions at a time: the file holds every packet in
/// order (trace processor agrees), and the ring gets each group's regions
/// back as that group lands, before the next is copied.
#[test]
fn direct_a_pass_beyond_its_bounce_limit_goes_in_groups() {
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
    use recorder::storage::write_pass::{PassStage, Take, write_pass_staged};
    for io in choices() {
        let dir = scratch();
        let path = dir.path().join("grouped.pftrace");
        let buffer =
            Buffer::new(BufferParams::new(4 << 20, FillPolicy::RingBuffer)).expect("buffer");
        let mut w = buffer.writer(WriterId(2));
        // About 2 MB: 32 regions of 64 KiB, each with a partial last block.
        let want: Vec<Vec<u8>> = (0..2000).map(counter_packet).collect();
        for p in &want {
            w.write_packet(p).expect("fits");
        }
        w.flush();
        let before = buffer.stats().bytes_buffered;
        let mut sink = WatchedSink {
            inner: open_direct(&path, io),
            buffer: buffer.clone(),
            held: Vec::new(),
        };
        let stage = PassStage {
            max_bounce: Some(4 * 4096),
            last: true,
            ..PassStage::default()
        };
        let report = write_pass_staged(
            &mut sink,
            &[],
            &[(buffer.clone(), Take::Consume)],
            |_| Vec::new(),
            None,
            true,
            stage,
        )
        .expect("the pass");
        let held = std::mem::take(&mut sink.held);
        drop(sink);
        assert!(held.len() >= 8, "{io:?}: {} writes", held.len());
        assert!(
            held.windows(2).all(|w| w[1] <= w[0]) && held[0] < before,
            "{io:?}: each group's regions come back as it lands: {held:?}"
        );
        assert_eq!(buffer.stats().bytes_buffered, 0);
        assert_eq!(report.bytes, std::fs::metadata(&path).expect("file").len());
        assert_holds_packets(&path, &want, io);
    }
}

/// A `for_testing` packet of sequence 2 with `counter`, about 1000 bytes,
/// encoded by the independent encoder.
/// One write pass of all `buffer` holds, with no head, tail or size cap.
fn consume_pass(
    sink: &mut dyn FileSink,
    buffer: &std::sync::Arc<recorder::ringbuf::Buffer>,
    sync: bool,
) -> Result<recorder::storage::write_pass::PassReport, recorder::storage::write_pass::PassError> {
    use recorder::storage::write_pass::{Take, write_pass};
    write_pass(
        sink,
        &[],
        &[(buffer.clone(), Take::Consume)],
        |_| Vec::new(),
        None,
        sync,
    )
}

fn counter_packet(counter: u64) -> Vec<u8> {
    use protobuf::Message;
    let mut p = perfetto_protos::trace_packet::TracePacket::new();
    p.set_trusted_packet_sequence_id(2);
    let ev = p.mut_for_testing();
    ev.set_counter(counter);
    ev.set_str("x".repeat(980));
    p.write_to_bytes().expect("encodes")
}

/// A DISCARD buffer written full, then a write pass over all of it held in
/// flight step by step (64 KiB at a time, through the real sinks, with and
/// without O_DIRECT): after each step the writer takes the chunks the pass
/// has written — it is refused only once those are used up, and then for
/// the reason that is true (`Pinned`: the rest is in the pass) — so by the
/// end of the pass it has written nearly a buffer's worth again. Both
/// passes' packets reach the file in order.
#[test]
fn a_pass_in_flight_gives_back_what_it_has_written() {
    use recorder::ringbuf::{
        Buffer, BufferParams, DiscardReason, FillPolicy, WriteError, WriterId,
    };
    use recorder::storage::write_pass::{Take, write_pass};
    const STEP: usize = 64 * 1024;
    for (io, direct) in choices()
        .into_iter()
        .flat_map(|io| [(io, false), (io, true)])
    {
        let dir = scratch();
        let path = dir.path().join("held.pftrace");
        let inner = if direct {
            open_direct(&path, io)
        } else {
            open(&path, io)
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel();
        let mut sink = SteppedSink {
            inner,
            step: STEP,
            done_tx,
            go_rx,
        };
        let buffer = Buffer::new(BufferParams::new(1 << 20, FillPolicy::Discard)).expect("buffer");
        let mut w = buffer.writer(WriterId(2));
        let mut counter = 0u64;
        let mut accepted = Vec::new();
        // Fills the buffer: the first refusal is a full buffer.
        let first = loop {
            match w.write_packet(&counter_packet(counter)) {
                Ok(()) => accepted.push(counter),
                Err(e) => break e,
            }
            counter += 1;
        };
        counter += 1;
        assert_eq!(first, WriteError::Discarded(DiscardReason::Full), "{io:?}");
        let full = buffer.stats();
        let before_pass = accepted.len();

        let pass_buffer = buffer.clone();
        let pass = std::thread::spawn(move || {
            let r = write_pass(
                &mut sink,
                &[],
                &[(pass_buffer, Take::Consume)],
                |_| Vec::new(),
                None,
                false,
            );
            // Hangs up on the test: the pass is over.
            sink.done_tx = std::sync::mpsc::channel().0;
            (r, sink)
        });
        let slack = if direct { 3 * STEP } else { 2 * STEP } as u64;
        let (mut steps, mut bytes_during) = (0, 0u64);
        let mut refusals = Vec::new();
        let mut last_done = 0;
        while let Ok(done) = done_rx.recv() {
            steps += 1;
            last_done = done;
            // Write until refused: the chunks the pass has written so far.
            loop {
                let p = counter_packet(counter);
                counter += 1;
                match w.write_packet(&p) {
                    Ok(()) => {
                        accepted.push(counter - 1);
                        bytes_during += p.len() as u64 + 3;
                    }
                    Err(e) => {
                        refusals.push((done, e));
                        break;
                    }
                }
            }
            // What the pass has written came back, less a region or two
            // (a region goes back once all its bytes are in the file).
            assert!(
                bytes_during + slack >= done.min(full.bytes_written),
                "{io:?} direct {direct}: {bytes_during} bytes written back after {done}"
            );
            go_tx.send(()).expect("the sink waits");
        }
        let (r, mut sink) = pass.join().expect("the pass thread");
        let report = r.expect("the pass");
        assert_eq!(report.buffer_bytes, full.bytes_written, "{io:?}");
        assert!(steps >= 15, "{io:?}: the pass went in steps ({steps})");
        // Refused because the rest was pinned while the pass held some of
        // it; once it has let go of everything, because the buffer is full.
        for &(done, e) in &refusals {
            let why = if done < last_done {
                DiscardReason::Pinned
            } else {
                DiscardReason::Full
            };
            assert_eq!(
                e,
                WriteError::Discarded(why),
                "{io:?} direct {direct}: refused after {done} of {last_done} bytes"
            );
        }
        let refused_pinned = refusals.iter().filter(|(d, _)| *d < last_done).count() as u64;
        let s = buffer.stats();
        assert_eq!(s.packets_discarded_pinned, refused_pinned, "{io:?}");
        assert_eq!(s.packets_discarded_held, 0, "{io:?}");
        assert!(
            accepted.len() - before_pass >= before_pass * 3 / 4,
            "{io:?} direct {direct}: {} packets during the pass, {before_pass} before",
            accepted.len() - before_pass
        );
        assert!(s.is_balanced(), "{io:?}: {s:?}");

        // The second pass writes what came in meanwhile; it runs freely.
        drop(w);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        sink.done_tx = done_tx;
        let go = std::thread::spawn(move || {
            while done_rx.recv().is_ok() {
                go_tx.send(()).expect("the sink waits");
            }
        });
        consume_pass(&mut sink, &buffer, true).expect("the second pass");
        drop(sink);
        go.join().expect("the go-ahead thread");

        let data = std::fs::read(&path).expect("read back");
        let packets = decode(&data);
        let counters = test_counters(&packets);
        assert_eq!(counters.get(&2), Some(&accepted), "{io:?} direct {direct}");
        if let Some(tp) = trace_processor::open(&path) {
            // The refused packets are marked as lost on sequence 2.
            tp.assert_no_errors();
        }
    }
}

/// What a sink reported while it wrote.
#[derive(Default)]
struct Reports(Vec<u64>);

impl WriteProgress for Reports {
    fn written(&mut self, done: u64) -> u64 {
        self.0.push(done);
        0
    }
}

/// A 40 MiB call is reported in steps as its requests complete (io_uring
/// holds at most 32 MiB in flight, pwritev writes 4 MiB a call), growing,
/// ending at the whole call; the file holds the bytes.
#[test]
fn sinks_report_progress_as_requests_complete() {
    let data = pattern(40 << 20, 7);
    let bufs = split(&data, &[1 << 20, 3000, 5 << 20, 1]);
    for io in choices() {
        let dir = scratch();
        let path = dir.path().join("progress.bin");
        let mut sink = open(&path, io);
        let mut reports = Reports::default();
        let n = sink
            .write_all_reporting(&bufs, &mut reports)
            .expect("write");
        assert_eq!(n, data.len() as u64);
        let r = &reports.0;
        assert!(r.len() >= 2, "{io:?}: reported in steps: {r:?}");
        assert!(r.windows(2).all(|w| w[0] < w[1]), "{io:?}: growing: {r:?}");
        assert_eq!(r.last().copied(), Some(n), "{io:?}");
        assert!(std::fs::read(&path).expect("read back") == data, "{io:?}");
    }
}

/// A full disk in the middle of a pass that has already let go of the
/// regions it wrote (a 12 MiB loop-mounted ext4, passes of a 16 MiB ring,
/// with and without O_DIRECT): the sink walks packets only from the floor
/// the pass gave it, and the file still ends at a whole packet — the
/// written packets in order, then nothing torn.
#[test]
fn a_full_disk_mid_pass_keeps_whole_packets_after_letting_go() {
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
    require!(need::root());
    for (io, direct) in choices()
        .into_iter()
        .flat_map(|io| [(io, false), (io, true)])
    {
        let disk = Ext4Disk::mount(12);
        require!(disk.as_ref().err().map(|e| format!("no loop ext4: {e}")));
        let disk = disk.expect("mounted");
        let path = disk.path();
        let mut sink = if direct {
            open_direct(&path, io)
        } else {
            open(&path, io)
        };
        let buffer = Buffer::new(BufferParams::new(16 << 20, FillPolicy::Discard)).expect("buffer");
        let mut w = buffer.writer(WriterId(2));
        let mut accepted = Vec::new();
        let mut counter = 0u64;
        let err = loop {
            while w.write_packet(&counter_packet(counter)).is_ok() {
                accepted.push(counter);
                counter += 1;
            }
            w.flush();
            match consume_pass(sink.as_mut(), &buffer, false) {
                Ok(_) => assert!(counter < 1_000_000, "{io:?}: a 12 MiB disk fills up"),
                Err(e) => break e,
            }
        };
        assert!(err.kept_bytes > 0, "{io:?} direct {direct}: {err}");
        let in_file = sink.bytes_written();
        drop(sink);
        let data = std::fs::read(&path).expect("read back");
        assert_eq!(data.len() as u64, in_file, "{io:?} direct {direct}");
        assert_eq!(
            whole_prefix(&data),
            data.len(),
            "{io:?} direct {direct}: whole packets only"
        );
        let got = test_counters(&decode(&data)).remove(&2).unwrap_or_default();
        assert!(
            got.len() > 4096,
            "{io:?} direct {direct}: {} kept",
            got.len()
        );
        assert_eq!(
            got[..],
            accepted[..got.len()],
            "{io:?} direct {direct}: a prefix of what was written, in order"
        );
    }
}

/// On a file that takes O_DIRECT, passes too small to fill blocks go
/// through the page cache with no padding at all, and a large pass after
/// them first pads the file to a block boundary, then writes through
/// O_DIRECT again: every packet is there once, in order, and the trace
/// opens in trace processor.
#[test]
fn direct_small_passes_go_through_the_page_cache_unpadded() {
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
    use recorder::storage::direct::{DIRECT_ALIGN, MIN_DIRECT_PASS};
    for io in choices() {
        let dir = scratch();
        let path = dir.path().join("mixed.pftrace");
        let mut sink = open_direct(&path, io);
        let buffer = Buffer::new(BufferParams::new(8 << 20, FillPolicy::Discard)).expect("buffer");
        let mut w = buffer.writer(WriterId(2));
        let mut want: Vec<Vec<u8>> = Vec::new();
        // Packets per pass, about 200 bytes each: slow, slow, a burst,
        // slow, a burst.
        for (pass, n) in [(0u64, 10u64), (1, 40), (2, 3000), (3, 5), (4, 2500)] {
            let mut bytes = 0u64;
            for i in 0..n {
                let body = for_testing_packet(190, pass * 100_000 + i);
                w.write_packet(&body).expect("room");
                bytes += framed(&body).len() as u64;
                want.push(body);
            }
            let before = sink.bytes_written();
            let r = consume_pass(sink.as_mut(), &buffer, false).expect("pass");
            assert_eq!(r.input_bytes, bytes, "{io:?} pass {pass}: data only");
            if bytes < MIN_DIRECT_PASS {
                assert_eq!(sink.direct_alignment(), None, "{io:?} pass {pass}");
                assert_eq!(r.bytes, bytes, "{io:?} pass {pass}: no padding");
                assert_eq!(sink.bytes_written(), before + bytes);
            } else {
                assert_eq!(
                    sink.direct_alignment(),
                    Some(DIRECT_ALIGN),
                    "{io:?} pass {pass}"
                );
                assert_eq!(
                    sink.bytes_written() % DIRECT_ALIGN as u64,
                    0,
                    "{io:?} pass {pass}"
                );
                // One padding packet back to a block, then at most a block
                // per run of copies.
                assert!(
                    r.bytes - bytes < 4 * DIRECT_ALIGN as u64,
                    "{io:?} pass {pass}: {} bytes of padding",
                    r.bytes - bytes
                );
            }
        }
        assert_synced_holds_packets(sink, &path, &want, io);
    }
}
