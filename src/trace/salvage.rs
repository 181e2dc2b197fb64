//! A valid trace from the buffers of a recorder that is gone: read back
//! from their files ([`crate::ringbuf::image`]) by the process that saves
//! them when the recorder dies (its keeper, or the root broker), or by
//! `recorder recover` from a `--ring-dir` after every process is gone.
//!
//! ```text
//!  head      clock snapshots (the session's, taken when its buffers were
//!            made; and one now, on the same boot), the sync marker,
//!            trace_config, trace_uuid, system_info (same boot)
//!            — or, appended to a trace the session had begun writing, only
//!            the snapshot and the marker
//!  events    tracing_disabled, recorder_died (the recorder's own event)
//!  data      every buffer in config order, each writer's unread packets in
//!            write order, a loss marker where the writer lost data (before
//!            the death, or to damage found now)
//!  tail      read_tracing_buffers_completed, trace_stats (the counters the
//!            buffers kept), then trace_attributes `recorder.salvage.*`:
//!            who wrote it and what was left out
//! ```
//!
//! What is left out is what cannot be trusted: a packet a writer had begun
//! and not committed (its region is counted open), table entries caught
//! mid-update, and whatever the checks refuse (see the image module).
//! Nothing here trusts the rings: sizes are bounded by the image reader, and
//! packets are copied only once they passed its checks.

use std::io::{self, Write};

use crate::clock::{self, BuiltinClock, ClockReadings};
use crate::ringbuf::image::{Check, Damage, ReadAt, RegionView, RingImage};
use crate::storage::packets::loss_marker;
use crate::trace::service::{
    self, AttributeValue, BufferStatsRecord, ServiceEvent, SystemInfo, TraceStatsRecord,
    WriterStatsRecord,
};

/// Who writes the trace: said in its attributes and summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedBy {
    /// The unprivileged session's keeper, when the recorder died.
    Keeper,
    /// The root session's broker, when the recorder died.
    Broker,
    /// `recorder recover`, from ring files.
    Recover,
}

impl SavedBy {
    /// The name the `recorder.salvage.by` trace attribute carries.
    pub fn name(self) -> &'static str {
        match self {
            SavedBy::Keeper => "keeper",
            SavedBy::Broker => "broker",
            SavedBy::Recover => "recover",
        }
    }
}

/// Whether the output already holds the session's first packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// A new trace: everything a reader needs first.
    Full,
    /// Appended to a trace the session had begun (its config, uuid and
    /// first snapshot are in it).
    Append,
}

/// How to write it.
#[derive(Clone, Copy, Debug)]
pub struct SalvageOptions {
    /// Whether to write a new trace's head or append to one begun.
    pub head: Head,
    /// How closely each packet is checked before it is copied.
    pub check: Check,
    /// Who is writing, for the attributes.
    pub by: SavedBy,
    /// The recorder's pid and, when it is known, the signal that ended it.
    pub pid: Option<u32>,
    /// The signal that ended the recorder, when it is known
    /// (`recorder.salvage.signal`).
    pub signal: Option<i32>,
    /// The trace is segment `index` of a segmented session: it carries the
    /// segment's own trace UUID and names the session and its index, as
    /// every segment does (`service_log`).
    pub segment: Option<u64>,
}

/// One ring to read: what its table says, and its file.
pub struct Ring<'a> {
    /// The ring's header, counters and unread regions, as read from its
    /// file.
    pub image: RingImage,
    /// The ring's file, read again for the regions' bytes.
    pub src: &'a dyn ReadAt,
}

/// What went into the trace and what was left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SalvageReport {
    /// Packets of the buffers written, and their framed bytes.
    pub packets: u64,
    /// Framed bytes of those packets.
    pub bytes: u64,
    /// Loss markers written, one before each writer's packets that follow
    /// lost data.
    pub loss_markers: u64,
    /// Packets written after the buffers' (the kernel's ftrace leftover).
    pub(crate) extra_packets: u64,
    /// Buffers read.
    pub buffers: usize,
    /// Everything every buffer left out.
    pub damage: Damage,
    /// Bytes written in all (the recorder's own packets included); 0 when
    /// the buffers held nothing unread, and then nothing was written.
    pub written: u64,
    /// The rings were made on this boot: their timestamps relate to the
    /// clocks now (a fresh snapshot and system_info were written).
    pub same_boot: bool,
}

