//! Runs one configuration end to end: real buffers, real writer threads,
//! real write passes into a real sink, then decodes the file.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::BenchError;
use super::histogram::LatencyHistogram;
use super::report::{BufferReport, ConfigReport, PassSummary, Verification};
use super::usage::{CpuMark, peak_rss_kb, reset_peak_rss};
use super::verify;
use super::workload::{StartGate, WriterOutcome, WriterPlan, WriterProgress, run_writer};
use crate::ringbuf::{Buffer, BufferParams, BufferStats, FillPolicy, WriterId, slot_header_bytes};
use crate::sources::for_testing::max_packet_len;
use crate::storage::write_pass::{Take, write_pass};
use crate::storage::{
    FileSink, IoChoice, OpenOptions, OutputPath, SinkError, SinkKind, WriteList, open_output,
};

/// One buffer of a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSetup {
    /// Buffer size in bytes.
    pub size_bytes: usize,
    /// `None`: the engine's default for this size.
    pub chunk_size: Option<usize>,
    /// What the writers do when no chunk is free: RING_BUFFER overwrites,
    /// DISCARD drops.
    pub policy: FillPolicy,
}

impl BufferSetup {
    /// The engine parameters (prefaulted: the run measures steady state, not
    /// first-touch page faults).
    pub fn params(&self) -> BufferParams {
        let p = BufferParams::new(self.size_bytes, self.policy);
        match self.chunk_size {
            Some(c) => p.with_chunk_size(c),
            None => p,
        }
    }
}

/// Where a configuration's trace goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputTarget {
    /// Kept at this path.
    Keep(PathBuf),
    /// Written here, verified, removed.
    Temporary(PathBuf),
    /// Passes run but the bytes go nowhere (no disk cost, no verification).
    Discard,
}

/// One configuration of a sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    /// Position in the sweep (0-based).
    pub index: usize,
    /// The buffers, by index; the first is the one the report's top line
    /// describes.
    pub buffers: Vec<BufferSetup>,
    /// One plan per writer thread.
    pub writers: Vec<WriterPlan>,
    /// The swept packet size (for the report), if one was swept.
    pub(crate) packet_size: Option<usize>,
    /// Total offered rate (for the report); `None` is as fast as possible.
    pub(crate) rate_pps: Option<f64>,
    /// Period of the write passes.
    pub write_period: Duration,
    /// Stop after this long; `None`: when every writer has offered its count.
    pub duration: Option<Duration>,
    /// Where the trace goes.
    pub output: OutputTarget,
    /// Which sink writes the trace file.
    pub io: IoChoice,
}

/// A sink for `--no-output`: counts, writes nothing.
struct NullSink {
    bytes: u64,
}

impl FileSink for NullSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Stream
    }
    fn write_list(&mut self, list: &mut WriteList<'_, '_>) -> Result<u64, SinkError> {
        let n = list.len();
        self.bytes += n;
        list.advance(n as usize);
        list.written(n);
        Ok(n)
    }
    fn sync_data(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    fn bytes_written(&self) -> u64 {
        self.bytes
    }
}

/// One write pass as seen by the bench.
#[derive(Clone, Copy, Debug)]
struct PassMark {
    /// Offered bytes per buffer before the pass took its data …
    before: Instant,
    /// … and after it released it.
    after: Instant,
    duration: Duration,
    bytes: u64,
}

/// Offered bytes of each buffer's writers, now.
fn offered_by_buffer(n: usize, plans: &[WriterPlan], progress: &[Arc<WriterProgress>]) -> Vec<u64> {
    let mut v = vec![0u64; n];
    for (p, pr) in plans.iter().zip(progress) {
        v[p.buffer] += pr.offered_bytes.load(Ordering::Relaxed);
    }
    v
}

/// The bench's flusher: a pass every write period, and a last one after
/// the writers stop. Offered bytes are sampled around each pass to find
/// the largest amount any buffer had to hold at once.
struct Flusher<'c> {
    cfg: &'c BenchConfig,
    progress: &'c [Arc<WriterProgress>],
    take: Vec<(Arc<Buffer>, Take)>,
    passes: Vec<PassMark>,
    pass_hist: LatencyHistogram,
    offered_before: Vec<Vec<u64>>,
    offered_after: Vec<Vec<u64>>,
}

