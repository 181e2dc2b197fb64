//! The buffer engine: zero-copy, mmap'd, chunked ring buffers.
//!
//! One [`Buffer`] is one mapping of `size_bytes` (rounded up to the page
//! size) cut into fixed-size chunks, after a header and a chunk table that
//! describe it ([`layout`]): anonymous memory, a sealed memfd or a file
//! ([`Backing`]), so that another process can read back what it held
//! ([`image`]) once this one is gone. [`Writer`]s encode packets in place
//! into the chunk they own; the flusher takes byte ranges of the mapping
//! ([`FlushBatch`]) and hands them to the kernel as iovecs. No byte is copied
//! between the writer's encoder and the file.
//!
//! # Layout
//!
//! ```text
//!  mapping (size_bytes, page-rounded)
//!  ┌──────────┬──────────┬──────────┬─────┬────────────┬───────┐
//!  │ chunk 0  │ chunk 1  │ chunk 2  │ ... │ chunk n-1  │ slack │
//!  └──────────┴──────────┴──────────┴─────┴────────────┴───────┘
//!   ◄─chunk_size─►       write cursor ─► (regions of chunks are taken in
//!                                         address order, wrapping:
//!                                         write_wrap_count)
//!
//!  one chunk: packets in the file's own framing, back to back, no header
//!  ┌────┬──────────┬─────────────┬────┬──────────┬──────────┬────────────┐
//!  │ 0A │ len (1-4 │ TracePacket │ 0A │ len      │ packet   │ unused     │
//!  │    │  varint) │  (len B)    │    │          │          │ (padding)  │
//!  └────┴──────────┴─────────────┴────┴──────────┴──────────┴────────────┘
//!   0                                             ▲ committed ▲ chunk_size
//!                                  (bytes, packets) published by the writer
//!                                  with one Release store after each packet
//!
//!  begin_packet(max_len) reserves a length varint as wide as max_len's
//!  (slot_header_bytes) and fills it at commit, redundant if the packet came
//!  out shorter; the packet's bytes never move:
//!   max_len < 128      0A  l0  <packet>                  (2 B, as write_packet)
//!   max_len < 16 KiB   0A  80|l0  l1  <packet>           (3 B)
//!   max_len < 2 MiB    0A  80|l0  80|l1  l2  <packet>    (4 B)
//!   larger             0A  80|l0  80|l1  80|l2  l3  …    (5 B, MAX_SLOT_HEADER_BYTES)
//!
//!  begin_packet_at_least(min, max) hands out what is left of the region (up to
//!  max) when that is at least min, so a splittable writer (ftrace bundles)
//!  leaves less than min of padding at a region's end
//!
//!  a packet larger than a chunk: a span of k adjacent chunks, one region
//!  ┌──────────┬──────────┬──────────┐
//!  │ 0A len … big packet …  │ 0A …  │   flushed as one contiguous range;
//!  └──────────┴──────────┴──────────┘   lost (overwritten) only as a whole
//! ```
//!
//! Chunk metadata (owner, state, read offset, pins) lives out of band in the
//! chunk table under the buffer's mutex, so chunk bytes are exactly the bytes
//! of the file; every change to it is mirrored into the mapping's own chunk
//! table ([`layout`]), never on the writer's per-packet path. A *region* is one chunk or a span of adjacent chunks; every
//! state change applies to a whole region. States:
//! free → writing (one writer) → complete → free, where the flusher may read
//! the committed prefix of a writing region and pin any region it read until
//! its bytes are in the file (or the batch is released).
//!
//! # Policies
//!
//! * [`FillPolicy::RingBuffer`]: when no chunk is free the writer takes the
//!   next chunk under the write cursor that is complete and not pinned (the
//!   oldest one it can reuse), counting what it held as overwritten.
//! * [`FillPolicy::Discard`]: unflushed data is never overwritten. While no
//!   chunk is free, new packets are dropped and counted; once a flush has
//!   been released and freed space, writers are accepted again. (Perfetto's
//!   default buffer stops accepting for good at the first overflow; this one
//!   resumes after a flush, on purpose: a long capture should recover from a
//!   burst.)
//!
//! Where a writer's data was lost, the next batch yields
//! [`FlushItem::Loss`] at exactly that place in the writer's stream.
//!
//! # Invariants
//!
//! Contract (ARCHITECTURE.md §5.1):
//! * **R1** The file receives only whole, well-formed packets: a range handed
//!   out ends at a packet boundary, a region is lost only as a whole.
//! * **R2** Packets of one writer reach the file in the order written, none
//!   twice: each region keeps a read offset that only grows, and a writer's
//!   regions are read in acquisition order.
//! * **R3** Accounting balances at every moment:
//!   `bytes_written = bytes_read + bytes_overwritten + bytes_cleared +
//!   bytes_buffered`, likewise for packets; a dropped packet is counted in
//!   exactly one of overwritten, discarded, refused or cleared.
//! * **R4** Writers never wait for I/O and the flusher never blocks a writer:
//!   the per-packet path takes no lock; the mutex is held only for table
//!   bookkeeping, never across I/O; a writer that finds no chunk drops.
//!
//! Memory safety rests on five more, cited by every `// SAFETY:`:
//! * **M1** The mapping is created once, never moved or unmapped while the
//!   [`Buffer`] lives; every access is within `[0, chunk_count * chunk_size)`.
//! * **M2** Only the writer that owns a writing region writes to it, and only
//!   at or above its published committed length; bytes below that length are
//!   never written again while the region is not free.
//! * **M3** A region referenced by an unreleased [`FlushBatch`] is pinned: it
//!   is never handed to a writer, so the bytes of the batch stay unchanged
//!   until `release`, or until `release_written` lets go of it (M4).
//! * **M4** `FlushBatch::release_written(n)` unpins only regions whose bytes
//!   lie entirely in the first `n` bytes of the batch's data, and its caller
//!   (an `unsafe` call) never reads those bytes again: a write pass lets go
//!   of what the kernel has written while the rest is still in flight. The
//!   one caller is `storage::write_pass`; what it relies on lives there and
//!   in `storage` (P1, kept by `storage::WriteList` for every sink, not by
//!   each sink; P2, local to the pass).
//! * **M5** The live page and the chunk table lie in the mapping, aligned,
//!   below the chunks, and are accessed only through atomics (see
//!   [`layout`]): sound even when another process shares the mapping.
//!
//! Reading a ring back in place adds **M6** ([`image::SealedMap`]): the
//! memfd mapped read-only is sealed against every change first.
//!
//! # Writers and chunks
//!
//! A chunk ([`BufferParams::DEFAULT_CHUNK_SIZE`], 4 KiB) is the unit of
//! allocation; a writer takes a *region* of adjacent chunks at once, sized
//! when it asks (`Table::region_size`): its share of the space it can take,
//! `avail / (2 × writers holding no region)`, capped at
//! [`BufferParams::region_chunks`] (64 KiB) and never less than the packet
//! needs. `avail` is the free chunks (fully read ones are freed as soon as
//! no pass pins them); a RING_BUFFER without enough free chunks, which
//! overwrites anyway, counts every chunk not being written.
//!
//! **W1** Each acquisition leaves at least `(2R − 1) / 2R` of the available
//! chunks to the `R − 1` other writers holding nothing, so while the
//! buffer has more chunks than writers, a writer attached before the
//! others start writing (the session attaches every data source's writer
//! at start) always finds a chunk: no packet is lost because writers
//! outnumber regions, and a lone busy writer still takes whole 64 KiB
//! regions. A writer attached later finds what the holders left (at
//! least half of the space available when the last of them took its
//! share); regions return as their writers fill or flush them.
//!
//! **W2** A write pass pins only the regions it read, and only until their
//! bytes are in the file: the pass lets go of each region as the sink
//! reports its bytes written (`release_written`, M4), not at the end of
//! the pass. Writers take free (DISCARD) or complete unpinned (RING_BUFFER)
//! chunks around them, so a pass in flight never refuses a writer while
//! such chunks exist, and what the pass has written already is such
//! chunks.
//!
//! **W3** Regions are taken first fit in ring order: from the write cursor,
//! the first run of at least the needed chunks, the writer's share of it at
//! most. Under RING_BUFFER the complete unpinned regions the search passes
//! over (a run too short for the packet) are overwritten with the ones it
//! takes. So, with no pass pinning data, overwrites go oldest first for
//! every writer and what the buffer keeps of each writer sequence is one
//! run ending at its newest packet: no piece from before a wrap outlives
//! newer data. (Regions other writers hold, and regions a pass or snapshot
//! pins, are skipped and keep their data.)
//!
//! A writer that finds no chunk drops the packet and counts it by
//! [`DiscardReason`]: DISCARD full of unread data, space pinned by a pass in
//! flight, or every chunk held by other writers (more writers than chunks).
//! The summary and `trace_stats` report each apart.
//!
//! # Chunk size
//!
//! Regions of 64 KiB ([`BufferParams::DEFAULT_REGION_BYTES`]) come from the
//! `ringbuf` benchmark (`BENCHMARKS.md`, "Buffer engine"): the per-packet
//! cost is flat from 16 KiB up while 4 KiB hand-overs were the slowest (a
//! mutex round trip every ~60 small packets), and handing a full 64 MiB
//! buffer to the flusher took 53 µs with 64 KiB regions against 825 µs with
//! 4 KiB ones (the flusher walks regions, not chunks). Chunks of 4 KiB let
//! many writers share a small buffer; overwrite loss stays per region.
//!
//! # Testing
//!
//! Unit tests beside the code (small enough for miri:
//! `cargo +nightly miri test --lib ringbuf::`, ~30 s once the dependencies
//! are built); the model test, stress test and RSS test in
//! `tests/integration/ringbuf.rs`; the fuzz target `ringbuf_model`
//! (`cd fuzz && cargo +nightly fuzz run ringbuf_model -- -max_total_time=120`,
//! ran clean for 124 s, 18 625 runs, once slot headers and
//! `begin_packet_at_least` were in the model) shares the model oracle with the
//! proptest.
#![allow(unsafe_code)]

