//! Model-based oracle for the buffer engine (`recorder::ringbuf`).
//!
//! Drives a real [`Buffer`] with a sequence of operations — writes, zero-copy
//! slots (slot headers of 2 to 4 bytes, as wide as the reserved length's
//! varint), reservations that take what is left of a region, writer flushes
//! and drops, flushes, snapshots, releases, clears —
//! and checks after every step, against a model of one `VecDeque` per writer
//! sequence holding every packet written and not yet seen:
//! * R1: every data range parses on its own into whole frames
//!   (`0x0A <varint len> <payload>`), and every payload is intact (it names
//!   its writer and number and carries a checksum-like fill);
//! * R2: a writer's packets come in the order written, none twice; a
//!   batch is grouped by ascending writer id; a loss marker precedes a
//!   packet exactly when packets of that writer were lost before it;
//! * R3: the counters equal the model's (written, read, discarded, refused)
//!   and balance; packets skipped never exceed those counted lost, and at
//!   the end they are equal and nothing is left;
//! * M3: a batch's bytes are unchanged when it is released;
//! * capacity: RING_BUFFER with nothing pinned, and either policy right
//!   after a drain, never refuse a one-chunk packet while a chunk is free;
//! * W3: RING_BUFFER overwrites oldest first: with no batch held while the
//!   packets were written, a batch never carries a writer's packet and then
//!   a later packet of that writer that was overwritten (what is kept of a
//!   writer since the last pass is one run ending at its newest packet).
//!
//! The same module runs as the libFuzzer target `ringbuf_model` (input
//! decoded by [`decode`]) and as the proptest in the integration tests.

use std::collections::VecDeque;
use std::sync::Arc;

use recorder::ringbuf::{
    Buffer, BufferParams, FillPolicy, FlushBatch, FlushItem, PacketSlot, WriteError, Writer,
    WriterId,
};

/// Writer sequences the model drives.
pub const WRITERS: usize = 4;
/// Smallest payload: writer (1 byte) and packet number (4 bytes).
const MIN_LEN: usize = 5;
/// Batches held at once.
const MAX_OUTSTANDING: usize = 4;

/// The buffer under test.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub policy: FillPolicy,
    pub chunk_size: usize,
    pub chunks: usize,
    /// Chunks a writer takes at once at most (the engine sizes each region
    /// between the packet's need and this; the model reads what it got).
    pub region_chunks: usize,
}

/// One step.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// `write_packet` of a `len`-byte payload.
    Write { writer: u8, len: u32 },
    /// `begin_packet(max_len)`, then commit `len` bytes, or drop the slot
    /// uncommitted when `len > max_len`.
    Slot { writer: u8, max_len: u32, len: u32 },
    /// `begin_packet_at_least(min_len, max_len)`, then commit of the
    /// slot's length less `back` bytes, or drop the slot uncommitted when
    /// `back` is `u32::MAX`.
    Reserve {
        writer: u8,
        min_len: u32,
        max_len: u32,
        back: u32,
    },
    /// `Writer::flush`.
    Flush { writer: u8 },
    /// Drop the writer (a later write makes a new one with the same id).
    Drop { writer: u8 },
    /// `take_flush`, holding the batch.
    Take,
    /// `take_flush` and release at once.
    Drain,
    /// `snapshot`, holding the batch.
    Snapshot,
    /// Release one held batch.
    Release { which: u8 },
    /// `clear`.
    Clear,
}

