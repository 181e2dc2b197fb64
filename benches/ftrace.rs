//! ftrace page parsing and bundle encoding, ns per event, on pages captured
//! from this machine (`tests/fixtures/ftrace/`). Baselines in the same run:
//! memcpy of the same raw bytes, and a walk of the ring-buffer pages that
//! visits every record without decoding it.
//!
//! Three groups: `ftrace` (the small mixed fixtures: sched, print, power,
//! task events), `ftrace_sched` (64 pages of a pipe ping-pong captured with
//! `scripts/capture_ftrace_pages.py`: sched_switch + sched_wakeup, the pair
//! and the compact_sched setting `scripts/bench_ftrace.py` records) and
//! `ftrace_rules` (the same pages with trigger rules watching them).

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group};
use recorder::config::rule::parse_text;
use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, PacketSlot, Writer, WriterId};
use recorder::sources::ftrace::encode::{BundleEncoder, CpuCursor, PrintFilter, count_page_events};
use recorder::sources::ftrace::event_table::EventTable;
use recorder::sources::ftrace::format::PageLayout;
use recorder::sources::ftrace::tracefs::Tracefs;
use recorder::sources::ftrace::watch::Watch;
use recorder::sources::ftrace::{PacketOutput, load_layouts, resolve_event};
use recorder::sources::rules::RulePlan;

/// A ring writer that overwrites its oldest chunks (never full), counting
/// the bytes committed: measures encoding into the engine, not storage.
struct Sink {
    ring: std::sync::Arc<Buffer>,
    writer: Writer,
}

impl Sink {
    fn new() -> Self {
        let ring = Buffer::new(BufferParams::new(16 << 20, FillPolicy::RingBuffer)).expect("ring");
        let writer = ring.writer(WriterId(2));
        Self { ring, writer }
    }

    /// Framed bytes committed so far.
    fn bytes(&self) -> u64 {
        self.ring.stats().bytes_written
    }
}

impl PacketOutput for Sink {
    fn write_packet(&mut self, p: &[u8]) {
        let _ = self.writer.write_packet(p);
    }
    fn begin(&mut self, min_len: usize, max_len: usize) -> Option<PacketSlot<'_>> {
        self.writer.begin_packet_at_least(min_len, max_len).ok()
    }
}

fn fixtures() -> (PageLayout, Vec<u8>, Tracefs) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ftrace");
    let t = Tracefs::at(dir.join("tree")).expect("fixture tree");
    let (l, _, _) = load_layouts(&t, &[], true).expect("layouts");
    // The sched pages: the two real captures of cpu0 and cpu1, repeated.
    let mut one = std::fs::read(dir.join("cpu0.raw")).expect("cpu0");
    one.extend(std::fs::read(dir.join("cpu1.raw")).expect("cpu1"));
    one.extend(std::fs::read(dir.join("lossy_cpu0.raw")).expect("lossy"));
    (l, one, t)
}

/// The ping-pong pages and a table of just the pair recorded with them.
fn sched_fixture(compact: bool) -> (PageLayout, Vec<u8>, EventTable) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ftrace");
    let t = Tracefs::at(dir.join("tree")).expect("fixture tree");
    let evs = [
        ("sched".to_string(), "sched_switch".to_string()),
        ("sched".to_string(), "sched_wakeup".to_string()),
    ];
    let (l, table, _) = load_layouts(&t, &evs, compact).expect("layouts");
    let mut pages = std::fs::read(dir.join("pingpong_cpu0.raw")).expect("pingpong cpu0");
    pages.extend(std::fs::read(dir.join("pingpong_cpu1.raw")).expect("pingpong cpu1"));
    (l, pages, table)
}

/// Five rules on the scheduler pages, none of which fires: three filtered
/// event rules on sched_switch and sched_wakeup, a scheduling-latency rule
/// (every switch and wakeup kept for pairing) and a loss rule (the
/// runner's, nothing here).
pub const FIVE_RULES: &str = r#"
a: event sched/sched_switch if prev_state & 2 && prev_comm == "nothing-has-this-name"
b: event sched/sched_wakeup if comm ~ "nothing*" || prio < -1000
c: event sched/sched_switch if next_pid == -5
d: latency sched > 10s
e: loss
"#;

