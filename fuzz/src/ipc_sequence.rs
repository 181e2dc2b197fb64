//! Oracle for the SMB chunk reader (a producer's writer sequence): any run
//! of chunks and patches, however malformed, leaves only well-formed packets
//! in the ring, each ending in the trusted fields with the sequence's id, uid
//! and pid; everything else is a counted refusal; the producer's memory
//! budget balances once the sequence finishes. Never a panic.
//!
//! Input: records of `[op][len u16 LE][bytes]`: op even → a chunk (the bytes,
//! header included, padded to 64), committed, or with op bit 1 read by
//! scraping (complete when op bit 2 is set), op odd → a patch of the chunk
//! id in the bytes' first 4, offset in the next 4, data the next 4, `done`
//! from op.

use recorder::producer::sequence::{Budget, Sequence, Trust, acceptable};
use recorder::producer::stats::ProducerStats;
use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId};

const BUDGET: usize = 1 << 20;
const SUFFIX: [u8; 8] = [3 << 3, 0xE8, 0x07, 10 << 3, 9, 0xF8, 0x04, 42];

pub fn check(data: &[u8]) {
    let buffer = Buffer::new(BufferParams::new(1 << 20, FillPolicy::RingBuffer)).expect("buffer");
    let trust = Trust {
        uid: 1000,
        pid: 42,
        sequence_id: 9,
    };
    let mut seq = Sequence::new(buffer.writer(WriterId(9)), trust);
    let mut stats = ProducerStats::default();
    let mut budget = Budget {
        left: BUDGET,
        short: 0,
    };
    let mut rest = data;
    while rest.len() >= 3 {
        let op = rest[0];
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let body = &rest[3..3 + len];
        rest = &rest[3 + len..];
        if op.is_multiple_of(2) {
            let mut chunk = body.to_vec();
            chunk.resize(chunk.len().max(64), 0);
            if op & 2 == 0 {
                seq.on_chunk(&chunk, &mut stats, &mut budget);
            } else {
                seq.on_scraped(&chunk, op & 4 != 0, &mut stats, &mut budget);
            }
        } else if body.len() >= 12 {
            let id = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
            let off = u32::from_le_bytes([body[4], body[5], body[6], body[7]]);
            seq.patch(
                id,
                &[(off, &body[8..12])],
                op & 2 == 0,
                &mut stats,
                &mut budget,
            );
        }
        assert!(budget.left <= BUDGET, "budget grew past its start");
    }
    seq.finish(&mut stats, &mut budget);
    drop(seq);
    assert_eq!(budget.left, BUDGET, "held memory was not all given back");
    let batch = buffer.take_flush();
    let mut n = 0;
    for item in batch.items() {
        let FlushItem::Data(bytes) = item else {
            continue;
        };
        let mut frames = recorder::wire::framing::frames(bytes);
        for frame in frames.by_ref() {
            let packet = frame.packet;
            let len = packet.len();
            // The producer's part is well-formed; the suffix is ours.
            let (ours, dropped) = if packet.ends_with(&[0xD0, 0x02, 1]) {
                (&packet[..len - 3], true)
            } else {
                (packet, false)
            };
            assert!(
                ours.ends_with(&SUFFIX),
                "trusted fields appended: {packet:?} {dropped}"
            );
            assert!(
                acceptable(&ours[..ours.len() - SUFFIX.len()]),
                "only acceptable packets"
            );
            n += 1;
        }
        let end = frames.end().expect("walked to the end");
        assert!(
            end.torn_tail.is_none() && end.corruption.is_none(),
            "framing"
        );
    }
    assert_eq!(n, stats.packets, "every stored packet counted once");
}
