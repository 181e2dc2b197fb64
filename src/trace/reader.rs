//! Reading trace files: streaming the records of a file of any size (the
//! framing itself, torn tails and corruption included, is
//! [`crate::wire::framing`]), and a wire-level look at each packet's fields
//! (enough for `inspect`, no generated types).

use std::collections::BTreeMap;
use std::io::Read;

use crate::wire::framing::{Step, step};
use crate::wire::{
    Value, WireError, WireType, buffer_stats, compact_sched, ftrace_cpu_stats, ftrace_event_bundle,
    ftrace_stats, key, test_event, trace_packet, trace_stats, tracing_service_event, varint,
};

pub use crate::wire::framing::{
    Frame, Frames, FramingError, MAX_PACKET_BYTES, PACKET_TAG, ScanEnd, TornTail, frames,
};

/// Reading a trace failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened (or is not a regular file), or a read
    /// from it failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file, as named to the reader.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Streams the records of `r` (a file of any size) through `f`, reading in
/// blocks of about 1 MiB; `name` is only for error messages.
pub fn scan_reader(
    mut r: impl Read,
    name: &str,
    mut f: impl FnMut(Frame<'_>),
) -> Result<ScanEnd, ReadError> {
    const BLOCK: usize = 1 << 20;
    let mut buf: Vec<u8> = vec![0; BLOCK];
    let mut start = 0usize; // unconsumed bytes are buf[start..filled]
    let mut filled = 0usize;
    let mut base = 0u64; // file offset of buf[0]
    let mut packets = 0u64;
    loop {
        // Consume every whole record in the buffer.
        loop {
            let offset = base + start as u64;
            match step(&buf[start..filled], offset) {
                Step::Frame(fr) => {
                    start += fr.record_len() as usize;
                    packets += 1;
                    f(fr);
                }
                Step::NeedMore => break,
                Step::Corrupt(e) => {
                    return Ok(ScanEnd {
                        bytes: offset,
                        packets,
                        torn_tail: None,
                        corruption: Some(e),
                    });
                }
            }
        }
        // Keep the partial record at the front; grow only for a record
        // larger than the buffer.
        if start > 0 {
            buf.copy_within(start..filled, 0);
            base += start as u64;
            filled -= start;
            start = 0;
        }
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = loop {
            match r.read(&mut buf[filled..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(ReadError::Io {
                        path: name.to_string(),
                        source,
                    });
                }
            }
        };
        if n == 0 {
            let left = filled as u64;
            return Ok(ScanEnd {
                bytes: base + left,
                packets,
                torn_tail: (left > 0).then_some(TornTail {
                    offset: base,
                    bytes: left,
                }),
                corruption: None,
            });
        }
        filled += n;
    }
}

/// A packet that is not valid protobuf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("malformed packet field at byte {at} of the packet")]
pub(crate) struct Malformed {
    pub at: usize,
    #[source]
    #[serde(skip)]
    pub cause: WireError,
}

impl From<WireError> for Malformed {
    fn from(cause: WireError) -> Self {
        Malformed {
            at: cause.offset(),
            cause,
        }
    }
}

/// Walks the top-level fields of a message.
fn for_each_field<'a>(data: &'a [u8], mut f: impl FnMut(u32, Value<'a>)) -> Result<(), Malformed> {
    crate::wire::for_each(data, |field| f(field.number, field.value)).map_err(Malformed::from)
}

/// The payload of a `zstd_compressed_packets` packet, when the
/// packet is one. Writers put that field alone in the packet, so only the
/// first field is looked at (the other packets cost one varint).
pub(crate) fn zstd_payload(packet: &[u8]) -> Option<&[u8]> {
    let mut pos = 0;
    let k = varint::read(packet, &mut pos).ok()?;
    if k != key(trace_packet::ZSTD_COMPRESSED_PACKETS, WireType::Len) {
        return None;
    }
    let len = usize::try_from(varint::read(packet, &mut pos).ok()?).ok()?;
    packet.get(pos..pos.checked_add(len)?)
}

/// The name of field `field` in a table, or `field_N`.
fn name_in(table: &[(u32, &'static str)], field: u32) -> std::borrow::Cow<'static, str> {
    match table.iter().find(|(n, _)| *n == field) {
        Some((_, name)) => (*name).into(),
        None => format!("field_{field}").into(),
    }
}

/// The name of a TracePacket `data` field.
pub(crate) fn kind_name(field: u32) -> std::borrow::Cow<'static, str> {
    name_in(trace_packet::DATA_NAMES, field)
}

/// The name of a TracingServiceEvent field (ARCHITECTURE.md §7.8).
pub(crate) fn service_event_name(field: u32) -> std::borrow::Cow<'static, str> {
    match tracing_service_event::RECORDER_NAMES
        .iter()
        .find(|(n, _)| *n == field)
    {
        Some((_, name)) => (*name).into(),
        None => name_in(tracing_service_event::NAMES, field),
    }
}

/// TraceStats.BufferStats field names (ARCHITECTURE.md §7.6).
fn buffer_stat_name(field: u32) -> std::borrow::Cow<'static, str> {
    match field
        .checked_sub(1)
        .and_then(|i| buffer_stats::NAMES.get(i as usize))
    {
        Some(n) => (*n).into(),
        None => format!("field_{field}").into(),
    }
}

/// TraceStats top-level scalar field names (ARCHITECTURE.md §7.6).
fn trace_stat_name(field: u32) -> std::borrow::Cow<'static, str> {
    name_in(trace_stats::SCALAR_NAMES, field)
}

