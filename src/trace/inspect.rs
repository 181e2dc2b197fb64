//! `recorder inspect`: what a trace file holds, for people (`Display`) and
//! for machines (`serde::Serialize`, `--json`).
//!
//! It reads the framing (tolerating a torn tail), decodes each packet's
//! top-level fields and tallies packets by kind and by sequence, the service
//! events, the last `trace_stats`, and losses. [`InspectReport::verdict`] is
//! an error when the file is corrupt beyond a torn tail.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Serialize;

use super::reader::{self, Frame, FramingError, PacketInfo, ScanEnd, TornTail, TraceStatsInfo};

/// Packets and bytes (framing included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Packets counted.
    pub packets: u64,
    /// Their records' bytes, tag and length included.
    pub bytes: u64,
}

/// The `for_testing` sequence numbers seen on one sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TestSequence {
    /// `for_testing` packets with a counter.
    pub count: u64,
    /// The first counter value seen.
    pub first: u64,
    /// The last counter value seen, in file order.
    pub last: u64,
    /// Times a value was more than one past the previous one.
    pub gaps: u64,
    /// Values missing in those gaps.
    pub missing: u64,
    /// Times a value was not above the previous one (reorder or duplicate).
    pub(crate) out_of_order: u64,
}

/// One `trusted_packet_sequence_id` (0: packets without one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SequenceReport {
    /// Packets on the sequence.
    pub packets: u64,
    /// Their records' bytes.
    pub bytes: u64,
    pub(crate) first_timestamp: Option<u64>,
    pub(crate) last_timestamp: Option<u64>,
    /// Packets marked `previous_packet_dropped`.
    pub losses: u64,
    /// The `TestEvent.counter` values seen, when the sequence carries
    /// `for_testing` packets.
    pub for_testing: Option<TestSequence>,
    /// The producer's process and user (`trusted_pid`, `trusted_uid`), for
    /// sequences written by a producer over the socket.
    pub pid: Option<i32>,
    /// The producer's `trusted_uid`, when it has a `trusted_pid`.
    pub uid: Option<i32>,
}

/// What one producer process wrote (its sequences carry its trusted pid).
/// Perfetto's format keeps no producer names: `recorder query` and the
/// summary give them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProducerSeen {
    /// The producer's `trusted_uid`, as its last sequence carries it.
    pub uid: Option<i32>,
    /// The `trusted_packet_sequence_id`s it wrote on, in ascending order.
    pub sequences: Vec<u32>,
    /// Packets over those sequences.
    pub packets: u64,
    /// Their records' bytes.
    pub bytes: u64,
    /// Packets marked `previous_packet_dropped` on its sequences.
    pub losses: u64,
}

/// A service event packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceEventSeen {
    /// The `TracingServiceEvent` field set, by name (`tracing_started`,
    /// `all_data_sources_flushed`, the recorder's `recorder_died`, ...).
    pub name: String,
    /// The packet's `TracePacket.timestamp`, if it has one.
    pub timestamp: Option<u64>,
    /// File offset of the packet's record (of the compressed packet holding
    /// it, for one inside `zstd_compressed_packets`).
    pub offset: u64,
}

/// A packet whose fields do not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Undecodable {
    /// Packets whose fields do not parse (compressed packets that do not
    /// decompress included).
    pub count: u64,
    /// File offset of the first such packet's record.
    pub(crate) first_offset: u64,
}

/// The ftrace data of a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FtraceSeen {
    /// `ftrace_events` packets, one `FtraceEventBundle` each.
    pub bundles: u64,
    /// Events in those bundles, compact-sched events included.
    pub events: u64,
    /// Bundles marked `lost_events` (the kernel dropped events before them).
    pub bundles_after_loss: u64,
    /// Per CPU, events the kernel lost, from the last end-of-trace FtraceStats.
    pub end_lost_per_cpu: Option<Vec<(u64, u64)>>,
}

/// The zstd-compressed packets of a trace (ARCHITECTURE.md §7.9).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CompressedSeen {
    /// `zstd_compressed_packets` records and their bytes in the file.
    pub packets: u64,
    /// Bytes of those records in the file, framing included.
    pub bytes: u64,
    /// Bytes of the records inside them, decompressed.
    pub(crate) uncompressed_bytes: u64,
    /// The largest compressed packet (Perfetto recommends under 512 KiB).
    pub(crate) largest_packet: u64,
}

/// Decompressed output accepted from one compressed packet (ours hold at
/// most 500 KiB; Perfetto's about 1 MiB); more is treated as corruption.
pub(crate) const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;

