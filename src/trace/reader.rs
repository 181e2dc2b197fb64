//! Reading trace files: the framing, and a wire-level look at each packet's
//! top-level fields (enough for `inspect`, no generated types).
//!
//! ```text
//!  file   := record*  [torn tail]
//!  record := 0x0A  <varint len>  <len bytes: TracePacket>
//!  torn   := 0x0A [<partial varint> | <varint len> <fewer than len bytes>]
//! ```
//!
//! A record cut off by the end of the data (a crash mid-write) is a torn
//! tail, reported apart from corruption; anything else that is not
//! `0x0A <len>` is corruption at that offset, and reading stops there.

use std::collections::BTreeMap;
use std::io::Read;

/// The tag of `Trace.packet` (field 1, length-delimited).
pub const PACKET_TAG: u8 = 0x0A;
/// A declared packet length past this is corruption, not a torn tail.
pub const MAX_PACKET_BYTES: u64 = 1 << 32;

/// One record of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Offset of the record's tag byte in the file.
    pub offset: u64,
    /// Bytes of tag + length varint.
    pub header_len: usize,
    /// The TracePacket bytes.
    pub packet: &'a [u8],
}

impl Frame<'_> {
    /// Bytes of the whole record.
    pub fn record_len(&self) -> u64 {
        (self.header_len + self.packet.len()) as u64
    }
}

/// Where framing broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
pub enum FramingError {
    #[error("offset {offset}: expected a packet record (tag 0x0a), found byte {byte:#04x}")]
    BadTag { offset: u64, byte: u8 },
    #[error("offset {offset}: malformed packet length")]
    BadLength { offset: u64 },
}

impl FramingError {
    pub fn offset(&self) -> u64 {
        match self {
            FramingError::BadTag { offset, .. } | FramingError::BadLength { offset } => *offset,
        }
    }
}

/// Reading a trace failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// An incomplete last record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TornTail {
    pub offset: u64,
    pub bytes: u64,
}

/// How a scan ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScanEnd {
    /// Bytes looked at (the file's size unless corruption stopped the scan).
    pub bytes: u64,
    pub packets: u64,
    pub torn_tail: Option<TornTail>,
    pub corruption: Option<FramingError>,
}

enum Header {
    /// A whole header: its length and the packet length it declares.
    Whole {
        header_len: usize,
        len: u64,
    },
    /// The data ends inside the header.
    Incomplete,
    Corrupt(FramingError),
}

fn parse_header(data: &[u8], offset: u64) -> Header {
    let Some(&tag) = data.first() else {
        return Header::Incomplete;
    };
    if tag != PACKET_TAG {
        return Header::Corrupt(FramingError::BadTag { offset, byte: tag });
    }
    let mut len = 0u64;
    for i in 0..10 {
        let Some(&b) = data.get(1 + i) else {
            return Header::Incomplete;
        };
        if i == 9 && b > 1 {
            return Header::Corrupt(FramingError::BadLength { offset });
        }
        len |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            if len > MAX_PACKET_BYTES {
                return Header::Corrupt(FramingError::BadLength { offset });
            }
            return Header::Whole {
                header_len: 2 + i,
                len,
            };
        }
    }
    Header::Corrupt(FramingError::BadLength { offset })
}

/// Why a step over the data stopped.
enum Step<'a> {
    Frame(Frame<'a>),
    /// The rest is an incomplete record (or nothing, when empty).
    NeedMore,
    Corrupt(FramingError),
}

fn step(data: &[u8], offset: u64) -> Step<'_> {
    match parse_header(data, offset) {
        Header::Incomplete => Step::NeedMore,
        Header::Corrupt(e) => Step::Corrupt(e),
        Header::Whole { header_len, len } => {
            let end = header_len as u64 + len;
            if (data.len() as u64) < end {
                return Step::NeedMore;
            }
            Step::Frame(Frame {
                offset,
                header_len,
                packet: &data[header_len..end as usize],
            })
        }
    }
}

