//! The chunk table: who owns which chunk, what of it was read, what is
//! pinned. Pure bookkeeping under the buffer's mutex; it never touches chunk
//! bytes, only the writers' published committed lengths. Every change to a
//! region is mirrored into the mapping's chunk table (`layout::Mirror`), so
//! that what the buffer holds can be read back by another process after
//! this one died.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use super::layout::{Mirror, flags};
use super::{BufferStats, DiscardReason, FillPolicy, WriterId};

/// What writers and the table share without the mutex.
pub(crate) struct Live {
    /// The mapping's chunk table: per head chunk, the writing region's
    /// committed `(bytes, packets)`, packed by [`pack`], stored by the
    /// owning writer after every packet (each word on a cache line of its
    /// own: two writers storing into neighbouring chunks must not share
    /// one).
    pub(crate) mirror: Mirror,
    /// Bumped whenever a chunk may have become available, so that a writer
    /// refused once can fail fast, without the lock, until something changed.
    pub(crate) generation: AtomicU64,
}

impl Live {
    /// The committed word of the region at `head`.
    #[inline]
    pub(crate) fn committed(&self, head: usize) -> &AtomicU64 {
        &self.mirror.desc(head).committed
    }
}

/// Packs a committed length and packet count into one word, so that one
/// Release store publishes both consistently.
#[inline]
pub(crate) fn pack(bytes: u32, packets: u32) -> u64 {
    (u64::from(packets) << 32) | u64::from(bytes)
}

#[inline]
pub(crate) fn unpack(word: u64) -> (u32, u32) {
    // Truncations are the packing's inverse: low half bytes, high half packets.
    (word as u32, (word >> 32) as u32)
}

/// One chunk or a span of adjacent chunks, described at its first chunk.
#[derive(Clone, Copy, Debug)]
struct Region {
    chunks: u32,
    writer: WriterId,
    writing: bool,
    /// Final length and packet count, valid once complete.
    used: u32,
    packets: u32,
    /// What the flusher already took (or `clear` dropped).
    read: u32,
    read_packets: u32,
    /// Unreleased batches referencing this region (M3).
    pins: u32,
    /// The writer lost data right before `read`: the next batch emits a loss
    /// marker before this region's next bytes.
    loss_pending: bool,
    /// Some of it was dropped by `clear` (so it is not counted as read).
    cleared: bool,
}

#[derive(Clone, Copy, Debug)]
enum Slot {
    Free,
    Head(Region),
    /// A later chunk of a span; its state is the head's.
    Member,
}

/// One writer sequence: its live regions in acquisition (= write) order.
#[derive(Debug, Default)]
struct Sequence {
    regions: VecDeque<usize>,
    /// Data was lost after every region listed: the loss goes before the
    /// writer's next region.
    loss_tail: bool,
    writers: u32,
}

/// A piece of a flush batch, as offsets into the mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawItem {
    Data { offset: usize, len: usize },
    Loss(WriterId),
}

/// A region a batch pins, and where its bytes end in the batch's data (the
/// sum of the data items' lengths up to and including this region's range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pin {
    pub(crate) head: u32,
    pub(crate) data_end: u64,
}

/// A run of takeable chunks [`Table::find`] chose.
#[derive(Clone, Copy, Debug)]
struct Found {
    start: usize,
    /// The region's length.
    chunks: usize,
    /// Where what must be reclaimed ends (`start + chunks` or past it).
    end: usize,
    /// The search went past the end of the ring to reach `start`.
    wrapped: bool,
}

/// What `take` gathered.
pub(crate) struct Taken {
    pub(crate) items: Vec<RawItem>,
    /// In data order, so `data_end` never decreases.
    pub(crate) pins: Vec<Pin>,
    pub(crate) bytes: u64,
}

