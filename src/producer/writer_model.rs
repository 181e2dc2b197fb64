//! A model of an SDK trace writer against the service's side of its
//! sequence. The writer fills chunks of a small shared memory as the SDK
//! does — packets fragmented across chunks, the size of a nested message
//! sent later as a patch when its chunk is gone, packet counts inflated so
//! a finished packet can be read, chunks marked complete while their
//! commit is still on its way — one step at a time. Between any two steps
//! the service takes the next commit message or scrapes, reading each chunk
//! at its own moment while the writer goes on. Whatever the interleaving,
//! every packet the writer finished is stored once, in order, and nothing
//! is marked lost.

use std::collections::VecDeque;
use std::sync::Arc;

use proptest::prelude::*;

use super::chunk::{FIRST_CONTINUES, HEADER_BYTES, LAST_CONTINUES, NEEDS_PATCHING};
use super::sequence::{Budget, Sequence, Trust};
use super::smb::Scraped;
use super::stats::ProducerStats;
use crate::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId};

/// Bytes of a chunk, header included: small, so packets cross chunks often.
const CHUNK: usize = 96;
const WRITER: u16 = 3;

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    Free,
    Writing,
    Complete,
}

#[derive(Clone, Debug)]
struct Slot {
    state: State,
    bytes: Vec<u8>,
}

impl Slot {
    fn packets(&self) -> u16 {
        u16::from_le_bytes([self.bytes[6], self.bytes[7]])
    }

    fn set_packets(&mut self, v: u16) {
        self.bytes[6..8].copy_from_slice(&v.to_le_bytes());
    }

    fn chunk_id(&self) -> u32 {
        u32::from_le_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]])
    }
}

/// A patch: where in the chunk's payload, and the 4 bytes.
type PatchBytes = (u32, [u8; 4]);

/// What the producer sends on its socket, in order.
#[derive(Debug)]
enum Msg {
    Move(usize),
    /// A chunk's patches; `more` when others for it are still to come.
    Patch {
        chunk_id: u32,
        patches: Vec<PatchBytes>,
        more: bool,
    },
}

/// One step of the writer.
#[derive(Clone, Debug)]
enum Op {
    /// NewTracePacket: a new chunk first when this one is too full, then
    /// the packet counted and its size field reserved.
    Begin,
    Bytes(Vec<u8>),
    /// A nested message's 4-byte size field, reserved in one piece.
    ReserveNested,
    /// A new chunk for the rest of the packet (fragmenting) or for a new
    /// one; the old chunk is returned by the steps queued after it.
    Acquire {
        fragmenting: bool,
    },
    /// The old chunk's last fragment: continues, sized.
    MarkContinues {
        slot: usize,
    },
    /// The open nested messages' size fields left in the old chunk become
    /// patches, outermost first.
    Annotate {
        slot: usize,
    },
    /// The old chunk is complete and its move is queued.
    Return {
        slot: usize,
        at: usize,
        inflated: bool,
    },
    /// The innermost open nested message ends, `usize` bytes long.
    EndNested(usize),
    EndFragment,
    Inflate,
    SendPatches,
}

/// Where an open nested message's size field is.
#[derive(Clone, Copy, Debug)]
enum NestedSize {
    InChunk { slot: usize, at: usize },
    Patch(usize),
}

#[derive(Debug)]
struct PatchEntry {
    chunk_id: u32,
    offset: u32,
    data: Option<[u8; 4]>,
}

struct Writer {
    slots: Vec<Slot>,
    next_slot: usize,
    next_chunk_id: u32,
    cur: Option<usize>,
    at: usize,
    inflated: bool,
    ops: VecDeque<Op>,
    /// The current fragment's size field (slot, offset) and first byte.
    fragment: Option<(usize, usize)>,
    fragment_start: usize,
    /// The fragment left in the old chunk at a break, and its length.
    fragment_old: Option<(usize, usize)>,
    fragment_old_len: usize,
    /// The open nested messages, outermost first.
    nested: Vec<NestedSize>,
    /// Patches not sent yet; `patches_sent` counts those before them.
    patches: VecDeque<PatchEntry>,
    patches_sent: usize,
    to_send: VecDeque<Msg>,
    /// Packets not begun yet (content bytes, nesting depth), and the ones
    /// finished.
    todo: VecDeque<(usize, u8)>,
    current: Option<Vec<u8>>,
    finished: Vec<Vec<u8>>,
}