/// Everything `inspect` says about a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct InspectReport {
    /// Bytes read (the file size unless corruption stopped the scan).
    pub(crate) file_bytes: u64,
    /// Packets read, those inside compressed packets counted one by one.
    pub packets: u64,
    /// Bytes of whole records.
    pub packet_bytes: u64,
    /// Packets by the `TracePacket.data` member they hold (`ftrace_events`,
    /// `trace_stats`, ...; `(no data)` for none).
    pub by_kind: BTreeMap<String, Tally>,
    /// Packets by `trusted_packet_sequence_id` (0: none).
    pub by_sequence: BTreeMap<u32, SequenceReport>,
    /// Producers (by trusted pid) and what they wrote.
    pub producers: BTreeMap<i32, ProducerSeen>,
    /// The service event packets, in file order.
    pub service_events: Vec<ServiceEventSeen>,
    pub(crate) trace_stats_packets: u64,
    /// The last `trace_stats` packet in the file: the service's final
    /// counts, when the recording ended cleanly.
    pub last_trace_stats: Option<TraceStatsInfo>,
    /// Packets marked `previous_packet_dropped`, over all sequences.
    pub losses: u64,
    /// Present when the trace holds ftrace bundles or an end-of-trace
    /// `FtraceStats`.
    pub ftrace: Option<FtraceSeen>,
    /// Present when the trace holds compressed packets; the packets inside
    /// them are counted everywhere else as if written plainly.
    pub compressed: Option<CompressedSeen>,
    /// The incomplete record the file ends in, if any: what a crash
    /// mid-write leaves, not corruption.
    pub torn_tail: Option<TornTail>,
    /// Bytes of that torn tail (0 without one).
    pub torn_tail_bytes: u64,
    /// The framing error that stopped the scan, if any.
    pub corruption: Option<FramingError>,
    pub(crate) undecodable: Option<Undecodable>,
}

/// The file is not a valid trace (beyond a torn tail), or cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The framing breaks before the end of the file (not a torn tail).
    #[error("corrupt trace: {0}")]
    Corrupt(FramingError),
    /// The framing holds, but some packets are not valid protobuf.
    #[error("corrupt trace: {} packet(s) do not decode, the first at offset {}", .0.count, .0.first_offset)]
    Undecodable(Undecodable),
    /// The file could not be opened or read.
    #[error(transparent)]
    Read(#[from] reader::ReadError),
}

impl InspectReport {
    fn add(&mut self, fr: Frame<'_>) {
        self.packet_bytes += fr.record_len();
        if let Some(payload) = reader::zstd_payload(fr.packet) {
            self.add_compressed(fr, payload);
            return;
        }
        self.add_packet(fr, fr.offset);
    }

    fn undecodable_at(&mut self, offset: u64) {
        let u = self.undecodable.get_or_insert(Undecodable {
            count: 0,
            first_offset: offset,
        });
        u.count += 1;
    }

    /// A compressed packet: its payload's records are counted as packets.
    fn add_compressed(&mut self, fr: Frame<'_>, payload: &[u8]) {
        let c = self.compressed.get_or_insert_with(Default::default);
        c.packets += 1;
        c.bytes += fr.record_len();
        c.largest_packet = c.largest_packet.max(fr.packet.len() as u64);
        let inner =
            match crate::storage::compress::decompress_bounded(payload, MAX_DECOMPRESSED_BYTES) {
                Ok(v) => v,
                Err(_) => return self.undecodable_at(fr.offset),
            };
        c.uncompressed_bytes += inner.len() as u64;
        let mut frames = reader::frames(&inner);
        for inner_fr in frames.by_ref() {
            // Offsets inside a compressed packet are reported as the packet's own.
            self.add_packet(inner_fr, fr.offset);
        }
        if frames
            .end()
            .is_some_and(|e| e.corruption.is_some() || e.torn_tail.is_some())
        {
            self.undecodable_at(fr.offset);
        }
    }