pub(crate) struct Table {
    slots: Vec<Slot>,
    chunk_size: usize,
    /// Chunks a writer takes at once when there is room.
    region_chunks: usize,
    policy: FillPolicy,
    cursor: usize,
    free_chunks: usize,
    /// Chunks in writing regions.
    writing_chunks: usize,
    /// Writing regions (one per writer holding one).
    writing_regions: usize,
    /// Writers attached now (every `Writer`, whatever its sequence).
    attached: usize,
    sequences: BTreeMap<WriterId, Sequence>,
    /// Every writer sequence that ever attached (`sequences` forgets the
    /// finished ones once read).
    served: BTreeSet<WriterId>,
    totals: BufferStats,
    generation: u64,
    /// The mapping's chunk table and live page.
    mirror: Mirror,
    /// Regions handed out so far: the next one's acquisition number.
    orders: u64,
}

/// A chunk acquisition was refused: the generation at that moment, and why.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Refused {
    pub(crate) generation: u64,
    pub(crate) reason: DiscardReason,
}

impl Table {
    pub(crate) fn new(
        chunk_count: usize,
        chunk_size: usize,
        region_chunks: usize,
        policy: FillPolicy,
        mirror: Mirror,
    ) -> Table {
        Table {
            slots: vec![Slot::Free; chunk_count],
            chunk_size,
            region_chunks,
            policy,
            cursor: 0,
            free_chunks: chunk_count,
            writing_chunks: 0,
            writing_regions: 0,
            attached: 0,
            sequences: BTreeMap::new(),
            served: BTreeSet::new(),
            totals: BufferStats::default(),
            generation: 0,
            mirror,
            orders: 0,
        }
    }

    /// The region at `head`'s flags, as the mapping's table keeps them.
    fn flag_bits(r: &Region) -> u32 {
        (if r.loss_pending {
            flags::LOSS_BEFORE
        } else {
            0
        }) | (if r.cleared { flags::CLEARED } else { 0 })
    }

    /// The counters, on the mapping's live page.
    fn mirror_stats(&self) {
        self.mirror.stats(&self.totals);
    }

    fn bump(&mut self, live: &Live) {
        self.generation += 1;
        live.generation.store(self.generation, Ordering::Release);
    }

    /// Every writer sequence that ever attached, ascending.
    pub(crate) fn writer_ids(&self) -> Vec<WriterId> {
        self.served.iter().copied().collect()
    }

    pub(crate) fn attach(&mut self, id: WriterId) {
        self.served.insert(id);
        self.sequences.entry(id).or_default().writers += 1;
        self.attached += 1;
    }

    /// The last writer of `id` went away; `lost` if it dropped packets after
    /// its last region.
    pub(crate) fn detach(&mut self, id: WriterId, lost: bool) {
        let seq = self.sequences.entry(id).or_default();
        seq.writers = seq.writers.saturating_sub(1);
        seq.loss_tail |= lost;
        self.attached = self.attached.saturating_sub(1);
    }

    fn region_mut(&mut self, head: usize) -> Option<&mut Region> {
        match self.slots.get_mut(head) {
            Some(Slot::Head(r)) => Some(r),
            _ => None,
        }
    }

    /// Where a region's readable data ends: the writer's published length
    /// while it writes, the final one after.
    fn end_of(r: &Region, head: usize, live: &Live) -> (u32, u32) {
        if r.writing {
            // Acquire pairs with the writer's Release store: the bytes below
            // the length are visible (M2).
            unpack(live.committed(head).load(Ordering::Acquire))
        } else {
            (r.used, r.packets)
        }
    }

    /// Returns a region to the free chunks. `lost`: the writer's stream has a
    /// gap here, which moves to its next region (or its tail).
    fn free_region(&mut self, head: usize, lost: bool) {
        let Some(&mut r) = self.region_mut(head) else {
            return;
        };
        if let Some(seq) = self.sequences.get_mut(&r.writer)
            && let Some(i) = seq.regions.iter().position(|&h| h == head)
        {
            seq.regions.remove(i);
            if lost {
                match seq.regions.get(i).copied() {
                    Some(next) => {
                        if let Some(Slot::Head(n)) = self.slots.get_mut(next) {
                            n.loss_pending = true;
                            self.mirror.flags(next, Self::flag_bits(n));
                        }
                    }
                    None => seq.loss_tail = true,
                }
            }
        }
        let end = head + r.chunks as usize;
        for s in &mut self.slots[head..end] {
            *s = Slot::Free;
        }
        self.mirror.free(head);
        self.free_chunks += r.chunks as usize;
    }