impl<'c> Flusher<'c> {
    fn new(
        cfg: &'c BenchConfig,
        buffers: &[Arc<Buffer>],
        progress: &'c [Arc<WriterProgress>],
    ) -> Self {
        Self {
            cfg,
            progress,
            take: buffers.iter().map(|b| (b.clone(), Take::Consume)).collect(),
            passes: Vec::new(),
            pass_hist: LatencyHistogram::new(),
            offered_before: Vec::new(),
            offered_after: Vec::new(),
        }
    }

    /// Passes every write period until every writer is done or the
    /// duration is up.
    fn run(&mut self, sink: &mut dyn FileSink, started: Instant) -> Result<(), BenchError> {
        let period = self.cfg.write_period;
        let mut next = started + period;
        loop {
            let all_done = self.progress.iter().all(|p| p.done.load(Ordering::Acquire));
            let time_up = self.cfg.duration.is_some_and(|d| started.elapsed() >= d);
            if all_done || time_up {
                return Ok(());
            }
            let now = Instant::now();
            if now >= next {
                self.pass(sink)?;
                next += period;
                if next <= Instant::now() {
                    // A pass overran the period: keep the cadence from now.
                    next = Instant::now() + period;
                }
            } else {
                // Short naps so that the end of the run is noticed promptly.
                std::thread::sleep((next - now).min(Duration::from_millis(5)));
            }
        }
    }

    /// One pass, timed, with the offered bytes sampled around it.
    fn pass(&mut self, sink: &mut dyn FileSink) -> Result<(), BenchError> {
        let (n, writers) = (self.take.len(), &self.cfg.writers);
        self.offered_before
            .push(offered_by_buffer(n, writers, self.progress));
        let before = Instant::now();
        let r = write_pass(sink, &[], &self.take, |_| Vec::new(), None, false);
        let after = Instant::now();
        self.offered_after
            .push(offered_by_buffer(n, writers, self.progress));
        let r = r.map_err(BenchError::Pass)?;
        self.pass_hist.record_ns(r.duration.as_nanos() as u64);
        self.passes.push(PassMark {
            before,
            after,
            duration: r.duration,
            bytes: r.bytes,
        });
        Ok(())
    }
}

/// Runs `cfg` and reports it.
pub fn run_config(cfg: &BenchConfig) -> Result<ConfigReport, BenchError> {
    let buffers: Vec<Arc<Buffer>> = cfg
        .buffers
        .iter()
        .enumerate()
        .map(|(index, b)| {
            Buffer::new(b.params()).map_err(|source| BenchError::Buffer { index, source })
        })
        .collect::<Result<_, _>>()?;
    let (mut sink, output_path) = open_sink(cfg)?;
    let sink_name = match cfg.output {
        OutputTarget::Discard => "none",
        _ => sink.kind().name(),
    };

    let stop = Arc::new(AtomicBool::new(false));
    let progress: Vec<Arc<WriterProgress>> = cfg.writers.iter().map(|_| Arc::default()).collect();

    reset_peak_rss();
    // Every writer attaches first, then all start at once with the flusher:
    // thread start-up is outside the timed run, and no writer has the
    // buffer to itself while the others are still being spawned.
    let start = Arc::new(StartGate::default());
    let threads = spawn_writers(cfg, &buffers, &progress, &start, &stop)?;
    start.open_when_ready(threads.len());
    let cpu = CpuMark::now();
    let started = Instant::now();

    let mut flusher = Flusher::new(cfg, &buffers, &progress);
    let mut sink_error = flusher.run(sink.as_mut(), started).err();
    stop.store(true, Ordering::Relaxed);
    let mut outcomes: Vec<WriterOutcome> = Vec::with_capacity(threads.len());
    for t in threads {
        outcomes.push(t.join().map_err(|_| BenchError::WriterPanicked)?);
    }
    // The writers' time: from the common start to the last packet any of
    // them offered (not the flusher's naps, the joins or the last pass).
    let elapsed = outcomes
        .iter()
        .filter_map(|o| o.finished)
        .max()
        .map_or_else(|| started.elapsed(), |t| t.duration_since(started));
    if sink_error.is_none()
        && let Err(e) = flusher.pass(sink.as_mut())
    {
        sink_error = Some(e);
    }
    if sink_error.is_none()
        && !matches!(cfg.output, OutputTarget::Discard)
        && let Err(e) = sink.sync_data()
    {
        sink_error = Some(BenchError::Sink(e));
    }
    let cpu = cpu.since();
    let wall = started.elapsed();
    let rss = peak_rss_kb();
    drop(sink);
    if let Some(e) = sink_error {
        return Err(e);
    }

    let Flusher {
        passes,
        pass_hist,
        offered_before,
        offered_after,
        ..
    } = flusher;
    let stats: Vec<_> = buffers.iter().map(|b| b.stats()).collect();
    let window = PassWindows {
        started,
        passes: &passes,
        offered_before: &offered_before,
        offered_after: &offered_after,
    };
    let buffer_reports: Vec<BufferReport> = buffers
        .iter()
        .zip(&stats)
        .enumerate()
        .map(|(i, (b, s))| buffer_report(i, b, s, cfg, &outcomes, &window))
        .collect();

    let verification = verify_output(cfg, output_path.as_deref(), &outcomes, &stats, &passes);

    let mut write = LatencyHistogram::new();
    let mut acquire = LatencyHistogram::new();
    for o in &outcomes {
        write.merge(&o.write);
        acquire.merge(&o.acquire);
    }
    let pass_summary = summarize_passes(&passes, &pass_hist);
    Ok(ConfigReport::new(
        cfg,
        sink_name,
        output_path.filter(|_| matches!(cfg.output, OutputTarget::Keep(_))),
        elapsed,
        wall,
        &outcomes,
        &stats,
        buffer_reports,
        write.percentiles(),
        acquire.percentiles(),
        pass_summary,
        cpu,
        rss,
        verification,
    ))
}

