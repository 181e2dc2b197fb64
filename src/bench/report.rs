//! What a configuration measured: one [`ConfigReport`] (one JSON object with
//! `--json`; the schema is in the module docs of [`crate::bench`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::histogram::Percentiles;
use super::run::BenchConfig;
use super::usage::CpuUsage;
use super::verify::{DecodeError, Retention, TraceFound, Written};
use super::workload::WriterOutcome;
use crate::ringbuf::{Buffer, BufferStats, FillPolicy};

/// `ring` or `discard`.
pub(crate) fn policy_name(p: FillPolicy) -> &'static str {
    match p {
        FillPolicy::RingBuffer => "ring",
        FillPolicy::Discard => "discard",
    }
}

/// One buffer's counters and sizing advice.
#[derive(Clone, Debug, Serialize)]
pub struct BufferReport {
    pub index: usize,
    pub policy: &'static str,
    pub size_kb: u64,
    pub(crate) chunk_kb: f64,
    pub(crate) packets_offered: u64,
    pub(crate) bytes_offered: u64,
    pub packets_written: u64,
    pub bytes_written: u64,
    pub packets_overwritten: u64,
    pub bytes_overwritten: u64,
    pub packets_discarded: u64,
    pub bytes_discarded: u64,
    pub packets_refused: u64,
    /// Packets and framed bytes that reached the file.
    pub packets_retained: u64,
    pub(crate) bytes_retained: u64,
    pub retained_pct: f64,
    /// Buffer bytes used per accepted packet (framing and chunk padding included).
    pub(crate) buffer_bytes_per_packet: f64,
    /// Largest offered amount between one pass taking data and the next
    /// releasing it: what the buffer had to hold at once.
    pub(crate) peak_window_bytes: u64,
    pub(crate) peak_window_ms: f64,
    /// Smallest `size_kb` that would have kept everything of this run.
    pub min_size_kb: u64,
    /// Rate this size sustains without loss at the measured pass cadence.
    pub(crate) lossless_rate_pps: f64,
    /// R3 held at the end.
    pub balanced: bool,
}

impl BufferReport {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: usize,
        b: &Buffer,
        s: &BufferStats,
        packets_offered: u64,
        bytes_offered: u64,
        peak_window_bytes: u64,
        peak_window: Duration,
        min_size_kb: u64,
        lossless_rate_pps: f64,
    ) -> Self {
        let used = s.bytes_written + s.unused_chunk_bytes;
        Self {
            index,
            policy: policy_name(b.policy()),
            size_kb: (b.size_bytes() as u64).div_ceil(1024),
            chunk_kb: b.chunk_size() as f64 / 1024.0,
            packets_offered,
            bytes_offered,
            packets_written: s.packets_written,
            bytes_written: s.bytes_written,
            packets_overwritten: s.packets_overwritten,
            bytes_overwritten: s.bytes_overwritten,
            packets_discarded: s.packets_discarded,
            bytes_discarded: s.bytes_discarded,
            packets_refused: s.packets_refused,
            packets_retained: s.packets_read,
            bytes_retained: s.bytes_read,
            retained_pct: pct(s.packets_read, packets_offered),
            buffer_bytes_per_packet: if s.packets_written > 0 {
                used as f64 / s.packets_written as f64
            } else {
                0.0
            },
            peak_window_bytes,
            peak_window_ms: peak_window.as_secs_f64() * 1e3,
            min_size_kb,
            lossless_rate_pps,
            balanced: s.is_balanced(),
        }
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Write passes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PassSummary {
    pub count: u64,
    /// Pass durations.
    pub duration: Percentiles,
    pub(crate) bytes_mean: u64,
    pub(crate) bytes_max: u64,
    pub(crate) longest_ms: f64,
    /// Every pass's duration, summed.
    pub(crate) total_ms: f64,
    /// The last pass, after the writers stopped (outside `elapsed_s`).
    pub final_ms: f64,
}

/// Whether the file shows exactly the loss the counters report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Verification {
    /// Decoded, in order, and every count agreed.
    pub ok: bool,
    pub checked: bool,
    pub(crate) packets_in_file: u64,
    /// Test packets found, summed over sequences.
    pub(crate) test_packets: u64,
    /// Offered minus found, summed over sequences.
    pub(crate) lost_in_file: u64,
    /// Overwritten + discarded + refused, from the counters.
    pub(crate) lost_counted: u64,
    /// Write passes that took data while the writers wrote (0: the file is
    /// what the buffer held at the end).
    pub streaming_passes: u64,
    /// Per writer sequence: which packets the file kept.
    pub retention: Vec<Retention>,
    pub problems: Vec<String>,
}

impl Verification {
    pub fn skipped(why: &str) -> Self {
        Self {
            problems: vec![format!("not checked: {why}")],
            ..Self::default()
        }
    }