    /// Whether the slot at `j` may be taken: `Ok(chunks it covers)` or
    /// `Err(chunks to skip)`.
    fn takeable(&self, j: usize) -> Result<usize, usize> {
        match &self.slots[j] {
            Slot::Free => Ok(1),
            Slot::Member => Err(1),
            Slot::Head(r) => {
                // M3: pinned regions are never reused; writing ones belong to
                // their writer (M2).
                let reusable = !r.writing
                    && r.pins == 0
                    && (self.policy == FillPolicy::RingBuffer || r.read == r.used);
                if reusable {
                    Ok(r.chunks as usize)
                } else {
                    Err(r.chunks as usize)
                }
            }
        }
    }

    /// How many chunks a writer needing `need` takes: its share of the
    /// space it can take, `avail / (2 × writers without a region)`, capped
    /// at `region_chunks`, and never less than `need`. Half of what is
    /// available stays for the writers that hold nothing yet (see "Writers
    /// and chunks" in the module docs). The space is the free chunks (taking
    /// them loses nothing); only a RING_BUFFER without enough of them, which
    /// overwrites anyway, counts every chunk not being written.
    fn region_size(&self, need: usize) -> usize {
        let avail = match self.policy {
            FillPolicy::RingBuffer if self.free_chunks < need => {
                self.slots.len() - self.writing_chunks
            }
            _ => self.free_chunks,
        };
        // The acquiring writer holds nothing now (swap_region completed its
        // region first), so it is among those counted.
        let regionless = self.attached.saturating_sub(self.writing_regions).max(1);
        let share = avail / (2 * regionless);
        need.max(share.min(self.region_chunks))
    }

    /// Gives `id` a region at the write cursor, or at the first place after
    /// it where `need` adjacent chunks can be had: its share of chunks
    /// ([`Self::region_size`]) or fewer if the run there is shorter, reusing
    /// complete unpinned chunks under RING_BUFFER. `lost`: the writer
    /// dropped packets since its previous region. Returns the region's head
    /// and length in chunks.
    pub(crate) fn acquire(
        &mut self,
        live: &Live,
        id: WriterId,
        need: usize,
        lost: bool,
    ) -> Result<(usize, usize), Refused> {
        let want = self.region_size(need);
        let Some(found) = self.find(need, want) else {
            self.totals.chunks_discarded += 1;
            self.mirror_stats();
            return Err(Refused {
                generation: self.generation,
                reason: self.refusal_reason(need),
            });
        };
        let Found {
            start,
            chunks: k,
            end,
            wrapped,
        } = found;
        // W3: what the search passed over is older than anything it will
        // write; under RING_BUFFER it goes now, not after newer data.
        if self.policy == FillPolicy::RingBuffer {
            if wrapped {
                self.reclaim(self.cursor, self.slots.len());
                self.reclaim(0, start);
            } else {
                self.reclaim(self.cursor, start);
            }
        }
        // Everything in [start, end): free chunks stay free, complete
        // regions are overwritten (RING_BUFFER) or were fully read.
        self.reclaim(start, end);
        let seq = self.sequences.entry(id).or_default();
        let loss_pending = lost || seq.loss_tail;
        seq.loss_tail = false;
        seq.regions.push_back(start);
        self.slots[start] = Slot::Head(Region {
            chunks: k as u32,
            writer: id,
            writing: true,
            used: 0,
            packets: 0,
            read: 0,
            read_packets: 0,
            pins: 0,
            loss_pending,
            cleared: false,
        });
        for s in &mut self.slots[start + 1..start + k] {
            *s = Slot::Member;
        }
        self.free_chunks -= k;
        self.writing_chunks += k;
        self.writing_regions += 1;
        live.committed(start).store(pack(0, 0), Ordering::Release);
        self.orders += 1;
        self.mirror
            .begin_region(start, k, id.0, self.orders, loss_pending);
        if wrapped {
            self.totals.write_wrap_count += 1;
        }
        self.cursor = start + k;
        if self.cursor >= self.slots.len() {
            self.cursor = 0;
            self.totals.write_wrap_count += 1;
        }
        self.mirror_stats();
        Ok((start, k))
    }