mod buffer;
mod flush;
pub mod image;
pub mod layout;
mod memory;
mod stats;
mod table;
mod writer;

pub use buffer::Buffer;
pub use flush::{FlushBatch, FlushItem};
pub use layout::RingIdentity;
pub use memory::Backing;
pub use stats::BufferStats;
pub use writer::{MAX_SLOT_HEADER_BYTES, PacketSlot, Writer, slot_header_bytes};

/// What a full buffer does with new data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FillPolicy {
    /// Reuse the oldest complete, unpinned chunk (flight recorder).
    #[default]
    RingBuffer,
    /// Never overwrite unflushed data; drop new packets while full.
    Discard,
}

/// Identity of one writer sequence: the packets' `trusted_packet_sequence_id`,
/// chosen by the caller, unique per session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WriterId(pub u32);

/// How to build a [`Buffer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferParams {
    /// Bytes of trace data the buffer holds (rounded up to the page size).
    pub size_bytes: usize,
    /// Bytes per chunk: the unit of allocation, reuse and loss.
    pub chunk_size: usize,
    /// Chunks a writer takes at once at most when the buffer has room (its
    /// region; fewer when space is short, more for a packet that needs them).
    /// See "Writers and chunks" in the module docs.
    pub region_chunks: usize,
    /// What to do when full.
    pub policy: FillPolicy,
    /// Fault every page in at creation (`MADV_POPULATE_WRITE`), so writers
    /// never take a page fault.
    pub prefault: bool,
}