fn redundant_varint(v: usize) -> [u8; 4] {
    let v = v as u32;
    [
        (v & 0x7F) as u8 | 0x80,
        ((v >> 7) & 0x7F) as u8 | 0x80,
        ((v >> 14) & 0x7F) as u8 | 0x80,
        ((v >> 21) & 0x7F) as u8,
    ]
}

/// Packet `i`: a timestamp and the tag of field 900, and `content` bytes
/// that go inside it (directly, or one message deeper); sizes are written
/// in the SDK's 4-byte form.
fn packet(i: usize, content: usize) -> (Vec<u8>, Vec<u8>) {
    let mut head = vec![8 << 3];
    crate::wire::varint::push(&mut head, i as u64 + 1);
    head.extend([0xA2, 0x38]); // field 900, length-delimited
    (head, vec![b'x'; content])
}

impl Writer {
    fn new(slots: usize, first_slot: usize, sizes: &[(usize, u8)]) -> Self {
        Self {
            slots: vec![
                Slot {
                    state: State::Free,
                    bytes: vec![0; CHUNK],
                };
                slots
            ],
            next_slot: first_slot % slots,
            next_chunk_id: 0,
            cur: None,
            at: 0,
            inflated: false,
            ops: VecDeque::new(),
            fragment: None,
            fragment_start: 0,
            fragment_old: None,
            fragment_old_len: 0,
            nested: Vec::new(),
            patches: VecDeque::new(),
            patches_sent: 0,
            to_send: VecDeque::new(),
            todo: sizes.iter().copied().collect(),
            current: None,
            finished: Vec::new(),
        }
    }

    fn done(&self) -> bool {
        self.ops.is_empty() && self.todo.is_empty()
    }

    fn room(&self) -> usize {
        self.cur.map_or(0, |_| CHUNK - self.at)
    }

