//! One writer sequence of one producer: the chunks a trace writer committed,
//! reassembled into whole packets in chunk-id order and stored in a ring
//! buffer in the file's framing, each with the trusted fields appended
//! (ARCHITECTURE.md §7.3, ARCHITECTURE.md §7.3, §9.6).
//!
//! Chunks that need patching wait (with every later chunk of the sequence)
//! until their patches arrive; a gap in chunk ids, a bad fragment length or
//! a packet that sets a trusted field itself costs that packet and marks the
//! next one `previous_packet_dropped`. Memory held here is charged to the
//! producer's [`Budget`].
//!
//! Scraping reads chunks before the producer commits them
//! ([`Sequence::on_scraped`]): whole chunks it finished, and the finished
//! fragments of the one it is writing. Each such chunk is remembered with
//! the fragments read from it, so that its commit (or the next scrape)
//! stores only what came after them: no packet is stored twice.

use std::collections::VecDeque;

use super::chunk::{self, ChunkHeader, Fragment};
use super::smb::Scraped;
use super::stats::ProducerStats;
use crate::ringbuf::Writer;
use crate::wire::fields::plain_without;
use crate::wire::key::{WireType, key};
use crate::wire::trace_packet::{
    PREVIOUS_PACKET_DROPPED, SERVICE_ONLY, TRUSTED_PACKET_SEQUENCE_ID as TRUSTED_SEQUENCE_ID,
    TRUSTED_PID, TRUSTED_UID,
};
use crate::wire::varint::push as encode_varint;
/// Room for the appended fields: four tags of up to 2 bytes, varints of up
/// to 10.
const TRUSTED_SUFFIX_MAX: usize = 4 * 2 + 10 + 5 + 5 + 1;
/// Chunks one sequence may hold back waiting for patches. The SDK moves
/// chunks as they fill and sends their patches in later commits, so a fast
/// writer runs well ahead of them; the producer's [`Budget`] is what bounds
/// the memory.
const MAX_HELD_CHUNKS: usize = 16 * 1024;
/// Chunks read by scraping and not committed yet that one sequence
/// remembers. A writer has at most its current chunk and those awaiting a
/// commit in the SMB; an older entry is one the producer will never commit
/// (it died, or it is hostile) and is forgotten first.
const MAX_READ_AHEAD: usize = 1024;

/// Bytes a producer may have held in partial packets and chunks waiting
/// for patches, over all its sequences (lent from its uid's room,
/// `producer::quota::Holds`).
#[derive(Debug, Default)]
pub struct Budget {
    /// Bytes that may still be held, of what was lent.
    pub left: usize,
    /// Times held chunks or a partial packet were given up for want of it.
    pub short: u64,
}

/// Who wrote the packets (from the socket, not from the producer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trust {
    /// The producer's uid, from its socket.
    pub uid: u32,
    /// The producer's pid, from its socket.
    pub pid: u32,
    /// The `trusted_packet_sequence_id` of this (producer, writer, buffer).
    pub sequence_id: u32,
}

/// A chunk read (partly or wholly) by scraping before its commit.
#[derive(Clone, Copy, Debug)]
struct ReadAhead {
    chunk_id: u32,
    /// Its fragments already read, from the first.
    fragments: u16,
}

#[derive(Debug)]
struct Held {
    header: ChunkHeader,
    bytes: Vec<u8>,
    needs_patching: bool,
}

/// One (producer, writer, buffer) sequence.
#[derive(Debug)]
pub struct Sequence {
    writer: Writer,
    next_chunk: Option<u32>,
    /// The packet being reassembled across chunks.
    partial: Option<Vec<u8>>,
    /// The next stored packet says data was lost before it.
    dropped: bool,
    held: VecDeque<Held>,
    read_ahead: VecDeque<ReadAhead>,
    /// trusted_uid, trusted_packet_sequence_id and trusted_pid, encoded once
    /// (they never change for a sequence); then the same followed by
    /// previous_packet_dropped, for the packet after a loss.
    suffix: Vec<u8>,
    suffix_after_loss: Vec<u8>,
}