/// What `inspect` reads of an FtraceEventBundle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BundleInfo {
    /// Typed and generic events plus the compact_sched switch and waking rows.
    pub events: u64,
    /// The kernel lost events before this bundle (`lost_events`).
    pub lost_events: bool,
}

impl BundleInfo {
    fn decode(body: &[u8]) -> Result<BundleInfo, Malformed> {
        let mut b = BundleInfo::default();
        let mut nested = Ok(());
        for_each_field(body, |f, v| match (f, v) {
            (ftrace_event_bundle::EVENT, _) => b.events += 1,
            (ftrace_event_bundle::LOST_EVENTS, Value::Varint(x)) => b.lost_events = x != 0,
            (ftrace_event_bundle::COMPACT_SCHED, Value::Len(cs)) => {
                nested = for_each_field(cs, |cf, cv| {
                    // switch_timestamp / waking_timestamp: one packed varint a row.
                    if let (
                        compact_sched::SWITCH_TIMESTAMP | compact_sched::WAKING_TIMESTAMP,
                        Value::Len(col),
                    ) = (cf, cv)
                    {
                        b.events += varint::count(col) as u64;
                    }
                });
            }
            _ => {}
        })?;
        nested.map(|()| b)
    }
}

/// An FtraceStats packet: its phase and, per CPU, the events the kernel
/// lost (overrun + dropped_events).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct FtraceStatsInfo {
    /// 1 start of trace, 2 end of trace.
    pub phase: u64,
    pub(crate) lost_per_cpu: Vec<(u64, u64)>,
}

impl FtraceStatsInfo {
    fn decode(body: &[u8]) -> Result<FtraceStatsInfo, Malformed> {
        let mut s = FtraceStatsInfo::default();
        let mut nested = Ok(());
        for_each_field(body, |f, v| match (f, v) {
            (ftrace_stats::PHASE, Value::Varint(x)) => s.phase = x,
            (ftrace_stats::CPU_STATS, Value::Len(c)) => {
                let (mut cpu, mut lost) = (0, 0);
                let r = for_each_field(c, |cf, cv| match (cf, cv) {
                    (ftrace_cpu_stats::CPU, Value::Varint(x)) => cpu = x,
                    (
                        ftrace_cpu_stats::OVERRUN | ftrace_cpu_stats::DROPPED_EVENTS,
                        Value::Varint(x),
                    ) => lost += x,
                    _ => {}
                });
                if r.is_err() {
                    nested = r;
                }
                s.lost_per_cpu.push((cpu, lost));
            }
            _ => {}
        })?;
        nested.map(|()| s)
    }
}

/// The scalar fields of a `trace_stats` packet, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceStatsInfo {
    /// One map per `buffer_stats` entry, in order (buffer 0 first).
    pub buffers: Vec<BTreeMap<String, u64>>,
    /// Top-level varint fields.
    pub counters: BTreeMap<String, u64>,
}

