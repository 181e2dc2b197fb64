//! The recorder's own packets (sequence id 1, BOOTTIME): clock snapshots, the
//! synchronisation marker, `trace_config`, `trace_uuid`, `system_info`,
//! service events, `trigger`s and `trace_stats` (facts §4.3, §4.6–4.8).
//!
//! Each function returns one *framed* record (`0x0A <len> <packet>`), ready to
//! be appended to the file next to the ring buffers' chunks, which use the
//! same framing.

use crate::clock::{BuiltinClock, ClockReadings};
use crate::ringbuf::{Buffer, BufferStats};
use crate::trace::encoder::{Overflow, ProtoEncoder, put_varint};

/// The sequence id of the recorder's own packets (Perfetto's
/// `kServicePacketSequenceID`).
pub const SERVICE_SEQUENCE_ID: u32 = 1;

/// The 16 bytes of the synchronisation marker (UUID 82477a76-b28d-42ba-81dc-33326d57a079).
pub const SYNC_MARKER: [u8; 16] = [
    0x82, 0x47, 0x7a, 0x76, 0xb2, 0x8d, 0x42, 0xba, 0x81, 0xdc, 0x33, 0x32, 0x6d, 0x57, 0xa0, 0x79,
];

mod field {
    pub const TIMESTAMP: u32 = 8;
    pub const TRUSTED_UID: u32 = 3;
    pub const TRUSTED_SEQUENCE_ID: u32 = 10;
    pub const TIMESTAMP_CLOCK_ID: u32 = 58;
    pub const PREVIOUS_PACKET_DROPPED: u32 = 42;
    pub const CLOCK_SNAPSHOT: u32 = 6;
    pub const TRACE_CONFIG: u32 = 33;
    pub const TRACE_STATS: u32 = 35;
    pub const SYNC_MARKER: u32 = 36;
    pub const SYSTEM_INFO: u32 = 45;
    pub const TRIGGER: u32 = 46;
    pub const SERVICE_EVENT: u32 = 69;
    pub const TRACE_UUID: u32 = 89;
    pub const CLONE_SNAPSHOT_TRIGGER: u32 = 113;
    /// TraceAttributes { repeated Attribute attribute = 1 { key = 1,
    /// long_value = 2, string_value = 3 } } (Perfetto's trace_packet.proto).
    pub const TRACE_ATTRIBUTES: u32 = 126;
}

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
    let mut out = Vec::with_capacity(packet.len() + 11);
    out.push(0x0a);
    let mut len = [0u8; 10];
    let n = put_varint(&mut len, packet.len() as u64).unwrap_or(0);
    out.extend_from_slice(&len[..n]);
    out.extend_from_slice(packet);
    out
}

/// The trusted fields every service packet carries.
fn trusted(enc: &mut ProtoEncoder<'_>, uid: u32) {
    enc.uint(field::TRUSTED_UID, uid as u64);
    enc.uint(field::TRUSTED_SEQUENCE_ID, SERVICE_SEQUENCE_ID as u64);
}

fn timestamped(enc: &mut ProtoEncoder<'_>, ts_ns: u64) {
    enc.uint(field::TIMESTAMP, ts_ns);
    enc.uint(field::TIMESTAMP_CLOCK_ID, BuiltinClock::Boottime as u64);
}

/// A `clock_snapshot` packet (no TracePacket timestamp, as the service writes it).
pub fn clock_snapshot(uid: u32, readings: &ClockReadings) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        let snap = e.begin_nested(field::CLOCK_SNAPSHOT);
        for (clock, ts) in &readings.0 {
            let c = e.begin_nested(1);
            e.uint(1, *clock as u64);
            e.uint(2, *ts);
            e.end_nested(c);
        }
        e.uint(2, BuiltinClock::Boottime as u64);
        e.end_nested(snap);
    })
}

/// The synchronisation marker, with its ABI-fixed field order.
pub fn sync_marker(uid: u32) -> Vec<u8> {
    framed(|e| {
        e.uint(field::TRUSTED_UID, uid as u64);
        e.uint(field::TRUSTED_SEQUENCE_ID, SERVICE_SEQUENCE_ID as u64);
        e.bytes(field::SYNC_MARKER, &SYNC_MARKER);
    })
}

/// The `trace_config` packet: the config as loaded (its binary encoding).
pub fn trace_config(uid: u32, ts_ns: u64, config_bytes: &[u8]) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        e.bytes(field::TRACE_CONFIG, config_bytes);
    })
}