/// Decodes fuzz input: two setup bytes, then operations of 1–5 bytes each.
pub fn decode(data: &[u8]) -> (Setup, Vec<Op>) {
    let mut it = data.iter().copied();
    let mut next = move || it.next();
    let b0 = next().unwrap_or(0);
    let b1 = next().unwrap_or(0);
    let policy = if b0 & 1 == 0 {
        FillPolicy::RingBuffer
    } else {
        FillPolicy::Discard
    };
    // 64 KiB chunks make room for slots with 4-byte headers (16 KiB and up).
    let chunk_size = if b0 & 8 != 0 {
        64 * 1024
    } else {
        [16, 64, 256, 1024][usize::from((b0 >> 1) & 3)]
    };
    let chunks = 2 + usize::from(b1 % 15);
    let region_chunks = [1, 1, 2, 4][usize::from((b1 / 15) % 4)];
    let setup = Setup {
        policy,
        chunk_size,
        chunks,
        region_chunks,
    };
    let mut ops = Vec::new();
    while let Some(code) = next() {
        let writer = code >> 4;
        let len = |n: &mut dyn FnMut() -> Option<u8>| -> Option<u32> {
            let sel = n()?;
            let lo = n()?;
            let v = u32::from(sel >> 2) << 8 | u32::from(lo);
            let (limit, v) = match sel & 3 {
                0 => (64, v),
                1 => (2 * chunk_size, v),
                2 => (8 * chunk_size, v),
                // 14 bits scaled up to reach the whole 64 KiB.
                _ => (64 * 1024, v << 2 | v & 3),
            };
            Some(v % limit as u32)
        };
        let op = match code & 15 {
            0..=5 => Op::Write {
                writer,
                len: len(&mut next).unwrap_or(0),
            },
            6 | 7 => {
                let max_len = len(&mut next).unwrap_or(0);
                // 255: drop the slot uncommitted; else commit a bit less.
                let back = next().unwrap_or(0);
                let len = if back == 255 {
                    u32::MAX
                } else {
                    max_len.saturating_sub(u32::from(back))
                };
                Op::Slot {
                    writer,
                    max_len,
                    len,
                }
            }
            8 => Op::Flush { writer },
            9 => Op::Drop { writer },
            10 => Op::Take,
            11 => Op::Drain,
            12 => Op::Snapshot,
            13 => Op::Release { which: writer },
            14 => Op::Clear,
            _ => {
                let min_len = len(&mut next).unwrap_or(0);
                let max_len = len(&mut next).unwrap_or(0);
                let back = next().unwrap_or(0);
                Op::Reserve {
                    writer,
                    min_len,
                    max_len,
                    back: if back == 255 {
                        u32::MAX
                    } else {
                        u32::from(back)
                    },
                }
            }
        };
        ops.push(op);
    }
    (setup, ops)
}

/// Fuzz entry point: panics when an oracle is violated.
pub fn check(data: &[u8]) {
    let (setup, ops) = decode(data);
    run(setup, &ops);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Written { seq: u32, framed: u64 },
    Dropped,
}

#[derive(Default)]
struct SeqModel {
    queue: VecDeque<Entry>,
    next_seq: u32,
    writer: Option<Writer>,
    /// The writer's region as the model predicts it: (capacity, used, chunks).
    region: Option<(usize, usize, usize)>,
}

struct Model {
    setup: Setup,
    buffer: Arc<Buffer>,
    seqs: Vec<SeqModel>,
    held: VecDeque<(FlushBatch, Vec<u8>)>,
    /// No batch held and nothing written since the last drain.
    drained: bool,
    written: (u64, u64),
    discarded: (u64, u64),
    refused: (u64, u64),
    read: (u64, u64),
    skipped: u64,
    /// Something was written while a batch was held since the last
    /// consuming pass: pinned data may outlive newer data (W3 is off).
    pinned_writes: bool,
}

fn varint_len(v: usize) -> usize {
    let bits = usize::BITS - (v | 1).leading_zeros();
    bits.div_ceil(7) as usize
}

/// Bytes before a slot's packet: the tag and a length varint as wide as the
/// reserved length's.
fn slot_header(max_len: usize) -> usize {
    1 + varint_len(max_len)
}

fn fill(w: u8, seq: u32, i: usize) -> u8 {
    (seq as u8).wrapping_add(i as u8) ^ w.wrapping_mul(31)
}

fn payload(w: u8, seq: u32, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[0] = w;
    p[1..5].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in p.iter_mut().enumerate().skip(MIN_LEN) {
        *b = fill(w, seq, i);
    }
    p
}

/// Splits one data range into frames; each is (payload, framed length).
/// Panics on anything but whole, well-formed frames (R1).
pub fn frames(data: &[u8]) -> Vec<(&[u8], usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        assert_eq!(
            data[at], 0x0A,
            "R1: frame at {at} does not start with the packet tag"
        );
        let mut len = 0usize;
        let mut i = at + 1;
        let mut shift = 0;
        loop {
            assert!(i < data.len() && shift < 35, "R1: truncated length at {at}");
            let b = data[i];
            len |= usize::from(b & 0x7F) << shift;
            i += 1;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        assert!(
            i + len <= data.len(),
            "R1: packet at {at} runs past its range"
        );
        out.push((&data[i..i + len], i + len - at));
        at = i + len;
    }
    out
}