/// Attaches every writer, then starts one thread per writer; they wait at
/// `start` until the flusher opens it.
fn spawn_writers(
    cfg: &BenchConfig,
    buffers: &[Arc<Buffer>],
    progress: &[Arc<WriterProgress>],
    start: &Arc<StartGate>,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<std::thread::JoinHandle<WriterOutcome>>, BenchError> {
    let mut writers = Vec::with_capacity(cfg.writers.len());
    for plan in &cfg.writers {
        let buffer = buffers
            .get(plan.buffer)
            .ok_or(BenchError::NoSuchBuffer(plan.buffer))?;
        writers.push(buffer.writer(WriterId(plan.sequence_id)));
    }
    let mut threads = Vec::with_capacity(cfg.writers.len());
    for ((plan, pr), writer) in cfg.writers.iter().zip(progress).zip(writers) {
        let (plan, gate, halt, pr) = (plan.clone(), start.clone(), stop.clone(), pr.clone());
        let t = std::thread::Builder::new()
            .name(format!("bench-writer-{}", plan.sequence_id))
            .spawn(move || run_writer(writer, plan, gate, halt, pr))
            .map_err(BenchError::Thread);
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                // The ones started wait at the gate: let them go, stopped.
                stop.store(true, Ordering::Relaxed);
                start.open();
                return Err(e);
            }
        }
    }
    Ok(threads)
}

/// The run's sink: none (`--no-output`), or the trace file, opened as a
/// session opens its output.
fn open_sink(cfg: &BenchConfig) -> Result<(Box<dyn FileSink>, Option<PathBuf>), BenchError> {
    Ok(match &cfg.output {
        OutputTarget::Discard => (Box::new(NullSink { bytes: 0 }), None),
        OutputTarget::Keep(p) | OutputTarget::Temporary(p) => (
            open_output(
                OutputPath::File(p.clone()),
                OpenOptions {
                    no_clobber: false,
                    io: cfg.io,
                    // Streams as a session does (RECORDER_DIRECT_IO=off: the
                    // page cache).
                    direct: true,
                },
            )?,
            Some(p.clone()),
        ),
    })
}

/// The write passes of a run, with the bytes offered to each buffer just
/// before each pass took its data and just after it released it.
struct PassWindows<'a> {
    started: Instant,
    passes: &'a [PassMark],
    offered_before: &'a [Vec<u64>],
    offered_after: &'a [Vec<u64>],
}