/// Iterates the records of an in-memory trace. After it returns `None`,
/// [`Frames::end`] says whether a torn tail or corruption ended it.
pub struct Frames<'a> {
    data: &'a [u8],
    pos: usize,
    packets: u64,
    end: Option<ScanEnd>,
}

/// The records of `data`.
pub fn frames(data: &[u8]) -> Frames<'_> {
    Frames {
        data,
        pos: 0,
        packets: 0,
        end: None,
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Frame<'a>;

    fn next(&mut self) -> Option<Frame<'a>> {
        if self.end.is_some() {
            return None;
        }
        let rest = &self.data[self.pos..];
        let offset = self.pos as u64;
        match step(rest, offset) {
            Step::Frame(f) => {
                self.pos += f.record_len() as usize;
                self.packets += 1;
                Some(f)
            }
            Step::NeedMore => {
                let torn = (!rest.is_empty()).then_some(TornTail {
                    offset,
                    bytes: rest.len() as u64,
                });
                self.end = Some(ScanEnd {
                    bytes: self.data.len() as u64,
                    packets: self.packets,
                    torn_tail: torn,
                    corruption: None,
                });
                None
            }
            Step::Corrupt(e) => {
                self.end = Some(ScanEnd {
                    bytes: offset,
                    packets: self.packets,
                    torn_tail: None,
                    corruption: Some(e),
                });
                None
            }
        }
    }
}

impl Frames<'_> {
    /// How the scan ended; `None` until the iterator is exhausted.
    pub fn end(&self) -> Option<&ScanEnd> {
        self.end.as_ref()
    }
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

/// A packet that is not valid protobuf at the top level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("malformed packet field at byte {at} of the packet")]
pub struct Malformed {
    pub at: usize,
}

/// Protobuf wire values of one field.
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Fixed32,
    Len(&'a [u8]),
}

