//! Writers: encode packets in place into the region they own.
//!
//! The per-packet path is a bounds check, the copy (or the caller's own
//! encoding, through [`PacketSlot`]) and one Release store of the committed
//! length: no lock, no syscall, no allocation, no read-modify-write.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::buffer::{Buffer, WriterTotals};
use super::{DiscardReason, WriteError, WriterId};
use crate::wire::framing::{PACKET_TAG, record_header};
use crate::wire::varint::{self, len_usize as varint_len};

/// Most bytes a slot header takes: the 0x0A tag and a 4-byte varint, as wide
/// as the longest slot's length.
pub const MAX_SLOT_HEADER_BYTES: usize = 5;
/// Largest length a 4-byte varint holds.
const MAX_SLOT_LEN: usize = varint::REDUNDANT4_MAX as usize;
/// Largest length a one-byte varint holds: the short path's packets.
const SHORT_MAX: usize = 0x7F;

/// Bytes a slot of `max_len` reserves before the packet: the 0x0A tag and
/// the length as a varint as wide as `max_len`'s (2 bytes below 128, 3 below
/// 16 KiB, at most [`MAX_SLOT_HEADER_BYTES`]), so that any committed length
/// up to `max_len` fits without moving the body.
#[inline(always)]
pub const fn slot_header_bytes(max_len: usize) -> usize {
    1 + varint_len(max_len)
}

/// A writer's own counters, stored (never RMW'd) by the writer and summed by
/// `Buffer::stats`.
#[derive(Debug, Default)]
pub(crate) struct WriterCounters {
    packets_discarded: AtomicU64,
    bytes_discarded: AtomicU64,
    packets_discarded_pinned: AtomicU64,
    bytes_discarded_pinned: AtomicU64,
    packets_discarded_held: AtomicU64,
    bytes_discarded_held: AtomicU64,
    packets_refused: AtomicU64,
    bytes_refused: AtomicU64,
}

impl WriterCounters {
    pub(crate) fn load(&self) -> WriterTotals {
        WriterTotals {
            packets_discarded: self.packets_discarded.load(Ordering::Relaxed),
            bytes_discarded: self.bytes_discarded.load(Ordering::Relaxed),
            packets_discarded_pinned: self.packets_discarded_pinned.load(Ordering::Relaxed),
            bytes_discarded_pinned: self.bytes_discarded_pinned.load(Ordering::Relaxed),
            packets_discarded_held: self.packets_discarded_held.load(Ordering::Relaxed),
            bytes_discarded_held: self.bytes_discarded_held.load(Ordering::Relaxed),
            packets_refused: self.packets_refused.load(Ordering::Relaxed),
            bytes_refused: self.bytes_refused.load(Ordering::Relaxed),
        }
    }
}

/// The region a writer holds. The per-packet path works from these fields
/// alone (no `Arc` or table lookup), so it is: a room check, the header and
/// copy at `base + pos`, one add to `word` and its Release store.
///
/// Invariants (with M1, M2):
/// * **C1** `base` is the region's first byte in the mapping and `cap` its
///   length: `[base, base + cap)` lies in the mapping (M1) and belongs to
///   this writer (M2) while it holds the region.
/// * **C2** `committed` is the region's committed word in `Live::committed`,
///   alive as long as the `Buffer` (the writer's `Arc` keeps it).
/// * **C3** `word` is what was last stored there: `pack(pos, packets)`, with
///   `pos <= cap < 2^32`, so adding a framed length and `1 << 32` moves both
///   halves without a carry between them.
#[derive(Debug)]
struct Current {
    head: usize,
    base: NonNull<u8>,
    committed: NonNull<AtomicU64>,
    cap: usize,
    word: u64,
}

// SAFETY: C1, C2 — the pointers lead into the `Buffer` the owning `Writer`
// keeps alive through its `Arc`, and only that writer uses them (M2); moving
// the writer to another thread moves that ownership with it.
unsafe impl Send for Current {}

impl Current {
    /// Bytes committed so far (C3: the word's low half).
    #[inline(always)]
    fn pos(&self) -> usize {
        self.word as u32 as usize
    }

    /// Packets committed so far (C3: the word's high half).
    #[inline(always)]
    fn packets(&self) -> u32 {
        (self.word >> 32) as u32
    }

    /// Bytes free after the committed ones.
    #[inline(always)]
    fn room(&self) -> usize {
        self.cap - self.pos()
    }