impl Sequence {
    /// A sequence writing into `writer`, its packets stamped with
    /// `trust`'s fields.
    pub fn new(writer: Writer, trust: Trust) -> Self {
        let mut suffix = Vec::with_capacity(TRUSTED_SUFFIX_MAX);
        for (field, v) in [
            (TRUSTED_UID, i64::from(trust.uid as i32) as u64),
            (TRUSTED_SEQUENCE_ID, u64::from(trust.sequence_id)),
            (TRUSTED_PID, i64::from(trust.pid as i32) as u64),
        ] {
            encode_varint(&mut suffix, key(field, WireType::Varint));
            encode_varint(&mut suffix, v);
        }
        let mut suffix_after_loss = suffix.clone();
        encode_varint(
            &mut suffix_after_loss,
            key(PREVIOUS_PACKET_DROPPED, WireType::Varint),
        );
        encode_varint(&mut suffix_after_loss, 1);
        debug_assert!(suffix_after_loss.len() <= TRUSTED_SUFFIX_MAX);
        Self {
            writer,
            next_chunk: None,
            partial: None,
            dropped: false,
            held: VecDeque::new(),
            read_ahead: VecDeque::new(),
            suffix,
            suffix_after_loss,
        }
    }

    /// A chunk moved out of the SMB (header included), untrusted.
    /// Stored at once unless it (or an earlier one) waits for patches; only
    /// then is it copied to be held.
    pub fn on_chunk(&mut self, bytes: &[u8], stats: &mut ProducerStats, budget: &mut Budget) {
        let Some(header) = ChunkHeader::parse(bytes) else {
            stats.abi_violations += 1;
            return;
        };
        let needs_patching = header.flags & chunk::NEEDS_PATCHING != 0;
        if !needs_patching && self.held.is_empty() {
            self.store(&header, bytes, stats, budget);
            return;
        }
        if self.held.len() >= MAX_HELD_CHUNKS || budget.left < bytes.len() {
            // Patches that never come would stall the sequence: give the
            // held chunks up as lost.
            budget.short += u64::from(budget.left < bytes.len());
            self.drop_held(stats, budget);
            if budget.left < bytes.len() {
                // Still no room (other sequences or producers of the uid
                // hold it): this chunk is lost too, and the gap says so.
                stats.chunks_discarded += 1;
                return;
            }
        }
        budget.left -= bytes.len().min(budget.left);
        self.held.push_back(Held {
            header,
            bytes: bytes.to_vec(),
            needs_patching,
        });
        self.release_held(stats, budget);
    }

    /// Patches for chunk `chunk_id`: each writes 4 bytes at an offset counted
    /// from the byte after the chunk header. `done` when no more will come.
    pub fn patch(
        &mut self,
        chunk_id: u32,
        patches: &[(u32, &[u8])],
        done: bool,
        stats: &mut ProducerStats,
        budget: &mut Budget,
    ) {
        let Some(h) = self.held.iter_mut().find(|h| h.header.chunk_id == chunk_id) else {
            stats.patches_failed += 1;
            return;
        };
        for (offset_untrusted, data) in patches {
            let at = chunk::HEADER_BYTES + *offset_untrusted as usize;
            match h.bytes.get_mut(at..at + 4) {
                Some(dst) if data.len() == 4 => {
                    dst.copy_from_slice(data);
                    stats.patches_succeeded += 1;
                }
                _ => stats.patches_failed += 1,
            }
        }
        if done {
            h.needs_patching = false;
        }
        self.release_held(stats, budget);
    }

    /// Stores the held chunks at the front that no longer wait.
    fn release_held(&mut self, stats: &mut ProducerStats, budget: &mut Budget) {
        while self.held.front().is_some_and(|h| !h.needs_patching) {
            let Some(h) = self.held.pop_front() else {
                break;
            };
            budget.left += h.bytes.len();
            self.store(&h.header, &h.bytes, stats, budget);
        }
    }

