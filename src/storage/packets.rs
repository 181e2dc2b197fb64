//! The packets the write path adds to what the ring buffers hold: loss
//! markers, where a writer's data was lost, and padding packets.
//!
//! Padding packets are TracePackets that carry nothing, of any length from 2
//! bytes, so that a file written with `O_DIRECT` can fill each write up to
//! the block size and stay a valid trace.
//!
//! ```text
//!  2..=6 B   0A  <0 as a varint of 1..=5 bytes>              an empty packet
//!  7 B up    0A  <len>  BA 03 <n>  <n zero bytes>            field 55, bytes
//! ```
//!
//! Field 55 of TracePacket is reserved (ARCHITECTURE.md §7.2): Perfetto will not give
//! it a meaning, and every reader skips a field it does not know. The
//! length varints may be wider than needed (a redundant varint, as slot
//! headers use), so that any total length can be hit exactly. Trace
//! processor imports such packets without a stat; the independent decoders
//! see packets with no known field.

/// The reserved TracePacket field the padding bytes go in.
pub const PADDING_FIELD: u32 = crate::wire::trace_packet::PADDING;
/// The shortest padding packet: `0A 00`.
pub(crate) const MIN_PADDING: usize = 2;
/// Widest varint used (as wide as the widest slot header's).
const MAX_VARINT: usize = 5;

use crate::wire::framing::{PACKET_TAG, record};
use crate::wire::key::{WireType, key};
use crate::wire::trace_packet as tp;
use crate::wire::varint::{self, len_usize as varint_len, put_width as put_varint};

/// The packet standing where a sequence lost data: it carries only the
/// sequence id and `previous_packet_dropped`, so trace processor counts the
/// loss and resets that sequence's incremental state at exactly that point.
/// Framed, ready for the file.
pub fn loss_marker(sequence_id: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(8);
    varint::push(
        &mut p,
        key(tp::TRUSTED_PACKET_SEQUENCE_ID, WireType::Varint),
    );
    varint::push(&mut p, u64::from(sequence_id));
    varint::push(&mut p, key(tp::PREVIOUS_PACKET_DROPPED, WireType::Varint));
    varint::push(&mut p, 1);
    record(&p)
}

/// Fills `out` with one padding packet of exactly `out.len()` bytes.
/// Returns false (and writes nothing) for a length that cannot hold one:
/// 0, 1, or above 2^28 bytes.
pub(crate) fn write_padding(out: &mut [u8]) -> bool {
    let n = out.len();
    if !(MIN_PADDING..(1 << 28)).contains(&n) {
        return false;
    }
    out[0] = PACKET_TAG;
    if n <= 1 + MAX_VARINT {
        put_varint(&mut out[1..], 0, n - 1);
        return true;
    }
    // 0A <len: w1 bytes> BA 03 <inner: w2 bytes> <inner zero bytes>
    let tag = key(PADDING_FIELD, WireType::Len) as usize;
    let tag_len = varint_len(tag);
    for w1 in 1..=MAX_VARINT {
        let body = n - 1 - w1;
        if varint_len(body) > w1 || body < tag_len + 1 {
            continue;
        }
        for w2 in 1..=MAX_VARINT {
            let Some(inner) = body.checked_sub(tag_len + w2) else {
                break;
            };
            if varint_len(inner) > w2 {
                continue;
            }
            put_varint(&mut out[1..], body, w1);
            let at = 1 + w1;
            put_varint(&mut out[at..], tag, tag_len);
            put_varint(&mut out[at + tag_len..], inner, w2);
            out[at + tag_len + w2..].fill(0);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::Message;

    #[test]
    fn every_length_is_one_packet_with_nothing_known_in_it() {
        let lengths = (2..600).chain([4095, 4096, 8191, 16_383, 16_384, 16_385, 1 << 21]);
        for n in lengths {
            let mut buf = vec![0xEEu8; n];
            assert!(write_padding(&mut buf), "length {n}");
            let frames: Vec<_> = crate::wire::framing::frames(&buf).collect();
            assert_eq!(frames.len(), 1, "length {n}: one record");
            let trace = perfetto_protos::trace::Trace::parse_from_bytes(&buf)
                .unwrap_or_else(|e| panic!("length {n}: {e}"));
            assert_eq!(trace.packet.len(), 1);
            let p = &trace.packet[0];
            assert!(p.data.is_none() && !p.has_timestamp(), "length {n}");
            let unknown = p.special_fields.unknown_fields();
            assert_eq!(unknown.iter().count(), usize::from(n > 1 + MAX_VARINT));
            assert!(unknown.iter().all(|(f, _)| f == PADDING_FIELD));
        }
    }

    #[test]
    fn a_loss_marker_is_the_sequence_and_the_drop_flag_alone() {
        let m = loss_marker(300);
        let trace = perfetto_protos::trace::Trace::parse_from_bytes(&m).expect("decodes");
        assert_eq!(trace.packet.len(), 1);
        let p = &trace.packet[0];
        assert_eq!(p.trusted_packet_sequence_id(), 300);
        assert!(p.previous_packet_dropped());
        assert!(p.data.is_none() && !p.has_timestamp());
        assert_eq!(p.special_fields.unknown_fields().iter().count(), 0);
    }

    #[test]
    fn lengths_that_hold_no_packet_are_refused() {
        assert!(!write_padding(&mut []));
        assert!(!write_padding(&mut [0]));
    }
}
