//! Oracle for the trace framing reader, `inspect`, and the packet-boundary cut.
//!
//! Input: 2 bytes of cut limit, 1 byte of slice-split step, then the trace.
//! - The slice reader and the streaming reader (fed in uneven reads) agree
//!   on every record, its offset, and how the scan ended.
//! - Records tile the data: their lengths plus the torn tail add up to the
//!   bytes scanned, which is all of it unless corruption stopped the scan.
//! - `inspect::report` counts the same packets and the same ending.
//! - The cut keeps a prefix under the limit made of whole records: reading
//!   the kept bytes finds no torn tail and no corruption.

use std::io::{IoSlice, Read};

use recorder::storage::cut_at_packet_boundary;
use recorder::trace::{inspect, reader};

struct Uneven<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Uneven<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.data.len()).min(self.step);
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.step = self.step % 97 + 13;
        Ok(n)
    }
}

pub fn check(input: &[u8]) {
    if input.len() < 3 {
        return;
    }
    let limit = u64::from(u16::from_le_bytes([input[0], input[1]]));
    let split = usize::from(input[2]) + 1;
    let data = &input[3..];

    let mut frames = reader::frames(data);
    let mut got = Vec::new();
    let mut tiled = 0u64;
    for f in frames.by_ref() {
        assert_eq!(f.offset, tiled, "records are contiguous");
        tiled += f.record_len();
        got.push((f.offset, f.packet.to_vec()));
    }
    let end = frames.end().expect("exhausted iterator has an end").clone();
    let torn = end.torn_tail.map_or(0, |t| t.bytes);
    assert_eq!(tiled + torn, end.bytes);
    assert_eq!(end.packets as usize, got.len());
    if end.corruption.is_none() {
        assert_eq!(end.bytes, data.len() as u64);
    } else {
        assert!(end.torn_tail.is_none());
    }

    let mut streamed = Vec::new();
    let send = reader::scan_reader(Uneven { data, step: split }, "fuzz", |f| {
        streamed.push((f.offset, f.packet.to_vec()))
    })
    .expect("in-memory reads do not fail");
    assert_eq!(streamed, got);
    assert_eq!(send, end);

    let r = inspect::report(data);
    assert_eq!(r.packets as usize, got.len());
    assert_eq!(r.torn_tail_bytes, torn);
    assert_eq!(r.corruption, end.corruption);
    let _ = r.to_string();

    let bufs: Vec<IoSlice<'_>> = data.chunks(split).map(IoSlice::new).collect();
    let (kept, cut) = cut_at_packet_boundary(&bufs, limit);
    let kept_bytes: Vec<u8> = kept.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(kept_bytes.len() as u64, cut.kept_bytes);
    assert_eq!(&kept_bytes[..], &data[..kept_bytes.len()]);
    assert_eq!(cut.cut, kept_bytes.len() < data.len());
    if (data.len() as u64) < limit {
        assert!(!cut.cut);
    } else {
        assert!(cut.kept_bytes < limit || cut.kept_bytes == 0);
        let mut kf = reader::frames(&kept_bytes);
        let n = kf.by_ref().count();
        let kend = kf.end().expect("ended");
        assert!(kend.torn_tail.is_none() && kend.corruption.is_none());
        // Whole records of the original, in order.
        assert!(n <= got.len());
    }
}
