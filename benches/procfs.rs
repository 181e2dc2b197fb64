//! Cost of the polled /proc sources on this machine: one SysStats tick
//! (meminfo + vmstat + stat) and one ProcessStats poll, each against the
//! baseline of only reading the same files (no parsing, no encoding).

use std::hint::black_box;
use std::os::unix::fs::FileExt;

use criterion::{Criterion, criterion_group, criterion_main};
use recorder::config::spec::{ProcessStatsSpec, SysStatsSpec};
use recorder::sources::process_stats::ProcessStatsSource;
use recorder::sources::procfs::HostPaths;
use recorder::sources::sys_stats::SysStatsSource;

/// Discards packets (counts their bytes so the work is not optimised away).
struct Sink(usize);

impl recorder::sources::poller::PacketOutput for Sink {
    fn write_packet(&mut self, packet: &[u8]) {
        self.0 += packet.len();
    }
}

fn pread_all(f: &std::fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    loop {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) | Err(_) => return n,
            Ok(k) => n += k,
        }
    }
}

fn sys_stats(c: &mut Criterion) {
    let mut g = c.benchmark_group("sys_stats_tick");
    let files: Vec<std::fs::File> = ["meminfo", "vmstat", "stat"]
        .iter()
        .map(|f| std::fs::File::open(format!("/proc/{f}")).expect("procfs"))
        .collect();
    let mut buf = vec![0u8; 1 << 16];
    g.bench_function("baseline_pread_meminfo_vmstat_stat", |b| {
        b.iter(|| {
            let n: usize = files.iter().map(|f| pread_all(f, &mut buf)).sum();
            black_box(n)
        })
    });
    let period = Some(std::time::Duration::from_millis(100));
    let opts = SysStatsSpec {
        meminfo_period: period,
        vmstat_period: period,
        stat_period: period,
        ..SysStatsSpec::default()
    };
    let mut src = SysStatsSource::new(&opts, HostPaths::default(), 2).expect("valid");
    let mut sink = Sink(0);
    g.bench_function("read_parse_encode_meminfo_vmstat_stat", |b| {
        b.iter(|| src.write_tick(&mut sink))
    });
    g.finish();
    black_box(sink.0);
}

fn process_stats(c: &mut Criterion) {
    let mut g = c.benchmark_group("process_stats_poll");
    g.sample_size(20);
    g.bench_function("baseline_read_every_status", |b| {
        let mut buf = Vec::new();
        b.iter(|| {
            let pids = recorder::sources::procfs::numeric_dirs(std::path::Path::new("/proc"))
                .expect("procfs");
            for p in pids {
                let _ = recorder::sources::procfs::read_file(
                    std::path::Path::new(&format!("/proc/{p}/status")),
                    &mut buf,
                );
            }
        })
    });
    // A TTL of zero forgets the cache every poll: the worst case, every
    // counter of every process encoded every time.
    let opts = ProcessStatsSpec {
        poll_period: Some(std::time::Duration::from_millis(100)),
        ..ProcessStatsSpec::default()
    };
    let mut src = ProcessStatsSource::new(opts, HostPaths::default(), 2);
    let mut sink = Sink(0);
    g.bench_function("poll_all_counters", |b| {
        b.iter(|| src.write_process_stats(&mut sink))
    });
    g.finish();
    black_box(sink.0);
}

criterion_group!(benches, sys_stats, process_stats);
criterion_main!(benches);