    /// The retention shape shared by every sequence, or `mixed`.
    pub fn kept(&self) -> &'static str {
        let mut shapes = self.retention.iter().map(|r| r.shape.name());
        match shapes.next() {
            None => "-",
            Some(first) if shapes.all(|s| s == first) => first,
            Some(_) => "mixed",
        }
    }

    pub fn failed(why: String) -> Self {
        Self {
            checked: true,
            problems: vec![why],
            ..Self::default()
        }
    }

    /// Compares the decoded file with what the writers offered and the
    /// buffers counted, and what each sequence kept with what its buffer's
    /// policy promises (`policies`: per buffer).
    pub fn check(
        decoded: Result<TraceFound, DecodeError>,
        outcomes: &[WriterOutcome],
        stats: &[BufferStats],
        policies: &[FillPolicy],
        streaming_passes: u64,
    ) -> Self {
        let found = match decoded {
            Ok(f) => f,
            Err(e) => return Self::failed(format!("trace does not decode: {e}")),
        };
        let mut v = Self {
            checked: true,
            packets_in_file: found.packets,
            streaming_passes,
            ..Self::default()
        };
        let mut bytes_found = 0u64;
        for o in outcomes {
            let s = found
                .sequences
                .get(&o.sequence_id)
                .cloned()
                .unwrap_or_default();
            if s.disorder > 0 {
                v.problems.push(format!(
                    "sequence {}: {} packets out of order or duplicated",
                    o.sequence_id, s.disorder
                ));
            }
            if s.last_counter.is_some_and(|l| l >= o.offered) {
                v.problems.push(format!(
                    "sequence {}: counter {:?} beyond the {} offered",
                    o.sequence_id, s.last_counter, o.offered
                ));
            }
            v.test_packets += s.packets;
            v.lost_in_file += o.offered.saturating_sub(s.packets);
            bytes_found += s.bytes;
            let written = Written {
                sequence_id: o.sequence_id,
                offered: o.offered,
                accepted: o.accepted,
                first_accepted: o.first_accepted,
                last_accepted: o.last_accepted,
            };
            let policy = policies.get(o.buffer).copied().unwrap_or_default();
            let r = Retention::of(&s, &written, policy, streaming_passes > 0);
            let refused = stats.get(o.buffer).is_some_and(|b| b.packets_refused > 0);
            v.problems.extend(r.problems(refused));
            v.retention.push(r);
        }
        let unknown: Vec<u32> = found
            .sequences
            .keys()
            .copied()
            .filter(|k| !outcomes.iter().any(|o| o.sequence_id == *k))
            .collect();
        if !unknown.is_empty() {
            v.problems
                .push(format!("test packets of unknown sequences {unknown:?}"));
        }
        let read: u64 = stats.iter().map(|s| s.packets_read).sum();
        let bytes_read: u64 = stats.iter().map(|s| s.bytes_read).sum();
        v.lost_counted = stats
            .iter()
            .map(|s| s.packets_overwritten + s.packets_discarded + s.packets_refused)
            .sum();
        let buffered: u64 = stats.iter().map(|s| s.packets_buffered).sum();
        if buffered > 0 {
            v.problems.push(format!(
                "{buffered} packets still buffered after the last pass"
            ));
        }
        if v.test_packets != read {
            v.problems.push(format!(
                "{} test packets in the file, {read} handed to the flusher",
                v.test_packets
            ));
        }
        if bytes_found != bytes_read {
            v.problems.push(format!(
                "{bytes_found} test packet bytes in the file, {bytes_read} handed to the flusher"
            ));
        }
        if v.lost_in_file != v.lost_counted {
            v.problems.push(format!(
                "{} packets missing from the file, {} counted lost",
                v.lost_in_file, v.lost_counted
            ));
        }
        v.ok = v.problems.is_empty();
        v
    }
}

/// Runs shorter than this are flagged: start-up, the first region
/// hand-overs and the last pass weigh on their rates.
pub(crate) const SHORT_RUN: Duration = Duration::from_secs(1);

/// Warnings for a run too short to trust its rates.
pub(crate) fn short_run_warnings(
    elapsed: Duration,
    write_period: Duration,
    passes: &PassSummary,
) -> Vec<String> {
    let mut w = Vec::new();
    if elapsed < SHORT_RUN {
        w.push(format!(
            "short run: the writers ran {:.0} ms (under {} s); its rates are not representative, \
             run longer (--duration or more packets)",
            elapsed.as_secs_f64() * 1e3,
            SHORT_RUN.as_secs()
        ));
    }
    if passes.count < 3 && elapsed >= SHORT_RUN {
        w.push(format!(
            "short run: {} write pass(es) at a {} ms period; the rates say little about streaming",
            passes.count,
            write_period.as_millis()
        ));
    }
    w
}

