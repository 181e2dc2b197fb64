//! The compression stage of a write pass (ARCHITECTURE.md §7.9): the pass's records,
//! `0x0A <len> <packet>` repeated, are cut into groups of whole records and
//! each group becomes one `zstd_compressed_packets` packet whose payload,
//! once decompressed, is itself `Trace`-framed.
//!
//! ```text
//!  pass:   [rec][rec][rec][rec][rec][rec]        (iovecs into the ring's mmap)
//!           └──── group ────┘└── group ──┘       (≤ GROUP_INPUT_BYTES each)
//!  file:   0A <len> AA 08 <len> <zstd frame>    one record per group
//! ```
//!
//! - The stage reads the ring's memory through the caller's iovecs (no
//!   staging copy of the input) and owns only its output.
//! - A group holds at most [`GROUP_INPUT_BYTES`] of input, so its packet stays
//!   under Perfetto's recommended 512 KiB (`MAX_COMPRESSED_PACKET_BYTES`) whatever the
//!   data (zstd's worst case is bounded by `compress_bound`). A single record
//!   larger than a group is a group of its own and may exceed it.
//! - Each zstd frame carries its content size, so any decoder can size its
//!   output (Python's `zstandard` needs it for one-shot decompression).
//! - Framing that is not `0x0A <varint len>` (never written by the recorder)
//!   ends the record walk; the remaining bytes are compressed in groups cut
//!   by size alone, so nothing the uncompressed path would write is dropped.

use std::io::IoSlice;

use zstd::zstd_safe::{self, CCtx, CParameter, InBuffer, OutBuffer, ResetDirective};

use crate::sys::iov::io_slice_bytes;
use crate::wire::framing::{SlicedRecords, record_header};
use crate::wire::{WireType, key, trace_packet, varint};

/// `TracePacket.zstd_compressed_packets` (ARCHITECTURE.md §7.2).
pub(crate) const ZSTD_COMPRESSED_PACKETS_FIELD: u32 = trace_packet::ZSTD_COMPRESSED_PACKETS;
/// Perfetto's recommended ceiling for one compressed packet ("under 512 KB").
#[cfg(test)]
pub(crate) const MAX_COMPRESSED_PACKET_BYTES: usize = 512 * 1024;
/// Input bytes per compressed packet: zstd's bound on this plus the framing
/// stays under `MAX_COMPRESSED_PACKET_BYTES` (checked by a test).
pub(crate) const GROUP_INPUT_BYTES: usize = 500 * 1024;
/// zstd's own default level, used for `zstd {}` with no level and `--compress`.
pub(crate) const DEFAULT_ZSTD_LEVEL: i32 = 3;

/// zstd refused the work (only a bad parameter or no memory do that).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("zstd compression failed: {0}")]
pub struct CompressError(pub &'static str);

/// The compressed records of one pass; each is two owned parts (the
/// record's framing and the zstd frame) handed to the sink as iovecs.
#[derive(Debug, Default)]
pub struct Compressed {
    records: Vec<(Vec<u8>, Vec<u8>)>,
    /// Input bytes of each record.
    inputs: Vec<u64>,
    /// TracePackets inside each record.
    packets: Vec<u64>,
}

impl Compressed {
    /// The records as iovecs, in order.
    pub fn slices(&self) -> Vec<IoSlice<'_>> {
        let mut v = Vec::with_capacity(self.records.len() * 2);
        for (head, frame) in &self.records {
            v.push(IoSlice::new(head));
            v.push(IoSlice::new(frame));
        }
        v
    }

    /// For the first `written` bytes of [`slices`](Self::slices) (a prefix
    /// of whole records, as a cap keeps): the input bytes they hold and how
    /// many records they are.
    pub(crate) fn input_of_prefix(&self, written: u64) -> (u64, u64) {
        let (mut at, mut input, mut n) = (0u64, 0u64, 0u64);
        for ((head, frame), i) in self.records.iter().zip(&self.inputs) {
            at += (head.len() + frame.len()) as u64;
            if at > written {
                break;
            }
            input += i;
            n += 1;
        }
        (input, n)
    }

    /// The TracePackets inside the first `written` bytes of whole records.
    pub(crate) fn packets_of_prefix(&self, written: u64) -> u64 {
        let (mut at, mut n) = (0u64, 0u64);
        for ((head, frame), p) in self.records.iter().zip(&self.packets) {
            at += (head.len() + frame.len()) as u64;
            if at > written {
                break;
            }
            n += p;
        }
        n
    }

    /// How many compressed packets.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// A reusable zstd compressor for write passes.
pub struct ZstdStage {
    cctx: CCtx<'static>,
    level: i32,
}

impl std::fmt::Debug for ZstdStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZstdStage")
            .field("level", &self.level)
            .finish()
    }
}