/// A copy of `table` with `rules` watching it, and their watch.
fn watched(table: &EventTable, rules: &str) -> (EventTable, Watch) {
    let plan = RulePlan::new(parse_text("bench", rules).expect("rules parse"));
    let mut t = table.clone();
    let w = Watch::new(&plan, &mut t, 0)
        .expect("rules compile")
        .expect("a watch");
    (t, w)
}

/// One group over `pages`: the baselines (memcpy of the raw bytes, a bare
/// walk of every record) and each named encoder table, ns per event, with
/// the output size per event printed for the report.
fn encoder_group(
    c: &mut Criterion,
    group: &str,
    l: &PageLayout,
    pages: &[u8],
    encoders: &[(&str, EventTable)],
) {
    let events: usize = pages
        .chunks_exact(l.page_size())
        .map(|p| count_page_events(p, l).expect("clean fixture"))
        .sum();
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(events as u64));
    let mut dst = vec![0u8; pages.len()];
    g.bench_function("memcpy_raw_pages", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(pages));
            black_box(&dst);
        })
    });
    g.bench_function("walk", |b| {
        b.iter(|| {
            let n: usize = pages
                .chunks_exact(l.page_size())
                .map(|p| count_page_events(black_box(p), l).unwrap_or(0))
                .sum();
            black_box(n)
        })
    });
    let filter = PrintFilter::default();
    for (name, table) in encoders {
        let mut sink = Sink::new();
        let mut enc = BundleEncoder::new(2, 32 * 1024);
        g.bench_function(*name, |b| {
            b.iter(|| {
                let mut cur = CpuCursor::default();
                enc.encode_pages(&mut sink, table, &filter, l, &mut cur, black_box(pages));
            })
        });
        let mut s2 = Sink::new();
        BundleEncoder::new(2, 32 * 1024).encode_pages(
            &mut s2,
            table,
            &filter,
            l,
            &mut CpuCursor::default(),
            pages,
        );
        eprintln!(
            "{group}/{name}: {events} events, raw {} B ({:.1} B/event), encoded {} B ({:.1} B/event, {:.3}x raw)",
            pages.len(),
            pages.len() as f64 / events as f64,
            s2.bytes(),
            s2.bytes() as f64 / events as f64,
            s2.bytes() as f64 / pages.len() as f64
        );
    }
    g.finish();
}

/// ns per event of the encoder on the scheduler pages; with rules, each
/// pass ends as a drain does (the latency rule pairs what it kept).
fn bench_sched(c: &mut Criterion) {
    let (l, pages, compact) = sched_fixture(true);
    let (_, _, typed) = sched_fixture(false);
    encoder_group(
        c,
        "ftrace_sched",
        &l,
        &pages,
        &[("encode_compact", compact.clone()), ("encode_typed", typed)],
    );
    let events: usize = pages
        .chunks_exact(l.page_size())
        .map(|p| count_page_events(p, &l).expect("clean fixture"))
        .sum();
    // Where cpu1's pages start.
    let split = std::fs::metadata(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ftrace/pingpong_cpu0.raw"),
    )
    .map_or(0, |m| m.len() as usize)
    .min(pages.len());
    let mut g = c.benchmark_group("ftrace_rules");
    g.throughput(Throughput::Elements(events as u64));
    let filter = PrintFilter::default();
    for (name, rules) in [
        ("encode_compact_no_rules", None),
        ("encode_compact_5_rules", Some(FIVE_RULES)),
        (
            "encode_compact_3_event_rules",
            Some(&FIVE_RULES[..FIVE_RULES.find("d:").unwrap_or(0)]),
        ),
        (
            "encode_compact_latency_rule",
            Some("d: latency sched > 10s\n"),
        ),
        (
            "encode_compact_every_switch_rule",
            Some("s: event sched/sched_switch\n"),
        ),
    ] {
        let mut sink = Sink::new();
        let mut enc = BundleEncoder::new(2, 32 * 1024);
        let table = match rules {
            Some(r) => {
                let (t, w) = watched(&compact, r);
                enc.set_watch(w);
                t
            }
            None => compact.clone(),
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                // A drain: each CPU's pages, then the rules pair what they kept.
                for (cpu, part) in [(0, &pages[..split]), (1, &pages[split..])] {
                    let mut cur = CpuCursor {
                        cpu,
                        ..CpuCursor::default()
                    };
                    enc.encode_pages(&mut sink, &table, &filter, &l, &mut cur, black_box(part));
                }
                enc.settle_watch(u64::MAX);
            })
        });
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    let (l, pages, t) = fixtures();
    let mut evs = Vec::new();
    for g in t.groups() {
        evs.extend(resolve_event(&t, &format!("{g}/*")));
    }
    let table = |compact| load_layouts(&t, &evs, compact).expect("layouts").1;
    encoder_group(
        c,
        "ftrace",
        &l,
        &pages,
        &[
            ("parse_encode_typed", table(false)),
            ("parse_encode_compact", table(true)),
        ],
    );
}