    /// What completing the region hands the table: (head, bytes, packets).
    fn done(&self) -> (usize, u32, u32) {
        (self.head, self.pos() as u32, self.packets())
    }
}

/// Writes one sequence's packets into a [`Buffer`]. `Send`, used by one
/// thread at a time. Dropping it commits what it holds.
pub struct Writer {
    buffer: Arc<Buffer>,
    id: WriterId,
    cur: Option<Current>,
    counters: Arc<WriterCounters>,
    local: WriterTotals,
    /// Packets were dropped since the current region was acquired.
    lost: bool,
    /// Generation, size and reason of the last refused acquisition: until
    /// the generation moves, an acquisition at least as big fails without
    /// the lock, for the same reason.
    refused_at: Option<(u64, usize, DiscardReason)>,
    /// `buffer.max_packet_len()`, kept here for the fast path.
    max_len: usize,
    /// Longest packet with a one-byte length the buffer takes:
    /// `min(max_len, 127)`, so the short path needs one compare.
    short_max: usize,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("id", &self.id)
            .field("cur", &self.cur)
            .finish_non_exhaustive()
    }
}

impl Writer {
    pub(crate) fn new(buffer: Arc<Buffer>, id: WriterId, counters: Arc<WriterCounters>) -> Writer {
        Writer {
            id,
            cur: None,
            counters,
            local: WriterTotals::default(),
            lost: false,
            refused_at: None,
            max_len: buffer.max_packet_len(),
            short_max: buffer.max_packet_len().min(SHORT_MAX),
            buffer,
        }
    }

    /// The sequence this writer writes.
    pub fn id(&self) -> WriterId {
        self.id
    }

    /// The buffer written to.
    pub fn buffer(&self) -> &Arc<Buffer> {
        &self.buffer
    }

    /// Stores `packet` as `0x0A <varint len> packet`.
    ///
    /// Small enough to inline into the caller's loop: a packet under 128
    /// bytes (a one-byte length, so no varint to size) takes one compare
    /// against `short_max`, the room check, a 2-byte header store, an
    /// inline copy and the publish; anything else takes the general path,
    /// out of line.
    #[inline]
    pub fn write_packet(&mut self, packet: &[u8]) -> Result<(), WriteError> {
        let len = packet.len();
        if len <= self.short_max
            && let Some(c) = self.cur.as_mut()
            && c.room() >= 2 + len
        {
            put_short(c, packet);
            return Ok(());
        }
        self.write_long(packet)
    }

    /// [`write_packet`](Self::write_packet) for any length, or with no room
    /// in the region.
    #[inline(never)]
    fn write_long(&mut self, packet: &[u8]) -> Result<(), WriteError> {
        let len = packet.len();
        let framed = 1 + varint_len(len) + len;
        if len <= self.max_len
            && let Some(c) = self.cur.as_mut()
            && c.room() >= framed
        {
            put_packet(c, packet);
            return Ok(());
        }
        self.write_slow(packet, framed)
    }

    #[cold]
    fn write_slow(&mut self, packet: &[u8], framed: usize) -> Result<(), WriteError> {
        self.make_room(packet.len(), framed)?;
        let c = self
            .cur
            .as_mut()
            .expect("make_room succeeded, so the writer holds a region");
        put_packet(c, packet);
        Ok(())
    }

