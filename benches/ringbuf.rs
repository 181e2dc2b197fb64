//! Buffer engine benchmarks, each beside the baseline it is judged against,
//! measured in the same run (figures and ratios in `BENCHMARKS.md`):
//!
//! * `small/*`: one writer, 64-byte packets into a 64 MiB ring, against
//!   `rtrb` 0.4 used as a byte ring with one commit per record, and a plain
//!   `Vec<u8>` append of the same framed bytes over a 64 MiB region;
//! * `chunk_size/*`: the same load for several chunk sizes (the default's
//!   justification);
//! * `large/*`: 1 KiB and 64 KiB packets against `memcpy` over a region of
//!   the same size;
//! * `writers/*`: one and two writer threads on one buffer;
//! * `full/*`: steady state of a full ring (every chunk taken overwrites) and
//!   of a full DISCARD buffer (every packet dropped);
//! * `flush/*`: collecting and releasing the ranges of a full 64 MiB buffer;
//! * `prefault/*`: mapping and prefaulting 64 MiB (RSS printed once), on
//!   anonymous memory and on a memfd (collapsed into huge pages);
//! * `backing/*`: one writer, 64-byte and 1 KiB packets, into a 64 MiB ring
//!   on anonymous memory (the baseline), on a sealed memfd (a buffer saved
//!   if the recorder dies) and on a file in a tmpfs (`--ring-dir
//!   /dev/shm/...`), interleaved in one run.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main,
};
use recorder::ringbuf::{
    Backing, Buffer, BufferParams, FillPolicy, RingIdentity, Writer, WriterId,
};

const REGION: usize = 64 << 20;
/// Packets per timed iteration.
const N: usize = 10_000;

fn ring(size: usize, chunk_size: usize, policy: FillPolicy) -> Arc<Buffer> {
    Buffer::new(BufferParams::new(size, policy).with_chunk_size(chunk_size))
        .expect("valid bench buffer")
}

/// A ring of the default chunk size over [`REGION`].
fn default_ring() -> Arc<Buffer> {
    ring(
        REGION,
        BufferParams::DEFAULT_CHUNK_SIZE,
        FillPolicy::RingBuffer,
    )
}

/// Benchmarks `n` writes of `payload` through `w` as `name`.
fn bench_writes(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: impl Into<String>,
    w: &mut Writer,
    payload: &[u8],
    n: usize,
) {
    g.bench_function(name, |b| {
        b.iter(|| {
            for _ in 0..n {
                let _ = w.write_packet(black_box(payload));
            }
        })
    });
}

/// `0x0A <varint len> payload`.
fn framed(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x0A];
    let mut v = payload.len();
    while v >= 0x80 {
        f.push((v as u8) | 0x80);
        v >>= 7;
    }
    f.push(v as u8);
    f.extend_from_slice(payload);
    f
}

/// Appends framed packets to a Vec, wrapping at `REGION` bytes: the copy
/// limit over the same working set as the ring.
fn vec_baseline(c: &mut Criterion, group: &str, len: usize, n: usize) {
    let packet = vec![0x5Au8; len];
    let f = framed(&packet);
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(n as u64));
    let mut v: Vec<u8> = Vec::with_capacity(REGION);
    v.resize(REGION, 1); // fault it in
    v.clear();
    g.bench_function("vec_append", |b| {
        b.iter(|| {
            for _ in 0..n {
                if v.len() + f.len() > REGION {
                    v.clear();
                }
                v.extend_from_slice(black_box(&f));
            }
        })
    });
    g.finish();
}

fn small(c: &mut Criterion) {
    let payload = vec![0x5Au8; 64];
    let f = framed(&payload);
    {
        let mut g = c.benchmark_group("small");
        g.throughput(Throughput::Elements(N as u64));
        let buffer = default_ring();
        let mut w = buffer.writer(WriterId(2));
        bench_writes(&mut g, "ringbuf_write_packet", &mut w, &payload, N);
        g.bench_function("ringbuf_begin_packet", |b| {
            b.iter(|| {
                for _ in 0..N {
                    if let Ok(mut slot) = w.begin_packet(64) {
                        slot.buf().copy_from_slice(black_box(&payload));
                        slot.commit(64);
                    }
                }
            })
        });
        drop(w);
        drop(buffer);
        // rtrb as a byte ring: one write chunk and one commit per record; the
        // consumer drains in the same thread every N records.
        let (mut tx, mut rx) = rtrb::RingBuffer::<u8>::new(REGION);
        g.bench_function("rtrb_commit_per_record", |b| {
            b.iter(|| {
                for _ in 0..N {
                    let mut chunk = tx.write_chunk(f.len()).expect("drained every N records");
                    let (a, bb) = chunk.as_mut_slices();
                    let (fa, fb) = black_box(&f).split_at(a.len());
                    a.copy_from_slice(fa);
                    bb.copy_from_slice(fb);
                    chunk.commit_all();
                }
                let n = rx.slots();
                rx.read_chunk(n).expect("n slots are readable").commit_all();
            })
        });
        g.finish();
    }
    vec_baseline(c, "small", 64, N);
}