    /// One step; false when it must wait for a free chunk.
    fn step(&mut self) -> bool {
        if self.ops.is_empty() {
            let Some((content, depth)) = self.todo.pop_front() else {
                return false;
            };
            let (head, body) = packet(self.finished.len(), content);
            let mut whole = head.clone();
            self.ops
                .extend([Op::Begin, Op::Bytes(head), Op::ReserveNested]);
            if depth == 2 {
                // Field 900 holds field 1, which holds the content.
                let inner = body.len();
                whole.extend(redundant_varint(1 + 4 + inner));
                whole.push(0x0A);
                whole.extend(redundant_varint(inner));
                self.ops.extend([
                    Op::Bytes(vec![0x0A]),
                    Op::ReserveNested,
                    Op::Bytes(body.clone()),
                    Op::EndNested(inner),
                    Op::EndNested(1 + 4 + inner),
                ]);
            } else {
                whole.extend(redundant_varint(body.len()));
                self.ops
                    .extend([Op::Bytes(body.clone()), Op::EndNested(body.len())]);
            }
            whole.extend(&body);
            self.current = Some(whole);
            self.ops
                .extend([Op::EndFragment, Op::Inflate, Op::SendPatches]);
        }
        let Some(op) = self.ops.pop_front() else {
            return false;
        };
        match op {
            Op::Begin => {
                if self.room() < 4 + 8 {
                    self.ops.push_front(Op::Begin);
                    self.ops.push_front(Op::Acquire { fragmenting: false });
                    return true;
                }
                let slot = self.cur.expect("a chunk");
                if self.inflated {
                    self.inflated = false;
                } else {
                    let p = self.slots[slot].packets();
                    self.slots[slot].set_packets(p + 1);
                }
                self.reserve_fragment(slot);
            }
            Op::Bytes(b) => {
                let n = b.len().min(self.room());
                let slot = self.cur.expect("a chunk");
                self.slots[slot].bytes[self.at..self.at + n].copy_from_slice(&b[..n]);
                self.at += n;
                if n < b.len() {
                    self.ops.push_front(Op::Bytes(b[n..].to_vec()));
                    self.fragment_break();
                }
            }
            Op::ReserveNested => {
                if self.room() < 4 {
                    self.ops.push_front(Op::ReserveNested);
                    self.fragment_break();
                    return true;
                }
                let slot = self.cur.expect("a chunk");
                self.slots[slot].bytes[self.at..self.at + 4].fill(0);
                self.nested.push(NestedSize::InChunk { slot, at: self.at });
                self.at += 4;
            }
            Op::Acquire { fragmenting } => {
                let n = self.slots.len();
                let Some(free) = (0..n)
                    .map(|i| (self.next_slot + i) % n)
                    .find(|&i| self.slots[i].state == State::Free)
                else {
                    self.ops.push_front(op);
                    return false;
                };
                self.next_slot = free;
                let old = self.cur;
                let s = &mut self.slots[free];
                s.state = State::Writing;
                s.bytes[0..4].copy_from_slice(&self.next_chunk_id.to_le_bytes());
                s.bytes[4..6].copy_from_slice(&WRITER.to_le_bytes());
                let packets = if fragmenting {
                    1 | (u16::from(FIRST_CONTINUES) << 10)
                } else {
                    0
                };
                s.set_packets(packets);
                self.next_chunk_id = self.next_chunk_id.wrapping_add(1);
                // The old chunk is finished off before the writer moves on.
                let mut then = Vec::new();
                if let Some(old) = old {
                    if fragmenting {
                        then.push(Op::MarkContinues { slot: old });
                        then.push(Op::Annotate { slot: old });
                    }
                    then.push(Op::Return {
                        slot: old,
                        at: self.at,
                        inflated: self.inflated,
                    });
                }
                for op in then.into_iter().rev() {
                    self.ops.push_front(op);
                }
                self.cur = Some(free);
                self.inflated = false;
                self.at = HEADER_BYTES;
                if fragmenting {
                    self.reserve_fragment(free);
                }
            }
            Op::MarkContinues { slot } => {
                let p = self.slots[slot].packets();
                self.slots[slot].set_packets(p | (u16::from(LAST_CONTINUES) << 10));
                if let Some((s, at)) = self.fragment_old.take() {
                    let size = self.fragment_old_len;
                    self.slots[s].bytes[at..at + 4].copy_from_slice(&redundant_varint(size));
                }
            }
            Op::Annotate { slot } => {
                for i in 0..self.nested.len() {
                    let NestedSize::InChunk { slot: s, at } = self.nested[i] else {
                        continue;
                    };
                    if s != slot {
                        continue;
                    }
                    let chunk_id = self.slots[slot].chunk_id();
                    self.patches.push_back(PatchEntry {
                        chunk_id,
                        offset: (at - HEADER_BYTES) as u32,
                        data: None,
                    });
                    let id = self.patches_sent + self.patches.len() - 1;
                    self.nested[i] = NestedSize::Patch(id);
                    let p = self.slots[slot].packets();
                    self.slots[slot].set_packets(p | (u16::from(NEEDS_PATCHING) << 10));
                }
            }
            Op::Return { slot, at, inflated } => self.complete(slot, at, inflated),
            Op::EndNested(len) => {
                let size = redundant_varint(len);
                match self.nested.pop() {
                    Some(NestedSize::InChunk { slot, at }) => {
                        self.slots[slot].bytes[at..at + 4].copy_from_slice(&size)
                    }
                    Some(NestedSize::Patch(id)) => {
                        self.patches[id - self.patches_sent].data = Some(size)
                    }
                    None => {}
                }
            }
            Op::EndFragment => {
                if let Some((slot, at)) = self.fragment.take() {
                    let size = redundant_varint(self.at - self.fragment_start);
                    self.slots[slot].bytes[at..at + 4].copy_from_slice(&size);
                }
                self.finished
                    .push(self.current.take().expect("the packet under way"));
            }
            Op::Inflate => {
                if let Some(slot) = self.cur {
                    if self.room() == 0 {
                        self.complete(slot, self.at, false);
                        self.cur = None;
                    } else {
                        let p = self.slots[slot].packets();
                        self.slots[slot].set_packets(p + 1);
                        self.inflated = true;
                    }
                }
            }
            Op::SendPatches => {
                // The finished ones at the front, a message per chunk; one
                // whose chunk still has an unfinished patch says more come.
                let mut msg: Option<(u32, Vec<PatchBytes>)> = None;
                while let Some(p) = self.patches.front()
                    && let Some(data) = p.data
                {
                    let (chunk_id, offset) = (p.chunk_id, p.offset);
                    self.patches.pop_front();
                    self.patches_sent += 1;
                    match &mut msg {
                        Some((id, list)) if *id == chunk_id => list.push((offset, data)),
                        _ => {
                            if let Some((chunk_id, patches)) = msg.take() {
                                self.to_send.push_back(Msg::Patch {
                                    chunk_id,
                                    patches,
                                    more: false,
                                });
                            }
                            msg = Some((chunk_id, vec![(offset, data)]));
                        }
                    }
                }
                if let Some((chunk_id, patches)) = msg {
                    let more = self.patches.front().is_some_and(|p| p.chunk_id == chunk_id);
                    self.to_send.push_back(Msg::Patch {
                        chunk_id,
                        patches,
                        more,
                    });
                }
            }
        }
        true
    }