    /// Reserves room for a packet of at most `max_len` bytes, encoded in
    /// place through the returned slot (zero-copy).
    #[inline]
    pub fn begin_packet(&mut self, max_len: usize) -> Result<PacketSlot<'_>, WriteError> {
        let header = slot_header_bytes(max_len);
        let framed = header + max_len;
        let fits = max_len <= self.max_len && matches!(&self.cur, Some(c) if c.room() >= framed);
        if !fits {
            self.make_room(max_len, framed)?;
        }
        let cur = self
            .cur
            .as_mut()
            .expect("begin_packet holds a region once make_room succeeded");
        Ok(PacketSlot::new(cur, header, max_len))
    }

    /// Like [`begin_packet`](Self::begin_packet), for encoders that can split
    /// their output across packets: a slot of what is free in the current
    /// region (less the slot header, at most `max_len`) when that is at least
    /// `min_len`, and only otherwise a new region's slot of `max_len` bytes,
    /// so that little of a region is left as padding. The slot's
    /// [`max_len`](PacketSlot::max_len) is what was granted. `max_len` above
    /// [`Buffer::max_packet_len`](super::Buffer::max_packet_len) is lowered
    /// to it (a `min_len` above that is refused as too big); a `min_len`
    /// above `max_len` is lowered to `max_len`.
    pub fn begin_packet_at_least(
        &mut self,
        min_len: usize,
        max_len: usize,
    ) -> Result<PacketSlot<'_>, WriteError> {
        let min_len = min_len.min(max_len);
        let max_len = max_len.min(self.max_len);
        if min_len > max_len {
            return self.begin_packet(min_len);
        }
        // The header of any length up to `free` fits in 1 + varint_len(free).
        let room = self.cur.as_ref().map_or(0, |c| {
            let free = c.room();
            free.saturating_sub(1 + varint_len(free))
        });
        let len = room.min(max_len);
        if len > 0 && len >= min_len {
            let cur = self
                .cur
                .as_mut()
                .expect("room was measured in the region the writer holds");
            return Ok(PacketSlot::new(cur, slot_header_bytes(len), len));
        }
        self.begin_packet(max_len)
    }

    /// Hands the current region over (commits it), e.g. before going idle.
    /// Not needed for the data to be flushed: `take_flush` takes committed
    /// prefixes too.
    pub fn flush(&mut self) {
        if let Some(c) = self.cur.take() {
            let (head, used, packets) = c.done();
            self.buffer.complete(head, used, packets);
        }
    }

    /// Gets a region with `framed` free bytes, or counts the packet dropped.
    fn make_room(&mut self, len: usize, framed: usize) -> Result<(), WriteError> {
        if len > self.max_len || len > MAX_SLOT_LEN {
            self.local.packets_refused += 1;
            self.local.bytes_refused += framed as u64;
            let c = &self.counters;
            c.packets_refused
                .store(self.local.packets_refused, Ordering::Relaxed);
            c.bytes_refused
                .store(self.local.bytes_refused, Ordering::Relaxed);
            return Err(WriteError::TooBig);
        }
        let k = framed.div_ceil(self.buffer.chunk_size());
        if self.cur.is_none()
            && let Some((generation, refused_k, reason)) = self.refused_at
            && k >= refused_k
            && generation == self.buffer.generation()
        {
            return Err(self.discard(framed, reason));
        }
        let done = self.cur.take().map(|c| c.done());
        match self.buffer.swap_region(self.id, done, k, self.lost) {
            Ok((head, chunks)) => {
                let cs = self.buffer.chunk_size();
                // SAFETY: M1 — the region `[head * cs, (head + chunks) * cs)`
                // lies in the mapping (the table hands out only its chunks).
                let base = unsafe { self.buffer.base().add(head * cs) };
                self.cur = Some(Current {
                    head,
                    base: NonNull::new(base).expect("the mapping is not at address 0"),
                    committed: NonNull::from(self.buffer.committed(head)),
                    cap: chunks * cs,
                    word: 0,
                });
                self.lost = false;
                self.refused_at = None;
                Ok(())
            }
            Err(refused) => {
                self.refused_at = Some((refused.generation, k, refused.reason));
                Err(self.discard(framed, refused.reason))
            }
        }
    }

    fn discard(&mut self, framed: usize, reason: DiscardReason) -> WriteError {
        self.lost = true;
        let (l, c) = (&mut self.local, &self.counters);
        // The local totals are this writer's; the shared counters mirror them.
        let count = |local: &mut u64, shared: &AtomicU64, n: u64| {
            *local += n;
            shared.store(*local, Ordering::Relaxed);
        };
        count(&mut l.packets_discarded, &c.packets_discarded, 1);
        count(&mut l.bytes_discarded, &c.bytes_discarded, framed as u64);
        match reason {
            DiscardReason::Full => {}
            DiscardReason::Pinned => {
                count(
                    &mut l.packets_discarded_pinned,
                    &c.packets_discarded_pinned,
                    1,
                );
                count(
                    &mut l.bytes_discarded_pinned,
                    &c.bytes_discarded_pinned,
                    framed as u64,
                );
            }
            DiscardReason::HeldByWriters => {
                count(&mut l.packets_discarded_held, &c.packets_discarded_held, 1);
                count(
                    &mut l.bytes_discarded_held,
                    &c.bytes_discarded_held,
                    framed as u64,
                );
            }
        }
        WriteError::Discarded(reason)
    }

    /// Bytes of the region the writer holds (0 if none): its share, as
    /// `Buffer` sized it.
    pub fn region_bytes(&self) -> usize {
        self.cur.as_ref().map_or(0, |c| c.cap)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let done = self.cur.take().map(|c| c.done());
        self.buffer.detach(self.id, done, self.lost, &self.counters);
    }
}