    /// This writer's chunks copied by one scrape, in any order: read in
    /// chunk-id order (ids are u32 and wrap) from the latest one stored, or
    /// from chunk 0 before any was, each only while everything before it
    /// was read whole.
    pub(crate) fn on_scrape(
        &mut self,
        mut chunks: Vec<(u32, Scraped)>,
        stats: &mut ProducerStats,
        budget: &mut Budget,
    ) {
        // The latest chunk stored may have been read only in part: the rest
        // of it comes before anything of the next one.
        let base = self.next_chunk.map_or(0, |next| next.wrapping_sub(1));
        chunks.sort_by_key(|(id, _)| id.wrapping_sub(base));
        for (_, s) in chunks {
            if !self.on_scraped(&s.bytes, s.complete, stats, budget) {
                break;
            }
        }
    }

    /// A chunk copied by scraping, still in the producer's memory (header
    /// included, untrusted). `complete`: the writer finished it; otherwise
    /// it is the chunk being written, whose last fragment may be the packet
    /// under way and is left out. Returns whether a later chunk of this
    /// writer may be read next: only after a whole chunk, and never past a
    /// gap or a chunk that waits for patches.
    pub fn on_scraped(
        &mut self,
        bytes: &[u8],
        complete: bool,
        stats: &mut ProducerStats,
        budget: &mut Budget,
    ) -> bool {
        let Some(mut header) = ChunkHeader::parse(bytes) else {
            return false;
        };
        // Chunks held for patches keep everything after them waiting, and a
        // chunk that needs patches is read when they have come.
        if !self.held.is_empty() || header.flags & chunk::NEEDS_PATCHING != 0 {
            return false;
        }
        let latest = self.next_chunk.map(|n| n.wrapping_sub(1));
        let before = self
            .read_ahead
            .iter()
            .find(|r| r.chunk_id == header.chunk_id)
            .map(|r| r.fragments);
        match before {
            // Read before: only the latest chunk can have grown since.
            Some(_) if latest != Some(header.chunk_id) => return true,
            Some(_) => {}
            None => {
                if self.next_chunk.unwrap_or(0) != header.chunk_id {
                    // A gap (the missing chunk is the commit's business), an
                    // old chunk id, or a sequence not begun whose first
                    // chunk (id 0, as writers number them) was not read:
                    // not read ahead of its turn.
                    return false;
                }
            }
        }
        if !complete {
            // The packet under way stays out, so nothing continues from here.
            header.count = header.count.saturating_sub(1);
            header.flags &= !chunk::LAST_CONTINUES;
        }
        let from = before.unwrap_or(0);
        match before {
            None => self.store_from(&header, bytes, None, stats, budget),
            Some(_) if header.count > from => {
                self.store_from(&header, bytes, Some(from), stats, budget)
            }
            Some(_) => {}
        }
        let read = header.count.max(from);
        match self
            .read_ahead
            .iter_mut()
            .find(|r| r.chunk_id == header.chunk_id)
        {
            Some(r) => r.fragments = read,
            None => {
                stats.chunks_scraped += 1;
                if self.read_ahead.len() >= MAX_READ_AHEAD {
                    self.read_ahead.pop_front();
                }
                self.read_ahead.push_back(ReadAhead {
                    chunk_id: header.chunk_id,
                    fragments: read,
                });
            }
        }
        complete
    }

    fn drop_held(&mut self, stats: &mut ProducerStats, budget: &mut Budget) {
        for h in self.held.drain(..) {
            budget.left += h.bytes.len();
            stats.chunks_discarded += 1;
        }
        self.abandon(budget);
    }

    /// At the end: chunks still waiting for patches are lost.
    pub fn finish(&mut self, stats: &mut ProducerStats, budget: &mut Budget) {
        if !self.held.is_empty() {
            stats.patches_failed += self.held.len() as u64;
            self.drop_held(stats, budget);
        }
        self.abandon(budget);
    }

