//! The recorder's own packets (sequence id 1, BOOTTIME): clock snapshots, the
//! synchronisation marker, `trace_config`, `trace_uuid`, `system_info`,
//! service events, `trigger`s and `trace_stats` (ARCHITECTURE.md §7.3,
//! §7.6–7.8).
//!
//! Each function returns one *framed* record (`0x0A <len> <packet>`), ready to
//! be appended to the file next to the ring buffers' chunks, which use the
//! same framing.

use crate::clock::{BuiltinClock, ClockReadings};
use crate::ringbuf::{Buffer, BufferStats};
use crate::trace::encoder::{Overflow, ProtoEncoder};
use crate::wire::{
    attribute, buffer_stats as bs, clock, clock_snapshot, service_event_data_sources as sed,
    system_info as si, trace_attributes, trace_packet as tp, trace_stats as ts, trace_uuid,
    tracing_service_event as tse, trigger as tr, utsname, writer_stats,
};

/// The sequence id of the recorder's own packets (Perfetto's
/// `kServicePacketSequenceID`).
pub(crate) const SERVICE_SEQUENCE_ID: u32 = 1;

/// The 16 bytes of the synchronisation marker (UUID 82477a76-b28d-42ba-81dc-33326d57a079).
pub(crate) const SYNC_MARKER: [u8; 16] = [
    0x82, 0x47, 0x7a, 0x76, 0xb2, 0x8d, 0x42, 0xba, 0x81, 0xdc, 0x33, 0x32, 0x6d, 0x57, 0xa0, 0x79,
];

/// Encodes one packet with `body`, growing the scratch space until it fits,
/// and frames it.
fn framed(body: impl Fn(&mut ProtoEncoder<'_>)) -> Vec<u8> {
    let mut cap = 512;
    loop {
        let mut buf = vec![0u8; cap];
        let mut enc = ProtoEncoder::new(&mut buf);
        body(&mut enc);
        match enc.finish() {
            Ok(len) => {
                buf.truncate(len);
                return frame(&buf);
            }
            Err(Overflow) => cap *= 4,
        }
    }
}

/// Frames an encoded packet as one `Trace.packet` record.
pub fn frame(packet: &[u8]) -> Vec<u8> {
    crate::wire::framing::record(packet)
}

/// The trusted fields every service packet carries.
fn trusted(enc: &mut ProtoEncoder<'_>, uid: u32) {
    enc.uint(tp::TRUSTED_UID, uid as u64);
    enc.uint(tp::TRUSTED_PACKET_SEQUENCE_ID, SERVICE_SEQUENCE_ID as u64);
}

fn timestamped(enc: &mut ProtoEncoder<'_>, ts_ns: u64) {
    enc.uint(tp::TIMESTAMP, ts_ns);
    enc.uint(tp::TIMESTAMP_CLOCK_ID, BuiltinClock::Boottime as u64);
}

/// A `clock_snapshot` packet (no TracePacket timestamp, as the service writes it).
pub(crate) fn clock_snapshot(uid: u32, readings: &ClockReadings) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        let snap = e.begin_nested(tp::CLOCK_SNAPSHOT);
        for (id, ts) in &readings.0 {
            let c = e.begin_nested(clock_snapshot::CLOCKS);
            e.uint(clock::CLOCK_ID, *id as u64);
            e.uint(clock::TIMESTAMP, *ts);
            e.end_nested(c);
        }
        e.uint(
            clock_snapshot::PRIMARY_TRACE_CLOCK,
            BuiltinClock::Boottime as u64,
        );
        e.end_nested(snap);
    })
}

/// The synchronisation marker, with its ABI-fixed field order.
pub(crate) fn sync_marker(uid: u32) -> Vec<u8> {
    framed(|e| {
        e.uint(tp::TRUSTED_UID, uid as u64);
        e.uint(tp::TRUSTED_PACKET_SEQUENCE_ID, SERVICE_SEQUENCE_ID as u64);
        e.bytes(tp::SYNCHRONIZATION_MARKER, &SYNC_MARKER);
    })
}