impl SalvageReport {
    /// One line for people: what was saved where, and what was left out.
    pub fn summary(&self, out: &str) -> String {
        let d = &self.damage;
        let mut left = Vec::new();
        if d.regions_open > 0 {
            left.push(format!(
                "{} region(s) a writer held (a packet being written in each, if any)",
                d.regions_open
            ));
        }
        if d.entries_mid_update > 0 {
            left.push(format!(
                "{} table entr(ies) caught mid-update",
                d.entries_mid_update
            ));
        }
        if d.regions_in_flight > 0 {
            left.push(format!(
                "{} region(s) a write pass or snapshot held (a pass's bytes taken from them may be missing from the trace)",
                d.regions_in_flight
            ));
        }
        if d.is_damaged() {
            left.push(format!(
                "damage: {} unframed bytes, {} invalid packets ({} bytes), {} invalid and {} overlapping table entries{}{}{}",
                d.bytes_unframed,
                d.packets_invalid,
                d.bytes_invalid,
                d.entries_invalid,
                d.regions_overlapping,
                if d.truncated { ", a file truncated" } else { "" },
                if d.meta_damaged { ", config and clocks unreadable" } else { "" },
                if d.header_copy_damaged { ", a header copy damaged" } else { "" },
            ));
        }
        let left = if left.is_empty() {
            "nothing left out".to_string()
        } else {
            format!("left out: {}", left.join("; "))
        };
        let extra = if self.extra_packets > 0 {
            format!(" and {} of what the kernel still held", self.extra_packets)
        } else {
            String::new()
        };
        format!(
            "{} packets ({}) of {} buffer(s){extra} written to {out}; {left}",
            self.packets,
            crate::bytes::HumanBytes(self.bytes),
            self.buffers,
        )
    }
}

/// `trace_attributes` keys of a salvaged trace.
pub(crate) mod attr {
    pub(crate) const BY: &str = "recorder.salvage.by";
    pub(crate) const PID: &str = "recorder.salvage.pid";
    pub(crate) const SIGNAL: &str = "recorder.salvage.signal";
    pub(crate) const PACKETS: &str = "recorder.salvage.packets";
    pub(crate) const REGIONS_OPEN: &str = "recorder.salvage.regions_open";
    pub(crate) const REGIONS_IN_FLIGHT: &str = "recorder.salvage.regions_in_flight";
    pub(crate) const ENTRIES_MID_UPDATE: &str = "recorder.salvage.entries_mid_update";
    pub(crate) const DAMAGED: &str = "recorder.salvage.damaged";
    pub(crate) const BYTES_UNFRAMED: &str = "recorder.salvage.bytes_unframed";
    pub(crate) const PACKETS_INVALID: &str = "recorder.salvage.packets_invalid";
    pub(crate) const BYTES_INVALID: &str = "recorder.salvage.bytes_invalid";
    pub(crate) const ENTRIES_INVALID: &str = "recorder.salvage.entries_invalid";
    pub(crate) const REGIONS_OVERLAPPING: &str = "recorder.salvage.regions_overlapping";
    pub(crate) const BUFFERS_MISSING: &str = "recorder.salvage.buffers_missing";
}