    /// A fragment's 4-byte size field at the write position.
    fn reserve_fragment(&mut self, slot: usize) {
        self.slots[slot].bytes[self.at..self.at + 4].fill(0);
        self.fragment = Some((slot, self.at));
        self.at += 4;
        self.fragment_start = self.at;
    }

    /// The packet goes on in a new chunk: the open fragment is sized when
    /// the old chunk is finished off.
    fn fragment_break(&mut self) {
        self.fragment_old = self.fragment.take();
        self.fragment_old_len = self.at - self.fragment_start;
        self.ops.push_front(Op::Acquire { fragmenting: true });
    }

    fn complete(&mut self, slot: usize, at: usize, inflated: bool) {
        if inflated && at < CHUNK {
            // The inflated count's empty fragment, sized 0.
            self.slots[slot].bytes[at] = 0;
        }
        self.slots[slot].state = State::Complete;
        self.to_send.push_back(Msg::Move(slot));
    }
}

/// The service's side: the sequence, the ring it stores into.
struct Service {
    buffer: Arc<Buffer>,
    seq: Sequence,
    stats: ProducerStats,
    budget: Budget,
}

impl Service {
    fn new() -> Self {
        let buffer = Buffer::new(BufferParams::new(1 << 20, FillPolicy::Discard)).expect("buffer");
        let trust = Trust {
            uid: 1000,
            pid: 42,
            sequence_id: 7,
        };
        let seq = Sequence::new(buffer.writer(WriterId(7)), trust);
        Self {
            buffer,
            seq,
            stats: ProducerStats::default(),
            budget: Budget {
                left: 1 << 20,
                short: 0,
            },
        }
    }

    /// Takes the producer's next message: a chunk moved out of the SMB
    /// (freed, its header zeroed, as the service frees it) or a patch.
    fn deliver(&mut self, w: &mut Writer) -> bool {
        let Some(msg) = w.to_send.pop_front() else {
            return false;
        };
        match msg {
            Msg::Move(slot) => {
                let s = &mut w.slots[slot];
                assert_eq!(s.state, State::Complete, "moved chunks are complete");
                let bytes = s.bytes.clone();
                s.bytes[..HEADER_BYTES].fill(0);
                s.state = State::Free;
                self.seq.on_chunk(&bytes, &mut self.stats, &mut self.budget);
            }
            Msg::Patch {
                chunk_id,
                patches,
                more,
            } => {
                let patches: Vec<(u32, &[u8])> =
                    patches.iter().map(|(o, d)| (*o, &d[..])).collect();
                self.seq
                    .patch(chunk_id, &patches, !more, &mut self.stats, &mut self.budget)
            }
        }
        true
    }