fn zstd_err(code: usize) -> CompressError {
    CompressError(zstd_safe::get_error_name(code))
}

impl ZstdStage {
    /// A compressor at `level` (0 means zstd's default).
    pub fn new(level: i32) -> Result<Self, CompressError> {
        let mut cctx = CCtx::try_create().ok_or(CompressError("cannot allocate a context"))?;
        cctx.set_parameter(CParameter::CompressionLevel(level))
            .map_err(zstd_err)?;
        cctx.set_parameter(CParameter::ContentSizeFlag(true))
            .map_err(zstd_err)?;
        Ok(Self { cctx, level })
    }

    pub fn level(&self) -> i32 {
        self.level
    }

    /// Compresses the records of `bufs` into framed compressed packets.
    pub fn compress(&mut self, bufs: &[IoSlice<'_>]) -> Result<Compressed, CompressError> {
        self.compress_in_groups(bufs, GROUP_INPUT_BYTES)
    }

    /// [`compress`](Self::compress) with groups of at most `limit` input bytes.
    fn compress_in_groups(
        &mut self,
        bufs: &[IoSlice<'_>],
        limit: usize,
    ) -> Result<Compressed, CompressError> {
        let (ends, counts) = groups(bufs, limit);
        let mut out = Compressed {
            records: Vec::with_capacity(ends.len()),
            inputs: Vec::with_capacity(ends.len()),
            packets: counts,
        };
        let mut pieces = Pieces::new(bufs);
        let mut start = 0u64;
        for end in ends {
            let frame = self.frame(&mut pieces, end - start)?;
            out.records.push((record_head(frame.len()), frame));
            out.inputs.push(end - start);
            start = end;
        }
        Ok(out)
    }

    /// One zstd frame of the next `len` bytes of `pieces`.
    fn frame(&mut self, pieces: &mut Pieces<'_, '_>, len: u64) -> Result<Vec<u8>, CompressError> {
        self.cctx
            .reset(ResetDirective::SessionOnly)
            .map_err(zstd_err)?;
        self.cctx
            .set_pledged_src_size(Some(len))
            .map_err(zstd_err)?;
        let mut frame: Vec<u8> = Vec::with_capacity(zstd_safe::compress_bound(len as usize));
        let mut left = len;
        while left > 0 {
            let piece = pieces
                .take(left)
                .ok_or(CompressError("input ended early"))?;
            left -= piece.len() as u64;
            let mut input = InBuffer::around(piece);
            while input.pos() < piece.len() {
                reserve(&mut frame);
                let at = frame.len();
                let mut output = OutBuffer::around_pos(&mut frame, at);
                self.cctx
                    .compress_stream2(
                        &mut output,
                        &mut input,
                        zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_continue,
                    )
                    .map_err(zstd_err)?;
            }
        }
        loop {
            reserve(&mut frame);
            let at = frame.len();
            let mut output = OutBuffer::around_pos(&mut frame, at);
            let mut input = InBuffer::around(&[]);
            let remaining = self
                .cctx
                .compress_stream2(
                    &mut output,
                    &mut input,
                    zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_end,
                )
                .map_err(zstd_err)?;
            if remaining == 0 {
                return Ok(frame);
            }
        }
    }
}

/// Keeps some spare capacity for zstd to write into.
fn reserve(v: &mut Vec<u8>) {
    if v.capacity() - v.len() < 4096 {
        v.reserve(64 * 1024);
    }
}

/// The framing of one compressed record: `0x0A <len> AA 08 <len>`.
fn record_head(frame_len: usize) -> Vec<u8> {
    let mut field = Vec::with_capacity(8);
    varint::push(
        &mut field,
        key(ZSTD_COMPRESSED_PACKETS_FIELD, WireType::Len),
    );
    varint::push(&mut field, frame_len as u64);
    // The record's header, then the field's key and length; the frame
    // follows as a slice of its own.
    let (h, n) = record_header(field.len() + frame_len);
    let mut head = Vec::with_capacity(16);
    head.extend_from_slice(&h[..n]);
    head.extend_from_slice(&field);
    head
}

/// Hands out the bytes of a slice list in pieces of bounded length.
struct Pieces<'s, 'a> {
    bufs: &'s [IoSlice<'a>],
    idx: usize,
    off: usize,
}

impl<'s, 'a> Pieces<'s, 'a> {
    fn new(bufs: &'s [IoSlice<'a>]) -> Self {
        Self {
            bufs,
            idx: 0,
            off: 0,
        }
    }