    /// Drops the packet being reassembled; the next one says so.
    fn abandon(&mut self, budget: &mut Budget) {
        if let Some(p) = self.partial.take() {
            budget.left += p.capacity();
            self.dropped = true;
        }
    }

    /// A committed chunk: what scraping did not read of it yet.
    fn store(
        &mut self,
        header: &ChunkHeader,
        bytes: &[u8],
        stats: &mut ProducerStats,
        budget: &mut Budget,
    ) {
        let Some(at) = self
            .read_ahead
            .iter()
            .position(|r| r.chunk_id == header.chunk_id)
        else {
            return self.store_from(header, bytes, None, stats, budget);
        };
        let Some(r) = self.read_ahead.remove(at) else {
            return;
        };
        if header.count <= r.fragments {
            // Read whole by scraping already.
            return;
        }
        if self.next_chunk.map(|n| n.wrapping_sub(1)) != Some(header.chunk_id) {
            // Later chunks were stored since: the rest of this one would
            // come out of order.
            stats.chunks_committed_out_of_order += 1;
            self.abandon(budget);
            self.dropped = true;
            return;
        }
        self.store_from(header, bytes, Some(r.fragments), stats, budget);
    }

    /// Stores the packets of a chunk; with `resume`, from that fragment on
    /// (the ones before were stored from a scraped copy of it).
    fn store_from(
        &mut self,
        header: &ChunkHeader,
        bytes: &[u8],
        resume: Option<u16>,
        stats: &mut ProducerStats,
        budget: &mut Budget,
    ) {
        let skip = resume.unwrap_or(0);
        if resume.is_none()
            && let Some(next) = self.next_chunk
            && header.chunk_id != next
        {
            stats.chunks_committed_out_of_order += 1;
            self.abandon(budget);
            self.dropped = true;
        }
        self.next_chunk = Some(header.chunk_id.wrapping_add(1));
        let payload = &bytes[chunk::HEADER_BYTES..];
        let count = header.count;
        let mut iter = chunk::fragments(payload, count).enumerate().peekable();
        while let Some((i, frag)) = iter.next() {
            let last = iter.peek().is_none() && i + 1 == count as usize;
            if i < skip as usize {
                if frag.is_err() {
                    // It parsed when it was read; the producer changed it.
                    stats.abi_violations += 1;
                    self.abandon(budget);
                    self.dropped = true;
                    return;
                }
                continue;
            }
            let data = match frag {
                Ok(Fragment::Bytes(d)) => d,
                Ok(Fragment::Dropped) => {
                    stats.trace_writer_packet_loss += 1;
                    self.abandon(budget);
                    self.dropped = true;
                    continue;
                }
                Err(_) => {
                    stats.abi_violations += 1;
                    self.abandon(budget);
                    self.dropped = true;
                    return;
                }
            };
            let continues_prev = i == 0 && header.flags & chunk::FIRST_CONTINUES != 0;
            let continues_next = last && header.flags & chunk::LAST_CONTINUES != 0;
            if continues_prev {
                if self.partial.is_none() {
                    // The start of this packet is gone.
                    self.dropped = true;
                    continue;
                }
            } else if self.partial.is_some() {
                // The previous chunk promised a continuation that never came.
                self.abandon(budget);
            }
            let limit = self.writer.buffer().max_packet_len();
            if !continues_prev && !continues_next {
                // Whole in this chunk (most packets): stored straight from
                // the chunk's copy, nothing held.
                if data.len() > limit {
                    stats.packets_too_big += 1;
                    self.dropped = true;
                } else if !data.is_empty() {
                    self.emit(data, stats);
                }
                continue;
            }
            let mut packet = self.partial.take().unwrap_or_default();
            let before = packet.capacity();
            if packet.len() + data.len() > limit || budget.left + before < packet.len() + data.len()
            {
                budget.short += u64::from(packet.len() + data.len() <= limit);
                budget.left += before;
                stats.packets_too_big += 1;
                self.dropped = true;
                continue;
            }
            packet.extend_from_slice(data);
            budget.left = (budget.left + before).saturating_sub(packet.capacity());
            if continues_next {
                self.partial = Some(packet);
                continue;
            }
            budget.left += packet.capacity();
            if packet.is_empty() {
                continue;
            }
            self.emit(&packet, stats);
        }
        if resume.is_none() {
            stats.chunks_stored += 1;
        }
    }

