//! Checks a bench trace on its own terms: walks the file's framing and,
//! with a small wire decoder, reads the `for_testing` counter of every test
//! packet per sequence, so the loss the file shows can be set against the
//! loss the buffer counted, and which packets a policy kept can be checked
//! ([`Retention`]).
//!
//! # What each policy keeps
//!
//! The writers number their packets 0, 1, 2, … per sequence, lost or not, so
//! the file's counters show where loss happened. What the engine guarantees
//! (`ringbuf` R1–R3 and its loss markers), per sequence:
//!
//! * Always: counters only increase (R2), and every gap (before the first
//!   kept packet, between two kept packets, after the last) is announced by a
//!   loss marker of that sequence (`previous_packet_dropped`) in the place of
//!   the gap. Refused (too big) packets are the exception: the writer is told
//!   at once, so no marker is written for them.
//! * RING_BUFFER, no pass during the writes (the run ended within one write
//!   period): the file holds one contiguous run ending at the last accepted
//!   packet ("newest"); loss is only before it. Overwrites take the chunk
//!   under the write cursor, and a writer's older chunk is never skipped
//!   (it is complete and nothing is pinned), so a sequence loses its oldest
//!   chunks first.
//! * RING_BUFFER with passes streaming to the file during the writes: each
//!   gap is data overwritten before a pass reached it; the last run ends at
//!   the last accepted packet. A pass usually contributes one contiguous run
//!   per sequence, but not always: a chunk a pass read only partly (its
//!   writer was still filling it) stays pinned until that pass's I/O ends,
//!   so if the ring wraps meanwhile, later chunks of the same writer are
//!   overwritten first and the next pass brings the rest of the pinned
//!   chunk, a gap, then newer data. Only the markers are exact.
//!   With several writers on one buffer, a writer that stopped before the
//!   others can lose its tail to them: then a loss marker follows its last
//!   kept packet.
//! * DISCARD: accepted data is never lost; every accepted packet is in the
//!   file, starting with the first accepted one (counter 0 unless the buffer
//!   was already full when the writer started). Without a pass during the
//!   writes that is one contiguous run from the start ("oldest"), the rest
//!   dropped at write time; with passes, the writer resumes after each pass
//!   that frees space, so the file holds several runs, each starting where
//!   space came back.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ringbuf::FillPolicy;
use crate::wire::framing::{FramingError, Header, frames, parse_header};
use crate::wire::{Value, test_event, trace_packet};

/// Why a trace did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A record does not start with the packet tag: not a trace, or
    /// damaged there.
    #[error("byte {offset}: record tag {tag:#04x}, not a packet (0x0a)")]
    NotAPacket {
        /// Where the record starts in the file.
        offset: usize,
        /// The byte found instead of 0x0a.
        tag: u8,
    },
    /// A record's length is not a well-formed varint, or the file ends
    /// inside it.
    #[error("byte {offset}: malformed varint")]
    Varint {
        /// Where the record starts in the file.
        offset: usize,
    },
    /// The last record claims more bytes than the file has left: a torn
    /// tail, which a finished bench file must not have.
    #[error("byte {offset}: packet of {len} bytes runs past the end ({size} bytes)")]
    Torn {
        /// Where the record starts in the file.
        offset: usize,
        /// The packet length its header claims.
        len: u64,
        /// The file's size.
        size: usize,
    },
    /// A packet's fields do not parse as protobuf.
    #[error("packet at byte {offset}: malformed field")]
    Field {
        /// Where the packet's record starts in the file.
        offset: usize,
    },
}

/// One sequence's test packets as found in the file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SequenceFound {
    /// Test packets found.
    pub packets: u64,
    /// Their framed bytes.
    pub bytes: u64,
    /// Counter of the first test packet found.
    pub first_counter: Option<u64>,
    /// Highest counter found.
    pub last_counter: Option<u64>,
    /// Counters missing between the first and the last.
    pub gaps: u64,
    /// A counter that did not increase (out of order or duplicated).
    pub(crate) disorder: u64,
    /// Contiguous runs of counters.
    pub runs: u64,
    /// Loss markers (`previous_packet_dropped`) of this sequence.
    pub loss_markers: u64,
    /// Gaps, the one before the first packet included, with no loss marker
    /// of this sequence since the packet before.
    pub(crate) unmarked_gaps: u64,
    /// A loss marker follows the last test packet.
    pub trailing_marker: bool,
}