/// The `trace_config` packet: the config as loaded (its binary encoding).
pub(crate) fn trace_config(uid: u32, ts_ns: u64, config_bytes: &[u8]) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        e.bytes(tp::TRACE_CONFIG, config_bytes);
    })
}

/// The `trace_uuid` packet.
pub(crate) fn trace_uuid(uid: u32, ts_ns: u64, msb: i64, lsb: i64) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let u = e.begin_nested(tp::TRACE_UUID);
        e.int(trace_uuid::MSB, msb);
        e.int(trace_uuid::LSB, lsb);
        e.end_nested(u);
    })
}

/// One value of a `trace_attributes` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AttributeValue {
    Long(i64),
    Text(String),
}

/// The `trace_attributes` packet: key/value facts about this trace file
/// (segmented output puts the session UUID and segment index here).
pub(crate) fn trace_attributes(uid: u32, ts_ns: u64, attrs: &[(&str, AttributeValue)]) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let ta = e.begin_nested(tp::TRACE_ATTRIBUTES);
        for (key, value) in attrs {
            let a = e.begin_nested(trace_attributes::ATTRIBUTE);
            e.string(attribute::KEY, key);
            match value {
                AttributeValue::Long(v) => e.int(attribute::LONG_VALUE, *v),
                AttributeValue::Text(t) => e.string(attribute::STRING_VALUE, t),
            }
            e.end_nested(a);
        }
        e.end_nested(ta);
    })
}

/// What `system_info` reports.
#[derive(Clone, Debug, Default)]
pub(crate) struct SystemInfo {
    pub(crate) sysname: String,
    pub version: String,
    pub release: String,
    pub machine: String,
    pub(crate) tracing_service_version: String,
    pub page_size: u32,
    pub(crate) num_cpus: u32,
    pub(crate) timezone_off_mins: i32,
    pub(crate) system_ram_bytes: u64,
}

impl SystemInfo {
    /// Reads this machine's facts.
    pub(crate) fn current() -> Self {
        let uts = rustix::system::uname();
        let lossy = |s: &std::ffi::CStr| s.to_string_lossy().into_owned();
        Self {
            sysname: lossy(uts.sysname()),
            version: lossy(uts.version()),
            release: lossy(uts.release()),
            machine: lossy(uts.machine()),
            tracing_service_version: service_version(),
            page_size: rustix::param::page_size() as u32,
            num_cpus: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            timezone_off_mins: timezone_offset_minutes(),
            system_ram_bytes: system_ram_bytes(),
        }
    }
}

/// `tracing_service_version`: names recorder and its version, and the
/// Perfetto service release whose behaviour it follows (trace processor reads
/// the `Perfetto vNN.M` part to decide which service quirks apply).
pub(crate) fn service_version() -> String {
    format!(
        "recorder {} (Perfetto v58.2 compatible)",
        env!("CARGO_PKG_VERSION")
    )
}

fn system_ram_bytes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return 0;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The local timezone's offset from UTC in minutes, from the TZif file behind
/// `/etc/localtime` (0 when it cannot be read: UTC).
fn timezone_offset_minutes() -> i32 {
    let Ok(data) = std::fs::read("/etc/localtime") else {
        return 0;
    };
    tzif_current_offset_secs(&data).map_or(0, |s| s / 60)
}

/// The UTC offset of the last transition type in a TZif (v1 block) file:
/// good enough for `system_info`, which only reports the current offset.
fn tzif_current_offset_secs(d: &[u8]) -> Option<i32> {
    if d.get(..4)? != b"TZif" {
        return None;
    }
    let be32 =
        |o: usize| -> Option<u32> { Some(u32::from_be_bytes(d.get(o..o + 4)?.try_into().ok()?)) };
    let (isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt) = (
        be32(20)?,
        be32(24)?,
        be32(28)?,
        be32(32)?,
        be32(36)?,
        be32(40)?,
    );
    let _ = (isutcnt, isstdcnt, leapcnt, charcnt);
    let times = 44usize;
    let idx = times + timecnt as usize * 4;
    let types = idx + timecnt as usize;
    let type_index = if timecnt > 0 {
        *d.get(idx + timecnt as usize - 1)? as usize
    } else {
        0
    };
    if type_index >= typecnt as usize {
        return None;
    }
    let o = types + type_index * 6;
    Some(i32::from_be_bytes(d.get(o..o + 4)?.try_into().ok()?))
}