    /// One scrape: each chunk in page order, its state, then its count,
    /// then its bytes, each read after the writer took the steps
    /// `pauses` gives (no commit is taken meanwhile: the same thread does
    /// both).
    fn scrape(&mut self, w: &mut Writer, pauses: &[u8]) {
        let mut pause = pauses.iter().copied().cycle();
        let mut steps = |w: &mut Writer| {
            for _ in 0..pause.next().unwrap_or(0) % 4 {
                w.step();
            }
        };
        let mut read = Vec::new();
        for slot in 0..w.slots.len() {
            steps(w);
            let state = w.slots[slot].state;
            if state == State::Free {
                continue;
            }
            steps(w);
            let packets = w.slots[slot].packets();
            if state == State::Writing && packets & 0x3FF < 2 {
                continue;
            }
            steps(w);
            let mut bytes = w.slots[slot].bytes.clone();
            bytes[6..8].copy_from_slice(&packets.to_le_bytes());
            let id = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            read.push((
                id,
                Scraped {
                    complete: state == State::Complete,
                    bytes,
                },
            ));
        }
        self.seq.on_scrape(read, &mut self.stats, &mut self.budget);
    }

    /// Every packet stored, without the trusted fields; and whether any
    /// was marked as following a loss.
    fn stored(&self) -> (Vec<Vec<u8>>, bool) {
        let batch = self.buffer.take_flush();
        let mut out = Vec::new();
        let mut lost = false;
        for item in batch.items() {
            if let FlushItem::Data(bytes) = item {
                for f in crate::wire::framing::frames(bytes) {
                    let p = f.packet;
                    // uid 1000, sequence 7, pid 42; then field 42 after a loss.
                    let trusted = [3 << 3, 0xE8, 0x07, 10 << 3, 7, 0xF8, 0x04, 42];
                    let at = p
                        .windows(trusted.len())
                        .rposition(|w| w == trusted)
                        .expect("the trusted fields");
                    lost |= p.len() > at + trusted.len();
                    out.push(p[..at].to_vec());
                }
            }
        }
        (out, lost)
    }
}

/// What the service does between the writer's steps.
#[derive(Clone, Debug)]
enum Turn {
    Write(u8),
    Deliver(u8),
    Scrape(Vec<u8>),
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        4 => (1u8..12).prop_map(Turn::Write),
        2 => (1u8..4).prop_map(Turn::Deliver),
        1 => proptest::collection::vec(any::<u8>(), 1..8).prop_map(Turn::Scrape),
    ]
}

/// Runs `turns`, then lets the writer finish (taking commits whenever it
/// waits for a chunk), takes every commit and scrapes once more, as the
/// stop does. Returns what was written and what was stored.
fn run(
    slots: usize,
    first_slot: usize,
    sizes: &[(usize, u8)],
    turns: &[Turn],
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, bool, ProducerStats) {
    let mut w = Writer::new(slots, first_slot, sizes);
    let mut s = Service::new();
    for t in turns {
        match t {
            Turn::Write(n) => {
                for _ in 0..*n {
                    if !w.step() {
                        break;
                    }
                }
            }
            Turn::Deliver(n) => {
                for _ in 0..*n {
                    s.deliver(&mut w);
                }
            }
            Turn::Scrape(pauses) => s.scrape(&mut w, pauses),
        }
    }
    while !w.done() {
        if !w.step() {
            assert!(
                s.deliver(&mut w),
                "the writer waits for a chunk only the service frees"
            );
        }
    }
    while s.deliver(&mut w) {}
    s.scrape(&mut w, &[0]);
    let (stored, lost) = s.stored();
    (w.finished, stored, lost, s.stats)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_finished_packet_is_stored_once_in_order_whatever_reads_it(
        slots in 3usize..8,
        first_slot in 0usize..8,
        sizes in proptest::collection::vec((0usize..120, 1u8..=2), 1..24),
        turns in proptest::collection::vec(turn(), 0..60),
    ) {
        let (written, stored, lost, stats) = run(slots, first_slot, &sizes, &turns);
        prop_assert_eq!(written.len(), sizes.len());
        prop_assert!(!lost, "a loss marked: {:?}", stats);
        prop_assert_eq!(stats.abi_violations, 0);
        prop_assert_eq!(stats.chunks_committed_out_of_order, 0);
        prop_assert_eq!(stats.invalid_packets, 0);
        prop_assert_eq!(stored, written);
    }
}