impl TraceStatsInfo {
    fn decode(data: &[u8]) -> Result<Self, Malformed> {
        let mut out = TraceStatsInfo::default();
        let mut bad = None;
        for_each_field(data, |f, v| match (f, v) {
            (trace_stats::BUFFER_STATS, Value::Len(b)) => {
                let mut m = BTreeMap::new();
                let r = for_each_field(b, |bf, bv| {
                    if let Value::Varint(x) = bv {
                        m.insert(buffer_stat_name(bf).into_owned(), x);
                    }
                });
                if let Err(e) = r {
                    bad.get_or_insert(e);
                }
                out.buffers.push(m);
            }
            (f, Value::Varint(x)) => {
                out.counters.insert(trace_stat_name(f).into_owned(), x);
            }
            _ => {}
        })?;
        match bad {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// The top-level facts of one TracePacket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PacketInfo {
    /// Field number of the `data` oneof member present (the last one wins).
    pub kind: Option<u32>,
    pub trusted_packet_sequence_id: Option<u32>,
    /// The writer's process, as the service appended it (producers' packets).
    pub trusted_pid: Option<i32>,
    pub trusted_uid: Option<i32>,
    pub timestamp: Option<u64>,
    /// Non-zero when data was lost before this packet on its sequence.
    pub previous_packet_dropped: u64,
    /// `for_testing.counter` (0, 1, 2, … per sequence).
    pub(crate) for_testing_counter: Option<u64>,
    /// The TracingServiceEvent fields set, in order.
    pub service_events: Vec<u32>,
    /// Decoded when the packet is a `trace_stats` one.
    pub trace_stats: Option<TraceStatsInfo>,
    /// Decoded when the packet is an ftrace bundle.
    pub(crate) ftrace_bundle: Option<BundleInfo>,
    /// Decoded when the packet is an `ftrace_stats` one.
    pub ftrace_stats: Option<FtraceStatsInfo>,
}

impl PacketInfo {
    /// Decodes the top-level fields (and the few nested ones `inspect` needs).
    pub(crate) fn decode(packet: &[u8]) -> Result<PacketInfo, Malformed> {
        let mut p = PacketInfo::default();
        let mut nested: Option<Malformed> = None;
        for_each_field(packet, |f, v| {
            match (f, &v) {
                (trace_packet::TIMESTAMP, Value::Varint(x)) => p.timestamp = Some(*x),
                (trace_packet::TRUSTED_PACKET_SEQUENCE_ID, Value::Varint(x)) => {
                    p.trusted_packet_sequence_id = Some(*x as u32);
                }
                (trace_packet::PREVIOUS_PACKET_DROPPED, Value::Varint(x)) => {
                    p.previous_packet_dropped = *x
                }
                (trace_packet::TRUSTED_PID, Value::Varint(x)) => p.trusted_pid = Some(*x as i32),
                (trace_packet::TRUSTED_UID, Value::Varint(x)) => p.trusted_uid = Some(*x as i32),
                _ => {}
            }
            if trace_packet::NON_DATA.contains(&f) {
                return;
            }
            p.kind = Some(f);
            let Value::Len(body) = v else { return };
            let r = match f {
                trace_packet::FOR_TESTING => for_each_field(body, |tf, tv| {
                    if let (test_event::COUNTER, Value::Varint(x)) = (tf, tv) {
                        p.for_testing_counter = Some(x);
                    }
                }),
                trace_packet::SERVICE_EVENT => {
                    for_each_field(body, |sf, _| p.service_events.push(sf))
                }
                trace_packet::TRACE_STATS => {
                    TraceStatsInfo::decode(body).map(|s| p.trace_stats = Some(s))
                }
                trace_packet::FTRACE_EVENTS => {
                    BundleInfo::decode(body).map(|b| p.ftrace_bundle = Some(b))
                }
                trace_packet::FTRACE_STATS => {
                    FtraceStatsInfo::decode(body).map(|s| p.ftrace_stats = Some(s))
                }
                _ => Ok(()),
            };
            if let Err(e) = r {
                nested.get_or_insert(e);
            }
        })?;
        match nested {
            Some(e) => Err(e),
            None => Ok(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn varint(v: u64, out: &mut Vec<u8>) {
        varint::push(out, v);
    }

    fn framed(packets: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in packets {
            crate::wire::framing::push_record(&mut out, p);
        }
        out
    }

    fn key(field: u32, wt: WireType, out: &mut Vec<u8>) {
        varint(crate::wire::key(field, wt), out);
    }

    #[test]
    fn decodes_the_fields_inspect_needs() {
        let mut p = Vec::new();
        key(trace_packet::TIMESTAMP, WireType::Varint, &mut p);
        varint(123_456, &mut p);
        key(trace_packet::FOR_TESTING, WireType::Len, &mut p);
        let body = [0x10, 0x07, 0x18, 0x2a]; // seq_value = 7, counter = 42
        varint(body.len() as u64, &mut p);
        p.extend_from_slice(&body);
        key(
            trace_packet::TRUSTED_PACKET_SEQUENCE_ID,
            WireType::Varint,
            &mut p,
        );
        varint(3, &mut p);
        key(
            trace_packet::PREVIOUS_PACKET_DROPPED,
            WireType::Varint,
            &mut p,
        );
        varint(1, &mut p);
        let info = PacketInfo::decode(&p).expect("decodes");
        assert_eq!(info.kind, Some(trace_packet::FOR_TESTING));
        assert_eq!(info.timestamp, Some(123_456));
        assert_eq!(info.trusted_packet_sequence_id, Some(3));
        assert_eq!(info.previous_packet_dropped, 1);
        assert_eq!(info.for_testing_counter, Some(42));

        let mut s = Vec::new();
        let mut stats = Vec::new();
        let mut buf0 = Vec::new();
        key(buffer_stats::BYTES_WRITTEN, WireType::Varint, &mut buf0);
        varint(999, &mut buf0);
        key(buffer_stats::BYTES_OVERWRITTEN, WireType::Varint, &mut buf0);
        varint(5, &mut buf0);
        key(trace_stats::BUFFER_STATS, WireType::Len, &mut stats);
        varint(buf0.len() as u64, &mut stats);
        stats.extend_from_slice(&buf0);
        key(
            trace_stats::PRODUCERS_CONNECTED,
            WireType::Varint,
            &mut stats,
        );
        varint(1, &mut stats);
        key(trace_packet::TRACE_STATS, WireType::Len, &mut s);
        varint(stats.len() as u64, &mut s);
        s.extend_from_slice(&stats);
        let info = PacketInfo::decode(&s).expect("decodes");
        let ts = info.trace_stats.expect("trace_stats");
        assert_eq!(ts.buffers[0]["bytes_written"], 999);
        assert_eq!(ts.buffers[0]["bytes_overwritten"], 5);
        assert_eq!(ts.counters["producers_connected"], 1);
    }

    #[test]
    fn malformed_packets_are_reported() {
        assert!(PacketInfo::decode(&[0x42, 0x05, 0x00]).is_err()); // length past the end
        assert!(PacketInfo::decode(&[0x0b]).is_err()); // group wire type
        assert!(PacketInfo::decode(&[]).is_ok());
    }

    proptest! {
        // Round trip: framing what we decode gives back the same packets, for
        // the slice reader and the streaming reader (with a tiny read size).
        #[test]
        fn framing_round_trip(
            packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..400), 0..30),
            tail in 0usize..6,
        ) {
            let data = framed(&packets);
            let mut f = frames(&data);
            let got: Vec<Vec<u8>> = f.by_ref().map(|fr| fr.packet.to_vec()).collect();
            prop_assert_eq!(&got, &packets);
            prop_assert_eq!(f.end().expect("ended").torn_tail, None);

            // A torn copy of one more packet at the end.
            let mut torn = data.clone();
            let extra = framed(&[vec![1u8; 200]]);
            let t = tail.min(extra.len() - 1).max(1);
            torn.extend_from_slice(&extra[..t]);
            struct Dribble<'a>(&'a [u8]);
            impl Read for Dribble<'_> {
                fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                    let n = buf.len().min(self.0.len()).min(7);
                    buf[..n].copy_from_slice(&self.0[..n]);
                    self.0 = &self.0[n..];
                    Ok(n)
                }
            }
            let mut streamed = Vec::new();
            let end = scan_reader(Dribble(&torn), "mem", |fr| streamed.push((fr.offset, fr.packet.to_vec()))).expect("reads");
            prop_assert_eq!(streamed.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(), packets.clone());
            let offsets: Vec<u64> = frames(&data).map(|fr| fr.offset).collect();
            prop_assert_eq!(streamed.iter().map(|(o, _)| *o).collect::<Vec<_>>(), offsets);
            prop_assert_eq!(end.torn_tail, Some(TornTail { offset: data.len() as u64, bytes: t as u64 }));
            prop_assert_eq!(end.corruption, None);
        }
    }
}