/// Buffer `i`'s report, with the sizing advice: the most any window between
/// one pass's take and the next pass's release asked it to hold, the size
/// that would have held it, and the rate its size holds without loss.
fn buffer_report(
    i: usize,
    b: &Buffer,
    s: &BufferStats,
    cfg: &BenchConfig,
    outcomes: &[WriterOutcome],
    w: &PassWindows<'_>,
) -> BufferReport {
    let mine: Vec<&WriterOutcome> = outcomes.iter().filter(|o| o.buffer == i).collect();
    let plans: Vec<&WriterPlan> = cfg.writers.iter().filter(|p| p.buffer == i).collect();
    let offered: u64 = mine.iter().map(|o| o.offered).sum();
    let offered_bytes: u64 = mine.iter().map(|o| o.offered_bytes).sum();
    let reserved = plans
        .iter()
        .map(|p| {
            let max_len = max_packet_len(p.filler_len);
            slot_header_bytes(max_len) + max_len
        })
        .max()
        .unwrap_or(0);
    let mut peak_bytes = 0u64;
    let mut peak_window = Duration::ZERO;
    for k in 0..w.passes.len() {
        let (from_bytes, from_t) = if k == 0 {
            (0, w.started)
        } else {
            (w.offered_before[k - 1][i], w.passes[k - 1].before)
        };
        peak_bytes = peak_bytes.max(w.offered_after[k][i].saturating_sub(from_bytes));
        peak_window = peak_window.max(w.passes[k].after.duration_since(from_t));
    }
    let chunk = b.chunk_size() as u64;
    let writers_here = plans.len().max(1) as u64;
    // A chunk loses up to one reserved packet slot to padding, and each
    // writer holds one partly filled chunk.
    let usable_per_chunk = chunk.saturating_sub(reserved as u64).max(1);
    let min_chunks = peak_bytes.div_ceil(usable_per_chunk) + writers_here;
    let min_size_kb = (min_chunks.max(2) * chunk).div_ceil(1024);
    let usable = (b.chunk_count() as u64).saturating_sub(writers_here) * usable_per_chunk;
    let per_packet = if offered > 0 {
        offered_bytes as f64 / offered as f64
    } else {
        0.0
    };
    let lossless_rate_pps = if per_packet > 0.0 && !peak_window.is_zero() {
        usable as f64 / per_packet / peak_window.as_secs_f64()
    } else {
        0.0
    };
    BufferReport::new(
        i,
        b,
        s,
        offered,
        offered_bytes,
        peak_bytes,
        peak_window,
        min_size_kb,
        lossless_rate_pps,
    )
}

/// Decodes the run's file (if it kept one) and checks it shows exactly the
/// loss the counters report; a temporary file is removed after.
fn verify_output(
    cfg: &BenchConfig,
    output_path: Option<&std::path::Path>,
    outcomes: &[WriterOutcome],
    stats: &[BufferStats],
    passes: &[PassMark],
) -> Verification {
    // Every pass but the last one ran while the writers wrote.
    let streaming_passes = passes
        .iter()
        .take(passes.len().saturating_sub(1))
        .filter(|p| p.bytes > 0)
        .count() as u64;
    let Some(p) = output_path else {
        return Verification::skipped("--no-output");
    };
    let v = match std::fs::read(p) {
        Ok(data) => {
            let policies: Vec<FillPolicy> = cfg.buffers.iter().map(|b| b.policy).collect();
            Verification::check(
                verify::decode(&data),
                outcomes,
                stats,
                &policies,
                streaming_passes,
            )
        }
        Err(e) => Verification::failed(format!("cannot read {}: {e}", p.display())),
    };
    if matches!(cfg.output, OutputTarget::Temporary(_)) {
        let _ = std::fs::remove_file(p);
    }
    v
}

/// The passes' durations and sizes, for the report.
fn summarize_passes(passes: &[PassMark], hist: &LatencyHistogram) -> PassSummary {
    let pass_bytes: Vec<u64> = passes.iter().map(|p| p.bytes).collect();
    let ms = |p: &PassMark| p.duration.as_secs_f64() * 1e3;
    PassSummary {
        count: passes.len() as u64,
        duration: hist.percentiles(),
        bytes_mean: if pass_bytes.is_empty() {
            0
        } else {
            pass_bytes.iter().sum::<u64>() / pass_bytes.len() as u64
        },
        bytes_max: pass_bytes.iter().copied().max().unwrap_or(0),
        longest_ms: passes.iter().map(ms).fold(0.0, f64::max),
        total_ms: passes.iter().map(ms).sum(),
        final_ms: passes.last().map_or(0.0, ms),
    }
}