/// The `trace_uuid` packet.
pub fn trace_uuid(uid: u32, ts_ns: u64, msb: i64, lsb: i64) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let u = e.begin_nested(field::TRACE_UUID);
        e.int(1, msb);
        e.int(2, lsb);
        e.end_nested(u);
    })
}

/// One value of a `trace_attributes` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttributeValue {
    Long(i64),
    Text(String),
}

/// The `trace_attributes` packet: key/value facts about this trace file
/// (segmented output puts the session UUID and segment index here).
pub fn trace_attributes(uid: u32, ts_ns: u64, attrs: &[(&str, AttributeValue)]) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let ta = e.begin_nested(field::TRACE_ATTRIBUTES);
        for (key, value) in attrs {
            let a = e.begin_nested(1);
            e.string(1, key);
            match value {
                AttributeValue::Long(v) => e.int(2, *v),
                AttributeValue::Text(t) => e.string(3, t),
            }
            e.end_nested(a);
        }
        e.end_nested(ta);
    })
}

/// What `system_info` reports.
#[derive(Clone, Debug, Default)]
pub struct SystemInfo {
    pub sysname: String,
    pub version: String,
    pub release: String,
    pub machine: String,
    pub tracing_service_version: String,
    pub page_size: u32,
    pub num_cpus: u32,
    pub timezone_off_mins: i32,
    pub system_ram_bytes: u64,
}

impl SystemInfo {
    /// Reads this machine's facts.
    pub fn current() -> Self {
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
pub fn service_version() -> String {
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
pub fn system_info(uid: u32, ts_ns: u64, info: &SystemInfo) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let si = e.begin_nested(field::SYSTEM_INFO);
        let u = e.begin_nested(1);
        e.string(1, &info.sysname);
        e.string(2, &info.version);
        e.string(3, &info.release);
        e.string(4, &info.machine);
        e.end_nested(u);
        e.string(4, &info.tracing_service_version);
        e.uint(6, info.page_size as u64);
        e.int(7, info.timezone_off_mins as i64);
        e.uint(8, info.num_cpus as u64);
        e.uint(16, info.system_ram_bytes);
        e.end_nested(si);
    })
}

/// TracingServiceEvent kinds we emit (their field numbers, facts §4.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum ServiceEvent {
    AllDataSourcesStarted = 1,
    TracingStarted = 2,
    AllDataSourcesFlushed = 3,
    ReadTracingBuffersCompleted = 4,
    TracingDisabled = 5,
    FlushStarted = 9,
    CloneStarted = 10,
}

/// One `service_event` packet.
pub fn service_event(uid: u32, ts_ns: u64, ev: ServiceEvent) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let s = e.begin_nested(field::SERVICE_EVENT);
        e.bool(ev as u32, true);
        e.end_nested(s);
    })
}

/// A `buffer_cloned` service event for buffer `index`.
pub fn buffer_cloned(uid: u32, ts_ns: u64, index: u32) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let s = e.begin_nested(field::SERVICE_EVENT);
        e.uint(11, index as u64);
        e.end_nested(s);
    })
}

/// A received trigger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriggerRecord {
    pub name: String,
    pub producer: String,
    pub uid: u32,
    pub stop_delay_ms: u64,
    pub boot_ns: u64,
}

/// A `trigger` packet (or `clone_snapshot_trigger` in a snapshot).
pub fn trigger(uid: u32, t: &TriggerRecord, for_clone: bool) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, t.boot_ns);
        let f = if for_clone {
            field::CLONE_SNAPSHOT_TRIGGER
        } else {
            field::TRIGGER
        };
        let n = e.begin_nested(f);
        e.string(1, &t.name);
        e.string(2, &t.producer);
        e.int(3, t.uid as i64);
        e.uint(4, t.stop_delay_ms);
        e.end_nested(n);
    })
}

/// Per-buffer statistics as TraceStats.BufferStats reports them (facts §4.6),
/// each with Perfetto's meaning. Byte counts are framed packet bytes (there
/// are no chunk headers to count).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferStatsRecord {
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
    /// Producers' chunk patches applied and not applicable.
    pub patches_succeeded: u64,
    pub patches_failed: u64,
    /// Breaches of the shared-memory ABI by producers writing here.
    pub abi_violations: u64,
    pub chunks_committed_out_of_order: u64,
}