/// The `system_info` packet.
pub(crate) fn system_info(uid: u32, ts_ns: u64, info: &SystemInfo) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let n = e.begin_nested(tp::SYSTEM_INFO);
        let u = e.begin_nested(si::UTSNAME);
        e.string(utsname::SYSNAME, &info.sysname);
        e.string(utsname::VERSION, &info.version);
        e.string(utsname::RELEASE, &info.release);
        e.string(utsname::MACHINE, &info.machine);
        e.end_nested(u);
        e.string(si::TRACING_SERVICE_VERSION, &info.tracing_service_version);
        e.uint(si::PAGE_SIZE, info.page_size as u64);
        e.int(si::TIMEZONE_OFF_MINS, info.timezone_off_mins as i64);
        e.uint(si::NUM_CPUS, info.num_cpus as u64);
        e.uint(si::SYSTEM_RAM_BYTES, info.system_ram_bytes);
        e.end_nested(n);
    })
}

/// TracingServiceEvent kinds we emit (their field numbers, ARCHITECTURE.md §7.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub(crate) enum ServiceEvent {
    AllDataSourcesStarted = tse::ALL_DATA_SOURCES_STARTED,
    TracingStarted = tse::TRACING_STARTED,
    AllDataSourcesFlushed = tse::ALL_DATA_SOURCES_FLUSHED,
    ReadTracingBuffersCompleted = tse::READ_TRACING_BUFFERS_COMPLETED,
    TracingDisabled = tse::TRACING_DISABLED,
    CloneStarted = tse::CLONE_STARTED,
    /// The recorder's own: the recording process died, and another one
    /// wrote what its buffers held.
    RecorderDied = tse::RECORDER_DIED,
}

/// One `service_event` packet.
pub(crate) fn service_event(uid: u32, ts_ns: u64, ev: ServiceEvent) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let s = e.begin_nested(tp::SERVICE_EVENT);
        e.bool(ev as u32, true);
        e.end_nested(s);
    })
}

/// Data sources a slow-start or slow-flush event lists at most (ARCHITECTURE.md §7.8).
pub(crate) const MAX_LISTED_DATA_SOURCES: usize = 32;

/// A `slow_starting_data_sources` service event: the (producer, data
/// source) pairs that had not acknowledged their start.
pub(crate) fn slow_starting(uid: u32, ts_ns: u64, slow: &[(String, String)]) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let s = e.begin_nested(tp::SERVICE_EVENT);
        let list = e.begin_nested(tse::SLOW_STARTING_DATA_SOURCES);
        for (producer, source) in slow.iter().take(MAX_LISTED_DATA_SOURCES) {
            let d = e.begin_nested(sed::DATA_SOURCE);
            e.string(sed::PRODUCER_NAME, producer);
            e.string(sed::DATA_SOURCE_NAME, source);
            e.end_nested(d);
        }
        e.end_nested(list);
        e.end_nested(s);
    })
}

/// A `buffer_cloned` service event for buffer `index`.
pub(crate) fn buffer_cloned(uid: u32, ts_ns: u64, index: u32) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let s = e.begin_nested(tp::SERVICE_EVENT);
        e.uint(tse::BUFFER_CLONED, index as u64);
        e.end_nested(s);
    })
}

/// A received trigger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TriggerRecord {
    pub name: String,
    pub producer: String,
    pub uid: u32,
    pub stop_delay_ms: u64,
    pub(crate) boot_ns: u64,
}

