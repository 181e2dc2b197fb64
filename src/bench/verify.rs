//! Checks a bench trace on its own terms: walks the file's framing and,
//! with a small wire decoder, reads the `for_testing` counter of every test
//! packet per sequence, so the loss the file shows can be set against the
//! loss the buffer counted.

use std::collections::BTreeMap;

use serde::Serialize;

/// TracePacket fields read here.
const TRUSTED_PACKET_SEQUENCE_ID: u64 = 10;
const FOR_TESTING: u64 = 900;
/// TestEvent.counter.
const COUNTER: u64 = 3;

/// Why a trace did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("byte {offset}: record tag {tag:#04x}, not a packet (0x0a)")]
    NotAPacket { offset: usize, tag: u8 },
    #[error("byte {offset}: malformed varint")]
    Varint { offset: usize },
    #[error("byte {offset}: packet of {len} bytes runs past the end ({size} bytes)")]
    Torn {
        offset: usize,
        len: u64,
        size: usize,
    },
    #[error("packet at byte {offset}: malformed field")]
    Field { offset: usize },
}

/// One sequence's test packets as found in the file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SequenceFound {
    /// Test packets found.
    pub packets: u64,
    /// Their framed bytes.
    pub bytes: u64,
    pub first_counter: Option<u64>,
    pub last_counter: Option<u64>,
    /// Counters missing between the first and the last.
    pub gaps: u64,
    /// A counter that did not increase (out of order or duplicated).
    pub disorder: u64,
}

/// What the file holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TraceFound {
    /// Every packet (service packets too).
    pub packets: u64,
    pub sequences: BTreeMap<u32, SequenceFound>,
}

fn varint(data: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *data.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Calls `f(field, wire_type, varint value or payload)` for each field of `msg`.
fn fields(msg: &[u8], mut f: impl FnMut(u64, u64, u64, &[u8])) -> Option<()> {
    let mut pos = 0;
    while pos < msg.len() {
        let key = varint(msg, &mut pos)?;
        let (field, wt) = (key >> 3, key & 7);
        match wt {
            0 => {
                let v = varint(msg, &mut pos)?;
                f(field, wt, v, &[]);
            }
            1 => {
                let end = pos.checked_add(8).filter(|&e| e <= msg.len())?;
                pos = end;
            }
            2 => {
                let len = varint(msg, &mut pos)? as usize;
                let end = pos.checked_add(len).filter(|&e| e <= msg.len())?;
                f(field, wt, 0, &msg[pos..end]);
                pos = end;
            }
            5 => {
                let end = pos.checked_add(4).filter(|&e| e <= msg.len())?;
                pos = end;
            }
            _ => return None,
        }
    }
    Some(())
}

/// Decodes a whole trace (no torn tail allowed: a bench file is complete).
pub fn decode(data: &[u8]) -> Result<TraceFound, DecodeError> {
    let mut found = TraceFound::default();
    let mut pos = 0;
    while pos < data.len() {
        let offset = pos;
        if data[pos] != 0x0a {
            return Err(DecodeError::NotAPacket {
                offset,
                tag: data[pos],
            });
        }
        pos += 1;
        let len = varint(data, &mut pos).ok_or(DecodeError::Varint { offset })?;
        let end = pos
            .checked_add(len as usize)
            .filter(|&e| e <= data.len())
            .ok_or(DecodeError::Torn {
                offset,
                len,
                size: data.len(),
            })?;
        let packet = &data[pos..end];
        pos = end;
        found.packets += 1;
        let mut seq = None;
        let mut counter = None;
        fields(packet, |field, wt, v, payload| match (field, wt) {
            (TRUSTED_PACKET_SEQUENCE_ID, 0) => seq = Some(v as u32),
            (FOR_TESTING, 2) => {
                counter = Some(0);
                // A malformed TestEvent surfaces below as a missing counter.
                let _ = fields(payload, |f, w, v, _| {
                    if (f, w) == (COUNTER, 0) {
                        counter = Some(v);
                    }
                });
            }
            _ => {}
        })
        .ok_or(DecodeError::Field { offset })?;
        if let (Some(seq), Some(counter)) = (seq, counter) {
            let s = found.sequences.entry(seq).or_default();
            s.packets += 1;
            s.bytes += (end - offset) as u64;
            match s.last_counter {
                Some(last) if counter > last => s.gaps += counter - last - 1,
                Some(_) => s.disorder += 1,
                None => s.first_counter = Some(counter),
            }
            if s.last_counter.is_none_or(|l| counter > l) {
                s.last_counter = Some(counter);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::for_testing::encode_test_packet;
    use crate::trace::service::frame;

    fn packet(seq: u32, counter: u64) -> Vec<u8> {
        let mut buf = [0u8; 128];
        let n = encode_test_packet(&mut buf, seq, 1000 + counter, counter, 7, b"xyz", false)
            .expect("fits");
        frame(&buf[..n])
    }

    #[test]
    fn counts_gaps_per_sequence() {
        let mut file = Vec::new();
        for (seq, c) in [(2, 0), (3, 5), (2, 1), (2, 4), (3, 6), (2, 9)] {
            file.extend(packet(seq, c));
        }
        let found = decode(&file).expect("decodes");
        assert_eq!(found.packets, 6);
        let s2 = &found.sequences[&2];
        assert_eq!((s2.packets, s2.gaps, s2.disorder), (4, 2 + 4, 0));
        assert_eq!((s2.first_counter, s2.last_counter), (Some(0), Some(9)));
        let s3 = &found.sequences[&3];
        assert_eq!((s3.packets, s3.gaps, s3.first_counter), (2, 0, Some(5)));
        assert_eq!(s2.bytes + s3.bytes, file.len() as u64);
    }

    #[test]
    fn disorder_and_corruption_are_seen() {
        let mut file = packet(2, 3);
        file.extend(packet(2, 3));
        assert_eq!(decode(&file).expect("decodes").sequences[&2].disorder, 1);
        let torn = &file[..file.len() - 1];
        assert!(matches!(decode(torn), Err(DecodeError::Torn { .. })));
        assert!(matches!(
            decode(&[0x12, 0]),
            Err(DecodeError::NotAPacket { .. })
        ));
    }
}