/// What the file holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TraceFound {
    /// Every packet (service packets too).
    pub packets: u64,
    /// Test packets by `trusted_packet_sequence_id`.
    pub sequences: BTreeMap<u32, SequenceFound>,
}

/// Decodes a whole trace (no torn tail allowed: a bench file is complete).
pub fn decode(data: &[u8]) -> Result<TraceFound, DecodeError> {
    let mut found = TraceFound::default();
    let mut records = frames(data);
    for fr in records.by_ref() {
        let offset = fr.offset as usize;
        let end = offset + fr.record_len() as usize;
        found.packets += 1;
        let mut seq = None;
        let mut counter = None;
        let mut dropped = false;
        crate::wire::for_each(fr.packet, |f| match (f.number, f.value) {
            (trace_packet::TRUSTED_PACKET_SEQUENCE_ID, Value::Varint(v)) => seq = Some(v as u32),
            (trace_packet::PREVIOUS_PACKET_DROPPED, Value::Varint(v)) => dropped = v != 0,
            (trace_packet::FOR_TESTING, Value::Len(payload)) => {
                counter = Some(0);
                // A malformed TestEvent surfaces below as a missing counter.
                let _ = crate::wire::for_each(payload, |t| {
                    if let (test_event::COUNTER, Value::Varint(v)) = (t.number, t.value) {
                        counter = Some(v);
                    }
                });
            }
            _ => {}
        })
        .map_err(|_| DecodeError::Field { offset })?;
        if let (Some(seq), true) = (seq, dropped) {
            let s = found.sequences.entry(seq).or_default();
            s.loss_markers += 1;
            s.trailing_marker = true;
        }
        if let (Some(seq), Some(counter)) = (seq, counter) {
            let s = found.sequences.entry(seq).or_default();
            s.packets += 1;
            s.bytes += (end - offset) as u64;
            // A marker since the previous packet announces any gap here.
            let marked = std::mem::take(&mut s.trailing_marker);
            let gap = match s.last_counter {
                Some(last) if counter > last => {
                    s.gaps += counter - last - 1;
                    counter > last + 1
                }
                Some(_) => {
                    s.disorder += 1;
                    false
                }
                None => {
                    s.first_counter = Some(counter);
                    s.runs = 1;
                    counter > 0
                }
            };
            if gap && s.last_counter.is_some() {
                s.runs += 1;
            }
            if gap && !marked {
                s.unmarked_gaps += 1;
            }
            if s.last_counter.is_none_or(|l| counter > l) {
                s.last_counter = Some(counter);
            }
        }
    }
    let end = records.end().cloned().unwrap_or_default();
    if let Some(e) = end.corruption {
        return Err(match e {
            FramingError::BadTag { offset, byte } => DecodeError::NotAPacket {
                offset: offset as usize,
                tag: byte,
            },
            FramingError::BadLength { offset } => DecodeError::Varint {
                offset: offset as usize,
            },
        });
    }
    if let Some(t) = end.torn_tail {
        let offset = t.offset as usize;
        return Err(match parse_header(&data[offset..], t.offset) {
            Header::Whole { len, .. } => DecodeError::Torn {
                offset,
                len,
                size: data.len(),
            },
            _ => DecodeError::Varint { offset },
        });
    }
    Ok(found)
}

/// What one writer wrote, as the retention check needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// The writer's `trusted_packet_sequence_id`.
    pub sequence_id: u32,
    /// Packets offered, accepted or not: the counters run from 0 to
    /// `offered - 1`.
    pub offered: u64,
    /// Packets the buffer accepted.
    pub accepted: u64,
    /// Counter of the first accepted packet.
    pub first_accepted: Option<u64>,
    /// Counter of the last accepted packet.
    pub last_accepted: Option<u64>,
}

