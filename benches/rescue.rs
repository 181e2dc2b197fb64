//! Saved at death: a 1 GiB ring written as a trace the way the broker or a
//! keeper writes it when the recorder dies (`privilege::rescue::save_rings`:
//! the memfd sealed against writes and read in place, every packet checked,
//! written after the file's last whole packet, then fdatasync), against
//! `dd if=/dev/zero bs=1M count=1024 conv=fdatasync` writing 1 GiB to the same filesystem,
//! in the same run (`cargo bench --bench rescue`).
//!
//! The ring holds 1 KiB packets and has wrapped once (every chunk holds
//! data, a loss marker heads it). The scratch directory is
//! `$RECORDER_BENCH_DIR`, else a folder under the target directory (the
//! work filesystem, not tmpfs). After criterion's own report the medians
//! and their ratio are printed, with the load average. In test mode
//! (`cargo test --benches`) a 16 MiB ring is saved once.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use recorder::privilege::rescue::save_rings;
use recorder::ringbuf::image::Check;
use recorder::ringbuf::{Backing, Buffer, BufferParams, FillPolicy, RingIdentity, WriterId};
use recorder::trace::salvage::{Head, SalvageOptions, SavedBy};

const MIB: usize = 1 << 20;

fn scratch_dir() -> PathBuf {
    let dir = std::env::var_os("RECORDER_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rescue-bench"));
    std::fs::create_dir_all(&dir).expect("bench dir creatable");
    dir
}

/// A ring of `size` bytes on a memfd, wrapped once with 1 KiB packets.
fn full_ring(size: usize) -> Arc<Buffer> {
    let identity = RingIdentity {
        count: 1,
        uuid: (1, 2),
        config: vec![0x0A, 0x03, 0x08, 0x80, 0x08],
        ..RingIdentity::default()
    };
    let b = Buffer::create(
        BufferParams::new(size, FillPolicy::RingBuffer),
        Backing::Memfd,
        &identity,
    )
    .expect("a memfd ring");
    let mut w = b.writer(WriterId(2));
    // trusted_packet_sequence_id 2, then a bytes field filling 1 KiB.
    let mut p = vec![0x50, 2, 0xA2, 0x38];
    let body = 1024 - p.len() - 2;
    p.extend_from_slice(&[(body as u8) | 0x80, (body >> 7) as u8]);
    p.resize(1024, 0x5A);
    for _ in 0..(size / 1024 + size / 8192) {
        w.write_packet(&p).expect("a ring never refuses");
    }
    drop(w);
    b
}

/// Removes a file when dropped (outside the timed part).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn save_once(rings: &[(u32, OwnedFd)], path: &Path) -> (Duration, Scratch) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("scratch file");
    let out: OwnedFd = file.into();
    let opts = SalvageOptions {
        head: Head::Full,
        check: Check::Packets,
        by: SavedBy::Keeper,
        pid: None,
        signal: None,
        segment: None,
    };
    let t0 = Instant::now();
    let report = save_rings(&out, rings, &[], opts)
        .expect("the save")
        .expect("the ring holds data");
    let took = t0.elapsed();
    assert!(report.packets > 0);
    (took, Scratch(path.to_path_buf()))
}

fn dd_once(path: &Path, mib: usize) -> (Duration, Scratch) {
    let t0 = Instant::now();
    let st = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", path.display()))
        .args([
            "bs=1M",
            &format!("count={mib}"),
            "conv=fdatasync",
            "status=none",
        ])
        .status()
        .expect("dd runs");
    let took = t0.elapsed();
    assert!(st.success(), "dd failed");
    (took, Scratch(path.to_path_buf()))
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let test_mode = std::env::args().any(|a| a == "--test" || a == "--list");
    let mib = if test_mode { 16 } else { 1024 };
    let dir = scratch_dir();
    let ring = full_ring(mib * MIB);
    let fd = ring
        .shared_file()
        .expect("shared")
        .try_clone_to_owned()
        .expect("dup");
    // As after a death: only the descriptor is left (so the save may seal
    // the memfd against writes and read it in place).
    drop(ring);
    let rings = vec![(0u32, fd)];
    let out = dir.join("rescue-bench.pftrace");
    if test_mode {
        drop(save_once(&rings, &out));
        return;
    }
    let load_before = load_average();
    let saves = Arc::new(Mutex::new(Vec::new()));
    let dds = Arc::new(Mutex::new(Vec::new()));
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(30));
    {
        let mut g = c.benchmark_group("save");
        g.throughput(Throughput::Bytes((mib * MIB) as u64));
        let times = saves.clone();
        g.bench_function("save_1GiB_ring", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (t, scratch) = save_once(&rings, &out);
                    drop(scratch);
                    times.lock().expect("times").push(t);
                    total += t;
                }
                total
            })
        });
        let times = dds.clone();
        g.bench_function("dd_1GiB_fdatasync", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (t, scratch) = dd_once(&out, mib);
                    drop(scratch);
                    times.lock().expect("times").push(t);
                    total += t;
                }
                total
            })
        });
        g.finish();
    }
    c.final_summary();
    let mut s = saves.lock().expect("times").clone();
    let mut d = dds.lock().expect("times").clone();
    let (ms, md) = (median(&mut s), median(&mut d));
    println!(
        "\nsave of a {mib} MiB ring: median {:.3} s ({} runs); dd {mib} MiB conv=fdatasync: median {:.3} s ({} runs); save / dd = {:.2}× (load average {load_before} before, {} after)",
        ms.as_secs_f64(),
        s.len(),
        md.as_secs_f64(),
        d.len(),
        ms.as_secs_f64() / md.as_secs_f64().max(1e-9),
        load_average()
    );
}
