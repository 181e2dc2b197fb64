//! linux.ftrace read through the kernel's mapping of the ring buffer
//! against read(2): the same markers, written on known CPUs, decode to the
//! same events either way; an overrun is reported the same way; a file the
//! kernel cannot map falls back to read(2) (or fails when the mapping is
//! required).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use perfetto_protos::trace_packet::TracePacket;
use recorder::config::spec::{ByteSize, FtraceSpec};
use recorder::sources::ftrace::format::PageLayout;
use recorder::sources::ftrace::reader::open_map;
use recorder::sources::ftrace::tracefs::Tracefs;
use recorder::sources::ftrace::{FtraceOptions, FtraceSource, FtraceSummary, ReadMode, VecOutput};
use rustix::thread::{CpuSet, sched_setaffinity};

use crate::harness::ftrace::{KERNEL, bundles, decode, events};
use crate::harness::*;

const SEQ: u32 = 9;

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set).expect("sched_setaffinity");
}

fn inst_cpus() -> usize {
    Tracefs::discover().map_or(1, |t| t.cpus().len())
}

/// Runs `f` on this thread pinned to `cpu`, then lets the thread run anywhere again.
fn on_cpu<T>(inst: &Tracefs, cpu: usize, f: impl FnOnce() -> T) -> T {
    pin(cpu);
    let r = f();
    let mut all = CpuSet::new();
    for c in inst.cpus() {
        all.set(c as usize);
    }
    sched_setaffinity(None, &all).expect("sched_setaffinity");
    r
}

/// Records ftrace/print in `mode` while `load` writes to the instance's
/// trace_marker; `flush` drains mid-load (partly read sub-buffers).
fn record_prints(
    mode: ReadMode,
    buffer_kb: u64,
    drain: Duration,
    load: impl FnOnce(&Tracefs, &mut dyn FnMut()),
) -> (Vec<TracePacket>, FtraceSummary) {
    let spec = FtraceSpec {
        events: vec!["ftrace/print".into()],
        buffer_size: Some(ByteSize::from_kb(buffer_kb)),
        drain_period: drain,
        // Drains only when asked (or every period): an overrun stays one.
        drain_buffer_percent: 0,
        ..Default::default()
    };
    let opts = FtraceOptions {
        spec,
        sequence_id: SEQ,
        read_mode: mode,
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    src.start().expect("start");
    let inst = src.tracefs_dir().expect("dir").clone();
    {
        let mut flush = || src.flush().expect("flush");
        // The closure borrows the source mutably; the instance is a clone.
        load(&inst, &mut flush);
    }
    let summary = src.stop().expect("stop");
    let out = src.take_output().expect("output");
    (decode(&out.bytes), summary)
}

/// The markers each CPU's bundles carry, in order, with their timestamps.
fn prints_per_cpu(p: &[TracePacket]) -> BTreeMap<u32, Vec<(u64, String)>> {
    let mut m: BTreeMap<u32, Vec<(u64, String)>> = BTreeMap::new();
    for b in bundles(p) {
        for e in &b.event {
            if e.has_print() {
                m.entry(b.cpu())
                    .or_default()
                    .push((e.timestamp(), e.print().buf().to_string()));
            }
        }
    }
    m
}

fn marker(cpu: usize, batch: usize, i: usize) -> String {
    format!("cpu{cpu} batch{batch} marker {i:05} of a deterministic load")
}

/// Each CPU writes its markers in batches; a flush after each batch leaves
/// the reader inside a sub-buffer the next batch keeps filling.
fn marker_load(inst: &Tracefs, flush: &mut dyn FnMut()) -> BTreeMap<u32, Vec<String>> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(inst.path("trace_marker"))
        .expect("trace_marker");
    let mut want: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for batch in 0..8 {
        for cpu in inst.cpus() {
            let cpu = cpu as usize;
            on_cpu(inst, cpu, || {
                for i in 0..250 {
                    let m = marker(cpu, batch, i);
                    f.write_all(m.as_bytes()).expect("marker written");
                    want.entry(cpu as u32).or_default().push(format!("{m}\n"));
                }
            });
        }
        flush();
    }
    want
}

#[test]
fn real_kernel_mmap_and_read_decode_the_same_markers() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let mut seen = Vec::new();
    for mode in [ReadMode::Mmap, ReadMode::Read] {
        let mut want = BTreeMap::new();
        let (p, summary) = record_prints(mode, 2048, Duration::from_secs(30), |inst, flush| {
            want = marker_load(inst, flush);
        });
        let got = prints_per_cpu(&p);
        let texts: BTreeMap<u32, Vec<String>> = got
            .iter()
            .map(|(c, v)| (*c, v.iter().map(|(_, t)| t.clone()).collect()))
            .collect();
        assert_eq!(texts, want, "{mode:?}: the markers, per CPU, in order");
        assert!(want.len() > 1 || inst_cpus() == 1, "markers on every CPU");
        for (cpu, v) in &got {
            assert!(
                v.windows(2).all(|w| w[0].0 <= w[1].0),
                "{mode:?}: cpu {cpu} timestamps go back"
            );
        }
        assert_eq!(summary.encode.lost_pages, 0, "{mode:?}");
        assert_eq!(
            summary.encode.parse_errors.iter().sum::<u64>(),
            0,
            "{mode:?}"
        );
        assert_eq!(summary.non_monotonic, 0, "{mode:?}");
        let cpus = summary.cpu_stats.len();
        assert_eq!(
            summary.mapped_cpus,
            if mode == ReadMode::Mmap { cpus } else { 0 },
            "{mode:?}: CPUs read through the mapping"
        );
        assert!(summary.encode.pages >= 8, "{mode:?}: {:?}", summary.encode);
        seen.push(texts);
    }
    assert_eq!(seen[0], seen[1], "mmap and read(2) decode alike");
}