/// Which of a sequence's packets the file kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kept {
    /// Nothing.
    None,
    /// Every packet offered.
    All,
    /// One contiguous run ending at the last accepted packet; loss before it.
    Newest,
    /// One contiguous run from counter 0; loss after it.
    Oldest,
    /// One contiguous run, loss on both sides.
    Middle,
    /// Several runs.
    Runs,
}

impl Kept {
    /// Its name in the table and the JSON (`newest`, `runs`, …).
    pub fn name(self) -> &'static str {
        match self {
            Kept::None => "none",
            Kept::All => "all",
            Kept::Newest => "newest",
            Kept::Oldest => "oldest",
            Kept::Middle => "middle",
            Kept::Runs => "runs",
        }
    }
}

/// One sequence's retained data, set against what its writer wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Retention {
    /// The writer's `trusted_packet_sequence_id`.
    pub sequence: u32,
    /// `ring` or `discard`.
    pub policy: &'static str,
    /// Packets the writer offered, accepted or not.
    pub offered: u64,
    /// Packets its buffer accepted.
    pub accepted: u64,
    /// Test packets of this sequence in the file.
    pub kept: u64,
    /// Counter of the first test packet of this sequence in the file.
    pub first_kept: Option<u64>,
    /// Highest counter of this sequence in the file.
    pub last_kept: Option<u64>,
    /// Counter of the first accepted packet.
    pub first_accepted: Option<u64>,
    /// Counter of the last accepted packet.
    pub last_accepted: Option<u64>,
    /// Contiguous runs of counters in the file.
    pub runs: u64,
    /// Counters missing before the first kept packet, between kept packets,
    /// and after the last kept one up to the last offered.
    pub(crate) lost_before: u64,
    pub(crate) lost_between: u64,
    pub(crate) lost_after: u64,
    /// Gaps (the tail included) with no loss marker in their place.
    pub(crate) unmarked_gaps: u64,
    /// A loss marker follows the last kept packet.
    pub trailing_marker: bool,
    /// A pass took data while the writers wrote.
    pub streaming: bool,
    /// Which packets the file kept, as one shape.
    pub shape: Kept,
    /// The buffer's policy, for the checks (`policy` is its name in the
    /// JSON).
    #[serde(skip)]
    pub fill: FillPolicy,
}

impl Retention {
    /// Sets `found` (this sequence in the file) against `w`.
    pub fn of(found: &SequenceFound, w: &Written, policy: FillPolicy, streaming: bool) -> Self {
        let lost_before = found.first_counter.unwrap_or(w.offered);
        let lost_after = found
            .last_counter
            .map_or(0, |l| w.offered.saturating_sub(l + 1));
        // The tail gap is marked by a marker after the last packet; with
        // nothing kept, the whole stream is one gap.
        let tail_gap = found.packets > 0 && lost_after > 0;
        let empty_gap = found.packets == 0 && w.offered > 0;
        let unmarked_tail = (tail_gap || empty_gap) && !found.trailing_marker;
        let ends_at_last = found.last_counter.is_some() && found.last_counter == w.last_accepted;
        let shape = match (found.packets, found.runs) {
            (0, _) => Kept::None,
            (_, 1) if lost_before == 0 && lost_after == 0 => Kept::All,
            (_, 1) if lost_before == 0 => Kept::Oldest,
            (_, 1) if ends_at_last => Kept::Newest,
            (_, 1) => Kept::Middle,
            _ => Kept::Runs,
        };
        Self {
            sequence: w.sequence_id,
            policy: match policy {
                FillPolicy::RingBuffer => "ring",
                FillPolicy::Discard => "discard",
            },
            offered: w.offered,
            accepted: w.accepted,
            kept: found.packets,
            first_kept: found.first_counter,
            last_kept: found.last_counter,
            first_accepted: w.first_accepted,
            last_accepted: w.last_accepted,
            runs: found.runs,
            lost_before,
            lost_between: found.gaps,
            lost_after,
            unmarked_gaps: found.unmarked_gaps + u64::from(unmarked_tail),
            trailing_marker: found.trailing_marker,
            streaming,
            shape,
            fill: policy,
        }
    }