/// Everything measured for one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigReport {
    /// Position in the sweep (0-based).
    pub index: usize,
    /// Writer threads.
    pub writers: usize,
    /// The swept packet size (TracePacket bytes, framing excluded).
    pub(crate) packet_size: Option<usize>,
    /// Policy, size and chunk of the first buffer (the swept one).
    pub policy: &'static str,
    /// The first buffer's size in KiB.
    pub buffer_kb: u64,
    pub(crate) chunk_kb: f64,
    pub(crate) write_period_ms: u64,
    /// Offered rate asked for; null: as fast as possible.
    pub(crate) rate_pps: Option<f64>,
    /// `io_uring`, `pwritev`, or `none` (`--no-output`).
    pub sink: &'static str,
    /// The kept trace, if any.
    pub output: Option<PathBuf>,
    /// The writers' time: from their common start to the last packet
    /// offered; every rate below is per this.
    pub elapsed_s: f64,
    /// From the common start to the end of the last pass and the sync.
    pub wall_s: f64,
    /// What makes the figures less than representative (a short run).
    pub warnings: Vec<String>,
    /// Packets the writers offered, accepted or not.
    pub offered_packets: u64,
    pub(crate) accepted_packets: u64,
    pub(crate) offered_pps: f64,
    pub(crate) accepted_pps: f64,
    /// Framed bytes (what the file would receive), 10^6 per MB.
    pub(crate) offered_mbps: f64,
    pub(crate) accepted_mbps: f64,
    pub(crate) bytes_offered: u64,
    /// Bytes the writers committed into the buffers.
    pub bytes_written: u64,
    /// Unread bytes lost to RING_BUFFER reuse.
    pub bytes_overwritten: u64,
    /// Framed bytes of the packets dropped because no chunk could be had.
    pub bytes_discarded: u64,
    pub(crate) bytes_retained: u64,
    /// Unread packets lost to RING_BUFFER reuse.
    pub packets_overwritten: u64,
    /// Packets dropped because no chunk could be had (a full DISCARD
    /// buffer, or space pinned by a pass or held by other writers).
    pub packets_discarded: u64,
    /// Packets refused as too big.
    pub packets_refused: u64,
    /// Packets the write passes took to the file.
    pub packets_retained: u64,
    /// Retained packets as a percentage of those offered.
    pub retained_pct: f64,
    /// Mean time per packet, from batches of 64.
    pub(crate) write_latency: Percentiles,
    /// `begin_packet` calls that took a new chunk.
    pub(crate) acquire_latency: Percentiles,
    pub(crate) acquire_failures: u64,
    /// The write passes: count, durations, bytes.
    pub passes: PassSummary,
    /// CPU time of the whole process during the run.
    pub cpu: CpuUsage,
    pub(crate) peak_rss_kb: u64,
    /// Per buffer: its counters and sizing advice.
    pub buffers: Vec<BufferReport>,
    /// Whether the file shows exactly the loss the counters report, and
    /// what each sequence kept.
    pub verify: Verification,
}

impl ConfigReport {
    /// The report of `cfg` from what its run measured; every rate is per
    /// `elapsed`, the writers' time.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &BenchConfig,
        sink: &'static str,
        output: Option<PathBuf>,
        elapsed: Duration,
        wall: Duration,
        outcomes: &[WriterOutcome],
        stats: &[BufferStats],
        buffers: Vec<BufferReport>,
        write_latency: Percentiles,
        acquire_latency: Percentiles,
        passes: PassSummary,
        cpu: CpuUsage,
        peak_rss_kb: u64,
        verify: Verification,
    ) -> Self {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let sum = |f: fn(&WriterOutcome) -> u64| outcomes.iter().map(f).sum::<u64>();
        let ssum = |f: fn(&BufferStats) -> u64| stats.iter().map(f).sum::<u64>();
        let offered_packets = sum(|o| o.offered);
        let accepted_packets = sum(|o| o.accepted);
        let bytes_offered = sum(|o| o.offered_bytes);
        let bytes_accepted = sum(|o| o.accepted_bytes);
        let first = buffers.first();
        let packets_retained = ssum(|s| s.packets_read);
        Self {
            index: cfg.index,
            writers: cfg.writers.len(),
            packet_size: cfg.packet_size,
            policy: first.map_or("ring", |b| b.policy),
            buffer_kb: first.map_or(0, |b| b.size_kb),
            chunk_kb: first.map_or(0.0, |b| b.chunk_kb),
            write_period_ms: cfg.write_period.as_millis() as u64,
            rate_pps: cfg.rate_pps,
            sink,
            output,
            elapsed_s: elapsed.as_secs_f64(),
            wall_s: wall.as_secs_f64(),
            warnings: short_run_warnings(elapsed, cfg.write_period, &passes),
            offered_packets,
            accepted_packets,
            offered_pps: offered_packets as f64 / secs,
            accepted_pps: accepted_packets as f64 / secs,
            offered_mbps: bytes_offered as f64 / secs / 1e6,
            accepted_mbps: bytes_accepted as f64 / secs / 1e6,
            bytes_offered,
            bytes_written: ssum(|s| s.bytes_written),
            bytes_overwritten: ssum(|s| s.bytes_overwritten),
            bytes_discarded: ssum(|s| s.bytes_discarded),
            bytes_retained: ssum(|s| s.bytes_read),
            packets_overwritten: ssum(|s| s.packets_overwritten),
            packets_discarded: ssum(|s| s.packets_discarded),
            packets_refused: ssum(|s| s.packets_refused),
            packets_retained,
            retained_pct: pct(packets_retained, offered_packets),
            write_latency,
            acquire_latency,
            acquire_failures: sum(|o| o.acquire_failures),
            passes,
            cpu,
            peak_rss_kb,
            buffers,
            verify,
        }
    }
}