impl BufferParams {
    /// Default chunk size: the allocation unit, small so that many writers
    /// each find one (see "Writers and chunks" in the module docs).
    pub const DEFAULT_CHUNK_SIZE: usize = 4 * 1024;
    /// Default region: what a writer takes at once when there is room (see
    /// "Chunk size" in the module docs for why 64 KiB).
    pub const DEFAULT_REGION_BYTES: usize = 64 * 1024;
    /// The fewest chunks [`BufferParams::new`] cuts a buffer into (chunks
    /// shrink, by halves down to 256 bytes, to reach it).
    pub(crate) const MIN_CHUNKS: usize = 64;
    /// Smallest chunk accepted.
    pub(crate) const MIN_CHUNK_SIZE: usize = 16;
    /// Largest chunk accepted (offsets in a region are 32-bit).
    pub(crate) const MAX_CHUNK_SIZE: usize = 64 * 1024 * 1024;
    /// Packets up to this length are accepted whole (if the buffer holds at
    /// least four times as much; see [`Buffer::max_packet_len`]).
    pub(crate) const MAX_PACKET_LEN: usize = 1024 * 1024;

    /// Params with the default chunk size, shrunk (by halves, down to 256
    /// bytes) so that a small buffer still holds [`Self::MIN_CHUNKS`]
    /// chunks, and regions of 64 KiB, or a quarter of the buffer if that is
    /// smaller; prefault on.
    pub fn new(size_bytes: usize, policy: FillPolicy) -> Self {
        let mut chunk_size = Self::DEFAULT_CHUNK_SIZE;
        while chunk_size > 256 && chunk_size.saturating_mul(Self::MIN_CHUNKS) > size_bytes {
            chunk_size /= 2;
        }
        BufferParams {
            size_bytes,
            chunk_size,
            region_chunks: 1,
            policy,
            prefault: true,
        }
        .with_chunk_size(chunk_size)
    }