    fn add_packet(&mut self, fr: Frame<'_>, offset: u64) {
        let record = fr.record_len();
        self.packets += 1;
        let info = match PacketInfo::decode(fr.packet) {
            Ok(i) => i,
            Err(_) => return self.undecodable_at(offset),
        };
        let kind = info
            .kind
            .map_or_else(|| "(no data)".into(), reader::kind_name);
        let t = self.by_kind.entry(kind.into_owned()).or_default();
        t.packets += 1;
        t.bytes += record;

        let seq = self
            .by_sequence
            .entry(info.trusted_packet_sequence_id.unwrap_or(0))
            .or_default();
        seq.packets += 1;
        seq.bytes += record;
        if info.trusted_pid.is_some() {
            seq.pid = info.trusted_pid;
            seq.uid = info.trusted_uid;
        }
        if let Some(ts) = info.timestamp {
            seq.first_timestamp.get_or_insert(ts);
            seq.last_timestamp = Some(ts);
        }
        if info.previous_packet_dropped != 0 {
            seq.losses += 1;
            self.losses += 1;
        }
        if let Some(v) = info.for_testing_counter {
            match &mut seq.for_testing {
                None => {
                    seq.for_testing = Some(TestSequence {
                        count: 1,
                        first: v,
                        last: v,
                        ..Default::default()
                    })
                }
                Some(t) => {
                    t.count += 1;
                    if v <= t.last {
                        t.out_of_order += 1;
                    } else if v > t.last + 1 {
                        t.gaps += 1;
                        t.missing += v - t.last - 1;
                    }
                    t.last = v;
                }
            }
        }
        for e in &info.service_events {
            self.service_events.push(ServiceEventSeen {
                name: reader::service_event_name(*e).into_owned(),
                timestamp: info.timestamp,
                offset,
            });
        }
        if let Some(s) = info.trace_stats {
            self.trace_stats_packets += 1;
            self.last_trace_stats = Some(s);
        }
        if let Some(b) = info.ftrace_bundle {
            let ft = self.ftrace.get_or_insert_with(Default::default);
            ft.bundles += 1;
            ft.events += b.events;
            ft.bundles_after_loss += u64::from(b.lost_events);
        }
        if let Some(s) = info.ftrace_stats
            && s.phase == 2
        {
            self.ftrace
                .get_or_insert_with(Default::default)
                .end_lost_per_cpu = Some(s.lost_per_cpu);
        }
    }

    /// Groups the sequences written by producers by their process.
    fn tally_producers(&mut self) {
        self.producers.clear();
        for (id, s) in &self.by_sequence {
            let Some(pid) = s.pid else { continue };
            let p = self.producers.entry(pid).or_default();
            p.uid = s.uid;
            p.sequences.push(*id);
            p.packets += s.packets;
            p.bytes += s.bytes;
            p.losses += s.losses;
        }
    }

    fn finish(&mut self, end: ScanEnd) {
        self.tally_producers();
        self.file_bytes = end.bytes;
        self.torn_tail = end.torn_tail;
        self.torn_tail_bytes = end.torn_tail.map_or(0, |t| t.bytes);
        self.corruption = end.corruption;
    }

    /// `Ok` for a valid trace (a torn tail allowed); the error otherwise.
    pub(crate) fn verdict(&self) -> Result<(), InspectError> {
        if let Some(c) = &self.corruption {
            return Err(InspectError::Corrupt(c.clone()));
        }
        if let Some(u) = self.undecodable {
            return Err(InspectError::Undecodable(u));
        }
        Ok(())
    }
}

/// Inspects an in-memory trace.
pub fn report(bytes: &[u8]) -> InspectReport {
    let mut r = InspectReport::default();
    let mut frames = reader::frames(bytes);
    for fr in frames.by_ref() {
        r.add(fr);
    }
    let end = frames.end().cloned().unwrap_or_default();
    r.finish(end);
    r
}

/// Inspects a trace file of any size, streaming it.
pub(crate) fn report_file(path: &Path) -> Result<InspectReport, InspectError> {
    let name = path.display().to_string();
    // A segment's name in a shared directory may hold anything: a regular
    // file only, never a FIFO waited on, never another user's link.
    let (file, _) = super::untrusted::open_regular(path).map_err(|e| reader::ReadError::Io {
        path: name.clone(),
        source: e.into(),
    })?;
    let mut r = InspectReport::default();
    let end = reader::scan_reader(file, &name, |fr| r.add(fr))?;
    r.finish(end);
    Ok(r)
}

