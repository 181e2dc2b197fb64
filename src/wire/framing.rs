//! The framing of a trace file and of the ring buffers' chunks: a serialized
//! `Trace` is nothing but its `packet` field repeated.
//!
//! ```text
//!  file   := record*  [torn tail]
//!  record := 0x0A  <varint len>  <len bytes: TracePacket>
//!  torn   := 0x0A [<partial varint> | <varint len> <fewer than len bytes>]
//! ```
//!
//! A record cut off by the end of the data (a crash mid-write) is a torn
//! tail, reported apart from corruption; anything else that is not
//! `0x0A <len>` is corruption at that offset, and a walk stops there.

use std::ops::Deref;

use super::key::{WireType, key_byte};
use super::numbers::trace;
use super::varint;

/// The key of `Trace.packet` (field 1, length-delimited): `0x0A`.
pub const PACKET_TAG: u8 = key_byte(trace::PACKET, WireType::Len);
/// A declared packet length past this is corruption, not a torn tail.
pub const MAX_PACKET_BYTES: u64 = 1 << 32;
/// Most bytes a record header (tag and length) takes.
pub(crate) const MAX_HEADER_BYTES: usize = 1 + varint::MAX_LEN;

/// One record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Offset of the record's tag byte.
    pub offset: u64,
    /// Bytes of tag + length varint.
    pub(crate) header_len: usize,
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
    /// A record starts with a byte other than [`PACKET_TAG`]: the bytes
    /// there are not a `Trace.packet` field.
    #[error("offset {offset}: expected a packet record (tag 0x0a), found byte {byte:#04x}")]
    BadTag {
        /// Offset of the byte where a tag was expected.
        offset: u64,
        /// The byte found there.
        byte: u8,
    },
    /// The length varint after the tag is overlong, or declares more than
    /// [`MAX_PACKET_BYTES`].
    #[error("offset {offset}: malformed packet length")]
    BadLength {
        /// Offset of the record's tag byte.
        offset: u64,
    },
}

impl FramingError {
    /// Where the broken record starts.
    pub fn offset(&self) -> u64 {
        match self {
            FramingError::BadTag { offset, .. } | FramingError::BadLength { offset } => *offset,
        }
    }
}

/// An incomplete last record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TornTail {
    /// Offset of the incomplete record's tag byte.
    pub offset: u64,
    /// Bytes from there to the end of the data.
    pub bytes: u64,
}

/// How a walk ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScanEnd {
    /// Bytes looked at (all of them unless corruption stopped the walk).
    pub bytes: u64,
    /// Whole records walked.
    pub packets: u64,
    /// The incomplete record the data ends in, if any (a crash mid-write).
    pub torn_tail: Option<TornTail>,
    /// The framing error that stopped the walk, if any.
    pub corruption: Option<FramingError>,
}

/// A record header read from the front of some bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Header {
    /// A whole header: its length and the packet length it declares.
    Whole {
        header_len: usize,
        len: u64,
    },
    /// The data ends inside the header.
    Incomplete,
    Corrupt(FramingError),
}

/// Reads the record header at the start of `data` (`offset` names where
/// `data` starts, for errors).
pub(crate) fn parse_header(data: &[u8], offset: u64) -> Header {
    let Some(&tag) = data.first() else {
        return Header::Incomplete;
    };
    if tag != PACKET_TAG {
        return Header::Corrupt(FramingError::BadTag { offset, byte: tag });
    }
    match varint::decode(&data[1..]) {
        Ok((len, _)) if len > MAX_PACKET_BYTES => {
            Header::Corrupt(FramingError::BadLength { offset })
        }
        Ok((len, n)) => Header::Whole {
            header_len: 1 + n,
            len,
        },
        Err(varint::VarintError::Truncated) => Header::Incomplete,
        Err(varint::VarintError::Overlong) => Header::Corrupt(FramingError::BadLength { offset }),
    }
}

/// What the front of some bytes holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step<'a> {
    Frame(Frame<'a>),
    /// The rest is an incomplete record (or nothing, when empty).
    NeedMore,
    Corrupt(FramingError),
}

/// The record at the start of `data`, which starts at `offset`.
pub(crate) fn step(data: &[u8], offset: u64) -> Step<'_> {
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

/// Iterates the records of in-memory data. After it returns `None`,
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
    /// How the walk ended; `None` until the iterator is exhausted.
    pub fn end(&self) -> Option<&ScanEnd> {
        self.end.as_ref()
    }
}

/// The header of a record holding `packet_len` bytes, with its length.
#[inline]
pub(crate) fn record_header(packet_len: usize) -> ([u8; MAX_HEADER_BYTES], usize) {
    let mut h = [0u8; MAX_HEADER_BYTES];
    h[0] = PACKET_TAG;
    let n = varint::put(&mut h[1..], packet_len as u64).unwrap_or(varint::MAX_LEN);
    (h, 1 + n)
}