impl BufferStatsRecord {
    /// The record of one engine buffer's counters.
    pub fn from_engine(s: &BufferStats) -> Self {
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
            ..Self::default()
        }
    }
}

/// TraceStats.WriterStats: the buffer a packet sequence writes into. Trace
/// processor needs it to attribute a sequence's loss markers
/// (`previous_packet_dropped`) to a buffer, as `traced_buf_sequence_packet_loss`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStatsRecord {
    pub sequence_id: u32,
    /// Index of the buffer in the config.
    pub buffer: u32,
}

/// Session-level statistics for `trace_stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceStatsRecord {
    pub buffers: Vec<BufferStatsRecord>,
    pub producers_connected: u32,
    pub producers_seen: u64,
    pub data_sources_registered: u32,
    pub data_sources_seen: u64,
    pub tracing_sessions: u32,
    pub total_buffers: u32,
    pub flushes_requested: u64,
    pub flushes_succeeded: u64,
    pub flushes_failed: u64,
    /// 0 unspecified, 1 succeeded, 2 failed.
    pub final_flush_outcome: u32,
    /// One entry per packet sequence that wrote into a buffer.
    pub writers: Vec<WriterStatsRecord>,
    /// Producers' chunks refused (service-wide, as Perfetto counts them).
    pub chunks_discarded: u64,
    pub patches_discarded: u64,
    /// Producer packets dropped for setting a service-only field or being
    /// malformed.
    pub invalid_packets: u64,
}

impl TraceStatsRecord {
    /// The statistics of a session's buffers, in config order: one
    /// BufferStats each and one WriterStats per sequence that wrote into
    /// them.
    pub fn of_buffers<'a>(buffers: impl IntoIterator<Item = &'a Buffer>) -> Self {
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

/// The `trace_stats` packet.
pub fn trace_stats(uid: u32, ts_ns: u64, s: &TraceStatsRecord) -> Vec<u8> {
    framed(|e| {
        trusted(e, uid);
        timestamped(e, ts_ns);
        let ts = e.begin_nested(field::TRACE_STATS);
        for b in &s.buffers {
            let n = e.begin_nested(1);
            e.uint(1, b.bytes_written);
            e.uint(2, b.chunks_written);
            e.uint(3, b.chunks_overwritten);
            e.uint(4, b.write_wrap_count);
            e.uint(12, b.buffer_size);
            e.uint(13, b.bytes_overwritten);
            e.uint(14, b.bytes_read);
            e.uint(15, b.padding_bytes_written);
            e.uint(17, b.chunks_read);
            e.uint(18, b.chunks_discarded);
            e.uint(19, b.trace_writer_packet_loss);
            e.uint(5, b.patches_succeeded);
            e.uint(6, b.patches_failed);
            e.uint(9, b.abi_violations);
            e.uint(11, b.chunks_committed_out_of_order);
            e.end_nested(n);
        }
        e.uint(2, s.producers_connected as u64);
        e.uint(3, s.producers_seen);
        e.uint(4, s.data_sources_registered as u64);
        e.uint(5, s.data_sources_seen);
        e.uint(6, s.tracing_sessions as u64);
        e.uint(7, s.total_buffers as u64);
        e.uint(8, s.chunks_discarded);
        e.uint(9, s.patches_discarded);
        e.uint(10, s.invalid_packets);
        e.uint(12, s.flushes_requested);
        e.uint(13, s.flushes_succeeded);
        e.uint(14, s.flushes_failed);
        if s.final_flush_outcome != 0 {
            e.uint(15, s.final_flush_outcome as u64);
        }
        for w in &s.writers {
            let n = e.begin_nested(18);
            e.uint(1, u64::from(w.sequence_id));
            e.uint(4, u64::from(w.buffer));
            e.end_nested(n);
        }
        e.end_nested(ts);
    })
}

/// The packet standing where a sequence lost data: it carries only the
/// sequence id and `previous_packet_dropped`, so trace processor counts the
/// loss and resets that sequence's incremental state at exactly that point.
pub fn loss_marker(sequence_id: u32) -> Vec<u8> {
    framed(|e| {
        e.uint(field::TRUSTED_SEQUENCE_ID, sequence_id as u64);
        e.uint(field::PREVIOUS_PACKET_DROPPED, 1);
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