/// Writes payload `p` at the start of `slot` and commits that much,
/// unless `commit` is false (the slot is dropped unwritten).
fn fill_slot(mut slot: PacketSlot<'_>, p: &[u8], commit: bool) {
    slot.buf()[..p.len()].copy_from_slice(p);
    if commit {
        slot.commit(p.len());
    }
}

impl Model {
    fn new(setup: Setup) -> Model {
        let params = BufferParams {
            size_bytes: setup.chunk_size * setup.chunks,
            chunk_size: setup.chunk_size,
            region_chunks: setup.region_chunks,
            policy: setup.policy,
            prefault: false,
        };
        let buffer = Buffer::new(params).expect("model setups are valid buffers");
        Model {
            setup,
            buffer,
            seqs: (0..WRITERS).map(|_| SeqModel::default()).collect(),
            held: VecDeque::new(),
            drained: true,
            written: (0, 0),
            discarded: (0, 0),
            refused: (0, 0),
            read: (0, 0),
            skipped: 0,
            pinned_writes: false,
        }
    }

    fn id(w: usize) -> WriterId {
        WriterId(w as u32 + 1)
    }

    /// Chunks held by writers other than `w`.
    fn others_chunks(&self, w: usize) -> usize {
        (self.seqs.iter().enumerate())
            .filter(|(i, _)| *i != w)
            .filter_map(|(_, s)| s.region.map(|r| r.2))
            .sum()
    }

    /// The region writer `w` was just given for a need of `k` chunks, `used`
    /// bytes of it written: as big as the need at least, as
    /// `region_chunks` at most unless the need is more, whole chunks.
    fn granted(&self, w: usize, k: usize, used: usize) -> (usize, usize, usize) {
        let cs = self.setup.chunk_size;
        let cap = self.seqs[w].writer.as_ref().map_or(0, Writer::region_bytes);
        assert!(
            cap.is_multiple_of(cs) && cap >= k * cs && cap <= k.max(self.setup.region_chunks) * cs,
            "a region of {cap} bytes for a need of {k} chunks of {cs}"
        );
        (cap, used, cap / cs)
    }

    /// Predicts whether the writer needs a new region for `framed` bytes, and
    /// whether getting one must succeed.
    fn predict(&self, w: usize, framed: usize) -> (bool, usize, bool) {
        let cs = self.setup.chunk_size;
        let needs = self.seqs[w]
            .region
            .is_none_or(|(cap, used, _)| cap - used < framed);
        let k = framed.div_ceil(cs);
        let buffer = &self.buffer;
        let must = !needs
            || (k == 1
                && self.others_chunks(w) < buffer.chunk_count()
                && ((buffer.policy() == FillPolicy::RingBuffer && self.held.is_empty())
                    || self.drained));
        (needs, k, must)
    }

    /// A granted slot dropped uncommitted writes nothing, but a region may
    /// have been acquired for it (`needs`, `k`); true when it was dropped.
    fn dropped_uncommitted(
        &mut self,
        w: usize,
        r: &Result<(), WriteError>,
        commit: bool,
        needs: bool,
        k: usize,
    ) -> bool {
        if r.is_err() || commit {
            return false;
        }
        if needs {
            self.seqs[w].region = Some(self.granted(w, k, 0));
        }
        true
    }

    fn writer(&mut self, w: usize) -> &mut Writer {
        let buffer = &self.buffer;
        self.seqs[w]
            .writer
            .get_or_insert_with(|| buffer.writer(Model::id(w)))
    }

    fn write(&mut self, w: usize, len: usize) {
        let len = len.max(MIN_LEN);
        let framed = 1 + varint_len(len) + len;
        let too_big = len > self.buffer.max_packet_len();
        let (needs, k, must) = self.predict(w, framed);
        let seq = self.seqs[w].next_seq;
        self.seqs[w].next_seq += 1;
        let p = payload(w as u8, seq, len);
        let r = self.writer(w).write_packet(&p);
        self.account(w, r, too_big, needs, must, k, seq, framed, framed);
    }