/// CPU seconds (user + system) of this process so far, exited threads included.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after = &stat[stat.rfind(')').expect("comm ends") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime), in clock ticks.
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}

/// `FTRACE_E2E=read|splice|mmap|auto`: records sched_switch + sched_wakeup for 10 s
/// while `stress-ng --switch 2` runs, and prints events, loss, CPU and bytes.
fn end_to_end(mode: &str) {
    use recorder::sources::ftrace::{FtraceOptions, FtraceSource, ReadMode};
    let read_mode = ReadMode::parse(mode).unwrap_or(ReadMode::Read);
    let secs: u64 = std::env::var("FTRACE_E2E_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let spec = recorder::config::spec::FtraceSpec {
        // FTRACE_E2E_EVENTS=a,b overrides the pair of the issue's benchmark.
        events: std::env::var("FTRACE_E2E_EVENTS")
            .map(|v| v.split(',').map(str::to_owned).collect())
            .unwrap_or_else(|_| vec!["sched/sched_switch".into(), "sched/sched_wakeup".into()]),
        compact_sched: std::env::var("FTRACE_E2E_COMPACT").map_or(true, |v| v != "0"),
        // FTRACE_E2E_PERCENT=0 drains on the period only.
        drain_buffer_percent: std::env::var("FTRACE_E2E_PERCENT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(recorder::config::validate::DEFAULT_DRAIN_BUFFER_PERCENT),
        ..Default::default()
    };
    // FTRACE_E2E_RULES=FILE (or `five`: FIVE_RULES) evaluates trigger rules.
    let rules = std::env::var("FTRACE_E2E_RULES").ok().map(|r| {
        let text = if r == "five" {
            FIVE_RULES.to_string()
        } else {
            std::fs::read_to_string(&r).expect("the rules file")
        };
        RulePlan::new(parse_text("FTRACE_E2E_RULES", &text).expect("rules parse"))
    });
    let opts = FtraceOptions {
        spec,
        read_mode,
        rules,
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, Sink::new()).expect("tracefs");
    let cpu0 = cpu_seconds();
    src.start().expect("start");
    let mut load = std::process::Command::new("stress-ng")
        .args(["--switch", "2", "--timeout", &format!("{secs}s"), "--quiet"])
        .spawn()
        .expect("stress-ng installed");
    // This thread hosts the reader, as the recorder's event loop does,
    // while another waits for the load to end.
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            load.wait().expect("stress-ng ran");
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        src.drive_until(&done, std::time::Duration::from_millis(10));
    });
    let s = src.stop().expect("stop");
    let cpu = cpu_seconds() - cpu0;
    let out = src.take_output().expect("output").bytes();
    let overrun: u64 = s.cpu_stats.iter().map(|c| c.overrun).sum();
    let ev = s.encode.events as f64;
    println!(
        "mode={mode} compact={} secs={secs} events={} ({:.2} M/s) raw_bytes={} ({:.1} B/event) out_bytes={} ({:.1} B/event, {:.3}x raw) lost_pages={} overrun={overrun} cpu_s={cpu:.2} ({:.1}% of a core) compact_events={} typed_events={} generic_events={} watermark_drains={}",
        std::env::var("FTRACE_E2E_COMPACT").map_or(true, |v| v != "0"),
        s.encode.events,
        ev / secs as f64 / 1e6,
        s.bytes_read,
        s.bytes_read as f64 / ev,
        out,
        out as f64 / ev,
        out as f64 / s.bytes_read as f64,
        s.encode.lost_pages,
        100.0 * cpu / secs as f64,
        s.encode.compact_events,
        s.encode.typed_events,
        s.encode.generic_events,
        s.watermark_drains,
    );
}

criterion_group!(benches, bench, bench_sched);

fn main() {
    if let Ok(mode) = std::env::var("FTRACE_E2E") {
        end_to_end(&mode);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
