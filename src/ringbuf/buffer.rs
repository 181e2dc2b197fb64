//! The buffer: one mapping, its chunk table, and the writers' counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::memory::Memory;
use super::table::{Committed, Live, Pin, Refused, Table};
use super::writer::{MAX_SLOT_HEADER_BYTES, Writer, WriterCounters};
use super::{BufferParams, BufferStats, FillPolicy, FlushBatch, RingbufError, WriterId};

/// One mmap'd, chunked ring buffer. `Send + Sync`; shared as `Arc<Buffer>`
/// between its writers and the flusher.
pub struct Buffer {
    memory: Memory,
    size_bytes: usize,
    chunk_size: usize,
    chunk_count: usize,
    region_chunks: usize,
    policy: FillPolicy,
    max_packet_len: usize,
    live: Live,
    inner: Mutex<Inner>,
}

struct Inner {
    table: Table,
    /// Counters of the writers alive now (each stores its own, no RMW).
    writers: Vec<Arc<WriterCounters>>,
    /// Counters of the writers gone.
    retired: WriterTotals,
}

/// Counters a writer keeps for itself: packets that never reached a chunk.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WriterTotals {
    pub(crate) packets_discarded: u64,
    pub(crate) bytes_discarded: u64,
    pub(crate) packets_discarded_pinned: u64,
    pub(crate) bytes_discarded_pinned: u64,
    pub(crate) packets_discarded_held: u64,
    pub(crate) bytes_discarded_held: u64,
    pub(crate) packets_refused: u64,
    pub(crate) bytes_refused: u64,
}