    fn slot(&mut self, w: usize, max_len: usize, len: usize) {
        let max_len = max_len.max(MIN_LEN);
        let commit = len <= max_len;
        let len = len.max(MIN_LEN).min(max_len);
        let header = slot_header(max_len);
        let framed = header + max_len;
        let too_big = max_len > self.buffer.max_packet_len();
        let (needs, k, must) = self.predict(w, framed);
        let seq = self.seqs[w].next_seq;
        self.seqs[w].next_seq += 1;
        let p = payload(w as u8, seq, len);
        let r = match self.writer(w).begin_packet(max_len) {
            Ok(mut slot) => {
                assert!(
                    slot.buf().len() == max_len,
                    "slot buffer has the reserved length"
                );
                fill_slot(slot, &p, commit);
                Ok(())
            }
            Err(e) => Err(e),
        };
        if self.dropped_uncommitted(w, &r, commit, needs, k) {
            return;
        }
        self.account(w, r, too_big, needs, must, k, seq, framed, header + len);
    }

    fn reserve(&mut self, w: usize, min_len: usize, max_len: usize, back: u32) {
        let max_len = max_len.max(MIN_LEN);
        let min_len = min_len.max(MIN_LEN).min(max_len);
        let capped = max_len.min(self.buffer.max_packet_len());
        if min_len > capped {
            // Refused as a slot of min_len would be.
            let framed = slot_header(min_len) + min_len;
            self.seqs[w].next_seq += 1;
            let r = self
                .writer(w)
                .begin_packet_at_least(min_len, max_len)
                .map(|_| ());
            assert_eq!(
                r,
                Err(WriteError::TooBig),
                "reservation over max_packet_len"
            );
            self.refused.0 += 1;
            self.refused.1 += framed as u64;
            return;
        }
        // What is left of the region, less the widest header it could need.
        let room = self.seqs[w].region.map(|(cap, used, _)| {
            let free = cap - used;
            free.saturating_sub(1 + varint_len(free))
        });
        let (granted, framed, needs, k, must) = match room {
            Some(room) if room.min(capped) >= min_len => {
                let g = room.min(capped);
                (g, slot_header(g) + g, false, 0, true)
            }
            _ => {
                let framed = slot_header(capped) + capped;
                let (needs, k, must) = self.predict(w, framed);
                (capped, framed, needs, k, must)
            }
        };
        let seq = self.seqs[w].next_seq;
        self.seqs[w].next_seq += 1;
        let commit = back != u32::MAX;
        let len = granted.saturating_sub(back as usize).max(MIN_LEN);
        let p = payload(w as u8, seq, len);
        let wr = self.writer(w);
        let r = match wr.begin_packet_at_least(min_len, max_len) {
            Ok(mut slot) => {
                assert_eq!(slot.buf().len(), granted, "begin_packet_at_least's length");
                fill_slot(slot, &p, commit);
                Ok(())
            }
            Err(e) => Err(e),
        };
        if self.dropped_uncommitted(w, &r, commit, needs, k) {
            return;
        }
        let stored = slot_header(granted) + len;
        self.account(w, r, false, needs, must, k, seq, framed, stored);
    }

    #[allow(clippy::too_many_arguments)]
    fn account(
        &mut self,
        w: usize,
        r: Result<(), WriteError>,
        too_big: bool,
        needs: bool,
        must: bool,
        k: usize,
        seq: u32,
        framed: usize,
        stored: usize,
    ) {
        match r {
            Ok(()) => {
                assert!(!too_big, "a packet over max_packet_len was accepted");
                let region = match self.seqs[w].region {
                    Some((cap, used, kk)) if !needs => (cap, used + stored, kk),
                    _ => self.granted(w, k, stored),
                };
                let s = &mut self.seqs[w];
                s.queue.push_back(Entry::Written {
                    seq,
                    framed: stored as u64,
                });
                s.region = Some(region);
                self.written.0 += 1;
                self.written.1 += stored as u64;
                self.drained = false;
            }
            Err(WriteError::TooBig) => {
                assert!(too_big, "a packet within max_packet_len was refused");
                self.refused.0 += 1;
                self.refused.1 += framed as u64;
            }
            Err(WriteError::Discarded(_)) => {
                assert!(!too_big, "an oversized packet was discarded, not refused");
                assert!(needs, "discarded although the packet fit its region");
                assert!(
                    !must,
                    "capacity: a one-chunk packet was discarded while a chunk was free"
                );
                let s = &mut self.seqs[w];
                s.queue.push_back(Entry::Dropped);
                s.region = None;
                self.discarded.0 += 1;
                self.discarded.1 += framed as u64;
            }
        }
    }