    /// Where this retention breaks what the policy promises (see the module
    /// docs). `refused`: the buffer refused packets, which get no marker.
    pub fn problems(&self, refused: bool) -> Vec<String> {
        let seq = self.sequence;
        let mut p = Vec::new();
        if self.unmarked_gaps > 0 && !refused {
            p.push(format!(
                "sequence {seq}: {} gaps without a loss marker",
                self.unmarked_gaps
            ));
        }
        match self.fill {
            FillPolicy::RingBuffer => {
                // The newest packet stays unless another writer overwrote
                // this one's tail after it stopped (then a marker follows).
                if self.last_accepted.is_some()
                    && self.last_kept != self.last_accepted
                    && !self.trailing_marker
                {
                    p.push(format!(
                        "sequence {seq}: ring buffer kept up to {:?}, not the last accepted packet {:?}",
                        self.last_kept, self.last_accepted
                    ));
                }
                if !self.streaming && self.runs > 1 {
                    p.push(format!(
                        "sequence {seq}: ring buffer without passes during the writes kept {} runs, not one newest run",
                        self.runs
                    ));
                }
            }
            FillPolicy::Discard => {
                if self.kept != self.accepted {
                    p.push(format!(
                        "sequence {seq}: discard buffer kept {} of {} accepted packets",
                        self.kept, self.accepted
                    ));
                }
                if self.first_kept != self.first_accepted {
                    p.push(format!(
                        "sequence {seq}: discard buffer kept from {:?}, not the first accepted packet {:?}",
                        self.first_kept, self.first_accepted
                    ));
                }
                if !self.streaming && self.runs > 1 {
                    p.push(format!(
                        "sequence {seq}: discard buffer without passes during the writes kept {} runs, not one oldest run",
                        self.runs
                    ));
                }
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::for_testing::encode_test_packet;
    use crate::storage::packets::loss_marker;
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

    /// A file of sequence 2: `Some(c)` a test packet, `None` a loss marker.
    fn file_of(items: &[Option<u64>]) -> SequenceFound {
        let mut file = Vec::new();
        for it in items {
            file.extend(match it {
                Some(c) => packet(2, *c),
                None => loss_marker(2),
            });
        }
        let found = decode(&file).expect("decodes");
        found.sequences.get(&2).cloned().unwrap_or_default()
    }

    fn counters(r: std::ops::RangeInclusive<u64>) -> Vec<Option<u64>> {
        r.map(Some).collect()
    }

    fn written(offered: u64, accepted: std::ops::RangeInclusive<u64>) -> Written {
        Written {
            sequence_id: 2,
            offered,
            accepted: accepted.end() + 1 - accepted.start(),
            first_accepted: Some(*accepted.start()),
            last_accepted: Some(*accepted.end()),
        }
    }

    #[test]
    fn runs_and_markers_are_counted() {
        let mut items = vec![None];
        items.extend(counters(3..=5));
        items.push(None);
        items.extend(counters(8..=9));
        items.push(Some(12)); // unmarked
        items.push(None);
        let s = file_of(&items);
        assert_eq!((s.runs, s.gaps, s.loss_markers), (3, 2 + 2, 3));
        assert_eq!(s.unmarked_gaps, 1);
        assert!(s.trailing_marker);
        // A packet that carries the flag itself marks its own gap.
        let mut file = packet(2, 0);
        let mut buf = [0u8; 128];
        let n = encode_test_packet(&mut buf, 2, 5, 5, 7, b"", false).expect("fits");
        let mut flagged = buf[..n].to_vec();
        flagged.extend([0xd0, 0x02, 0x01]); // previous_packet_dropped: 1
        file.extend(frame(&flagged));
        let s = &decode(&file).expect("decodes").sequences[&2];
        assert_eq!((s.runs, s.unmarked_gaps, s.trailing_marker), (2, 0, false));
    }

    #[test]
    fn ring_keeps_the_newest_run_and_a_planted_violation_is_caught() {
        let ring = FillPolicy::RingBuffer;
        let w = written(10, 0..=9);
        let mut newest = vec![None];
        newest.extend(counters(5..=9));
        let r = Retention::of(&file_of(&newest), &w, ring, false);
        assert_eq!(r.shape, Kept::Newest);
        assert_eq!((r.lost_before, r.lost_between, r.lost_after), (5, 0, 0));
        assert!(r.problems(false).is_empty(), "{:?}", r.problems(false));

        // The newest packets missing, no marker for them: the oldest were kept.
        let mut oldest = counters(0..=4);
        let r = Retention::of(&file_of(&oldest), &w, ring, false);
        assert_eq!((r.shape, r.unmarked_gaps), (Kept::Oldest, 1));
        let p = r.problems(false);
        assert!(
            p.iter().any(|p| p.contains("not the last accepted")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|p| p.contains("without a loss marker")),
            "{p:?}"
        );
        // With a marker after them (another writer overwrote this one's
        // tail) only the runs rule is left, and it holds.
        oldest.push(None);
        let r = Retention::of(&file_of(&oldest), &w, ring, false);
        assert!(r.problems(false).is_empty(), "{:?}", r.problems(false));

        // Two runs without a pass during the writes cannot come from a ring.
        let mut two = vec![None];
        two.extend(counters(2..=4));
        two.push(None);
        two.extend(counters(7..=9));
        let r = Retention::of(&file_of(&two), &w, ring, false);
        assert_eq!(r.shape, Kept::Runs);
        assert_eq!(r.problems(false).len(), 1, "{:?}", r.problems(false));
        // With passes streaming it can.
        let r = Retention::of(&file_of(&two), &w, ring, true);
        assert!(r.problems(false).is_empty());

        // A gap with no marker (but the sequence is newest and contiguous).
        let r = Retention::of(&file_of(&counters(5..=9)), &w, ring, false);
        assert_eq!(r.problems(false).len(), 1, "{:?}", r.problems(false));
        assert!(r.problems(true).is_empty(), "refused packets get no marker");
    }

    #[test]
    fn discard_keeps_the_oldest_run_and_a_planted_violation_is_caught() {
        let discard = FillPolicy::Discard;
        let w = written(10, 0..=4);
        let mut oldest = counters(0..=4);
        oldest.push(None);
        let r = Retention::of(&file_of(&oldest), &w, discard, false);
        assert_eq!(r.shape, Kept::Oldest);
        assert_eq!((r.lost_before, r.lost_after), (0, 5));
        assert!(r.problems(false).is_empty(), "{:?}", r.problems(false));

        // An accepted packet lost at the start: discard never loses one.
        let mut late = vec![None];
        late.extend(counters(1..=4));
        late.push(None);
        let p = Retention::of(&file_of(&late), &w, discard, false).problems(false);
        assert!(p.iter().any(|p| p.contains("kept 4 of 5")), "{p:?}");
        assert!(
            p.iter().any(|p| p.contains("not the first accepted")),
            "{p:?}"
        );

        // Resuming after a pass: runs are fine only when passes streamed.
        let w = written(10, 0..=9);
        let w = Written { accepted: 8, ..w };
        let mut runs = counters(0..=3);
        runs.push(None);
        runs.extend(counters(6..=9));
        assert!(
            Retention::of(&file_of(&runs), &w, discard, true)
                .problems(false)
                .is_empty()
        );
        assert_eq!(
            Retention::of(&file_of(&runs), &w, discard, false)
                .problems(false)
                .len(),
            1
        );
        // Nothing kept, nothing marked: the whole stream is an unmarked gap.
        let r = Retention::of(&SequenceFound::default(), &w, discard, true);
        assert_eq!((r.shape, r.unmarked_gaps), (Kept::None, 1));
    }
}