    /// These params with chunks of `chunk_size` and regions of 64 KiB in
    /// them (at least one chunk, at most a quarter of the buffer).
    pub fn with_chunk_size(self, chunk_size: usize) -> Self {
        let chunks = self.size_bytes / chunk_size.max(1);
        let region_chunks = (Self::DEFAULT_REGION_BYTES / chunk_size.max(1))
            .min(chunks / 4)
            .max(1);
        BufferParams {
            chunk_size,
            region_chunks,
            ..self
        }
    }
}

/// Why a buffer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RingbufError {
    /// The chunk size is outside the range the engine takes.
    #[error(
        "chunk_size {chunk_size} is out of range ({min}..={max})",
        min = BufferParams::MIN_CHUNK_SIZE,
        max = BufferParams::MAX_CHUNK_SIZE
    )]
    ChunkSize {
        /// The chunk size asked for, in bytes.
        chunk_size: usize,
    },
    /// A region was asked to span no chunk.
    #[error("region_chunks must be at least 1")]
    RegionChunks,
    /// The buffer holds fewer than 2 chunks of the chunk size, or more
    /// than the chunk table can describe.
    #[error("buffer of {size_bytes} bytes holds fewer than 2 chunks of {chunk_size} bytes")]
    TooSmall {
        /// The buffer size asked for.
        size_bytes: usize,
        /// The chunk size in use.
        chunk_size: usize,
    },
    /// The mapping could not be made: its layout overflows, the memfd or
    /// ring file could not be made or sized, or `mmap` failed.
    #[error("cannot map a buffer of {size_bytes} bytes: {source}")]
    Map {
        /// The buffer size asked for.
        size_bytes: usize,
        /// What the system said.
        source: std::io::Error,
    },
}

/// Why no chunk could be had for a packet: each is counted apart
/// ([`BufferStats`]), so that a loss is reported as what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiscardReason {
    /// DISCARD: unread data fills the buffer.
    Full,
    /// The space a writer could take is pinned by a write pass in flight
    /// (its bytes are being written to the file); it frees as the pass ends.
    Pinned,
    /// Every chunk not in a pass is held by another writer, or was taken by
    /// one for little data (DISCARD, its unread chunks less than half
    /// filled): more writers than the buffer has chunks, not a full buffer.
    HeldByWriters,
}

/// Why a packet was not stored. Tiny and `Copy`: counted, never logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WriteError {
    /// No chunk could be had (see [`DiscardReason`]); counted in
    /// `packets_discarded` and in the reason's own counter.
    #[error("no chunk could be had: packet discarded ({0:?})")]
    Discarded(DiscardReason),
    /// Larger than [`Buffer::max_packet_len`]; counted in `packets_refused`.
    /// The caller is told at once, so no loss marker is emitted for it.
    #[error("packet too big for this buffer")]
    TooBig,
}

#[cfg(test)]
mod tests;