/// Reads one varint at `*pos` and moves past it; `None` if truncated or
/// longer than ten bytes.
pub fn read_varint(data: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *data.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Walks the top-level fields of a message.
fn for_each_field<'a>(data: &'a [u8], mut f: impl FnMut(u32, Value<'a>)) -> Result<(), Malformed> {
    let mut pos = 0;
    while pos < data.len() {
        let at = pos;
        let bad = Malformed { at };
        let key = read_varint(data, &mut pos).ok_or(bad)?;
        let field = u32::try_from(key >> 3).map_err(|_| bad)?;
        if field == 0 {
            return Err(bad);
        }
        let v = match key & 7 {
            0 => Value::Varint(read_varint(data, &mut pos).ok_or(bad)?),
            1 => {
                pos = pos.checked_add(8).filter(|p| *p <= data.len()).ok_or(bad)?;
                Value::Fixed64
            }
            2 => {
                let len = read_varint(data, &mut pos).ok_or(bad)?;
                let end = usize::try_from(len)
                    .ok()
                    .and_then(|l| pos.checked_add(l))
                    .filter(|e| *e <= data.len())
                    .ok_or(bad)?;
                let s = &data[pos..end];
                pos = end;
                Value::Len(s)
            }
            5 => {
                pos = pos.checked_add(4).filter(|p| *p <= data.len()).ok_or(bad)?;
                Value::Fixed32
            }
            _ => return Err(bad),
        };
        f(field, v);
    }
    Ok(())
}

/// The payload of a `zstd_compressed_packets` packet (field 133), when the
/// packet is one. Writers put that field alone in the packet, so only the
/// first field is looked at (the other packets cost one varint).
pub fn zstd_payload(packet: &[u8]) -> Option<&[u8]> {
    let mut pos = 0;
    let key = read_varint(packet, &mut pos)?;
    if key != u64::from(field::ZSTD_COMPRESSED_PACKETS) << 3 | 2 {
        return None;
    }
    let len = usize::try_from(read_varint(packet, &mut pos)?).ok()?;
    packet.get(pos..pos.checked_add(len)?)
}

/// TracePacket fields outside the `data` oneof (facts §4.2).
const NON_DATA_FIELDS: &[u32] = &[3, 8, 10, 12, 13, 41, 42, 58, 59, 79, 87, 98];

/// TracePacket field numbers.
pub mod field {
    pub const FTRACE_EVENTS: u32 = 1;
    pub const FTRACE_STATS: u32 = 34;
    pub const TIMESTAMP: u32 = 8;
    pub const TRUSTED_PACKET_SEQUENCE_ID: u32 = 10;
    pub const TRACE_STATS: u32 = 35;
    pub const PREVIOUS_PACKET_DROPPED: u32 = 42;
    pub const SERVICE_EVENT: u32 = 69;
    pub const FOR_TESTING: u32 = 900;
    pub const ZSTD_COMPRESSED_PACKETS: u32 = 133;
}

/// The name of a TracePacket `data` field.
pub fn kind_name(field: u32) -> std::borrow::Cow<'static, str> {
    let name = match field {
        1 => "ftrace_events",
        2 => "process_tree",
        4 => "inode_file_map",
        5 => "chrome_events",
        6 => "clock_snapshot",
        7 => "sys_stats",
        9 => "process_stats",
        11 => "track_event",
        33 => "trace_config",
        34 => "ftrace_stats",
        35 => "trace_stats",
        36 => "synchronization_marker",
        37 => "profile_packet",
        43 => "process_descriptor",
        44 => "thread_descriptor",
        45 => "system_info",
        46 => "trigger",
        47 => "packages_list",
        49 => "perfetto_metatrace",
        50 => "compressed_packets",
        60 => "track_descriptor",
        69 => "service_event",
        72 => "extension_descriptor",
        89 => "trace_uuid",
        107 => "remote_clock_sync",
        113 => "clone_snapshot_trigger",
        124 => "trace_provenance",
        125 => "protovms",
        126 => "trace_attributes",
        133 => "zstd_compressed_packets",
        134 => "concurrent_session_event",
        900 => "for_testing",
        n => return format!("field_{n}").into(),
    };
    name.into()
}

/// The name of a TracingServiceEvent field (facts §4.8).
pub fn service_event_name(field: u32) -> std::borrow::Cow<'static, str> {
    let name = match field {
        1 => "all_data_sources_started",
        2 => "tracing_started",
        3 => "all_data_sources_flushed",
        4 => "read_tracing_buffers_completed",
        5 => "tracing_disabled",
        6 => "seized_for_bugreport",
        7 => "slow_starting_data_sources",
        8 => "last_flush_slow_data_sources",
        9 => "flush_started",
        10 => "clone_started",
        11 => "buffer_cloned",
        n => return format!("field_{n}").into(),
    };
    name.into()
}

/// TraceStats.BufferStats field names (facts §4.6).
fn buffer_stat_name(field: u32) -> std::borrow::Cow<'static, str> {
    const NAMES: [&str; 20] = [
        "bytes_written",
        "chunks_written",
        "chunks_overwritten",
        "write_wrap_count",
        "patches_succeeded",
        "patches_failed",
        "readaheads_succeeded",
        "readaheads_failed",
        "abi_violations",
        "chunks_rewritten",
        "chunks_committed_out_of_order",
        "buffer_size",
        "bytes_overwritten",
        "bytes_read",
        "padding_bytes_written",
        "padding_bytes_cleared",
        "chunks_read",
        "chunks_discarded",
        "trace_writer_packet_loss",
        "chunks_relocated",
    ];
    match field.checked_sub(1).and_then(|i| NAMES.get(i as usize)) {
        Some(n) => (*n).into(),
        None => format!("field_{field}").into(),
    }
}