    /// Frees the reusable regions among the slots in `[from, to)`, counting
    /// unread bytes as overwritten; regions a writer or a pass holds stay
    /// (a range [`Self::find`] chose holds none).
    fn reclaim(&mut self, from: usize, to: usize) {
        let mut i = from;
        while i < to {
            match self.slots[i] {
                Slot::Head(r) => {
                    if self.takeable(i).is_ok() {
                        let unread = r.used - r.read;
                        if unread > 0 {
                            self.totals.chunks_overwritten += u64::from(r.chunks);
                            self.totals.bytes_overwritten += u64::from(unread);
                            self.totals.packets_overwritten +=
                                u64::from(r.packets - r.read_packets);
                        }
                        self.free_region(i, unread > 0 || r.loss_pending);
                    }
                    i += r.chunks as usize;
                }
                Slot::Free | Slot::Member => i += 1,
            }
        }
    }

    /// The first run of at least `need` takeable chunks from the write
    /// cursor on, `want` of them at most (W3: first fit, so writes follow
    /// the ring in order), or `None` when no run is long enough.
    fn find(&self, need: usize, want: usize) -> Option<Found> {
        let n = self.slots.len();
        if need == 0 || need > n || (self.policy == FillPolicy::Discard && self.free_chunks < need)
        {
            return None;
        }
        let want = want.max(need);
        let mut start = self.cursor;
        let mut scanned = 0usize;
        let mut wrapped = false;
        while scanned < n {
            // Grow a run of takeable slots from `start`; a reusable region
            // may carry it past `want` (the rest of it is freed).
            let mut j = start;
            let blocked = loop {
                if j >= start + want || j >= n {
                    break None;
                }
                match self.takeable(j) {
                    Ok(len) => j += len,
                    Err(skip) => break Some(j + skip),
                }
            };
            if j - start >= need {
                return Some(Found {
                    start,
                    chunks: (j - start).min(want),
                    end: j,
                    wrapped,
                });
            }
            let next = blocked.unwrap_or(j);
            scanned += next - start;
            start = next;
            if start >= n {
                start = 0;
                wrapped = true;
            }
        }
        None
    }

    /// Why `need` chunks could not be had: a write pass pins space that
    /// would do once released; else DISCARD's unread data fills at least as
    /// many chunks as writers hold, and fills them (at least half of their
    /// bytes: the buffer is full); else writers hold the chunks, or took
    /// them for little data each (many writers, few chunks: "full" would
    /// mislead, with most of the buffer's bytes unused).
    fn refusal_reason(&self, need: usize) -> DiscardReason {
        let (mut pinned, mut unread, mut held) = (0usize, 0usize, 0usize);
        let mut unread_bytes = 0u64;
        for slot in &self.slots {
            match slot {
                Slot::Head(r) if r.writing => held += r.chunks as usize,
                Slot::Head(r) => {
                    let reusable = self.policy == FillPolicy::RingBuffer || r.read == r.used;
                    if r.pins > 0 && reusable {
                        pinned += r.chunks as usize;
                    }
                    if r.read < r.used {
                        unread += r.chunks as usize;
                        unread_bytes += u64::from(r.used - r.read);
                    }
                }
                _ => {}
            }
        }
        let filled = unread_bytes.saturating_mul(2) >= (unread * self.chunk_size) as u64;
        if pinned > 0 && pinned + self.free_chunks >= need {
            DiscardReason::Pinned
        } else if self.policy == FillPolicy::Discard && unread > 0 && unread >= held && filled {
            DiscardReason::Full
        } else if pinned > 0 {
            DiscardReason::Pinned
        } else {
            DiscardReason::HeldByWriters
        }
    }