/// Writes a packet of at most [`SHORT_MAX`] bytes, framed with a 2-byte
/// header, at the region's write position and publishes it.
#[inline(always)]
fn put_short(c: &mut Current, packet: &[u8]) {
    let len = packet.len();
    debug_assert!(len <= SHORT_MAX && c.room() >= 2 + len);
    // SAFETY: C1, M2 — the caller checked that the 2 + len framed bytes fit
    // at `pos` in the region this writer owns; nobody else writes there, and
    // the flusher reads only below the committed length published after.
    // No shared slice covers the region at or above `pos` (readers get only
    // what lies below the committed length, M2), so `packet` cannot overlap
    // the destination.
    unsafe {
        let dst = c.base.as_ptr().add(c.pos());
        dst.cast::<[u8; 2]>().write_unaligned(u16::to_le_bytes(
            u16::from(PACKET_TAG) | ((len as u16) << 8),
        ));
        copy_short(packet.as_ptr(), dst.add(2), len);
    }
    publish(c, 2 + len);
}

/// Copies `len < 128` bytes with a few fixed-size moves, the last of each
/// size overlapping the end, instead of a `memcpy` call: for short packets
/// the call and its dispatch cost about as much as the copy.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, and the two
/// ranges do not overlap.
#[inline(always)]
unsafe fn copy_short(src: *const u8, dst: *mut u8, len: usize) {
    debug_assert!(len <= SHORT_MAX);
    /// One unaligned move of `N` bytes at offset `at`.
    ///
    /// # Safety
    /// As `copy_short`'s, for `at + N <= len`.
    #[inline(always)]
    unsafe fn mv<const N: usize>(src: *const u8, dst: *mut u8, at: usize) {
        // SAFETY: by the caller's contract `[at, at + N)` lies within the
        // `len` bytes both pointers are valid for.
        unsafe {
            dst.add(at)
                .cast::<[u8; N]>()
                .write_unaligned(src.add(at).cast::<[u8; N]>().read_unaligned())
        }
    }
    // SAFETY: every move below covers `[at, at + N)` with `at + N <= len`
    // (each branch's bound), which the caller's contract makes valid. Each
    // branch takes the lengths up to twice its move, so a 64-byte packet is
    // two 32-byte moves, not four.
    unsafe {
        if len > 64 {
            mv::<32>(src, dst, 0);
            mv::<32>(src, dst, 32);
            mv::<32>(src, dst, len - 64);
            mv::<32>(src, dst, len - 32);
        } else if len >= 32 {
            mv::<32>(src, dst, 0);
            mv::<32>(src, dst, len - 32);
        } else if len >= 16 {
            mv::<16>(src, dst, 0);
            mv::<16>(src, dst, len - 16);
        } else if len >= 8 {
            mv::<8>(src, dst, 0);
            mv::<8>(src, dst, len - 8);
        } else if len >= 4 {
            mv::<4>(src, dst, 0);
            mv::<4>(src, dst, len - 4);
        } else if len > 0 {
            mv::<1>(src, dst, 0);
            mv::<1>(src, dst, len / 2);
            mv::<1>(src, dst, len - 1);
        }
    }
}

/// Writes a framed packet at the region's write position and publishes it.
#[inline(always)]
fn put_packet(c: &mut Current, packet: &[u8]) {
    let len = packet.len();
    // SAFETY: C1, M2 — the caller checked that the framed packet fits at
    // `pos` in the region this writer owns; nobody else writes there, and
    // the flusher reads only below the committed length published after.
    let n = unsafe {
        let dst = c.base.as_ptr().add(c.pos());
        let n = if len < 0x80 {
            // The common case: a one-byte length.
            dst.cast::<[u8; 2]>()
                .write_unaligned([PACKET_TAG, len as u8]);
            2
        } else {
            let (header, n) = record_header(len);
            std::ptr::copy_nonoverlapping(header.as_ptr(), dst, n);
            n
        };
        debug_assert!(c.room() >= n + len);
        std::ptr::copy_nonoverlapping(packet.as_ptr(), dst.add(n), len);
        n
    };
    publish(c, n + len);
}