fn chunk_size(c: &mut Criterion) {
    let payload = vec![0x5Au8; 64];
    let mut g = c.benchmark_group("chunk_size");
    g.throughput(Throughput::Elements(N as u64));
    for cs in [4096usize, 16 << 10, 64 << 10, 256 << 10] {
        let buffer = ring(REGION, cs, FillPolicy::RingBuffer);
        let mut w = buffer.writer(WriterId(2));
        bench_writes(
            &mut g,
            format!("write_64B/{}KiB", cs >> 10),
            &mut w,
            &payload,
            N,
        );
    }
    g.finish();
}

fn large(c: &mut Criterion) {
    for len in [1024usize, 64 * 1024] {
        let n = (8 << 20) / len; // 8 MiB per iteration
        let payload = vec![0x5Au8; len];
        let name = format!("large_{}KiB", len >> 10);
        let mut g = c.benchmark_group(&name);
        g.throughput(Throughput::Bytes((n * len) as u64));
        let buffer = default_ring();
        let mut w = buffer.writer(WriterId(2));
        bench_writes(&mut g, "ringbuf_write_packet", &mut w, &payload, n);
        drop(w);
        drop(buffer);
        let mut dst = vec![1u8; REGION];
        let mut at = 0;
        g.bench_function("memcpy", |b| {
            b.iter(|| {
                for _ in 0..n {
                    if at + len > REGION {
                        at = 0;
                    }
                    dst[at..at + len].copy_from_slice(black_box(&payload));
                    at += len;
                }
            })
        });
        g.finish();
    }
}

fn writers(c: &mut Criterion) {
    let payload = vec![0x5Au8; 64];
    let mut g = c.benchmark_group("writers");
    let per_thread = 200_000usize;
    for threads in [1usize, 2] {
        let buffer = default_ring();
        g.throughput(Throughput::Elements((threads * per_thread) as u64));
        g.bench_function(format!("write_64B/{threads}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        for t in 0..threads {
                            let buffer = &buffer;
                            let payload = &payload;
                            s.spawn(move || {
                                let mut w = buffer.writer(WriterId(t as u32 + 2));
                                for _ in 0..per_thread {
                                    let _ = w.write_packet(black_box(payload));
                                }
                            });
                        }
                    });
                    total += start.elapsed();
                }
                total
            })
        });
    }
    g.finish();
}

fn full(c: &mut Criterion) {
    let payload = vec![0x5Au8; 64];
    let mut g = c.benchmark_group("full");
    g.throughput(Throughput::Elements(N as u64));
    // A small ring, so every chunk acquisition overwrites unread data.
    let buffer = ring(
        1 << 20,
        BufferParams::DEFAULT_CHUNK_SIZE,
        FillPolicy::RingBuffer,
    );
    let mut w = buffer.writer(WriterId(2));
    for _ in 0..(4 << 20) / 66 {
        let _ = w.write_packet(&payload);
    }
    bench_writes(&mut g, "ring_overwrite_64B", &mut w, &payload, N);
    assert!(buffer.stats().chunks_overwritten > 0);
    let buffer = ring(
        1 << 20,
        BufferParams::DEFAULT_CHUNK_SIZE,
        FillPolicy::Discard,
    );
    let mut w = buffer.writer(WriterId(2));
    while w.write_packet(&payload).is_ok() {}
    bench_writes(&mut g, "discard_drop_64B", &mut w, &payload, N);
    assert!(buffer.stats().packets_discarded > 0);
    g.finish();
}