    /// The writer is done with the region at `head`, holding `used` bytes in
    /// `packets` packets.
    pub(crate) fn complete(&mut self, live: &Live, head: usize, used: u32, packets: u32) {
        let chunk_size = self.chunk_size as u64;
        let Some(r) = self.region_mut(head) else {
            return;
        };
        if !r.writing {
            return;
        }
        r.writing = false;
        r.used = used;
        r.packets = packets;
        let r = *r;
        self.mirror.complete(head, pack(used, packets));
        self.writing_chunks -= r.chunks as usize;
        self.writing_regions -= 1;
        if used > 0 {
            let t = &mut self.totals;
            t.bytes_written += u64::from(used);
            t.packets_written += u64::from(packets);
            t.chunks_written += u64::from(r.chunks);
            t.unused_chunk_bytes += u64::from(r.chunks) * chunk_size - u64::from(used);
            if r.read == used && !r.cleared {
                t.chunks_read += u64::from(r.chunks);
            }
        }
        if r.pins == 0 && r.read == used {
            self.free_region(head, r.loss_pending);
        }
        self.mirror_stats();
        self.bump(live);
    }

    /// Everything committed and not yet read, grouped by writer (ascending
    /// id), each writer's data in write order, with loss markers in place.
    /// `snapshot`: leave read offsets and loss flags as they are.
    /// The parts reading the table changes, borrowed apart so that
    /// walking the sequences can update the slots, totals and mirror.
    fn read_parts(
        &mut self,
    ) -> (
        &mut Vec<Slot>,
        &mut BTreeMap<WriterId, Sequence>,
        &mut BufferStats,
        &mut Mirror,
    ) {
        (
            &mut self.slots,
            &mut self.sequences,
            &mut self.totals,
            &mut self.mirror,
        )
    }

    pub(crate) fn take(&mut self, live: &Live, snapshot: bool) -> Taken {
        let mut taken = Taken {
            items: Vec::new(),
            pins: Vec::new(),
            bytes: 0,
        };
        let chunk_size = self.chunk_size;
        let (slots, sequences, totals, mirror) = self.read_parts();
        for (&id, seq) in sequences.iter_mut() {
            // A tail loss comes after every region listed.
            let mut pending = false;
            let tail = seq.loss_tail;
            if !snapshot {
                seq.loss_tail = false;
            }
            for &h in &seq.regions {
                let Some(Slot::Head(r)) = slots.get_mut(h) else {
                    continue;
                };
                if r.loss_pending {
                    pending = true;
                    if !snapshot {
                        r.loss_pending = false;
                        mirror.flags(h, Self::flag_bits(r));
                    }
                }
                let (end, end_packets) = Self::end_of(r, h, live);
                if end <= r.read {
                    continue;
                }
                if pending {
                    taken.items.push(RawItem::Loss(id));
                    pending = false;
                }
                let offset = h * chunk_size + r.read as usize;
                let len = (end - r.read) as usize;
                push_data(&mut taken.items, offset, len);
                r.pins += 1;
                mirror.pins(h, r.pins);
                taken.bytes += len as u64;
                taken.pins.push(Pin {
                    head: h as u32,
                    data_end: taken.bytes,
                });
                if !snapshot {
                    totals.bytes_read += len as u64;
                    totals.packets_read += u64::from(end_packets - r.read_packets);
                    r.read = end;
                    r.read_packets = end_packets;
                    mirror.read(h, pack(end, end_packets), Self::flag_bits(r));
                    if !r.writing && !r.cleared {
                        totals.chunks_read += u64::from(r.chunks);
                    }
                }
            }
            pending |= tail;
            if pending {
                // Nothing follows the loss yet: keep it where the writer's
                // next bytes will go, or mark the end of a finished stream.
                let last_writing = seq.regions.back().and_then(|&h| match slots.get_mut(h) {
                    Some(Slot::Head(r)) if r.writing => Some((h, r)),
                    _ => None,
                });
                match last_writing {
                    Some((h, r)) => {
                        r.loss_pending |= !snapshot;
                        mirror.flags(h, Self::flag_bits(r));
                    }
                    None if seq.writers > 0 => seq.loss_tail |= !snapshot,
                    None => taken.items.push(RawItem::Loss(id)),
                }
            }
        }
        if !snapshot {
            sequences.retain(|_, s| s.writers > 0 || !s.regions.is_empty() || s.loss_tail);
            self.mirror_stats();
            if taken.bytes > 0 {
                // What was unread is now pinned: a writer refused before
                // asks again, and is told the new reason.
                self.bump(live);
            }
        }
        taken
    }

