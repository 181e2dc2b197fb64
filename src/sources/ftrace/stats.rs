//! `per_cpu/cpuN/stats` and the FtraceStats packet (TracePacket field 34).

use crate::trace::encoder::ProtoEncoder;
use crate::wire::{ftrace_cpu_stats as cs, ftrace_stats as fs, trace_packet};

/// FtraceStats.phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Counters taken as the recording starts.
    StartOfTrace = 1,
    /// Counters taken as the recording stops.
    EndOfTrace = 2,
}

/// One CPU's kernel ring-buffer counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuStats {
    /// The CPU (N of `cpuN`).
    pub cpu: u64,
    /// `entries`: events in the buffer now.
    pub entries: u64,
    /// `overrun`: events lost because the ring buffer wrapped over them
    /// before they were read.
    pub overrun: u64,
    /// `commit overrun`: events dropped because writes nested inside one
    /// being committed filled the buffer.
    pub commit_overrun: u64,
    /// `bytes`: bytes of events in the buffer not yet read (Perfetto calls it
    /// `bytes_read`).
    pub bytes_read: u64,
    /// `oldest event ts`: the oldest event's timestamp, in seconds.
    pub oldest_event_ts: f64,
    /// `now ts`: the trace clock when the file was read, in seconds.
    pub now_ts: f64,
    /// `dropped events`: events refused because the buffer was full and set
    /// not to overwrite.
    pub dropped_events: u64,
    /// `read events`: events already read from the buffer.
    pub read_events: u64,
}

impl CpuStats {
    /// Parses the text of `per_cpu/cpuN/stats` (`key: value` lines).
    pub fn parse(cpu: u64, text: &str) -> Self {
        let mut s = CpuStats {
            cpu,
            ..Default::default()
        };
        for line in text.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let v = v.trim();
            let int = || v.parse::<u64>().unwrap_or(0);
            match k.trim() {
                "entries" => s.entries = int(),
                "overrun" => s.overrun = int(),
                "commit overrun" => s.commit_overrun = int(),
                "bytes" => s.bytes_read = int(),
                "oldest event ts" => s.oldest_event_ts = v.parse().unwrap_or(0.0),
                "now ts" => s.now_ts = v.parse().unwrap_or(0.0),
                "dropped events" => s.dropped_events = int(),
                "read events" => s.read_events = int(),
                _ => {}
            }
        }
        s
    }
}

/// What one FtraceStats packet reports.
#[derive(Clone, Debug, Default)]
pub struct StatsReport<'a> {
    /// Each CPU's counters, from `per_cpu/cpuN/stats`.
    pub cpus: &'a [CpuStats],
    /// Requested events this kernel does not have.
    pub unknown_events: &'a [String],
    /// Events that exist but could not be enabled, or kprobes that could not
    /// be made.
    pub failed_events: &'a [String],
    /// Perfetto `FtraceParseStatus` values seen, one entry each.
    pub parse_errors: &'a [u32],
    /// Size of each per-CPU ring buffer, in pages.
    pub cpu_buffer_size_pages: u64,
    /// The kernel buffer was not cleared at start (trace processor then
    /// keeps events older than the session's start).
    pub preserve_ftrace_buffer: bool,
}

/// Encodes an FtraceStats packet into `buf`, returning its length, or
/// `None` when it does not fit.
pub fn encode_stats_packet(
    buf: &mut [u8],
    seq_id: u32,
    timestamp: u64,
    phase: Phase,
    r: &StatsReport<'_>,
) -> Option<usize> {
    let mut enc = ProtoEncoder::new(buf);
    enc.uint(trace_packet::TIMESTAMP, timestamp);
    enc.uint(trace_packet::TRUSTED_PACKET_SEQUENCE_ID, seq_id as u64);
    let st = enc.begin_nested(trace_packet::FTRACE_STATS);
    enc.uint(fs::PHASE, phase as u64);
    for c in r.cpus {
        let m = enc.begin_nested(fs::CPU_STATS);
        enc.uint(cs::CPU, c.cpu);
        enc.uint(cs::ENTRIES, c.entries);
        enc.uint(cs::OVERRUN, c.overrun);
        enc.uint(cs::COMMIT_OVERRUN, c.commit_overrun);
        enc.uint(cs::BYTES_READ, c.bytes_read);
        enc.double(cs::OLDEST_EVENT_TS, c.oldest_event_ts);
        enc.double(cs::NOW_TS, c.now_ts);
        enc.uint(cs::DROPPED_EVENTS, c.dropped_events);
        enc.uint(cs::READ_EVENTS, c.read_events);
        enc.end_nested(m);
    }
    for u in r.unknown_events {
        enc.string(fs::UNKNOWN_FTRACE_EVENTS, u);
    }
    for f in r.failed_events {
        enc.string(fs::FAILED_FTRACE_EVENTS, f);
    }
    for e in r.parse_errors {
        enc.uint(fs::FTRACE_PARSE_ERRORS, *e as u64);
    }
    if r.preserve_ftrace_buffer {
        enc.bool(fs::PRESERVE_FTRACE_BUFFER, true);
    }
    if r.cpu_buffer_size_pages > 0 {
        enc.uint(fs::CPU_BUFFER_SIZE_PAGES, r.cpu_buffer_size_pages);
    }
    enc.end_nested(st);
    enc.finish().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_stats() {
        let text = "entries: 12\noverrun: 3\ncommit overrun: 0\nbytes: 4096\noldest event ts:   647.000001\nnow ts:   647.753985\ndropped events: 1\nread events: 40\n";
        let s = CpuStats::parse(1, text);
        assert_eq!(
            (
                s.cpu,
                s.entries,
                s.overrun,
                s.bytes_read,
                s.dropped_events,
                s.read_events
            ),
            (1, 12, 3, 4096, 1, 40)
        );
        assert!((s.now_ts - 647.753985).abs() < 1e-9);
    }
}