    /// Validates one whole packet and stores it with the trusted fields.
    fn emit(&mut self, packet: &[u8], stats: &mut ProducerStats) {
        if !acceptable(packet) {
            stats.invalid_packets += 1;
            self.dropped = true;
            return;
        }
        let suffix = if self.dropped {
            &self.suffix_after_loss
        } else {
            &self.suffix
        };
        let len = packet.len() + suffix.len();
        match self.writer.begin_packet(len) {
            Ok(mut slot) => {
                let buf = slot.buf();
                buf[..packet.len()].copy_from_slice(packet);
                buf[packet.len()..len].copy_from_slice(suffix);
                slot.commit(len);
                self.dropped = false;
                stats.packets += 1;
                stats.bytes += packet.len() as u64;
            }
            // The ring counts the loss (discarded or refused).
            Err(_) => self.dropped = true,
        }
    }
}

/// Whether a producer's packet is well-formed at the top level and leaves
/// the service-only fields alone.
pub fn acceptable(packet: &[u8]) -> bool {
    // Groups are refused as Perfetto's validator refuses them.
    plain_without(packet, |n| SERVICE_ONLY.contains(&n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId};
    use std::sync::Arc;

    fn chunk_bytes(id: u32, flags: u8, frags: &[&[u8]]) -> Vec<u8> {
        let mut c = Vec::new();
        c.extend(id.to_le_bytes());
        c.extend(1u16.to_le_bytes());
        c.extend(((frags.len() as u16) | (u16::from(flags) << 10)).to_le_bytes());
        for f in frags {
            let n = f.len() as u32;
            c.extend([
                (n & 0x7F) as u8 | 0x80,
                ((n >> 7) & 0x7F) as u8 | 0x80,
                ((n >> 14) & 0x7F) as u8 | 0x80,
                ((n >> 21) & 0x7F) as u8,
            ]);
            c.extend(*f);
        }
        c.resize(256, 0);
        c
    }

    /// A packet with only a `timestamp` (field 8).
    fn packet(ts: u8) -> Vec<u8> {
        vec![8 << 3, ts]
    }

    fn packets(buffer: &Arc<Buffer>) -> Vec<Vec<u8>> {
        let batch = buffer.take_flush();
        let mut out = Vec::new();
        for item in batch.items() {
            if let FlushItem::Data(bytes) = item {
                let mut frames = crate::wire::framing::frames(bytes);
                out.extend(frames.by_ref().map(|f| f.packet.to_vec()));
                let end = frames.end().expect("walked to the end");
                assert!(
                    end.torn_tail.is_none() && end.corruption.is_none(),
                    "whole records only"
                );
            }
        }
        out
    }

    fn setup() -> (Arc<Buffer>, Sequence, ProducerStats, Budget) {
        let buffer =
            Buffer::new(BufferParams::new(256 * 1024, FillPolicy::RingBuffer)).expect("buffer");
        let trust = Trust {
            uid: 1000,
            pid: 42,
            sequence_id: 7,
        };
        let seq = Sequence::new(buffer.writer(WriterId(7)), trust);
        (
            buffer,
            seq,
            ProducerStats::default(),
            Budget {
                left: 1 << 20,
                short: 0,
            },
        )
    }

    fn trusted(p: &[u8], dropped: bool) -> Vec<u8> {
        let mut v = p.to_vec();
        v.extend([3 << 3, 0xE8, 0x07, 10 << 3, 7, 0xF8, 0x04, 42]);
        if dropped {
            v.extend([0xD0, 0x02, 1]); // field 42, varint 1
        }
        v
    }

    #[test]
    fn packets_across_chunks_are_reassembled_and_tagged() {
        let (buffer, mut seq, mut st, mut budget) = setup();
        let a = packet(1);
        let whole = [8 << 3, 5, 2 << 3 | 2, 3, b'a', b'b', b'c'];
        seq.on_chunk(
            &chunk_bytes(0, chunk::LAST_CONTINUES, &[&a, &whole[..3]]),
            &mut st,
            &mut budget,
        );
        seq.on_chunk(
            &chunk_bytes(1, chunk::FIRST_CONTINUES, &[&whole[3..]]),
            &mut st,
            &mut budget,
        );
        assert_eq!(
            packets(&buffer),
            vec![trusted(&a, false), trusted(&whole, false)]
        );
        assert_eq!(st.packets, 2);
        assert_eq!(budget.left, 1 << 20);
    }

    #[test]
    fn a_gap_loses_the_open_packet_and_marks_the_next() {
        let (buffer, mut seq, mut st, mut budget) = setup();
        seq.on_chunk(
            &chunk_bytes(0, chunk::LAST_CONTINUES, &[&[8 << 3]]),
            &mut st,
            &mut budget,
        );
        seq.on_chunk(
            &chunk_bytes(5, chunk::FIRST_CONTINUES, &[&[1], &packet(2)]),
            &mut st,
            &mut budget,
        );
        assert_eq!(packets(&buffer), vec![trusted(&packet(2), true)]);
        assert_eq!(st.chunks_committed_out_of_order, 1);
    }

    #[test]
    fn packets_that_set_trusted_fields_are_dropped_and_counted() {
        let (buffer, mut seq, mut st, mut budget) = setup();
        let forged = [10 << 3, 1];
        let uid = [3 << 3, 0];
        seq.on_chunk(
            &chunk_bytes(0, 0, &[&forged, &uid, &[0xFF], &packet(3)]),
            &mut st,
            &mut budget,
        );
        assert_eq!(st.invalid_packets, 3);
        assert_eq!(packets(&buffer), vec![trusted(&packet(3), true)]);
    }

    #[test]
    fn patched_chunks_wait_for_their_patches_and_hold_back_later_ones() {
        let (buffer, mut seq, mut st, mut budget) = setup();
        // A nested field whose length the writer patches later.
        let before = [2 << 3 | 2, 0, 0, 0, 0];
        seq.on_chunk(
            &chunk_bytes(0, chunk::NEEDS_PATCHING, &[&before]),
            &mut st,
            &mut budget,
        );
        seq.on_chunk(&chunk_bytes(1, 0, &[&packet(4)]), &mut st, &mut budget);
        assert!(packets(&buffer).is_empty());
        // Payload offset: 4 (fragment length) + 1 (tag) = 5.
        seq.patch(
            0,
            &[(5, &[0x80, 0x80, 0x80, 0x00][..])],
            true,
            &mut st,
            &mut budget,
        );
        let got = packets(&buffer);
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0][..5], &[2 << 3 | 2, 0x80, 0x80, 0x80, 0x00]);
        assert_eq!(st.patches_succeeded, 1);
        seq.patch(9, &[(0, &[0, 0, 0, 0][..])], true, &mut st, &mut budget);
        assert_eq!(st.patches_failed, 1);
    }

    /// A chunk as the SDK leaves it while writing: `done` packets finished
    /// and the count bumped for the next one (a placeholder, not written).
    fn open_chunk(id: u32, flags: u8, done: &[&[u8]]) -> Vec<u8> {
        let mut c = chunk_bytes(id, flags, done);
        c[6..8]
            .copy_from_slice(&((done.len() as u16 + 1) | (u16::from(flags) << 10)).to_le_bytes());
        c
    }

    #[test]
    fn scraped_packets_are_stored_once_whatever_reads_the_chunk_next() {
        let (buffer, mut seq, mut st, mut budget) = setup();
        let p: Vec<Vec<u8>> = (0..6).map(packet).collect();
        // Two finished packets in the chunk being written: both are read.
        assert!(!seq.on_scraped(
            &open_chunk(0, 0, &[&p[0], &p[1]]),
            false,
            &mut st,
            &mut budget
        ));
        // A later scrape of the same chunk adds only the third.
        seq.on_scraped(
            &open_chunk(0, 0, &[&p[0], &p[1], &p[2]]),
            false,
            &mut st,
            &mut budget,
        );
        // The commit of the whole chunk adds the fourth; the next chunk follows.
        seq.on_chunk(
            &chunk_bytes(0, 0, &[&p[0], &p[1], &p[2], &p[3]]),
            &mut st,
            &mut budget,
        );
        seq.on_chunk(&chunk_bytes(1, 0, &[&p[4]]), &mut st, &mut budget);
        // A finished chunk read ahead of its commit: the commit adds nothing.
        assert!(seq.on_scraped(&chunk_bytes(2, 0, &[&p[5]]), true, &mut st, &mut budget));
        seq.on_chunk(&chunk_bytes(2, 0, &[&p[5]]), &mut st, &mut budget);
        let want: Vec<_> = p.iter().map(|x| trusted(x, false)).collect();
        assert_eq!(packets(&buffer), want);
        assert_eq!(st.chunks_scraped, 2);
        assert_eq!(st.chunks_committed_out_of_order, 0);
        assert_eq!(st.packets, 6);
    }

    #[test]
    fn scraping_stops_at_gaps_patches_and_the_packet_under_way() {
        let (buffer, mut seq, mut st, mut budget) = setup();
        seq.on_chunk(&chunk_bytes(0, 0, &[&packet(0)]), &mut st, &mut budget);
        // Chunk 2 is not next: left to its commit.
        assert!(!seq.on_scraped(
            &chunk_bytes(2, 0, &[&packet(2)]),
            true,
            &mut st,
            &mut budget
        ));
        // The packet under way (counted, not finished) is not read from an
        // open chunk, even if it is marked as continuing.
        let half = [8 << 3];
        seq.on_scraped(
            &chunk_bytes(1, chunk::LAST_CONTINUES, &[&packet(1), &half]),
            false,
            &mut st,
            &mut budget,
        );
        assert_eq!(
            packets(&buffer),
            vec![trusted(&packet(0), false), trusted(&packet(1), false)]
        );
        // Its commit completes the packet in the next chunk.
        seq.on_chunk(
            &chunk_bytes(1, chunk::LAST_CONTINUES, &[&packet(1), &half]),
            &mut st,
            &mut budget,
        );
        seq.on_chunk(
            &chunk_bytes(2, chunk::FIRST_CONTINUES, &[&[9]]),
            &mut st,
            &mut budget,
        );
        assert_eq!(packets(&buffer), vec![trusted(&[8 << 3, 9], false)]);
        // A chunk that waits for patches is not read ahead of them.
        assert!(!seq.on_scraped(
            &chunk_bytes(3, chunk::NEEDS_PATCHING, &[&packet(3)]),
            true,
            &mut st,
            &mut budget
        ));
        assert!(packets(&buffer).is_empty());
        assert_eq!(st.chunks_committed_out_of_order, 0);
    }

    #[test]
    fn the_packet_validator_walks_every_wire_type() {
        assert!(acceptable(&[
            8 << 3,
            1,
            9,
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            8,
            13,
            1,
            2,
            3,
            4,
            2 << 3 | 2,
            1,
            0
        ]));
        assert!(!acceptable(&[2 << 3 | 2, 5, 0]));
        assert!(!acceptable(&[8 << 3 | 3]));
        assert!(!acceptable(&[79 << 3 & 0x7F | 0x80, 79 >> 4, 0]));
    }
}