impl fmt::Display for InspectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} packets, {} bytes in packets, {} bytes read",
            self.packets, self.packet_bytes, self.file_bytes
        )?;
        if let Some(c) = &self.compressed {
            writeln!(
                f,
                "zstd: {} compressed packets, {} bytes holding {} ({:.2}x), largest {} bytes",
                c.packets,
                c.bytes,
                c.uncompressed_bytes,
                c.uncompressed_bytes as f64 / c.bytes.max(1) as f64,
                c.largest_packet
            )?;
        }
        writeln!(f, "\npackets by kind:")?;
        for (k, t) in &self.by_kind {
            writeln!(
                f,
                "  {k:<32} {:>10} packets {:>14} bytes",
                t.packets, t.bytes
            )?;
        }
        writeln!(f, "\npackets by sequence:")?;
        for (id, s) in &self.by_sequence {
            let label = if *id == 0 {
                "(none)".to_string()
            } else {
                id.to_string()
            };
            write!(
                f,
                "  seq {label:<8} {:>10} packets {:>14} bytes",
                s.packets, s.bytes
            )?;
            if s.losses > 0 {
                write!(f, "  {} after loss", s.losses)?;
            }
            if let Some(t) = &s.for_testing {
                write!(
                    f,
                    "  for_testing {}..={} ({} seen, {} missing, {} out of order)",
                    t.first, t.last, t.count, t.missing, t.out_of_order
                )?;
            }
            writeln!(f)?;
        }
        if !self.producers.is_empty() {
            writeln!(
                f,
                "\nproducers (by trusted pid; names are not kept in the trace):"
            )?;
            for (pid, p) in &self.producers {
                let seqs: Vec<String> = p.sequences.iter().map(|s| s.to_string()).collect();
                writeln!(
                    f,
                    "  pid {pid:<8} uid {:<6} {:>10} packets {:>14} bytes on sequences {}{}",
                    p.uid.map_or_else(|| "?".to_string(), |u| u.to_string()),
                    p.packets,
                    p.bytes,
                    seqs.join(", "),
                    if p.losses > 0 {
                        format!(", {} after loss", p.losses)
                    } else {
                        String::new()
                    }
                )?;
            }
        }
        if let Some(ft) = &self.ftrace {
            writeln!(
                f,
                "\nftrace: {} bundles, {} events, {} bundles after events the kernel lost",
                ft.bundles, ft.events, ft.bundles_after_loss
            )?;
            match &ft.end_lost_per_cpu {
                Some(cpus) => {
                    let per: Vec<String> =
                        cpus.iter().map(|(c, n)| format!("cpu{c} {n}")).collect();
                    writeln!(
                        f,
                        "  lost in the kernel (end FtraceStats): {}",
                        per.join(", ")
                    )?;
                }
                None => writeln!(f, "  no end-of-trace FtraceStats")?,
            }
        }
        if !self.service_events.is_empty() {
            writeln!(f, "\nservice events:")?;
            for e in &self.service_events {
                match e.timestamp {
                    Some(ts) => writeln!(f, "  {:<34} ts {ts}", e.name)?,
                    None => writeln!(f, "  {}", e.name)?,
                }
            }
        }
        writeln!(f, "\ntrace_stats packets: {}", self.trace_stats_packets)?;
        if let Some(s) = &self.last_trace_stats {
            for (k, v) in &s.counters {
                writeln!(f, "  {k}: {v}")?;
            }
            for (i, b) in s.buffers.iter().enumerate() {
                let fields: Vec<String> = b.iter().map(|(k, v)| format!("{k}={v}")).collect();
                writeln!(f, "  buffer {i}: {}", fields.join(" "))?;
            }
        }
        writeln!(f, "\npackets after a loss: {}", self.losses)?;
        if let Some(t) = self.torn_tail {
            writeln!(
                f,
                "torn tail: {} bytes at offset {} (an interrupted write; ignored)",
                t.bytes, t.offset
            )?;
        }
        if let Some(u) = self.undecodable {
            writeln!(
                f,
                "UNDECODABLE: {} packet(s), the first at offset {}",
                u.count, u.first_offset
            )?;
        }
        if let Some(c) = &self.corruption {
            writeln!(f, "CORRUPT: {c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::{
        WireType, buffer_stats, key, test_event, trace, trace_packet, trace_stats,
        tracing_service_event, varint,
    };

    fn field_varint(field: u32, v: u64, out: &mut Vec<u8>) {
        varint::push(out, key(field, WireType::Varint));
        varint::push(out, v);
    }

    fn field_bytes(field: u32, b: &[u8], out: &mut Vec<u8>) {
        varint::push(out, key(field, WireType::Len));
        varint::push(out, b.len() as u64);
        out.extend_from_slice(b);
    }

    fn record(packet: &[u8], out: &mut Vec<u8>) {
        field_bytes(trace::PACKET, packet, out);
    }

    fn test_packet(seq_id: u64, value: u64, dropped: bool) -> Vec<u8> {
        let mut body = Vec::new();
        field_varint(test_event::SEQ_VALUE, 0x5eed ^ value, &mut body); // not the order
        field_varint(test_event::COUNTER, value, &mut body);
        let mut p = Vec::new();
        field_varint(trace_packet::TIMESTAMP, 1000 + value, &mut p);
        field_bytes(trace_packet::FOR_TESTING, &body, &mut p);
        field_varint(trace_packet::TRUSTED_PACKET_SEQUENCE_ID, seq_id, &mut p);
        if dropped {
            field_varint(trace_packet::PREVIOUS_PACKET_DROPPED, 1, &mut p);
        }
        p
    }

    fn sample() -> Vec<u8> {
        let mut t = Vec::new();
        let mut ev = Vec::new();
        field_varint(tracing_service_event::TRACING_STARTED, 1, &mut ev);
        let mut p = Vec::new();
        field_varint(trace_packet::TIMESTAMP, 5, &mut p);
        field_bytes(trace_packet::SERVICE_EVENT, &ev, &mut p);
        field_varint(trace_packet::TRUSTED_PACKET_SEQUENCE_ID, 1, &mut p);
        record(&p, &mut t);
        for v in [0, 1, 2, 5, 6] {
            record(&test_packet(2, v, v == 5), &mut t);
        }
        record(&test_packet(3, 0, false), &mut t);
        let mut buf = Vec::new();
        field_varint(buffer_stats::BYTES_OVERWRITTEN, 77, &mut buf);
        let mut stats = Vec::new();
        field_bytes(trace_stats::BUFFER_STATS, &buf, &mut stats);
        let mut p = Vec::new();
        field_bytes(trace_packet::TRACE_STATS, &stats, &mut p);
        field_varint(trace_packet::TRUSTED_PACKET_SEQUENCE_ID, 1, &mut p);
        record(&p, &mut t);
        t
    }

    #[test]
    fn counts_kinds_sequences_events_stats_and_losses() {
        let r = report(&sample());
        assert_eq!(r.packets, 8);
        assert_eq!(r.by_kind["for_testing"].packets, 6);
        assert_eq!(r.by_kind["service_event"].packets, 1);
        assert_eq!(r.by_sequence[&2].packets, 5);
        let t = r.by_sequence[&2].for_testing.expect("for_testing seen");
        assert_eq!(
            (t.first, t.last, t.count, t.gaps, t.missing, t.out_of_order),
            (0, 6, 5, 1, 2, 0)
        );
        assert_eq!(r.by_sequence[&2].losses, 1);
        assert_eq!(r.losses, 1);
        assert_eq!(r.service_events[0].name, "tracing_started");
        assert_eq!(r.service_events[0].timestamp, Some(5));
        let s = r.last_trace_stats.as_ref().expect("stats");
        assert_eq!(s.buffers[0]["bytes_overwritten"], 77);
        assert!(r.verdict().is_ok());
        let text = r.to_string();
        assert!(
            text.contains("tracing_started") && text.contains("bytes_overwritten=77"),
            "{text}"
        );
        let json = serde_json::to_value(&r).expect("serializes");
        assert_eq!(json["by_kind"]["for_testing"]["packets"], 6);
    }

    #[test]
    fn torn_tail_is_fine_corruption_is_not() {
        let mut t = sample();
        let whole = t.len() as u64;
        t.extend_from_slice(&[0x0A, 0x20, 1, 2]);
        let r = report(&t);
        assert_eq!(r.torn_tail_bytes, 4);
        assert_eq!(r.torn_tail.map(|x| x.offset), Some(whole));
        assert!(r.verdict().is_ok());

        let mut bad = sample();
        bad.extend_from_slice(&[0x0B, 0x00]);
        let r = report(&bad);
        assert!(matches!(
            r.verdict(),
            Err(InspectError::Corrupt(FramingError::BadTag { .. }))
        ));
        assert!(r.to_string().contains("CORRUPT"));

        let mut und = sample();
        record(&[0x0b], &mut und);
        assert!(matches!(
            report(&und).verdict(),
            Err(InspectError::Undecodable(_))
        ));
    }

    #[test]
    fn file_and_memory_reports_agree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.pftrace");
        let mut t = sample();
        t.extend_from_slice(&[0x0A]);
        std::fs::write(&path, &t).expect("write");
        assert_eq!(report_file(&path).expect("reads"), report(&t));
    }
}