/// A `trigger` packet (or `clone_snapshot_trigger` in a snapshot).
pub(crate) fn trigger(uid: u32, t: &TriggerRecord, for_clone: bool) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, t.boot_ns);
        let f = if for_clone {
            tp::CLONE_SNAPSHOT_TRIGGER
        } else {
            tp::TRIGGER
        };
        let n = e.begin_nested(f);
        e.string(tr::TRIGGER_NAME, &t.name);
        e.string(tr::PRODUCER_NAME, &t.producer);
        e.int(tr::TRUSTED_PRODUCER_UID, t.uid as i64);
        e.uint(tr::STOP_DELAY_MS, t.stop_delay_ms);
        e.end_nested(n);
    })
}

/// Per-buffer statistics as TraceStats.BufferStats reports them (ARCHITECTURE.md §7.6),
/// each with Perfetto's meaning. Byte counts are framed packet bytes (there
/// are no chunk headers to count).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BufferStatsRecord {
    pub buffer_size: u64,
    pub bytes_written: u64,
    pub chunks_written: u64,
    pub chunks_overwritten: u64,
    pub write_wrap_count: u64,
    pub bytes_overwritten: u64,
    pub bytes_read: u64,
    /// Bytes allocated as padding *between* chunks: none with fixed chunk
    /// slots (the unused end of a chunk is not padding in Perfetto's sense).
    pub padding_bytes_written: u64,
    pub chunks_read: u64,
    pub chunks_discarded: u64,
    /// Packets a writer lost before they reached the buffer (refused as too
    /// big for it); trace processor shows it as a `data_loss` stat.
    pub trace_writer_packet_loss: u64,
    /// The recorder's own counters, for losses Perfetto's fields cannot tell
    /// apart (they are in `chunks_discarded` too): packets and framed bytes
    /// discarded while the space was pinned by a write pass, and while every
    /// free chunk was held by another writer. Written under field numbers
    /// far above Perfetto's (`RECORDER_BUFFER_STATS_FIELDS`), so readers
    /// that do not know them skip them.
    pub packets_discarded_pinned: u64,
    pub(crate) bytes_discarded_pinned: u64,
    pub packets_discarded_held: u64,
    pub(crate) bytes_discarded_held: u64,
    /// Producers' chunk patches applied and not applicable.
    pub(crate) patches_succeeded: u64,
    pub patches_failed: u64,
    /// Breaches of the shared-memory ABI by producers writing here.
    pub abi_violations: u64,
    pub chunks_committed_out_of_order: u64,
}

/// BufferStats field numbers of the recorder's own counters (the table is
/// [`crate::wire::buffer_stats::RECORDER_OWN`]).
#[cfg(test)]
pub(crate) const RECORDER_BUFFER_STATS_FIELDS: [u32; 4] = bs::RECORDER_OWN;

impl BufferStatsRecord {
    /// The record of one engine buffer's counters.
    pub(crate) fn from_engine(s: &BufferStats) -> Self {
        Self {
            buffer_size: s.buffer_size,
            bytes_written: s.bytes_written,
            chunks_written: s.chunks_written,
            chunks_overwritten: s.chunks_overwritten,
            write_wrap_count: s.write_wrap_count,
            bytes_overwritten: s.bytes_overwritten,
            bytes_read: s.bytes_read,
            padding_bytes_written: s.padding_bytes_written,
            chunks_read: s.chunks_read,
            chunks_discarded: s.chunks_discarded,
            trace_writer_packet_loss: s.packets_refused,
            packets_discarded_pinned: s.packets_discarded_pinned,
            bytes_discarded_pinned: s.bytes_discarded_pinned,
            packets_discarded_held: s.packets_discarded_held,
            bytes_discarded_held: s.bytes_discarded_held,
            ..Self::default()
        }
    }
}

/// TraceStats.WriterStats: the buffer a packet sequence writes into. Trace
/// processor needs it to attribute a sequence's loss markers
/// (`previous_packet_dropped`) to a buffer, as `traced_buf_sequence_packet_loss`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WriterStatsRecord {
    pub sequence_id: u32,
    /// Index of the buffer in the config.
    pub buffer: u32,
}

