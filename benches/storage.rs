//! Storage throughput: 1 GiB in 1 MiB iovecs (one prefaulted region) through
//! each file sink, with a final fdatasync, against `dd bs=1M count=1024
//! conv=fsync` to the same filesystem in the same run.
//!
//! `cargo bench --bench storage` prints a table (medians of RUNS runs: MB/s
//! and CPU-seconds per GB), then runs the criterion group. The scratch
//! directory is `$RECORDER_BENCH_DIR`, else a folder under the target directory (the
//! work filesystem, not tmpfs). CPU time comes from `/proc/self/stat` (the
//! same per-process counters as getrusage: every thread, io_uring's io-wq
//! workers included) and, for dd, the waited-for children's counters.

use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use recorder::storage::{IoChoice, OpenOptions, OutputPath, io_uring_available, open_output};

const MIB: usize = 1 << 20;
const TOTAL: usize = 1024 * MIB;
const RUNS: usize = 5;

fn scratch_dir() -> PathBuf {
    let dir = std::env::var_os("RECORDER_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("storage-bench"));
    std::fs::create_dir_all(&dir).expect("bench dir creatable");
    dir
}

/// (self user+sys, children user+sys) in seconds, from /proc/self/stat.
fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start at state (3).
    let rest = &stat[stat.rfind(')').expect("stat has a command name") + 2..];
    let f: Vec<u64> = rest
        .split(' ')
        .skip(11)
        .take(4)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let hz = rustix::param::clock_ticks_per_second() as f64;
    ((f[0] + f[1]) as f64 / hz, (f[2] + f[3]) as f64 / hz)
}

/// One prefaulted 1 GiB region, cut into 1 MiB iovecs.
fn region() -> Vec<u8> {
    // Non-zero bytes, every page written (prefaulted).
    (0..TOTAL).map(|i| (i % 251) as u8).collect()
}

struct Run {
    secs: f64,
    cpu: f64,
}

fn sink_run(data: &[u8], io: IoChoice, path: &Path) -> Run {
    let bufs: Vec<IoSlice<'_>> = data.chunks(MIB).map(IoSlice::new).collect();
    let (cpu0, _) = cpu_seconds();
    let t = Instant::now();
    let mut sink = open_output(
        OutputPath::File(path.to_path_buf()),
        OpenOptions {
            no_clobber: false,
            io,
            direct: false,
        },
    )
    .expect("bench output opens");
    let n = sink.write_all(&bufs).expect("bench write");
    sink.sync_data().expect("bench fdatasync");
    drop(sink);
    let secs = t.elapsed().as_secs_f64();
    let (cpu1, _) = cpu_seconds();
    assert_eq!(n as usize, TOTAL);
    std::fs::remove_file(path).expect("bench file removable");
    Run {
        secs,
        cpu: cpu1 - cpu0,
    }
}

fn dd_run(path: &Path) -> Run {
    let (_, c0) = cpu_seconds();
    let t = Instant::now();
    let st = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", path.display()))
        .args(["bs=1M", "count=1024", "conv=fsync", "status=none"])
        .status()
        .expect("dd runs");
    let secs = t.elapsed().as_secs_f64();
    let (_, c1) = cpu_seconds();
    assert!(st.success(), "dd failed");
    std::fs::remove_file(path).expect("dd file removable");
    Run { secs, cpu: c1 - c0 }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn comparison(data: &[u8]) {
    let dir = scratch_dir();
    let path = dir.join("storage-bench.out");
    let mut names = vec!["pwritev sink", "dd conv=fsync"];
    if io_uring_available().is_ok() {
        names.insert(0, "io_uring sink");
    } else {
        eprintln!("io_uring unavailable: its row is left out");
    }
    let mut runs: Vec<Vec<Run>> = names.iter().map(|_| Vec::new()).collect();
    // Interleaved, so drift in the shared machine hits every row alike.
    for _ in 0..RUNS {
        for (i, name) in names.iter().enumerate() {
            let r = match *name {
                "io_uring sink" => sink_run(data, IoChoice::IoUring, &path),
                "pwritev sink" => sink_run(data, IoChoice::Pwritev, &path),
                _ => dd_run(&path),
            };
            runs[i].push(r);
        }
    }
    let gb = TOTAL as f64 / 1e9;
    let dd_mbs = median(
        runs[names.len() - 1]
            .iter()
            .map(|r| gb * 1e3 / r.secs)
            .collect(),
    );
    println!(
        "\n| writer (1 GiB, 1 MiB iovecs, fdatasync) | MB/s (median of {RUNS}) | vs dd | CPU-s per GB |"
    );
    println!("|---|---|---|---|");
    for (name, rs) in names.iter().zip(&runs) {
        let mbs = median(rs.iter().map(|r| gb * 1e3 / r.secs).collect());
        let cpu = median(rs.iter().map(|r| r.cpu / gb).collect());
        println!("| {name} | {mbs:.0} | {:.2}× | {cpu:.3} |", mbs / dd_mbs);
    }
    println!();
}

fn sinks(c: &mut Criterion) {
    let data = region();
    comparison(&data);
    let path = scratch_dir().join("storage-criterion.out");
    let mut g = c.benchmark_group("storage_1gib_fdatasync");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Bytes(TOTAL as u64));
    let mut choices = vec![("pwritev", IoChoice::Pwritev)];
    if io_uring_available().is_ok() {
        choices.push(("io_uring", IoChoice::IoUring));
    }
    for (name, io) in choices {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| Duration::from_secs_f64(sink_run(&data, io, &path).secs))
                    .sum()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, sinks);

fn main() {
    // `cargo test --benches` runs this in test mode: keep that cheap.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