/// Appends `packet` as one record.
pub(crate) fn push_record(out: &mut Vec<u8>, packet: &[u8]) {
    let (h, n) = record_header(packet.len());
    out.extend_from_slice(&h[..n]);
    out.extend_from_slice(packet);
}

/// `packet` as one record.
pub fn record(packet: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(packet.len() + MAX_HEADER_BYTES);
    push_record(&mut out, packet);
    out
}

/// Walks the record headers of data held in several slices (a write pass's
/// iovecs), where a record may span slices. Only headers are read; bodies
/// are skipped.
pub(crate) struct SlicedRecords<'s, S> {
    bufs: &'s [S],
    idx: usize,
    off: usize,
    pos: u64,
    total: u64,
}

impl<'s, S: Deref<Target = [u8]>> SlicedRecords<'s, S> {
    pub(crate) fn new(bufs: &'s [S]) -> Self {
        Self {
            bufs,
            idx: 0,
            off: 0,
            pos: 0,
            total: bufs.iter().map(|b| b.len() as u64).sum(),
        }
    }

    /// Bytes in all the slices.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Copies up to `out.len()` bytes from the current position without
    /// moving; how many were there.
    fn peek(&self, out: &mut [u8]) -> usize {
        let (mut idx, mut off, mut n) = (self.idx, self.off, 0);
        while n < out.len() && idx < self.bufs.len() {
            let b = &self.bufs[idx][off..];
            let k = b.len().min(out.len() - n);
            out[n..n + k].copy_from_slice(&b[..k]);
            n += k;
            idx += 1;
            off = 0;
        }
        n
    }

    fn skip(&mut self, mut n: u64) {
        self.pos += n;
        while n > 0 && self.idx < self.bufs.len() {
            let room = (self.bufs[self.idx].len() - self.off) as u64;
            if n < room {
                self.off += n as usize;
                return;
            }
            n -= room;
            self.idx += 1;
            self.off = 0;
        }
    }

    /// The end (offset just past it) of the next whole record, or `None` at
    /// the end of the data, at a record cut off by it, or at framing that is
    /// not a record (the walk stays there).
    pub(crate) fn next_end(&mut self) -> Option<u64> {
        let mut h = [0u8; MAX_HEADER_BYTES];
        let n = self.peek(&mut h);
        let Header::Whole { header_len, len } = parse_header(&h[..n], self.pos) else {
            return None;
        };
        let end = self
            .pos
            .checked_add(header_len as u64 + len)
            .filter(|e| *e <= self.total)?;
        self.skip(end - self.pos);
        Some(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(packets: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in packets {
            push_record(&mut out, p);
        }
        out
    }

    #[test]
    fn the_packet_tag() {
        assert_eq!(PACKET_TAG, 0x0A);
        assert_eq!(record(b"abc"), vec![0x0a, 3, b'a', b'b', b'c']);
    }

    #[test]
    fn empty_data_is_a_valid_trace() {
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
        let too_long = record_header(MAX_PACKET_BYTES as usize + 1);
        assert!(matches!(
            parse_header(&too_long.0[..too_long.1], 9),
            Header::Corrupt(FramingError::BadLength { offset: 9 })
        ));
    }

    proptest! {
        // Oracle: prost encodes the Trace (field 1 repeated); both walks
        // give back the packets, however the bytes are split.
        #[test]
        fn walks_what_prost_frames(
            packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20),
            splits in proptest::collection::vec(0usize..8000, 0..10),
            garbage in proptest::collection::vec(any::<u8>(), 0..4),
        ) {
            let mut data = Vec::new();
            prost::encoding::bytes::encode_repeated(1, &packets, &mut data);
            prop_assert_eq!(&data, &framed(&packets));
            let got: Vec<Vec<u8>> = frames(&data).map(|f| f.packet.to_vec()).collect();
            prop_assert_eq!(&got, &packets);

            let mut ends = Vec::new();
            let mut at = 0u64;
            for p in &packets {
                at += (record_header(p.len()).1 + p.len()) as u64;
                ends.push(at);
            }
            data.extend_from_slice(&garbage);
            let mut cuts: Vec<usize> = splits.iter().map(|s| s % (data.len() + 1)).collect();
            cuts.sort_unstable();
            let mut bufs: Vec<&[u8]> = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain(std::iter::once(data.len())) {
                bufs.push(&data[from..c]);
                from = c;
            }
            let mut walk = SlicedRecords::new(&bufs);
            let mut got_ends = Vec::new();
            while let Some(e) = walk.next_end() {
                got_ends.push(e);
            }
            // Trailing garbage can itself frame records; those come after ours.
            prop_assert_eq!(&got_ends[..ends.len()], &ends[..]);
            let whole: Vec<u64> = {
                let mut f = frames(&data);
                let v: Vec<u64> = f.by_ref().map(|r| r.offset + r.record_len()).collect();
                v
            };
            prop_assert_eq!(got_ends, whole);
        }
    }
}