/// Writes the trace of `rings` (one session's, any order) to `out`. Writes
/// nothing at all when no buffer holds an unread byte (a session idle, or
/// past its final pass). `missing`: buffers of the session that could not
/// be read at all, reported in the attributes.
pub fn salvage(
    rings: &mut [Ring<'_>],
    missing: u32,
    out: &mut dyn Write,
    opts: &SalvageOptions,
) -> io::Result<SalvageReport> {
    salvage_with(rings, missing, &[], out, opts)
}

/// [`salvage`], with `extra`: framed packets of the session's own making
/// that go after the buffers' data (the kernel's ftrace leftover, read by
/// the broker), counted in [`SalvageReport::extra_packets`].
pub(crate) fn salvage_with(
    rings: &mut [Ring<'_>],
    missing: u32,
    extra: &[Vec<u8>],
    out: &mut dyn Write,
    opts: &SalvageOptions,
) -> io::Result<SalvageReport> {
    salvage_into(rings, missing, extra, &mut Streamed(out), opts)
}

/// Where a salvaged trace goes, piece by piece: the recorder's own packets
/// (and loss markers) as bytes, the rings' records as runs read from (or
/// in place in) ring `ring` at byte `at` of its file.
pub(crate) trait SalvageSink {
    fn packets(&mut self, bytes: &[u8]) -> io::Result<()>;
    fn records(&mut self, ring: usize, at: u64, bytes: &[u8]) -> io::Result<()>;
}

/// Writes every piece as it comes.
pub(crate) struct Streamed<'a>(pub &'a mut dyn Write);

impl SalvageSink for Streamed<'_> {
    fn packets(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)
    }

    fn records(&mut self, _ring: usize, _at: u64, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)
    }
}

/// One piece of a gathered trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Owned(Vec<u8>),
    /// `len` bytes at `at` in the file of ring `ring` (its position in the
    /// slice [`salvage_into`] sorted).
    InPlace {
        ring: usize,
        at: u64,
        len: usize,
    },
}

/// Keeps the trace as pieces instead of writing it, for a writer that
/// takes the rings' records in place (from a read-only mapping, straight
/// to the disk).
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    pub pieces: Vec<Piece>,
}

impl SalvageSink for Gathered {
    fn packets(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.pieces.push(Piece::Owned(bytes.to_vec()));
        Ok(())
    }

    fn records(&mut self, ring: usize, at: u64, bytes: &[u8]) -> io::Result<()> {
        self.pieces.push(Piece::InPlace {
            ring,
            at,
            len: bytes.len(),
        });
        Ok(())
    }
}