/// Writes `0x0A` and `len` as a redundant varint filling the rest of an
/// `n`-byte slot header (`n = slot_header_bytes(max_len)`, `len <= max_len`,
/// so the length fits in `n - 1` varint bytes).
///
/// # Safety
/// `dst` is valid for writes of `n` bytes: the header space of a slot in the
/// calling writer's own region (M1: inside the mapping; M2: at or above its
/// published committed length, so no reader sees these bytes yet).
#[inline(always)]
unsafe fn put_slot_header(dst: *mut u8, n: usize, len: usize) {
    debug_assert!((2..=MAX_SLOT_HEADER_BYTES).contains(&n) && varint_len(len) < n);
    let b = |i: u32| ((len >> (7 * i)) as u8) | 0x80;
    // Fixed-size stores: the small-packet case is one 2-byte store. The last
    // byte ends the varint; `len < 2^(7(n-1))` leaves nothing above it.
    // SAFETY: M1, M2 — by the caller's contract the `n` bytes at `dst` lie in
    // the mapping, in the writer's own region above its committed length.
    unsafe {
        match n {
            2 => dst
                .cast::<[u8; 2]>()
                .write_unaligned([PACKET_TAG, len as u8]),
            3 => dst
                .cast::<[u8; 3]>()
                .write_unaligned([PACKET_TAG, b(0), (len >> 7) as u8]),
            4 => dst
                .cast::<[u8; 4]>()
                .write_unaligned([PACKET_TAG, b(0), b(1), (len >> 14) as u8]),
            _ => dst.cast::<[u8; 5]>().write_unaligned([
                PACKET_TAG,
                b(0),
                b(1),
                b(2),
                ((len >> 21) as u8) & 0x7F,
            ]),
        }
    }
}

/// Moves the committed length past a packet of `framed` bytes.
#[inline(always)]
fn publish(c: &mut Current, framed: usize) {
    debug_assert!(framed <= c.room());
    // C3: the low half stays within `cap`, the high half counts the packet.
    c.word += framed as u64 + (1 << 32);
    // SAFETY: C2 — the word lives in the buffer's table, kept alive by the
    // writer's `Arc`. Release: the packet's bytes are visible to whoever
    // Acquire-loads the new length (R1: the flusher only ever sees whole
    // packets).
    unsafe { c.committed.as_ref() }.store(c.word, Ordering::Release);
}

/// Room for one packet, encoded in place. Dropped without
/// [`commit`](PacketSlot::commit), nothing is written.
pub struct PacketSlot<'a> {
    cur: &'a mut Current,
    /// The slot's first byte (its header's), at the region's `pos`.
    at: NonNull<u8>,
    header: usize,
    max_len: usize,
}

impl<'a> PacketSlot<'a> {
    /// A slot at `cur`'s position; the caller made sure `header + max_len`
    /// bytes are free there.
    #[inline(always)]
    fn new(cur: &'a mut Current, header: usize, max_len: usize) -> PacketSlot<'a> {
        debug_assert!(header + max_len <= cur.room());
        // SAFETY: C1 — `pos <= cap`, so the address lies in the region.
        let at = unsafe { cur.base.add(cur.pos()) };
        PacketSlot {
            cur,
            at,
            header,
            max_len,
        }
    }

    /// The packet's bytes: exactly the `max_len` asked for, contiguous.
    #[inline]
    pub fn buf(&mut self) -> &mut [u8] {
        // SAFETY: C1, M1, M2 — begin_packet (or begin_packet_at_least) made
        // sure `header + max_len` bytes are free at `pos` in the writer's own
        // region; the memory is initialised (zeroed or old data) and only
        // this writer touches it until it publishes a larger committed
        // length. The slot borrows the writer, so no other slice of it lives.
        unsafe { std::slice::from_raw_parts_mut(self.at.as_ptr().add(self.header), self.max_len) }
    }

    /// The reserved length.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Stores the first `len` bytes of [`buf`](Self::buf) as one packet.
    ///
    /// # Panics
    /// If `len` exceeds the reserved length (a caller bug).
    #[inline]
    pub fn commit(self, len: usize) {
        assert!(
            len <= self.max_len,
            "PacketSlot::commit: {len} bytes exceed the {} reserved",
            self.max_len
        );
        // SAFETY: C1, M2 — the `header` bytes precede the slot's buffer in
        // the space begin_packet reserved in this writer's own region.
        unsafe { put_slot_header(self.at.as_ptr(), self.header, len) };
        publish(self.cur, self.header + len);
    }
}