    /// The next run of at most `max` bytes from one slice.
    fn take(&mut self, max: u64) -> Option<&'a [u8]> {
        while self.idx < self.bufs.len() {
            let whole: &'a [u8] = io_slice_bytes(&self.bufs[self.idx]);
            let rest = &whole[self.off..];
            if rest.is_empty() {
                self.idx += 1;
                self.off = 0;
                continue;
            }
            let n = (rest.len() as u64).min(max) as usize;
            self.off += n;
            return Some(&rest[..n]);
        }
        None
    }
}

/// Where each group ends, as byte positions in the stream: whole records,
/// at most `limit` bytes a group unless one record alone is larger. The last
/// entry is the stream's length (none for an empty stream).
#[cfg(test)]
pub(crate) fn group_ends(bufs: &[IoSlice<'_>], limit: usize) -> Vec<u64> {
    groups(bufs, limit).0
}

/// Where each group ends, as byte positions in the stream (whole records,
/// at most `limit` bytes a group unless one record alone is larger; the last
/// entry is the stream's length), with the number of whole records in each
/// group.
fn groups(bufs: &[IoSlice<'_>], limit: usize) -> (Vec<u64>, Vec<u64>) {
    let limit = limit.max(1) as u64;
    let mut walk = SlicedRecords::new(bufs);
    let total = walk.total();
    let (mut ends, mut counts) = (Vec::new(), Vec::new());
    let mut group_start = 0u64;
    let mut last_end = 0u64;
    let mut in_group = 0u64;
    while let Some(end) = walk.next_end() {
        if end - group_start > limit && last_end > group_start {
            ends.push(last_end);
            counts.push(in_group);
            group_start = last_end;
            in_group = 0;
        }
        last_end = end;
        in_group += 1;
    }
    if last_end > group_start {
        ends.push(last_end);
        counts.push(in_group);
        group_start = last_end;
    }
    // Bytes after the last whole record (bad framing): groups by size.
    while group_start < total {
        group_start = (group_start + limit).min(total);
        ends.push(group_start);
        counts.push(0);
    }
    (ends, counts)
}

/// The whole records in `bufs` (a walk over their headers only).
pub(crate) fn count_records(bufs: &[IoSlice<'_>]) -> u64 {
    let mut walk = SlicedRecords::new(bufs);
    let mut n = 0;
    while walk.next_end().is_some() {
        n += 1;
    }
    n
}

/// A compressed payload that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecompressError {
    /// Not a zstd frame, or a damaged one.
    #[error(transparent)]
    Frame(#[from] std::io::Error),
    #[error("decompresses to more than {limit} bytes")]
    TooLarge { limit: usize },
}

/// Decompresses one zstd frame (a `zstd_compressed_packets` payload), refusing
/// output past `limit` bytes (a hostile file cannot make us allocate more).
pub(crate) fn decompress_bounded(frame: &[u8], limit: usize) -> Result<Vec<u8>, DecompressError> {
    use std::io::Read;
    let mut dec = zstd::stream::read::Decoder::with_buffer(frame)?;
    let mut out = Vec::new();
    (&mut dec).take(limit as u64 + 1).read_to_end(&mut out)?;
    if out.len() > limit {
        return Err(DecompressError::TooLarge { limit });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::storage::test_records::{flatten, frame, records, split};

    /// Reads the framed compressed packets back: (payloads decompressed).
    fn unpack(data: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < data.len() {
            assert_eq!(data[pos], crate::wire::framing::PACKET_TAG);
            let mut p = pos + 1;
            let len = varint::read(data, &mut p).expect("len") as usize;
            let packet = &data[p..p + len];
            let mut q = 0;
            let k = varint::read(packet, &mut q).expect("key");
            assert_eq!(k, key(ZSTD_COMPRESSED_PACKETS_FIELD, WireType::Len));
            let flen = varint::read(packet, &mut q).expect("flen") as usize;
            assert_eq!(q + flen, packet.len(), "one field per packet");
            out.push(decompress_bounded(&packet[q..], 1 << 24).expect("decompresses"));
            pos = p + len;
        }
        out
    }

    #[test]
    fn the_group_bound_keeps_packets_under_the_recommended_size() {
        let worst = zstd_safe::compress_bound(GROUP_INPUT_BYTES);
        assert!(record_head(worst).len() + worst < MAX_COMPRESSED_PACKET_BYTES);
    }

    #[test]
    fn incompressible_passes_stay_under_the_limit() {
        let mut data = Vec::new();
        let mut x = 0x1234_5678u32;
        for _ in 0..400 {
            let p: Vec<u8> = (0..9000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            frame(&p, &mut data);
        }
        let bufs = [IoSlice::new(&data)];
        let mut z = ZstdStage::new(1).expect("stage");
        let c = z.compress(&bufs).expect("compresses");
        assert!(c.len() > 1);
        for (head, f) in &c.records {
            assert!(head.len() + f.len() < MAX_COMPRESSED_PACKET_BYTES);
        }
        let out = flatten(&c.slices());
        assert_eq!(unpack(&out).concat(), data);
    }

    #[test]
    fn empty_pass_makes_no_packet() {
        let mut z = ZstdStage::new(DEFAULT_ZSTD_LEVEL).expect("stage");
        assert!(z.compress(&[]).expect("ok").is_empty());
        assert!(z.compress(&[IoSlice::new(&[])]).expect("ok").is_empty());
    }

    #[test]
    fn a_record_larger_than_a_group_is_kept_whole() {
        let mut data = Vec::new();
        frame(&[1u8; 10], &mut data);
        frame(&vec![7u8; 3000], &mut data);
        frame(&[2u8; 10], &mut data);
        let bufs = [IoSlice::new(&data)];
        assert_eq!(group_ends(&bufs, 1000), vec![12, 12 + 3003, 12 + 3003 + 12]);
    }

    #[test]
    fn bad_framing_is_still_written() {
        let mut data = Vec::new();
        frame(b"abc", &mut data);
        data.extend_from_slice(&[0x12, 0x03, 1, 2, 3]);
        let bufs = [IoSlice::new(&data)];
        let mut z = ZstdStage::new(1).expect("stage");
        let out = flatten(&z.compress(&bufs).expect("ok").slices());
        assert_eq!(unpack(&out).concat(), data);
    }

    #[test]
    fn decompression_is_bounded() {
        let big = zstd::bulk::compress(&vec![0u8; 1 << 20], 1).expect("compresses");
        assert!(decompress_bounded(&big, 1000).is_err());
        assert_eq!(
            decompress_bounded(&big, 1 << 20).expect("fits").len(),
            1 << 20
        );
        assert!(decompress_bounded(b"not zstd", 1000).is_err());
    }

    proptest! {
        // Model: concatenating the decompressed payloads gives back the input
        // bytes; every payload is whole records; groups respect the limit
        // unless a single record is larger.
        #[test]
        fn round_trip(
            sizes in proptest::collection::vec(0usize..700, 0..40),
            splits in proptest::collection::vec(0usize..30_000, 0..12),
            limit in 1usize..3000,
        ) {
            let (data, ends) = records(&sizes, |i| (i % 251) as u8);
            let bufs = split(&data, &splits);
            let g = group_ends(&bufs, limit);
            let mut prev = 0u64;
            for e in &g {
                prop_assert!(ends.contains(e));
                let one_record = ends.iter().filter(|x| **x > prev && **x <= *e).count() == 1;
                prop_assert!(e - prev <= limit as u64 || one_record);
                prev = *e;
            }
            prop_assert_eq!(prev, data.len() as u64);
            let mut z = ZstdStage::new(1).expect("stage");
            let c = z.compress_in_groups(&bufs, limit).expect("compresses");
            prop_assert_eq!(c.len(), g.len());
            let payloads = unpack(&flatten(&c.slices()));
            for p in &payloads {
                let mut f = crate::wire::framing::frames(p);
                let n = f.by_ref().count();
                prop_assert!(n > 0);
                prop_assert_eq!(f.end().and_then(|e| e.torn_tail), None);
            }
            prop_assert_eq!(payloads.concat(), data);
        }
    }
}