#[test]
fn real_kernel_mmap_reports_an_overrun_like_read() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    const N: usize = 20_000;
    for mode in [ReadMode::Mmap, ReadMode::Read] {
        let (p, summary) = record_prints(mode, 16, Duration::from_secs(30), |inst, flush| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(inst.path("trace_marker"))
                .expect("trace_marker");
            // Far more than 16 KiB, with no drain in between: the oldest are overwritten.
            on_cpu(inst, 0, || {
                for i in 0..N {
                    f.write_all(marker(0, 0, i).as_bytes()).expect("marker");
                }
            });
            flush();
        });
        let end = p
            .iter()
            .filter(|p| p.has_ftrace_stats())
            .map(|p| p.ftrace_stats())
            .next_back()
            .expect("end FtraceStats");
        let overrun: u64 = end
            .cpu_stats
            .iter()
            .filter(|c| c.cpu() == 0)
            .map(|c| c.overrun())
            .sum();
        assert!(overrun > 0, "{mode:?}: 16 KiB should overrun");
        assert!(
            summary.encode.lost_pages > 0,
            "{mode:?}: {:?}",
            summary.encode
        );
        assert!(
            bundles(&p).iter().any(|b| b.cpu() == 0 && b.lost_events()),
            "{mode:?}: a cpu 0 bundle says events were lost"
        );
        // What survived is the newest markers, in order, ending with the last.
        let got: Vec<String> = prints_per_cpu(&p)
            .remove(&0)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        assert_eq!(
            got.last().map(String::as_str),
            Some(format!("{}\n", marker(0, 0, N - 1)).as_str()),
            "{mode:?}"
        );
        let idx: Vec<usize> = got
            .iter()
            .filter_map(|t| t.split_whitespace().nth(3)?.parse().ok())
            .collect();
        assert_eq!(idx.len(), got.len(), "{mode:?}: every marker intact");
        assert!(
            idx.windows(2).all(|w| w[0] < w[1]),
            "{mode:?}: in order, none twice"
        );
        let kept = idx.len() as u64;
        assert!(kept < N as u64, "{mode:?}: nothing lost?");
        // Every marker written is either decoded or counted lost by the kernel.
        assert!(
            kept + overrun >= N as u64,
            "{mode:?}: {kept} kept + {overrun} overrun < {N}"
        );
        let _ = events(&p);
    }
}

/// A file the kernel cannot map: read(2) under `auto`, an error under
/// `mmap`, nothing tried under `read`.
#[test]
fn a_file_the_kernel_cannot_map_falls_back_to_read() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("trace_pipe_raw");
    std::fs::write(&path, vec![0u8; 8192]).expect("file");
    let f = std::fs::File::open(&path).expect("open");
    let layout = PageLayout {
        timestamp_offset: 0,
        commit_offset: 8,
        commit_size: 8,
        data_offset: 16,
        data_size: 4080,
    };
    assert!(
        open_map(&f, 0, &layout, ReadMode::Auto)
            .expect("auto")
            .is_none()
    );
    assert!(
        open_map(&f, 0, &layout, ReadMode::Read)
            .expect("read")
            .is_none()
    );
    let err = open_map(&f, 0, &layout, ReadMode::Mmap)
        .err()
        .expect("mmap required");
    assert!(err.to_string().contains("not a tracefs file"), "{err}");
}

/// On the real kernel, `auto` maps every CPU, and a layout that does not
/// match the mapped sub-buffers is refused rather than misread.
#[test]
fn real_kernel_auto_maps_and_a_foreign_layout_is_refused() {
    require!(need::kernel_tracing());
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let (_, summary) = record_prints(
        ReadMode::Auto,
        1024,
        Duration::from_millis(50),
        |inst, _| {
            inst.write("trace_marker", "auto").expect("marker");
            // A second open of a mapped CPU, with the wrong page size.
            let f = std::fs::File::open(inst.path("per_cpu/cpu0/trace_pipe_raw")).expect("open");
            let wrong = PageLayout {
                timestamp_offset: 0,
                commit_offset: 8,
                commit_size: 8,
                data_offset: 16,
                data_size: 2 * 4096 - 16,
            };
            let err = open_map(&f, 0, &wrong, ReadMode::Mmap)
                .err()
                .expect("layout mismatch refused");
            assert!(err.to_string().contains("header_page says"), "{err}");
            assert!(
                open_map(&f, 0, &wrong, ReadMode::Auto)
                    .expect("auto")
                    .is_none()
            );
        },
    );
    assert_eq!(summary.mapped_cpus, summary.cpu_stats.len());
}