    /// A batch is done with these regions.
    pub(crate) fn release(&mut self, live: &Live, pins: &[Pin]) {
        for pin in pins {
            let h = pin.head as usize;
            let Some(r) = self.region_mut(h) else {
                continue;
            };
            r.pins = r.pins.saturating_sub(1);
            let r = *r;
            self.mirror.pins(h, r.pins);
            if r.pins == 0 && !r.writing && r.read == r.used {
                self.free_region(h, r.loss_pending);
            }
        }
        self.bump(live);
    }

    /// Drops all unread data, counted as cleared; each writer that lost data
    /// gets a loss marker before its next bytes.
    pub(crate) fn clear(&mut self, live: &Live) {
        let mut freeable = Vec::new();
        let (slots, sequences, totals, mirror) = self.read_parts();
        for seq in sequences.values() {
            for &h in &seq.regions {
                let Some(Slot::Head(r)) = slots.get_mut(h) else {
                    continue;
                };
                let (end, end_packets) = Self::end_of(r, h, live);
                if end > r.read {
                    totals.bytes_cleared += u64::from(end - r.read);
                    totals.packets_cleared += u64::from(end_packets - r.read_packets);
                    if !r.writing {
                        totals.chunks_cleared += u64::from(r.chunks);
                    }
                    r.read = end;
                    r.read_packets = end_packets;
                    r.loss_pending = true;
                    r.cleared = true;
                    mirror.read(h, pack(end, end_packets), Self::flag_bits(r));
                }
                if !r.writing && r.pins == 0 {
                    freeable.push((h, r.loss_pending));
                }
            }
        }
        for (h, lost) in freeable {
            self.free_region(h, lost);
        }
        self.mirror_stats();
        self.bump(live);
    }

    /// The table's counters plus what the writing regions hold right now.
    pub(crate) fn stats(&self, live: &Live) -> BufferStats {
        let mut s = self.totals;
        for seq in self.sequences.values() {
            for &h in &seq.regions {
                let Some(Slot::Head(r)) = self.slots.get(h) else {
                    continue;
                };
                let (end, end_packets) = Self::end_of(r, h, live);
                if r.writing {
                    s.bytes_written += u64::from(end);
                    s.packets_written += u64::from(end_packets);
                }
                s.bytes_buffered += u64::from(end - r.read);
                s.packets_buffered += u64::from(end_packets - r.read_packets);
            }
        }
        s
    }
}

/// Appends a data range, merging it with the previous one when adjacent in
/// the mapping (fewer iovecs; the bytes are the same).
fn push_data(items: &mut Vec<RawItem>, offset: usize, len: usize) {
    if let Some(RawItem::Data { offset: o, len: l }) = items.last_mut()
        && *o + *l == offset
    {
        *l += len;
        return;
    }
    items.push(RawItem::Data { offset, len });
}