/// Session-level statistics for `trace_stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TraceStatsRecord {
    pub buffers: Vec<BufferStatsRecord>,
    pub(crate) producers_connected: u32,
    pub producers_seen: u64,
    pub(crate) data_sources_registered: u32,
    pub(crate) data_sources_seen: u64,
    pub tracing_sessions: u32,
    pub(crate) total_buffers: u32,
    pub flushes_requested: u64,
    pub flushes_succeeded: u64,
    pub flushes_failed: u64,
    /// 0 unspecified, 1 succeeded, 2 failed.
    pub(crate) final_flush_outcome: u32,
    /// One entry per packet sequence that wrote into a buffer.
    pub writers: Vec<WriterStatsRecord>,
    /// Producers' chunks refused (service-wide, as Perfetto counts them).
    pub chunks_discarded: u64,
    pub patches_discarded: u64,
    /// Producer packets dropped for setting a service-only field or being
    /// malformed.
    pub invalid_packets: u64,
    /// Quota hits per uid, as `trace_attributes` entries
    /// (`recorder.quota.uid.<uid>.<limit>`): TraceStats counts producers but
    /// has no per-uid field, so they go beside it (see [`stats_packets`]).
    pub quota_hits: Vec<(String, i64)>,
    /// What each trigger rule did (`recorder.rule.<name>.<figure>`), beside
    /// the quota hits in the same `trace_attributes` packet.
    pub(crate) rule_counts: Vec<(String, i64)>,
}

impl TraceStatsRecord {
    /// The statistics of a session's buffers, in config order: one
    /// BufferStats each and one WriterStats per sequence that wrote into
    /// them.
    pub(crate) fn of_buffers<'a>(buffers: impl IntoIterator<Item = &'a Buffer>) -> Self {
        let mut rec = Self {
            producers_connected: 1,
            producers_seen: 1,
            tracing_sessions: 1,
            ..Self::default()
        };
        for (i, b) in buffers.into_iter().enumerate() {
            rec.buffers.push(BufferStatsRecord::from_engine(&b.stats()));
            rec.writers
                .extend(b.writer_ids().into_iter().map(|w| WriterStatsRecord {
                    sequence_id: w.0,
                    buffer: i as u32,
                }));
        }
        rec.total_buffers = rec.buffers.len() as u32;
        rec
    }
}

/// The `trace_stats` packet, and after it the `trace_attributes` packet of
/// the per-uid quota hits when there are any.
pub(crate) fn stats_packets(uid: u32, ts_ns: u64, s: &TraceStatsRecord) -> Vec<Vec<u8>> {
    let mut out = vec![trace_stats(uid, ts_ns, s)];
    if !s.quota_hits.is_empty() || !s.rule_counts.is_empty() {
        let attrs: Vec<(&str, AttributeValue)> = s
            .quota_hits
            .iter()
            .chain(&s.rule_counts)
            .map(|(k, v)| (k.as_str(), AttributeValue::Long(*v)))
            .collect();
        out.push(trace_attributes(uid, ts_ns, &attrs));
    }
    out
}