/// [`salvage_with`] into any [`SalvageSink`]; `rings` are left sorted by
/// buffer index, as the pieces name them.
pub(crate) fn salvage_into(
    rings: &mut [Ring<'_>],
    missing: u32,
    extra: &[Vec<u8>],
    out: &mut dyn SalvageSink,
    opts: &SalvageOptions,
) -> io::Result<SalvageReport> {
    rings.sort_by_key(|r| r.image.header.index);
    let mut report = SalvageReport {
        buffers: rings.len(),
        ..SalvageReport::default()
    };
    let Some(first) = rings.first() else {
        return Ok(report);
    };
    if rings.iter().all(|r| r.image.unread_bytes() == 0) && extra.iter().all(Vec::is_empty) {
        for r in rings.iter() {
            report.damage.add(&r.image.damage);
        }
        return Ok(report);
    }
    let h = &first.image.header;
    let uid = h.uid;
    let meta = rings.iter().find_map(|r| r.image.meta.clone());
    let boot = clock::boot_id();
    report.same_boot = boot != [0; 16] && boot == h.boot_id;
    let session_clocks = meta.as_ref().map(|m| {
        ClockReadings(
            m.clocks
                .iter()
                .filter_map(|&(id, ts)| BuiltinClock::from_id(id).map(|c| (c, ts)))
                .collect(),
        )
    });
    let boottime_of = |r: &ClockReadings| {
        r.0.iter()
            .find(|(c, _)| *c == BuiltinClock::Boottime)
            .map_or(0, |(_, ts)| *ts)
    };
    // On another boot "now" means nothing to these timestamps: the
    // session's own time stands in for it.
    let now = if report.same_boot {
        clock::boottime_ns()
    } else {
        session_clocks.as_ref().map_or(0, boottime_of)
    };
    let mut w = Counting { out, n: 0 };
    let w = &mut w;

    let mut snaps: Vec<ClockReadings> = Vec::new();
    if opts.head == Head::Full {
        snaps.extend(session_clocks.clone());
    }
    if report.same_boot {
        snaps.push(clock::snapshot());
    }
    snaps.sort_by_key(boottime_of);
    for s in &snaps {
        w.packets(&service::clock_snapshot(uid, s))?;
    }
    w.packets(&service::sync_marker(uid))?;
    if opts.head == Head::Full {
        if let Some(m) = meta.as_ref().filter(|m| !m.config.is_empty()) {
            w.packets(&service::trace_config(uid, now, &m.config))?;
        }
        let uuid = match opts.segment {
            Some(index) => crate::storage::segment::segment_uuid(h.uuid, index),
            None => h.uuid,
        };
        w.packets(&service::trace_uuid(uid, now, uuid.0, uuid.1))?;
        if let Some(index) = opts.segment {
            use crate::trace::service_log::{ATTR_SEGMENT_INDEX, ATTR_SESSION_UUID};
            let session = crate::storage::segment::sidecar::uuid_text(h.uuid.0, h.uuid.1);
            w.packets(&service::trace_attributes(
                uid,
                now,
                &[
                    (ATTR_SESSION_UUID, AttributeValue::Text(session)),
                    (
                        ATTR_SEGMENT_INDEX,
                        AttributeValue::Long(i64::try_from(index).unwrap_or(i64::MAX)),
                    ),
                ],
            ))?;
        }
        if report.same_boot {
            w.packets(&service::system_info(uid, now, &SystemInfo::current()))?;
        }
    }
    w.packets(&service::service_event(
        uid,
        now,
        ServiceEvent::TracingDisabled,
    ))?;
    w.packets(&service::service_event(
        uid,
        now,
        ServiceEvent::RecorderDied,
    ))?;

    let mut buf = Vec::new();
    let mut stats = TraceStatsRecord {
        producers_connected: 1,
        producers_seen: 1,
        tracing_sessions: 1,
        ..TraceStatsRecord::default()
    };
    for (index, ring) in rings.iter_mut().enumerate() {
        let regions = std::mem::take(&mut ring.image.regions);
        let mut i = 0;
        while i < regions.len() {
            let writer = regions[i].writer;
            let end = regions[i..]
                .iter()
                .position(|r| r.writer != writer)
                .map_or(regions.len(), |n| i + n);
            let seq = Sequence {
                ring,
                index,
                regions: &regions[i..end],
            };
            write_sequence(seq, opts.check, &mut buf, w, &mut report)?;
            i = end;
        }
        report.damage.add(&ring.image.damage);
        let mut b = BufferStatsRecord::from_engine(&ring.image.stats.unwrap_or_default());
        b.buffer_size =
            u64::from(ring.image.header.chunk_count) * u64::from(ring.image.header.chunk_size);
        stats.buffers.push(b);
        stats
            .writers
            .extend(ring.image.writers.iter().map(|&s| WriterStatsRecord {
                sequence_id: s,
                buffer: ring.image.header.index,
            }));
    }
    stats.total_buffers = stats.buffers.len() as u32;
    for e in extra {
        w.packets(e)?;
        report.extra_packets += crate::wire::framing::frames(e).count() as u64;
    }

    w.packets(&service::service_event(
        uid,
        now,
        ServiceEvent::ReadTracingBuffersCompleted,
    ))?;
    let d = &report.damage;
    let long = |v: u64| AttributeValue::Long(i64::try_from(v).unwrap_or(i64::MAX));
    let mut attrs = vec![
        (attr::BY, AttributeValue::Text(opts.by.name().to_string())),
        (attr::PACKETS, long(report.packets)),
        (attr::REGIONS_OPEN, long(d.regions_open)),
        (attr::REGIONS_IN_FLIGHT, long(d.regions_in_flight)),
        (attr::ENTRIES_MID_UPDATE, long(d.entries_mid_update)),
        (attr::DAMAGED, long(u64::from(d.is_damaged()))),
        (attr::BYTES_UNFRAMED, long(d.bytes_unframed)),
        (attr::PACKETS_INVALID, long(d.packets_invalid)),
        (attr::BYTES_INVALID, long(d.bytes_invalid)),
        (attr::ENTRIES_INVALID, long(d.entries_invalid)),
        (attr::REGIONS_OVERLAPPING, long(d.regions_overlapping)),
        (attr::BUFFERS_MISSING, long(u64::from(missing))),
    ];
    if let Some(pid) = opts.pid {
        attrs.push((attr::PID, long(u64::from(pid))));
    }
    if let Some(sig) = opts.signal {
        attrs.push((attr::SIGNAL, AttributeValue::Long(i64::from(sig))));
    }
    w.packets(&service::trace_stats(uid, now, &stats))?;
    w.packets(&service::trace_attributes(uid, now, &attrs))?;
    report.written = w.n;
    Ok(report)
}

/// One writer's regions (in write order) in ring `index`.
struct Sequence<'r, 'a> {
    ring: &'r mut Ring<'a>,
    index: usize,
    regions: &'r [RegionView],
}

/// One writer's regions: their packets, a loss marker first where the
/// writer lost data, and after damage found on the way.
fn write_sequence(
    seq: Sequence<'_, '_>,
    check: Check,
    buf: &mut Vec<u8>,
    w: &mut Counting<'_>,
    report: &mut SalvageReport,
) -> io::Result<()> {
    let Sequence {
        ring,
        index,
        regions,
    } = seq;
    let mut pending = false;
    for r in regions {
        pending |= r.loss_before;
        let before = ring.image.damage;
        let writer = r.writer;
        let got = ring
            .image
            .read_region(ring.src, r, check, buf, &mut |at, records| {
                if pending {
                    w.packets(&loss_marker(writer))?;
                    report.loss_markers += 1;
                    pending = false;
                }
                w.records(index, at, records)
            })?;
        report.packets += got.packets;
        report.bytes += got.bytes;
        let after = ring.image.damage;
        // Packets left out here: whatever comes next follows a loss.
        if after.bytes_unframed > before.bytes_unframed
            || after.packets_invalid > before.packets_invalid
            || after.regions_beyond_end > before.regions_beyond_end
        {
            pending = true;
        }
    }
    Ok(())
}

/// A sink that counts what went through.
struct Counting<'a> {
    out: &'a mut dyn SalvageSink,
    n: u64,
}