    /// Checks a batch against the model; `consume` for `take_flush`.
    fn verify(&mut self, batch: &FlushBatch, consume: bool) -> Vec<u8> {
        let mut queues: Vec<VecDeque<Entry>> = self.seqs.iter().map(|s| s.queue.clone()).collect();
        let mut pending = [false; WRITERS];
        let mut last = 0usize;
        let mut copy = Vec::new();
        let mut bytes = 0u64;
        let mut read = (0u64, 0u64);
        let mut skipped = 0u64;
        let mut delivered = [false; WRITERS];
        let w3 = self.setup.policy == FillPolicy::RingBuffer && !self.pinned_writes;
        for item in batch.items() {
            match item {
                FlushItem::Loss { writer } => {
                    let w = writer.0 as usize - 1;
                    assert!(w < WRITERS, "loss marker for unknown writer {writer:?}");
                    assert!(
                        w >= last,
                        "R2: batch not grouped by writer (loss of {w} after {last})"
                    );
                    assert!(!pending[w], "two loss markers in a row for writer {w}");
                    last = w;
                    pending[w] = true;
                }
                FlushItem::Data(data) => {
                    bytes += data.len() as u64;
                    copy.extend_from_slice(data);
                    for (p, framed) in frames(data) {
                        assert!(
                            p.len() >= MIN_LEN,
                            "R1: packet of {} bytes is not ours",
                            p.len()
                        );
                        let w = usize::from(p[0]);
                        assert!(w < WRITERS, "R1: packet names writer {w}");
                        let seq = u32::from_le_bytes([p[1], p[2], p[3], p[4]]);
                        for (i, &b) in p.iter().enumerate().skip(MIN_LEN) {
                            assert_eq!(
                                b,
                                fill(w as u8, seq, i),
                                "R1: packet {w}/{seq} corrupt at {i}"
                            );
                        }
                        assert!(
                            w >= last,
                            "R2: batch not grouped by writer ({w} after {last})"
                        );
                        last = w;
                        let mut lost = false;
                        loop {
                            match queues[w].pop_front() {
                                None => panic!("R2: packet {w}/{seq} unknown or seen twice"),
                                Some(Entry::Dropped) => lost = true,
                                Some(Entry::Written { seq: s, framed: f }) if s == seq => {
                                    assert_eq!(f, framed as u64, "packet {w}/{seq} framed length");
                                    break;
                                }
                                Some(Entry::Written { seq: s, .. }) => {
                                    assert!(
                                        !(w3 && delivered[w]),
                                        "W3: {w}/{s} overwritten while an older packet of {w} was kept"
                                    );
                                    lost = true;
                                    skipped += 1;
                                }
                            }
                        }
                        delivered[w] = true;
                        assert_eq!(
                            lost, pending[w],
                            "loss marker before {w}/{seq} iff data was lost before it"
                        );
                        pending[w] = false;
                        read.0 += 1;
                        read.1 += framed as u64;
                    }
                }
            }
        }
        for w in 0..WRITERS {
            let dead = self.seqs[w].writer.is_none();
            if pending[w] {
                assert!(dead, "trailing loss marker for live writer {w}");
                assert!(
                    !queues[w].is_empty(),
                    "trailing loss marker for {w} but nothing lost"
                );
                let overwritten = queues[w]
                    .drain(..)
                    .filter(|e| matches!(e, Entry::Written { .. }))
                    .count() as u64;
                assert!(
                    !(w3 && delivered[w] && overwritten > 0),
                    "W3: {w}'s last packets overwritten while an older one was kept"
                );
                skipped += overwritten;
            }
            if dead {
                assert!(
                    queues[w].is_empty(),
                    "writer {w} is gone but {} of its packets are unaccounted for",
                    queues[w].len()
                );
            }
        }
        assert_eq!(
            bytes,
            batch.len_bytes(),
            "len_bytes is the sum of the data ranges"
        );
        if consume {
            for (s, q) in self.seqs.iter_mut().zip(queues) {
                s.queue = q;
            }
            self.read.0 += read.0;
            self.read.1 += read.1;
            self.skipped += skipped;
        }
        copy
    }

    fn hold(&mut self, batch: FlushBatch, copy: Vec<u8>) {
        if self.held.len() >= MAX_OUTSTANDING {
            self.release(0);
        }
        self.held.push_back((batch, copy));
        self.drained = false;
    }