impl WriterTotals {
    fn add(&mut self, o: &WriterTotals) {
        self.packets_discarded += o.packets_discarded;
        self.bytes_discarded += o.bytes_discarded;
        self.packets_discarded_pinned += o.packets_discarded_pinned;
        self.bytes_discarded_pinned += o.bytes_discarded_pinned;
        self.packets_discarded_held += o.packets_discarded_held;
        self.bytes_discarded_held += o.bytes_discarded_held;
        self.packets_refused += o.packets_refused;
        self.bytes_refused += o.bytes_refused;
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("size_bytes", &self.size_bytes)
            .field("chunk_size", &self.chunk_size)
            .field("chunk_count", &self.chunk_count)
            .field("region_chunks", &self.region_chunks)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Buffer {
    /// Maps and (if asked) prefaults the buffer.
    pub fn new(params: BufferParams) -> Result<Arc<Buffer>, RingbufError> {
        let chunk_size = params.chunk_size;
        if !(BufferParams::MIN_CHUNK_SIZE..=BufferParams::MAX_CHUNK_SIZE).contains(&chunk_size) {
            return Err(RingbufError::ChunkSize { chunk_size });
        }
        let too_small = RingbufError::TooSmall {
            size_bytes: params.size_bytes,
            chunk_size,
        };
        if params.size_bytes / chunk_size < 2 {
            return Err(too_small);
        }
        if params.region_chunks == 0 {
            return Err(RingbufError::RegionChunks);
        }
        let memory = Memory::new(params.size_bytes, params.prefault)?;
        // Exactly the capacity asked for; the page-rounding tail is slack.
        let chunk_count = params.size_bytes / chunk_size;
        if u32::try_from(chunk_count).is_err() {
            return Err(too_small);
        }
        let usable = chunk_count * chunk_size;
        let max_packet_len =
            (chunk_size - MAX_SLOT_HEADER_BYTES).max(BufferParams::MAX_PACKET_LEN.min(usable / 4));
        let committed = (0..chunk_count).map(|_| Committed::default()).collect();
        Ok(Arc::new(Buffer {
            memory,
            size_bytes: params.size_bytes,
            chunk_size,
            chunk_count,
            region_chunks: params.region_chunks,
            policy: params.policy,
            max_packet_len,
            live: Live {
                committed,
                generation: AtomicU64::new(0),
            },
            inner: Mutex::new(Inner {
                table: Table::new(chunk_count, chunk_size, params.region_chunks, params.policy),
                writers: Vec::new(),
                retired: WriterTotals::default(),
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The table is updated in place by panic-free code; a panic elsewhere
        // while holding the lock leaves it consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A writer for sequence `id` (unique per session, chosen by the caller).
    pub fn writer(self: &Arc<Self>, id: WriterId) -> Writer {
        let counters = Arc::new(WriterCounters::default());
        {
            let mut inner = self.lock();
            inner.table.attach(id);
            inner.writers.push(Arc::clone(&counters));
        }
        Writer::new(Arc::clone(self), id, counters)
    }

    /// The writer sequences this buffer has served, ascending (trace_stats
    /// names each sequence's buffer so that its losses are attributed).
    pub fn writer_ids(&self) -> Vec<WriterId> {
        self.lock().table.writer_ids()
    }

    /// Counters at this moment; writers keep going.
    pub fn stats(&self) -> BufferStats {
        let inner = self.lock();
        let mut s = inner.table.stats(&self.live);
        let mut w = inner.retired;
        for c in &inner.writers {
            w.add(&c.load());
        }
        s.buffer_size = self.size_bytes as u64;
        s.packets_discarded = w.packets_discarded;
        s.bytes_discarded = w.bytes_discarded;
        s.packets_discarded_pinned = w.packets_discarded_pinned;
        s.bytes_discarded_pinned = w.bytes_discarded_pinned;
        s.packets_discarded_held = w.packets_discarded_held;
        s.bytes_discarded_held = w.bytes_discarded_held;
        s.packets_refused = w.packets_refused;
        s.bytes_refused = w.bytes_refused;
        s
    }

    /// Takes everything committed and not yet taken: complete chunks and the
    /// committed prefix of the chunks being written. The batch pins what it
    /// refers to until released.
    pub fn take_flush(self: &Arc<Self>) -> FlushBatch {
        let taken = self.lock().table.take(&self.live, false);
        FlushBatch::new(Arc::clone(self), taken)
    }

    /// A view of everything held and not yet taken, without consuming it
    /// (flight-recorder output, clones). Pinned like a flush until released.
    pub fn snapshot(self: &Arc<Self>) -> FlushBatch {
        let taken = self.lock().table.take(&self.live, true);
        FlushBatch::new(Arc::clone(self), taken)
    }

    /// Drops all unflushed data, counted in `*_cleared`.
    pub fn clear(&self) {
        self.lock().table.clear(&self.live);
    }

    /// The size asked for. The mapping is this rounded up to the page size;
    /// `chunk_count() * chunk_size()` bytes of it hold chunks.
    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// Bytes actually mapped (page-rounded).
    pub fn mapped_bytes(&self) -> usize {
        self.memory.len()
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.chunk_count
    }

    /// Chunks a writer takes at once at most when the buffer has room.
    pub fn region_chunks(&self) -> usize {
        self.region_chunks
    }

    /// The fill policy.
    pub fn policy(&self) -> FillPolicy {
        self.policy
    }

    /// Longest packet accepted: 1 MiB, or a quarter of the buffer if that is
    /// smaller, and at least what fits in one chunk.
    pub fn max_packet_len(&self) -> usize {
        self.max_packet_len
    }

    // ---- for writers and batches ----

    #[inline]
    pub(crate) fn base(&self) -> *mut u8 {
        self.memory.base()
    }

    #[inline]
    pub(crate) fn committed(&self, head: usize) -> &AtomicU64 {
        &self.live.committed[head].0
    }

    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.live.generation.load(Ordering::Acquire)
    }

    /// Completes `done` (head, bytes, packets) if any and acquires a region
    /// of at least `k` chunks: `(head, chunks)`.
    pub(crate) fn swap_region(
        &self,
        id: WriterId,
        done: Option<(usize, u32, u32)>,
        k: usize,
        lost: bool,
    ) -> Result<(usize, usize), Refused> {
        let mut inner = self.lock();
        if let Some((head, used, packets)) = done {
            inner.table.complete(&self.live, head, used, packets);
        }
        inner.table.acquire(&self.live, id, k, lost)
    }

    pub(crate) fn complete(&self, head: usize, used: u32, packets: u32) {
        self.lock().table.complete(&self.live, head, used, packets);
    }

    /// A writer goes away: completes its region, folds its counters.
    pub(crate) fn detach(
        &self,
        id: WriterId,
        done: Option<(usize, u32, u32)>,
        lost: bool,
        counters: &Arc<WriterCounters>,
    ) {
        let mut inner = self.lock();
        if let Some((head, used, packets)) = done {
            inner.table.complete(&self.live, head, used, packets);
        }
        inner.table.detach(id, lost);
        let totals = counters.load();
        inner.retired.add(&totals);
        inner.writers.retain(|c| !Arc::ptr_eq(c, counters));
    }

    pub(crate) fn release(&self, pins: &[Pin]) {
        self.lock().table.release(&self.live, pins);
    }
}