/// The `trace_stats` packet.
pub(crate) fn trace_stats(uid: u32, ts_ns: u64, s: &TraceStatsRecord) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let stats = e.begin_nested(tp::TRACE_STATS);
        for b in &s.buffers {
            let n = e.begin_nested(ts::BUFFER_STATS);
            e.uint(bs::BYTES_WRITTEN, b.bytes_written);
            e.uint(bs::CHUNKS_WRITTEN, b.chunks_written);
            e.uint(bs::CHUNKS_OVERWRITTEN, b.chunks_overwritten);
            e.uint(bs::WRITE_WRAP_COUNT, b.write_wrap_count);
            e.uint(bs::BUFFER_SIZE, b.buffer_size);
            e.uint(bs::BYTES_OVERWRITTEN, b.bytes_overwritten);
            e.uint(bs::BYTES_READ, b.bytes_read);
            e.uint(bs::PADDING_BYTES_WRITTEN, b.padding_bytes_written);
            e.uint(bs::CHUNKS_READ, b.chunks_read);
            e.uint(bs::CHUNKS_DISCARDED, b.chunks_discarded);
            e.uint(bs::TRACE_WRITER_PACKET_LOSS, b.trace_writer_packet_loss);
            e.uint(bs::PATCHES_SUCCEEDED, b.patches_succeeded);
            e.uint(bs::PATCHES_FAILED, b.patches_failed);
            e.uint(bs::ABI_VIOLATIONS, b.abi_violations);
            e.uint(
                bs::CHUNKS_COMMITTED_OUT_OF_ORDER,
                b.chunks_committed_out_of_order,
            );
            let own = [
                b.packets_discarded_pinned,
                b.bytes_discarded_pinned,
                b.packets_discarded_held,
                b.bytes_discarded_held,
            ];
            for (field, v) in bs::RECORDER_OWN.into_iter().zip(own) {
                if v > 0 {
                    e.uint(field, v);
                }
            }
            e.end_nested(n);
        }
        e.uint(ts::PRODUCERS_CONNECTED, s.producers_connected as u64);
        e.uint(ts::PRODUCERS_SEEN, s.producers_seen);
        e.uint(
            ts::DATA_SOURCES_REGISTERED,
            s.data_sources_registered as u64,
        );
        e.uint(ts::DATA_SOURCES_SEEN, s.data_sources_seen);
        e.uint(ts::TRACING_SESSIONS, s.tracing_sessions as u64);
        e.uint(ts::TOTAL_BUFFERS, s.total_buffers as u64);
        e.uint(ts::CHUNKS_DISCARDED, s.chunks_discarded);
        e.uint(ts::PATCHES_DISCARDED, s.patches_discarded);
        e.uint(ts::INVALID_PACKETS, s.invalid_packets);
        e.uint(ts::FLUSHES_REQUESTED, s.flushes_requested);
        e.uint(ts::FLUSHES_SUCCEEDED, s.flushes_succeeded);
        e.uint(ts::FLUSHES_FAILED, s.flushes_failed);
        if s.final_flush_outcome != 0 {
            e.uint(ts::FINAL_FLUSH_OUTCOME, s.final_flush_outcome as u64);
        }
        for w in &s.writers {
            let n = e.begin_nested(ts::WRITER_STATS);
            e.uint(writer_stats::SEQUENCE_ID, u64::from(w.sequence_id));
            e.uint(writer_stats::BUFFER, u64::from(w.buffer));
            e.end_nested(n);
        }
        e.end_nested(stats);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_marker_has_the_abi_bytes() {
        let m = sync_marker(0);
        let mut want = vec![0x0a, 0x17, 0x18, 0x00, 0x50, 0x01, 0xa2, 0x02, 0x10];
        want.extend_from_slice(&SYNC_MARKER);
        assert_eq!(m, want);
    }

    #[test]
    fn slow_starting_names_producer_and_data_source_as_perfetto_decodes_them() {
        use protobuf::Message;
        let slow: Vec<(String, String)> = (0..40)
            .map(|i| (format!("app{i}"), "track_event".to_string()))
            .collect();
        let framed = slow_starting(0, 7, &slow);
        let trace = perfetto_protos::trace::Trace::parse_from_bytes(&framed).expect("decodes");
        let p = &trace.packet[0];
        assert_eq!(p.timestamp(), 7);
        let listed = &p.service_event().slow_starting_data_sources().data_source;
        assert_eq!(listed.len(), MAX_LISTED_DATA_SOURCES);
        assert_eq!(listed[1].producer_name(), "app1");
        assert_eq!(listed[1].data_source_name(), "track_event");
    }

    #[test]
    fn frame_uses_minimal_length() {
        assert_eq!(frame(&[1, 2, 3]), vec![0x0a, 3, 1, 2, 3]);
        assert_eq!(frame(&[0; 200])[..3], [0x0a, 0xc8, 0x01]);
    }

    #[test]
    fn trace_stats_names_each_sequences_buffer_and_no_padding() {
        use crate::ringbuf::{BufferParams, FillPolicy, WriterId};
        use protobuf::Message;
        let buffer = |policy| {
            Buffer::new(BufferParams {
                size_bytes: 4096,
                chunk_size: 256,
                region_chunks: 1,
                policy,
                prefault: false,
            })
            .expect("valid params")
        };
        let (a, b) = (buffer(FillPolicy::RingBuffer), buffer(FillPolicy::Discard));
        let mut w3 = a.writer(WriterId(3));
        let mut w2 = b.writer(WriterId(2));
        let mut w5 = b.writer(WriterId(5));
        for w in [&mut w3, &mut w2, &mut w5] {
            w.write_packet(&[0x08, 1]).expect("fits");
            w.flush();
        }
        // A finished sequence whose data was read still counts.
        drop(w5);
        b.take_flush().release();
        b.take_flush().release();
        let rec = TraceStatsRecord::of_buffers([&*a, &*b]);
        assert_eq!(rec.total_buffers, 2);
        assert!(rec.buffers.iter().all(|s| s.padding_bytes_written == 0));
        assert!(
            b.stats().unused_chunk_bytes > 0,
            "the chunks have unused ends"
        );
        let framed = trace_stats(0, 1, &rec);
        let trace = perfetto_protos::trace::Trace::parse_from_bytes(&framed).expect("decodes");
        let ts = trace.packet[0].trace_stats();
        let writers: Vec<(u64, u32)> = ts
            .writer_stats
            .iter()
            .map(|w| (w.sequence_id(), w.buffer()))
            .collect();
        assert_eq!(writers, [(3, 0), (2, 1), (5, 1)]);
        assert_eq!(ts.buffer_stats[1].padding_bytes_written(), 0);
        assert_eq!(ts.buffer_stats[0].bytes_written(), 4, "one framed packet");
    }

    #[test]
    fn trace_stats_tell_a_pinned_discard_apart() {
        use crate::ringbuf::{BufferParams, FillPolicy, WriterId};
        use protobuf::Message;
        use protobuf::UnknownValueRef;
        let b = Buffer::new(BufferParams {
            size_bytes: 128,
            chunk_size: 64,
            region_chunks: 1,
            policy: FillPolicy::RingBuffer,
            prefault: false,
        })
        .expect("valid params");
        let mut w = b.writer(WriterId(2));
        w.write_packet(&[7; 50]).expect("fits");
        w.write_packet(&[7; 50]).expect("fits");
        // A pass holds both chunks: the next packet has nowhere to go.
        let pass = b.take_flush();
        assert!(w.write_packet(&[7; 50]).is_err());
        let rec = TraceStatsRecord::of_buffers([&*b]);
        drop(pass);
        assert_eq!(rec.buffers[0].packets_discarded_pinned, 1);
        let trace = perfetto_protos::trace::Trace::parse_from_bytes(&trace_stats(0, 1, &rec))
            .expect("decodes");
        let stats = &trace.packet[0].trace_stats().buffer_stats[0];
        assert_eq!(
            stats.chunks_discarded(),
            1,
            "Perfetto's own count has it too"
        );
        let own = stats.special_fields.unknown_fields();
        let [packets, bytes, held, _] = RECORDER_BUFFER_STATS_FIELDS;
        assert_eq!(own.get(packets), Some(UnknownValueRef::Varint(1)));
        assert_eq!(own.get(bytes), Some(UnknownValueRef::Varint(52)));
        assert_eq!(own.get(held), None, "zero counters are left out");
    }

    #[test]
    fn tzif_utc_is_zero() {
        // A minimal TZif v1 with no transitions and one type at offset 0.
        let mut d = b"TZif".to_vec();
        d.resize(20, 0);
        for v in [0u32, 0, 0, 0, 1, 4] {
            d.extend_from_slice(&v.to_be_bytes());
        }
        d.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        d.extend_from_slice(b"UTC\0");
        assert_eq!(tzif_current_offset_secs(&d), Some(0));
    }
}