fn flush(c: &mut Criterion) {
    let mut g = c.benchmark_group("flush");
    g.sample_size(20);
    for cs in [BufferParams::DEFAULT_CHUNK_SIZE, 64 << 10] {
        let buffer = ring(REGION, cs, FillPolicy::Discard);
        let payload = vec![0x5Au8; 200];
        g.bench_function(format!("take_release_64MiB/{}KiB", cs >> 10), |b| {
            b.iter_batched(
                || {
                    let mut w = buffer.writer(WriterId(2));
                    while w.write_packet(&payload).is_ok() {}
                },
                |()| {
                    let batch = buffer.take_flush();
                    black_box(batch.items().count());
                    batch.release();
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn prefault(c: &mut Criterion) {
    if let Some(before) = rss_kib() {
        let b = default_ring();
        let after = rss_kib().unwrap_or(0);
        println!(
            "prefault: RSS grew by {} KiB for a {} KiB buffer",
            after.saturating_sub(before),
            REGION >> 10
        );
        drop(b);
    }
    let mut g = c.benchmark_group("prefault");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(REGION as u64));
    g.bench_function("map_prefault_64MiB", |b| b.iter(default_ring));
    // Shared memory: sized and allocated, prefaulted, then collapsed into
    // huge pages (what a buffer saved at death costs to set up).
    g.bench_function("map_prefault_64MiB_memfd", |b| {
        b.iter(|| ring_on(Backing::Memfd))
    });
    g.finish();
}

/// A 64 MiB ring on `backing`.
fn ring_on(backing: Backing) -> Arc<Buffer> {
    let params = BufferParams::new(REGION, FillPolicy::RingBuffer)
        .with_chunk_size(BufferParams::DEFAULT_CHUNK_SIZE);
    Buffer::create(params, backing, &RingIdentity::default()).expect("valid bench buffer")
}

/// The backings compared: anonymous memory (the baseline), a sealed memfd,
/// and a file in a tmpfs (when /dev/shm is one).
fn backings(shm: Option<&Path>, tag: &str) -> Vec<(&'static str, Arc<Buffer>)> {
    let mut v = vec![
        ("anonymous", ring_on(Backing::Anonymous)),
        ("memfd", ring_on(Backing::Memfd)),
    ];
    if let Some(d) = shm {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(d.join(format!("bench-{tag}.ring")))
            .expect("a tmpfs file");
        v.push(("tmpfs_file", ring_on(Backing::File(file.into()))));
    }
    v
}

/// Rounds of the interleaved comparison.
const ROUNDS: usize = 201;

/// The same load on each backing in turn, round after round (the order
/// rotating), so that a shared machine's drift hits each alike; prints, per
/// packet size, the median over rounds of each backing's rate against the
/// anonymous ring's in the same round.
fn backing_ratios(shm: Option<&Path>) {
    println!("\n| packets | backing | rate ÷ anonymous, median of {ROUNDS} rounds (p25–p75) |");
    println!("|---|---|---|");
    for len in [64usize, 1024] {
        let payload = vec![0x5Au8; len];
        let rings = backings(shm, &format!("ratio-{len}"));
        let mut writers: Vec<_> = rings.iter().map(|(_, b)| b.writer(WriterId(2))).collect();
        let mut times = vec![Vec::with_capacity(ROUNDS); rings.len()];
        for round in 0..ROUNDS + 1 {
            for k in 0..rings.len() {
                let i = (k + round) % rings.len();
                let w = &mut writers[i];
                let t0 = Instant::now();
                for _ in 0..N {
                    let _ = w.write_packet(black_box(&payload));
                }
                // Round 0 warms up.
                if round > 0 {
                    times[i].push(t0.elapsed().as_secs_f64());
                }
            }
        }
        for (i, (name, _)) in rings.iter().enumerate().skip(1) {
            let mut r: Vec<f64> = times[0]
                .iter()
                .zip(&times[i])
                .map(|(anon, other)| anon / other)
                .collect();
            r.sort_by(f64::total_cmp);
            let q = |p: usize| r[(r.len() - 1) * p / 100];
            println!(
                "| {len} B | {name} | {:.3} ({:.3}–{:.3}) |",
                q(50),
                q(25),
                q(75)
            );
        }
    }
}

fn backing(c: &mut Criterion) {
    let shm = tempfile::tempdir_in("/dev/shm").ok();
    // Test mode (`cargo test --benches`) runs each bench once: not the rounds.
    if !std::env::args().any(|a| a == "--test") {
        backing_ratios(shm.as_ref().map(|d| d.path()));
    }
    let mut g = c.benchmark_group("backing");
    for len in [64usize, 1024] {
        let payload = vec![0x5Au8; len];
        g.throughput(Throughput::Elements(N as u64));
        for (name, buffer) in backings(shm.as_ref().map(|d| d.path()), &len.to_string()) {
            let mut w = buffer.writer(WriterId(2));
            bench_writes(&mut g, format!("write_{len}B/{name}"), &mut w, &payload, N);
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = small, chunk_size, large, writers, full, flush, prefault, backing
}
criterion_main!(benches);