impl Counting<'_> {
    fn packets(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.packets(bytes)?;
        self.n += bytes.len() as u64;
        Ok(())
    }

    fn records(&mut self, ring: usize, at: u64, bytes: &[u8]) -> io::Result<()> {
        self.out.records(ring, at, bytes)?;
        self.n += bytes.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ringbuf::{Backing, Buffer, BufferParams, FillPolicy, RingIdentity, WriterId};
    use protobuf::Message;

    fn ring(index: u32, count: u32) -> std::sync::Arc<Buffer> {
        let params = BufferParams {
            size_bytes: 64 * 256,
            chunk_size: 256,
            region_chunks: 2,
            policy: FillPolicy::RingBuffer,
            prefault: false,
        };
        let identity = RingIdentity {
            index,
            count,
            uuid: (3, 4),
            uid: 1000,
            pid: 77,
            boot_id: clock::boot_id(),
            clocks: clock::snapshot()
                .0
                .iter()
                .map(|(c, ts)| (*c as u32, *ts))
                .collect(),
            config: vec![0x10, 0x01],
            ..RingIdentity::default()
        };
        Buffer::create(params, Backing::Memfd, &identity).expect("memfd")
    }

    fn test_packet(seq: u32, counter: u64) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        let mut e = crate::trace::encoder::ProtoEncoder::new(&mut buf);
        e.uint(
            crate::wire::trace_packet::TRUSTED_PACKET_SEQUENCE_ID,
            u64::from(seq),
        );
        let t = e.begin_nested(crate::wire::trace_packet::FOR_TESTING);
        e.uint(crate::wire::test_event::COUNTER, counter);
        e.end_nested(t);
        let n = e.finish().expect("fits");
        buf.truncate(n);
        buf
    }

    fn salvaged(buffers: &[&std::sync::Arc<Buffer>], head: Head) -> (Vec<u8>, SalvageReport) {
        let fds: Vec<_> = buffers
            .iter()
            .map(|b| {
                b.shared_file()
                    .expect("shared")
                    .try_clone_to_owned()
                    .expect("dup")
            })
            .collect();
        let mut rings: Vec<Ring<'_>> = fds
            .iter()
            .map(|fd| Ring {
                image: RingImage::read(fd).expect("a ring"),
                src: fd,
            })
            .collect();
        let mut out = Vec::new();
        let opts = SalvageOptions {
            head,
            check: Check::Packets,
            by: SavedBy::Keeper,
            pid: Some(77),
            signal: Some(9),
            segment: None,
        };
        let report = salvage(&mut rings, 0, &mut out, &opts).expect("writes");
        (out, report)
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd is not available under miri")]
    fn a_saved_trace_holds_the_head_every_unread_packet_and_says_the_recorder_died() {
        let (a, b) = (ring(0, 2), ring(1, 2));
        let mut w2 = a.writer(WriterId(2));
        let mut w3 = b.writer(WriterId(3));
        for n in 0..50 {
            w2.write_packet(&test_packet(2, n)).expect("fits");
            w3.write_packet(&test_packet(3, n)).expect("fits");
        }
        let (out, report) = salvaged(&[&b, &a], Head::Full);
        assert_eq!(report.packets, 100);
        assert_eq!(report.buffers, 2);
        assert!(report.same_boot);
        assert_eq!(report.written, out.len() as u64);
        let trace = perfetto_protos::trace::Trace::parse_from_bytes(&out).expect("decodes");
        let p = &trace.packet;
        assert!(p[0].has_clock_snapshot() && p[1].has_clock_snapshot());
        assert!(p.iter().any(|p| p.has_trace_config()));
        assert!(p.iter().any(|p| p.has_trace_uuid()));
        let died = p
            .iter()
            .filter(|p| p.has_service_event())
            .filter(|p| {
                p.service_event()
                    .special_fields
                    .unknown_fields()
                    .get(crate::wire::tracing_service_event::RECORDER_DIED)
                    .is_some()
            })
            .count();
        assert_eq!(died, 1);
        let counters: Vec<(u32, u64)> = p
            .iter()
            .filter(|p| p.has_for_testing())
            .map(|p| (p.trusted_packet_sequence_id(), p.for_testing().counter()))
            .collect();
        let want: Vec<(u32, u64)> = (0..50)
            .map(|n| (2, n))
            .chain((0..50).map(|n| (3, n)))
            .collect();
        assert_eq!(counters, want, "buffer 0 first, each writer in order");
        // trace_attributes (126) is newer than the decoder's schema.
        let last = p.last().expect("attributes last");
        assert!(last.special_fields.unknown_fields().get(126).is_some());
        assert!(p[p.len() - 2].has_trace_stats());
        let stats = p[p.len() - 2].trace_stats();
        assert_eq!(stats.buffer_stats.len(), 2);
        assert_eq!(stats.writer_stats.len(), 2);
        let summary = report.summary("OUT");
        assert!(
            summary.contains("100 packets") && summary.contains("OUT"),
            "{summary}"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd is not available under miri")]
    fn nothing_unread_writes_nothing_and_an_appended_save_repeats_no_config() {
        let a = ring(0, 1);
        let mut w = a.writer(WriterId(2));
        for n in 0..10 {
            w.write_packet(&test_packet(2, n)).expect("fits");
        }
        a.take_flush().release();
        let (out, report) = salvaged(&[&a], Head::Full);
        assert!(out.is_empty() && report.written == 0, "{report:?}");
        w.write_packet(&test_packet(2, 10)).expect("fits");
        let (out, report) = salvaged(&[&a], Head::Append);
        assert_eq!(report.packets, 1);
        let trace = perfetto_protos::trace::Trace::parse_from_bytes(&out).expect("decodes");
        assert!(
            !trace
                .packet
                .iter()
                .any(|p| p.has_trace_config() || p.has_trace_uuid())
        );
        assert_eq!(
            trace
                .packet
                .iter()
                .filter(|p| p.has_for_testing())
                .map(|p| p.for_testing().counter())
                .collect::<Vec<_>>(),
            vec![10]
        );
    }
}