    fn release(&mut self, which: usize) {
        if self.held.is_empty() {
            return;
        }
        let (batch, copy) = self
            .held
            .remove(which % self.held.len())
            .expect("index is in range");
        let now: Vec<u8> = batch
            .items()
            .filter_map(|i| match i {
                FlushItem::Data(d) => Some(d.to_vec()),
                FlushItem::Loss { .. } => None,
            })
            .flatten()
            .collect();
        assert!(
            now == copy,
            "M3: a held batch's bytes changed before release"
        );
        batch.release();
    }

    fn step(&mut self, op: Op) {
        let w = |x: u8| usize::from(x) % WRITERS;
        if matches!(op, Op::Write { .. } | Op::Slot { .. } | Op::Reserve { .. })
            && !self.held.is_empty()
        {
            self.pinned_writes = true;
        }
        match op {
            Op::Write { writer, len } => self.write(w(writer), len as usize),
            Op::Slot {
                writer,
                max_len,
                len,
            } => self.slot(w(writer), max_len as usize, len as usize),
            Op::Reserve {
                writer,
                min_len,
                max_len,
                back,
            } => self.reserve(w(writer), min_len as usize, max_len as usize, back),
            Op::Flush { writer } => {
                let s = &mut self.seqs[w(writer)];
                if let Some(wr) = s.writer.as_mut() {
                    wr.flush();
                }
                s.region = None;
            }
            Op::Drop { writer } => {
                let s = &mut self.seqs[w(writer)];
                s.writer = None;
                s.region = None;
            }
            Op::Take => {
                let batch = self.buffer.take_flush();
                let copy = self.verify(&batch, true);
                // Everything unread until now is in this batch.
                self.pinned_writes = false;
                self.hold(batch, copy);
            }
            Op::Drain => {
                let batch = self.buffer.take_flush();
                self.verify(&batch, true);
                self.pinned_writes = false;
                batch.release();
                self.drained = self.held.is_empty();
            }
            Op::Snapshot => {
                let batch = self.buffer.snapshot();
                let copy = self.verify(&batch, false);
                self.hold(batch, copy);
            }
            Op::Release { which } => self.release(usize::from(which)),
            Op::Clear => {
                self.buffer.clear();
                // Cleared packets are skipped (with a loss marker) later.
                self.drained = false;
            }
        }
        self.check_stats();
    }

    fn check_stats(&self) {
        let s = self.buffer.stats();
        assert!(s.is_balanced(), "R3: counters do not balance: {s:#?}");
        assert_eq!(
            (s.packets_written, s.bytes_written),
            self.written,
            "R3: written"
        );
        assert_eq!((s.packets_read, s.bytes_read), self.read, "R3: read");
        assert_eq!(
            (s.packets_discarded, s.bytes_discarded),
            self.discarded,
            "R3: discarded"
        );
        assert_eq!(
            (s.packets_refused, s.bytes_refused),
            self.refused,
            "R3: refused"
        );
        if self.setup.policy == FillPolicy::Discard {
            assert_eq!(s.packets_overwritten, 0, "DISCARD overwrote data");
            assert_eq!(s.bytes_overwritten, 0, "DISCARD overwrote data");
        }
        assert!(
            self.skipped <= s.packets_overwritten + s.packets_cleared,
            "R3: {} packets missing but only {} counted lost",
            self.skipped,
            s.packets_overwritten + s.packets_cleared
        );
    }

    fn finish(mut self) {
        for s in &mut self.seqs {
            s.writer = None;
            s.region = None;
        }
        while !self.held.is_empty() {
            self.release(0);
        }
        self.step(Op::Drain);
        let s = self.buffer.stats();
        assert_eq!(
            (s.bytes_buffered, s.packets_buffered),
            (0, 0),
            "R3: data left after the final flush"
        );
        assert_eq!(
            self.skipped,
            s.packets_overwritten + s.packets_cleared,
            "R3: every lost packet is counted once"
        );
        for (w, seq) in self.seqs.iter().enumerate() {
            assert!(
                seq.queue.is_empty(),
                "writer {w}: packets never seen nor counted"
            );
        }
        // Everything was freed: a fresh writer gets a chunk at once.
        let mut wr = self.buffer.writer(WriterId(99));
        assert_eq!(
            wr.write_packet(&[0; MIN_LEN]),
            Ok(()),
            "buffer not reusable after final flush"
        );
    }
}

/// Runs `ops` against a fresh buffer, checking the oracles after each.
pub fn run(setup: Setup, ops: &[Op]) {
    let mut model = Model::new(setup);
    for &op in ops {
        model.step(op);
    }
    model.finish();
}