/// TraceStats top-level scalar field names (facts §4.6).
fn trace_stat_name(field: u32) -> std::borrow::Cow<'static, str> {
    let name = match field {
        2 => "producers_connected",
        3 => "producers_seen",
        4 => "data_sources_registered",
        5 => "data_sources_seen",
        6 => "tracing_sessions",
        7 => "total_buffers",
        8 => "chunks_discarded",
        9 => "patches_discarded",
        10 => "invalid_packets",
        12 => "flushes_requested",
        13 => "flushes_succeeded",
        14 => "flushes_failed",
        15 => "final_flush_outcome",
        n => return format!("field_{n}").into(),
    };
    name.into()
}

/// What `inspect` reads of an FtraceEventBundle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BundleInfo {
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
            (2, _) => b.events += 1,
            (3, Value::Varint(x)) => b.lost_events = x != 0,
            (4, Value::Len(cs)) => {
                nested = for_each_field(cs, |cf, cv| {
                    // switch_timestamp / waking_timestamp: one packed varint a row.
                    if let (1 | 7, Value::Len(col)) = (cf, cv) {
                        b.events += col.iter().filter(|&&c| c & 0x80 == 0).count() as u64;
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
pub struct FtraceStatsInfo {
    /// 1 start of trace, 2 end of trace.
    pub phase: u64,
    pub lost_per_cpu: Vec<(u64, u64)>,
}

impl FtraceStatsInfo {
    fn decode(body: &[u8]) -> Result<FtraceStatsInfo, Malformed> {
        let mut s = FtraceStatsInfo::default();
        let mut nested = Ok(());
        for_each_field(body, |f, v| match (f, v) {
            (1, Value::Varint(x)) => s.phase = x,
            (2, Value::Len(c)) => {
                let (mut cpu, mut lost) = (0, 0);
                let r = for_each_field(c, |cf, cv| match (cf, cv) {
                    (1, Value::Varint(x)) => cpu = x,
                    (3 | 8, Value::Varint(x)) => lost += x,
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
            (1, Value::Len(b)) => {
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
pub struct PacketInfo {
    /// Field number of the `data` oneof member present (the last one wins).
    pub kind: Option<u32>,
    pub trusted_packet_sequence_id: Option<u32>,
    pub timestamp: Option<u64>,
    /// Non-zero when data was lost before this packet on its sequence.
    pub previous_packet_dropped: u64,
    /// `for_testing.counter` (0, 1, 2, … per sequence).
    pub for_testing_counter: Option<u64>,
    /// The TracingServiceEvent fields set, in order.
    pub service_events: Vec<u32>,
    /// Decoded when the packet is a `trace_stats` one.
    pub trace_stats: Option<TraceStatsInfo>,
    /// Decoded when the packet is an ftrace bundle.
    pub ftrace_bundle: Option<BundleInfo>,
    /// Decoded when the packet is an `ftrace_stats` one.
    pub ftrace_stats: Option<FtraceStatsInfo>,
}

impl PacketInfo {
    /// Decodes the top-level fields (and the few nested ones `inspect` needs).
    pub fn decode(packet: &[u8]) -> Result<PacketInfo, Malformed> {
        let mut p = PacketInfo::default();
        let mut nested: Option<Malformed> = None;
        for_each_field(packet, |f, v| {
            match (f, &v) {
                (field::TIMESTAMP, Value::Varint(x)) => p.timestamp = Some(*x),
                (field::TRUSTED_PACKET_SEQUENCE_ID, Value::Varint(x)) => {
                    p.trusted_packet_sequence_id = Some(*x as u32);
                }
                (field::PREVIOUS_PACKET_DROPPED, Value::Varint(x)) => {
                    p.previous_packet_dropped = *x
                }
                _ => {}
            }
            if NON_DATA_FIELDS.contains(&f) {
                return;
            }
            p.kind = Some(f);
            let Value::Len(body) = v else { return };
            let r = match f {
                field::FOR_TESTING => for_each_field(body, |tf, tv| {
                    if let (3, Value::Varint(x)) = (tf, tv) {
                        p.for_testing_counter = Some(x);
                    }
                }),
                field::SERVICE_EVENT => for_each_field(body, |sf, _| p.service_events.push(sf)),
                field::TRACE_STATS => TraceStatsInfo::decode(body).map(|s| p.trace_stats = Some(s)),
                field::FTRACE_EVENTS => BundleInfo::decode(body).map(|b| p.ftrace_bundle = Some(b)),
                field::FTRACE_STATS => {
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

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn framed(packets: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in packets {
            out.push(PACKET_TAG);
            varint(p.len() as u64, &mut out);
            out.extend_from_slice(p);
        }
        out
    }

    fn key(field: u32, wt: u64, out: &mut Vec<u8>) {
        varint(u64::from(field) << 3 | wt, out);
    }

    #[test]
    fn empty_file_is_a_valid_trace() {
        let mut f = frames(&[]);
        assert!(f.next().is_none());
        assert_eq!(f.end(), Some(&ScanEnd::default()));
    }

    #[test]
    fn torn_tails_are_not_corruption() {
        let whole = framed(&[b"abc".to_vec(), vec![7u8; 300]]);
        for cut in 0..whole.len() {
            let mut f = frames(&whole[..cut]);
            let n = f.by_ref().count();
            let end = f.end().expect("ended").clone();
            assert!(end.corruption.is_none(), "cut {cut}");
            let first_end = 5;
            assert_eq!(n, usize::from(cut >= first_end), "cut {cut}");
            let torn = end.torn_tail.map_or(0, |t| t.bytes);
            let tail_start = if cut >= first_end { first_end } else { 0 };
            assert_eq!(torn, (cut - tail_start) as u64, "cut {cut}");
        }
    }

    #[test]
    fn a_wrong_tag_is_corruption_at_its_offset() {
        let mut data = framed(&[b"abc".to_vec()]);
        data.extend_from_slice(&[0x12, 0x00]);
        let mut f = frames(&data);
        assert_eq!(f.by_ref().count(), 1);
        let end = f.end().expect("ended");
        assert_eq!(
            end.corruption,
            Some(FramingError::BadTag {
                offset: 5,
                byte: 0x12
            })
        );
        assert_eq!(end.bytes, 5);
    }

    #[test]
    fn an_overlong_length_is_corruption() {
        let data = [
            0x0A, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ];
        let mut f = frames(&data);
        assert_eq!(f.by_ref().count(), 0);
        assert!(matches!(
            f.end().expect("ended").corruption,
            Some(FramingError::BadLength { offset: 0 })
        ));
    }

    #[test]
    fn decodes_the_fields_inspect_needs() {
        let mut p = Vec::new();
        key(8, 0, &mut p);
        varint(123_456, &mut p);
        key(900, 2, &mut p);
        let body = [0x10, 0x07, 0x18, 0x2a]; // seq_value = 7, counter = 42
        varint(body.len() as u64, &mut p);
        p.extend_from_slice(&body);
        key(10, 0, &mut p);
        varint(3, &mut p);
        key(42, 0, &mut p);
        varint(1, &mut p);
        let info = PacketInfo::decode(&p).expect("decodes");
        assert_eq!(info.kind, Some(900));
        assert_eq!(info.timestamp, Some(123_456));
        assert_eq!(info.trusted_packet_sequence_id, Some(3));
        assert_eq!(info.previous_packet_dropped, 1);
        assert_eq!(info.for_testing_counter, Some(42));

        let mut s = Vec::new();
        let mut stats = Vec::new();
        let mut buf0 = Vec::new();
        key(1, 0, &mut buf0);
        varint(999, &mut buf0);
        key(13, 0, &mut buf0);
        varint(5, &mut buf0);
        key(1, 2, &mut stats);
        varint(buf0.len() as u64, &mut stats);
        stats.extend_from_slice(&buf0);
        key(2, 0, &mut stats);
        varint(1, &mut stats);
        key(35, 2, &mut s);
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
