//! The buffer: one mapping, its chunk table, and the writers' counters.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::layout::{CoreHeader, Layout, Meta, Mirror, PAGE, RingIdentity};
use super::memory::{Backing, Memory};
use super::table::{Live, Pin, Refused, Table};
use super::writer::{MAX_SLOT_HEADER_BYTES, Writer, WriterCounters};
use super::{BufferParams, BufferStats, FillPolicy, FlushBatch, RingbufError, WriterId};

/// One mmap'd, chunked ring buffer. `Send + Sync`; shared as `Arc<Buffer>`
/// between its writers and the flusher.
pub struct Buffer {
    memory: Memory,
    /// Where the chunks start in the mapping (after the header and table).
    data_offset: usize,
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
    /// Maps and (if asked) prefaults the buffer: anonymous memory, with a
    /// header that names no session.
    pub fn new(params: BufferParams) -> Result<Arc<Buffer>, RingbufError> {
        Self::create(params, Backing::Anonymous, &RingIdentity::default())
    }

    /// Maps the buffer on `backing`, writes its header (`identity`: whose
    /// it is, and the clocks and config a trace of it needs) and, if asked,
    /// prefaults it. See `layout` for what the mapping holds.
    pub fn create(
        params: BufferParams,
        backing: Backing,
        identity: &RingIdentity,
    ) -> Result<Arc<Buffer>, RingbufError> {
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
        // Exactly the capacity asked for; the page-rounding tail is slack.
        let chunk_count = params.size_bytes / chunk_size;
        if chunk_count > super::layout::MAX_CHUNKS {
            return Err(too_small);
        }
        let meta = Meta {
            clocks: identity.clocks.clone(),
            config: identity.config.clone(),
        }
        .encode();
        let map_err = |source| RingbufError::Map {
            size_bytes: params.size_bytes,
            source,
        };
        let layout = Layout::new(chunk_count, chunk_size, meta.len())
            .ok_or_else(|| map_err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        let total = usize::try_from(layout.total)
            .map_err(|_| map_err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        let memory = Memory::new(total, params.prefault, backing)?;
        let header = CoreHeader {
            file_len: layout.total,
            chunk_size: chunk_size as u32,
            chunk_count: chunk_count as u32,
            region_chunks: params.region_chunks.min(u32::MAX as usize) as u32,
            policy: params.policy,
            index: identity.index,
            count: identity.count.max(identity.index + 1),
            meta_a: layout.meta_a,
            meta_b: layout.meta_b,
            meta_len: layout.meta_len as u32,
            live: layout.live,
            table: layout.table,
            data: layout.data,
            uuid: identity.uuid,
            uid: identity.uid,
            pid: identity.pid,
            boot_id: identity.boot_id,
            created_realtime_ns: identity.created_realtime_ns,
        }
        .encode();
        // SAFETY: M1, M5 — the header copies and the meta areas lie below
        // the live page and the table, in the mapping just made, which no
        // writer or batch can reach yet.
        unsafe {
            memory.write_at(0, &header);
            memory.write_at(PAGE, &header);
            memory.write_at(layout.meta_a as usize, &meta);
            memory.write_at(layout.meta_b as usize, &meta);
        }
        // SAFETY: M1, M5 — the mapping is `layout.total` bytes from its
        // page-aligned base, lives in the buffer with every copy of the
        // mirror (the table, the writers' `Arc`), and has `chunk_count`
        // table entries.
        let mirror = unsafe { Mirror::new(memory.base_nonnull(), &layout, chunk_count) };
        let usable = chunk_count * chunk_size;
        let max_packet_len =
            (chunk_size - MAX_SLOT_HEADER_BYTES).max(BufferParams::MAX_PACKET_LEN.min(usable / 4));
        Ok(Arc::new(Buffer {
            memory,
            data_offset: layout.data as usize,
            size_bytes: params.size_bytes,
            chunk_size,
            chunk_count,
            region_chunks: params.region_chunks,
            policy: params.policy,
            max_packet_len,
            live: Live {
                mirror,
                generation: AtomicU64::new(0),
            },
            inner: Mutex::new(Inner {
                table: Table::new(
                    chunk_count,
                    chunk_size,
                    params.region_chunks,
                    params.policy,
                    mirror,
                ),
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
    pub(crate) fn writer_ids(&self) -> Vec<WriterId> {
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

    /// Bytes actually mapped (page-rounded): the chunks, and before them
    /// the header, the chunk table and the live page (`layout`).
    #[cfg(test)]
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.memory.len()
    }

    /// The file behind a shared buffer (a memfd or a ring file), which
    /// another process may be given to read what the buffer held after
    /// this one is gone; `None` for anonymous memory.
    pub fn shared_file(&self) -> Option<BorrowedFd<'_>> {
        self.memory.file()
    }

    /// Writes what a file-backed buffer holds back to its file, and waits
    /// (`--ring-sync`); writers keep going meanwhile. A no-op for memory.
    pub(crate) fn sync_to_file(&self) -> std::io::Result<()> {
        self.memory.sync()
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

    /// Where the chunks start.
    #[inline]
    pub(crate) fn base(&self) -> *mut u8 {
        // SAFETY: M1 — the chunks lie `data_offset` bytes into the mapping.
        unsafe { self.memory.base().add(self.data_offset) }
    }

    #[inline]
    pub(crate) fn committed(&self, head: usize) -> &AtomicU64 {
        self.live.committed(head)
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
