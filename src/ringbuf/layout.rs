//! The mapping's own layout: every buffer describes itself, whether it is an
//! anonymous mapping, a memfd shared with the process that saves it when
//! the recorder dies, or a file in `--ring-dir`.
//!
//! ```text
//!  offset 0           4 KiB          8 KiB
//!  ┌──────────────┬──────────────┬───────────┬───────────┬───────┬─────────────┬──────────┐
//!  │ core header  │ core header  │ meta A    │ meta B    │ live  │ chunk table │ chunks   │
//!  │ (copy A)     │ (copy B)     │ (config,  │ (a copy)  │ page  │ 64 B/chunk  │ (data)   │
//!  │              │              │  clocks)  │           │       │             │          │
//!  └──────────────┴──────────────┴───────────┴───────────┴───────┴─────────────┴──────────┘
//!   written once at creation, checksummed  │ written by the engine as it runs  │ page-aligned
//! ```
//!
//! - **Core header** (256 bytes, little-endian, FNV-1a 64 checksum, two
//!   copies): magic `RECRING\0`, version, the byte order the atomics below
//!   were written in, sizes (file, chunk, chunk count, region), fill policy,
//!   the offsets of every area, the buffer's index and the session's buffer
//!   count, the session's trace UUID, uid and pid, the boot id and the wall
//!   time of creation. See [`CoreHeader`].
//! - **Meta** (two copies, each checksummed): the clock snapshot taken when
//!   the buffer was made and the session's TraceConfig (binary), what a
//!   valid trace needs from the session besides its packets.
//! - **Live page**: the chunk table's counters ([`LIVE_STATS`]), mirrored
//!   under the buffer's mutex after every table operation, inside a
//!   sequence count.
//! - **Chunk table**: one 64-byte [`Desc`] per chunk. Its first word is the
//!   writing region's committed word, the one the writer stores after every
//!   packet (C2); the rest mirrors the table's region bookkeeping (state,
//!   length, writer, acquisition order, final and read lengths, loss flag,
//!   pins), written only under the buffer's mutex, inside a per-entry
//!   sequence count (odd while an entry is being rewritten).
//! - **Chunks**: the data, exactly as before (`mod.rs`, "Layout").
//!
//! The writer's per-packet path is unchanged: it stores its committed word
//! where it always did, through the pointer it took at acquisition; only
//! the word's address moved from the heap into the mapping. Everything else
//! is written at region hand-overs, passes and releases.
//!
//! Invariant (with M1):
//! - **M5** The live page and the chunk table lie in the mapping at 64-byte
//!   aligned offsets below the chunks; they are only ever accessed through
//!   atomics ([`Desc`], [`LiveArea`]), whose every bit pattern is valid, so
//!   a mapping shared with another process (a memfd, a ring file) stays
//!   sound to read and write here whatever the other side stores, and the
//!   other side reads it as untrusted bytes (`image`). No slice is ever made
//!   of these areas; the chunk bytes are handed out only as M2–M4 say.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::{BufferStats, FillPolicy};

/// The core header's magic.
pub(crate) const MAGIC: [u8; 8] = *b"RECRING\0";
/// The meta area's magic.
pub(crate) const META_MAGIC: [u8; 8] = *b"RECMETA\0";
/// The layout version this build writes and reads.
pub(crate) const VERSION: u32 = 1;
/// Written as a native `u32`: read back as such, it says whether the
/// reader's byte order is the writer's (the atomics are native).
pub(crate) const BYTE_ORDER_MARK: u32 = 0x0102_0304;
/// Bytes of the core header, the checksum's last 8 included.
pub(crate) const CORE_LEN: usize = 256;
/// The page every area is aligned to.
pub(crate) const PAGE: usize = 4096;
/// Bytes of one chunk-table entry.
pub(crate) const DESC_BYTES: usize = 64;
/// Most clocks a meta area holds.
pub(crate) const MAX_CLOCKS: usize = 16;
/// Most config bytes a meta area holds (the config loader's own limit).
pub(crate) const MAX_CONFIG: usize = 1 << 20;
/// Most chunks a buffer has (buffers are under 4 GiB, chunks at least
/// 256 bytes; smaller test buffers have fewer).
pub(crate) const MAX_CHUNKS: usize = 1 << 24;

/// The name of buffer `index`'s file in a ring directory (`--ring-dir`).
pub(crate) fn file_name(index: u32) -> String {
    format!("buffer-{index:03}.ring")
}

/// The buffer index a ring directory's file name stands for, if it is one
/// of [`file_name`]'s.
pub(crate) fn index_of_file(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("buffer-")?.strip_suffix(".ring")?;
    if digits.len() < 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let i: u32 = digits.parse().ok()?;
    (file_name(i) == name).then_some(i)
}

/// Chunk-table entry states ([`Desc::state`]).
pub(crate) mod state {
    /// Nobody's: its bytes are stale.
    pub(crate) const FREE: u32 = 0;
    /// A later chunk of a region; the region is described at its head.
    pub(crate) const MEMBER: u32 = 1;
    /// A region's head, its writer still writing: the committed word says
    /// how far.
    pub(crate) const WRITING: u32 = 2;
    /// A region's head, complete: `used` says how far.
    pub(crate) const COMPLETE: u32 = 3;
}

/// [`Desc::flags`] bits.
pub(crate) mod flags {
    /// The writer lost data right before this region's unread bytes: a
    /// loss marker goes before them.
    pub(crate) const LOSS_BEFORE: u32 = 1;
    /// Some of it was dropped by a clear.
    pub(crate) const CLEARED: u32 = 2;
}

/// One chunk-table entry, 64 bytes on a cache line of its own (two writers
/// storing their committed words after every packet must not share one).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct Desc {
    /// The writing region's committed `(bytes, packets)`, packed as
    /// `table::pack` does; stored by the owning writer after every packet.
    pub committed: AtomicU64,
    /// Odd while the table rewrites the fields below.
    pub seq: AtomicU32,
    /// One of [`state`].
    pub state: AtomicU32,
    /// The region's length in chunks (at its head).
    pub chunks: AtomicU32,
    /// The writer sequence (`WriterId`) that owns the region.
    pub writer: AtomicU32,
    /// Acquisition number: a writer's regions in write order, from 1.
    pub order: AtomicU64,
    /// Final `(bytes, packets)` once complete, packed.
    pub used: AtomicU64,
    /// What a write pass took (or a clear dropped): `(bytes, packets)`.
    pub read: AtomicU64,
    /// [`flags`] bits.
    pub flags: AtomicU32,
    /// Unreleased batches holding the region.
    pub(crate) pins: AtomicU32,
    _reserved: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Desc>() == DESC_BYTES);

/// The table counters mirrored on the live page, in this order.
pub(crate) const LIVE_STATS: [&str; 15] = [
    "bytes_written",
    "chunks_written",
    "chunks_overwritten",
    "bytes_overwritten",
    "chunks_discarded",
    "packets_written",
    "packets_overwritten",
    "bytes_read",
    "chunks_read",
    "packets_read",
    "write_wrap_count",
    "unused_chunk_bytes",
    "chunks_cleared",
    "bytes_cleared",
    "packets_cleared",
];

/// The live page's contents.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct LiveArea {
    /// Odd while `stats` is rewritten.
    pub seq: AtomicU32,
    _pad: AtomicU32,
    /// [`LIVE_STATS`], in order.
    pub stats: [AtomicU64; LIVE_STATS.len()],
}

const _: () = assert!(std::mem::size_of::<LiveArea>() <= PAGE);

/// The table counters in [`LIVE_STATS`] order.
pub(crate) fn stats_words(s: &BufferStats) -> [u64; LIVE_STATS.len()] {
    [
        s.bytes_written,
        s.chunks_written,
        s.chunks_overwritten,
        s.bytes_overwritten,
        s.chunks_discarded,
        s.packets_written,
        s.packets_overwritten,
        s.bytes_read,
        s.chunks_read,
        s.packets_read,
        s.write_wrap_count,
        s.unused_chunk_bytes,
        s.chunks_cleared,
        s.bytes_cleared,
        s.packets_cleared,
    ]
}

/// [`LIVE_STATS`] words back into counters (the others stay 0).
pub(crate) fn stats_from_words(w: &[u64; LIVE_STATS.len()]) -> BufferStats {
    BufferStats {
        bytes_written: w[0],
        chunks_written: w[1],
        chunks_overwritten: w[2],
        bytes_overwritten: w[3],
        chunks_discarded: w[4],
        packets_written: w[5],
        packets_overwritten: w[6],
        bytes_read: w[7],
        chunks_read: w[8],
        packets_read: w[9],
        write_wrap_count: w[10],
        unused_chunk_bytes: w[11],
        chunks_cleared: w[12],
        bytes_cleared: w[13],
        packets_cleared: w[14],
        ..BufferStats::default()
    }
}

/// Who a buffer belongs to and what a trace of it needs besides its
/// packets: written into its header when it is made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingIdentity {
    /// The buffer's index in the config, and how many the session has.
    pub index: u32,
    /// How many buffers the session has.
    pub count: u32,
    /// The session's trace UUID (msb, lsb).
    pub uuid: (i64, i64),
    /// The trusted uid of the session's own packets.
    pub uid: u32,
    /// The recording process.
    pub pid: u32,
    /// `/proc/sys/kernel/random/boot_id` as 16 bytes (zero when unknown).
    pub boot_id: [u8; 16],
    /// Wall time of creation, ns since the epoch.
    pub created_realtime_ns: u64,
    /// (builtin clock id, ns) read together when the buffer was made.
    pub clocks: Vec<(u32, u64)>,
    /// The session's TraceConfig, binary.
    pub config: Vec<u8>,
}

/// Where each area lies, for a buffer's sizes and meta length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) meta_a: u64,
    pub(crate) meta_b: u64,
    /// Bytes reserved for each meta copy (page-rounded).
    pub(crate) meta_len: u64,
    pub live: u64,
    pub table: u64,
    pub data: u64,
    /// The whole mapping (page-rounded).
    pub total: u64,
}

impl Layout {
    /// The layout of `chunk_count` chunks of `chunk_size` bytes holding
    /// `meta_bytes` of meta; `None` when it does not fit in 64 bits.
    pub(crate) fn new(chunk_count: usize, chunk_size: usize, meta_bytes: usize) -> Option<Layout> {
        let page = PAGE as u64;
        let meta_len = (meta_bytes as u64)
            .checked_next_multiple_of(page)?
            .max(page);
        let meta_a = 2 * page;
        let meta_b = meta_a.checked_add(meta_len)?;
        let live = meta_b.checked_add(meta_len)?;
        let table = live.checked_add(page)?;
        let table_len = (chunk_count as u64).checked_mul(DESC_BYTES as u64)?;
        let data = table
            .checked_add(table_len)?
            .checked_next_multiple_of(page)?;
        let data_len = (chunk_count as u64).checked_mul(chunk_size as u64)?;
        let total = data.checked_add(data_len)?.checked_next_multiple_of(page)?;
        Some(Layout {
            meta_a,
            meta_b,
            meta_len,
            live,
            table,
            data,
            total,
        })
    }
}

/// The core header, as written and read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoreHeader {
    pub(crate) file_len: u64,
    /// Bytes per chunk.
    pub chunk_size: u32,
    /// Chunks in the data area.
    pub chunk_count: u32,
    /// Chunks a writer takes at once at most when the buffer has room.
    pub region_chunks: u32,
    /// What the writers did when no chunk was free: RING_BUFFER or
    /// DISCARD.
    pub policy: FillPolicy,
    /// The buffer's index in the session's config.
    pub index: u32,
    /// How many buffers the session has.
    pub count: u32,
    pub(crate) meta_a: u64,
    pub(crate) meta_b: u64,
    pub(crate) meta_len: u32,
    /// Offset of the live page (the counters).
    pub live: u64,
    /// Offset of the chunk table.
    pub table: u64,
    /// Offset of the first chunk.
    pub data: u64,
    /// The session's trace UUID (msb, lsb).
    pub uuid: (i64, i64),
    /// The trusted uid of the session's own packets.
    pub uid: u32,
    /// The recording process.
    pub pid: u32,
    /// `/proc/sys/kernel/random/boot_id` as 16 bytes (zero when unknown).
    pub boot_id: [u8; 16],
    /// Wall time of creation, ns since the epoch.
    pub created_realtime_ns: u64,
}

/// Why a header or meta area was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The area is shorter than a header: the file is cut short there.
    #[error("too short")]
    Short,
    /// The magic is wrong: not a ring buffer, or the area is overwritten.
    #[error("not a ring buffer (magic)")]
    Magic,
    /// Written by a build with another layout version (the one found).
    #[error("layout version {0} (this build reads {VERSION})")]
    Version(u32),
    /// Written on a machine of the other byte order, whose atomics' words
    /// this one would misread.
    #[error("written on a machine of the other byte order")]
    ByteOrder,
    /// The checksum does not match: the copy is damaged.
    #[error("checksum mismatch")]
    Checksum,
    /// The fields disagree with each other or with what the engine makes
    /// (which one is named).
    #[error("inconsistent: {0}")]
    Inconsistent(&'static str),
}

/// FNV-1a, 64 bits: damage detection, not security.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl CoreHeader {
    /// The header's 256 bytes, checksum last.
    pub fn encode(&self) -> [u8; CORE_LEN] {
        let mut b = [0u8; CORE_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        put_u32(&mut b, 8, VERSION);
        b[12..16].copy_from_slice(&BYTE_ORDER_MARK.to_ne_bytes());
        put_u32(&mut b, 16, CORE_LEN as u32);
        put_u64(&mut b, 24, self.file_len);
        put_u32(&mut b, 32, self.chunk_size);
        put_u32(&mut b, 36, self.chunk_count);
        put_u32(&mut b, 40, self.region_chunks);
        put_u32(
            &mut b,
            44,
            match self.policy {
                FillPolicy::RingBuffer => 0,
                FillPolicy::Discard => 1,
            },
        );
        put_u32(&mut b, 48, self.index);
        put_u32(&mut b, 52, self.count);
        put_u64(&mut b, 56, self.meta_a);
        put_u64(&mut b, 64, self.meta_b);
        put_u32(&mut b, 72, self.meta_len);
        put_u64(&mut b, 80, self.live);
        put_u64(&mut b, 88, self.table);
        put_u64(&mut b, 96, self.data);
        put_u64(&mut b, 104, self.uuid.0 as u64);
        put_u64(&mut b, 112, self.uuid.1 as u64);
        put_u32(&mut b, 120, self.uid);
        put_u32(&mut b, 124, self.pid);
        b[128..144].copy_from_slice(&self.boot_id);
        put_u64(&mut b, 144, self.created_realtime_ns);
        let sum = fnv1a(&b[..CORE_LEN - 8]);
        put_u64(&mut b, CORE_LEN - 8, sum);
        b
    }

    /// Reads and checks a header: its checksum, then that its areas follow
    /// each other in order, aligned, within `file_len`, and that its sizes
    /// are within what the engine makes. `b` is untrusted.
    pub fn decode(b: &[u8]) -> Result<CoreHeader, HeaderError> {
        if b.len() < CORE_LEN {
            return Err(HeaderError::Short);
        }
        if b[0..8] != MAGIC {
            return Err(HeaderError::Magic);
        }
        let version = get_u32(b, 8);
        if version != VERSION {
            return Err(HeaderError::Version(version));
        }
        if fnv1a(&b[..CORE_LEN - 8]) != get_u64(b, CORE_LEN - 8) {
            return Err(HeaderError::Checksum);
        }
        let mut bom = [0u8; 4];
        bom.copy_from_slice(&b[12..16]);
        if u32::from_ne_bytes(bom) != BYTE_ORDER_MARK {
            return Err(HeaderError::ByteOrder);
        }
        let policy = match get_u32(b, 44) {
            0 => FillPolicy::RingBuffer,
            1 => FillPolicy::Discard,
            _ => return Err(HeaderError::Inconsistent("fill policy")),
        };
        let h = CoreHeader {
            file_len: get_u64(b, 24),
            chunk_size: get_u32(b, 32),
            chunk_count: get_u32(b, 36),
            region_chunks: get_u32(b, 40),
            policy,
            index: get_u32(b, 48),
            count: get_u32(b, 52),
            meta_a: get_u64(b, 56),
            meta_b: get_u64(b, 64),
            meta_len: get_u32(b, 72),
            live: get_u64(b, 80),
            table: get_u64(b, 88),
            data: get_u64(b, 96),
            uuid: (get_u64(b, 104) as i64, get_u64(b, 112) as i64),
            uid: get_u32(b, 120),
            pid: get_u32(b, 124),
            boot_id: {
                let mut id = [0u8; 16];
                id.copy_from_slice(&b[128..144]);
                id
            },
            created_realtime_ns: get_u64(b, 144),
        };
        h.check()?;
        Ok(h)
    }

    /// The layout rules a header must keep (see [`Self::decode`]).
    fn check(&self) -> Result<(), HeaderError> {
        use HeaderError::Inconsistent as Bad;
        let cs = self.chunk_size as usize;
        if !(super::BufferParams::MIN_CHUNK_SIZE..=super::BufferParams::MAX_CHUNK_SIZE)
            .contains(&cs)
        {
            return Err(Bad("chunk size"));
        }
        let n = self.chunk_count as usize;
        if !(2..=MAX_CHUNKS).contains(&n) {
            return Err(Bad("chunk count"));
        }
        if self.index >= self.count || self.count > 1024 {
            return Err(Bad("buffer index"));
        }
        let meta_len = u64::from(self.meta_len);
        let Some(want) = Layout::new(n, cs, self.meta_len as usize) else {
            return Err(Bad("sizes"));
        };
        if meta_len % PAGE as u64 != 0 || meta_len > (MAX_CONFIG + 2 * PAGE) as u64 {
            return Err(Bad("meta length"));
        }
        let got = Layout {
            meta_a: self.meta_a,
            meta_b: self.meta_b,
            meta_len,
            live: self.live,
            table: self.table,
            data: self.data,
            total: self.file_len,
        };
        if got != want {
            return Err(Bad("area offsets"));
        }
        Ok(())
    }
}

/// What the meta area holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// (builtin clock id, ns) read together when the buffer was made.
    pub clocks: Vec<(u32, u64)>,
    /// The session's TraceConfig, binary.
    pub config: Vec<u8>,
}

/// Fixed bytes of a meta area before its clocks: magic, length, clock
/// count, checksum.
const META_HEAD: usize = 24;

impl Meta {
    /// Bytes the encoded meta takes.
    pub(crate) fn encoded_len(clocks: usize, config: usize) -> usize {
        META_HEAD + clocks.min(MAX_CLOCKS) * 16 + 4 + config.min(MAX_CONFIG)
    }

    /// Encoded: magic, length, clock count, checksum of what follows, the
    /// clocks, the config's length and bytes. At most [`MAX_CLOCKS`] clocks
    /// and [`MAX_CONFIG`] config bytes are kept.
    pub fn encode(&self) -> Vec<u8> {
        let clocks = &self.clocks[..self.clocks.len().min(MAX_CLOCKS)];
        let config = &self.config[..self.config.len().min(MAX_CONFIG)];
        let len = Self::encoded_len(clocks.len(), config.len());
        let mut b = vec![0u8; len];
        b[0..8].copy_from_slice(&META_MAGIC);
        put_u32(&mut b, 8, len as u32);
        put_u32(&mut b, 12, clocks.len() as u32);
        let mut at = META_HEAD;
        for &(id, ts) in clocks {
            put_u32(&mut b, at, id);
            put_u64(&mut b, at + 8, ts);
            at += 16;
        }
        put_u32(&mut b, at, config.len() as u32);
        b[at + 4..].copy_from_slice(config);
        let sum = fnv1a(&b[META_HEAD..]);
        put_u64(&mut b, 16, sum);
        b
    }

    /// Reads a meta area (untrusted): at most `b.len()` bytes are looked at.
    pub fn decode(b: &[u8]) -> Result<Meta, HeaderError> {
        if b.len() < META_HEAD + 4 {
            return Err(HeaderError::Short);
        }
        if b[0..8] != META_MAGIC {
            return Err(HeaderError::Magic);
        }
        let len = get_u32(b, 8) as usize;
        let clocks = get_u32(b, 12) as usize;
        if len > b.len() || len < META_HEAD + 4 || clocks > MAX_CLOCKS {
            return Err(HeaderError::Inconsistent("meta length"));
        }
        if fnv1a(&b[META_HEAD..len]) != get_u64(b, 16) {
            return Err(HeaderError::Checksum);
        }
        let b = &b[..len];
        let cfg_at = META_HEAD + clocks * 16;
        if cfg_at + 4 > len {
            return Err(HeaderError::Inconsistent("meta clocks"));
        }
        let clocks = (0..clocks)
            .map(|i| {
                let at = META_HEAD + i * 16;
                (get_u32(b, at), get_u64(b, at + 8))
            })
            .collect();
        let cfg_len = get_u32(b, cfg_at) as usize;
        if cfg_len > MAX_CONFIG || cfg_at + 4 + cfg_len != len {
            return Err(HeaderError::Inconsistent("meta config length"));
        }
        Ok(Meta {
            clocks,
            config: b[cfg_at + 4..].to_vec(),
        })
    }
}

/// The table's way into the mapping: where the chunk table and the live
/// page are. Copied into the table and the writers' bookkeeping; valid as
/// long as the buffer's mapping (M1, M5).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mirror {
    descs: NonNull<Desc>,
    count: usize,
    live: NonNull<LiveArea>,
}

// SAFETY: M5 — a `Mirror` only leads to atomics in the buffer's mapping,
// which lives as long as every holder (the table inside the buffer, writers
// through their `Arc<Buffer>`); atomics may be used from any thread.
unsafe impl Send for Mirror {}
// SAFETY: M5 — as above.
unsafe impl Sync for Mirror {}

impl Mirror {
    /// The mirror of a mapping at `base` laid out as `layout`.
    ///
    /// # Safety
    /// M1, M5: `base` is the start of a live mapping of at least
    /// `layout.total` bytes, page-aligned, that outlives every copy of the
    /// mirror, and `count` is the chunk count `layout` was made for.
    pub(crate) unsafe fn new(base: NonNull<u8>, layout: &Layout, count: usize) -> Mirror {
        // SAFETY: by the caller's contract the offsets lie in the mapping;
        // they are page multiples, so 64-byte aligned.
        unsafe {
            Mirror {
                descs: base.add(layout.table as usize).cast::<Desc>(),
                count,
                live: base.add(layout.live as usize).cast::<LiveArea>(),
            }
        }
    }

    /// Entry `i` of the chunk table.
    #[inline]
    pub(crate) fn desc(&self, i: usize) -> &Desc {
        assert!(i < self.count, "chunk {i} out of {}", self.count);
        // SAFETY: M1, M5 — `i` is in the table, which lies in the mapping,
        // aligned; a `Desc` is atomics only, valid for any bits.
        unsafe { self.descs.add(i).as_ref() }
    }

    fn live(&self) -> &LiveArea {
        // SAFETY: M1, M5 — the live page lies in the mapping, aligned, and
        // holds atomics only.
        unsafe { self.live.as_ref() }
    }

    /// Rewrites entry `i` with `f` inside its sequence count. Only the
    /// table calls this, under the buffer's mutex: one writer of these
    /// fields at a time.
    fn rewrite(&self, i: usize, f: impl FnOnce(&Desc)) {
        let d = self.desc(i);
        let s = d.seq.load(Ordering::Relaxed);
        d.seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        f(d);
        d.seq
            .store((s.wrapping_add(1) | 1).wrapping_add(1), Ordering::Release);
    }

    /// A region now starts at `head`: its writer's, `chunks` long, the
    /// `order`th taken; `loss_before` if the writer lost data before it.
    pub(crate) fn begin_region(
        &self,
        head: usize,
        chunks: usize,
        writer: u32,
        order: u64,
        loss_before: bool,
    ) {
        self.rewrite(head, |d| {
            d.state.store(state::WRITING, Ordering::Relaxed);
            d.chunks.store(chunks as u32, Ordering::Relaxed);
            d.writer.store(writer, Ordering::Relaxed);
            d.order.store(order, Ordering::Relaxed);
            d.used.store(0, Ordering::Relaxed);
            d.read.store(0, Ordering::Relaxed);
            d.flags.store(
                if loss_before { flags::LOSS_BEFORE } else { 0 },
                Ordering::Relaxed,
            );
            d.pins.store(0, Ordering::Relaxed);
        });
        for i in head + 1..head + chunks {
            self.rewrite(i, |d| d.state.store(state::MEMBER, Ordering::Relaxed));
        }
    }

    /// The region at `head` is complete with `used` (packed) in it.
    pub(crate) fn complete(&self, head: usize, used: u64) {
        self.rewrite(head, |d| {
            d.used.store(used, Ordering::Relaxed);
            d.state.store(state::COMPLETE, Ordering::Relaxed);
        });
    }

    /// The region at `head` is free again.
    pub(crate) fn free(&self, head: usize) {
        self.rewrite(head, |d| d.state.store(state::FREE, Ordering::Relaxed));
    }

    /// What of the region at `head` was taken (packed), and its flags.
    pub(crate) fn read(&self, head: usize, read: u64, flag_bits: u32) {
        self.rewrite(head, |d| {
            d.read.store(read, Ordering::Relaxed);
            d.flags.store(flag_bits, Ordering::Relaxed);
        });
    }

    /// The region at `head`'s flags.
    pub(crate) fn flags(&self, head: usize, flag_bits: u32) {
        self.rewrite(head, |d| d.flags.store(flag_bits, Ordering::Relaxed));
    }

    /// Batches holding the region at `head`.
    pub(crate) fn pins(&self, head: usize, pins: u32) {
        self.desc(head).pins.store(pins, Ordering::Relaxed);
    }

    /// The table's counters, inside the live page's sequence count.
    pub(crate) fn stats(&self, s: &BufferStats) {
        let live = self.live();
        let seq = live.seq.load(Ordering::Relaxed);
        live.seq.store(seq.wrapping_add(1) | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        for (w, v) in live.stats.iter().zip(stats_words(s)) {
            w.store(v, Ordering::Relaxed);
        }
        live.seq
            .store((seq.wrapping_add(1) | 1).wrapping_add(1), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> CoreHeader {
        let l = Layout::new(64, 4096, 300).expect("fits");
        CoreHeader {
            file_len: l.total,
            chunk_size: 4096,
            chunk_count: 64,
            region_chunks: 16,
            policy: FillPolicy::Discard,
            index: 1,
            count: 2,
            meta_a: l.meta_a,
            meta_b: l.meta_b,
            meta_len: l.meta_len as u32,
            live: l.live,
            table: l.table,
            data: l.data,
            uuid: (-5, 7),
            uid: 1000,
            pid: 42,
            boot_id: [9; 16],
            created_realtime_ns: 123,
        }
    }

    #[test]
    fn a_header_round_trips_and_any_flipped_byte_is_caught() {
        let h = header();
        let b = h.encode();
        assert_eq!(CoreHeader::decode(&b), Ok(h));
        for i in 0..CORE_LEN {
            let mut bad = b;
            bad[i] ^= 0x10;
            assert!(CoreHeader::decode(&bad).is_err(), "byte {i}");
        }
        assert_eq!(CoreHeader::decode(&b[..100]), Err(HeaderError::Short));
    }

    #[test]
    fn a_header_whose_areas_do_not_follow_the_layout_is_refused() {
        let mut h = header();
        h.data += 4096;
        assert_eq!(
            CoreHeader::decode(&h.encode()),
            Err(HeaderError::Inconsistent("area offsets"))
        );
        let mut h = header();
        h.chunk_count = u32::MAX;
        assert!(CoreHeader::decode(&h.encode()).is_err());
    }

    #[test]
    fn meta_round_trips_and_refuses_damage() {
        let m = Meta {
            clocks: vec![(6, 100), (1, 200)],
            config: b"\x08\x01config".to_vec(),
        };
        let b = m.encode();
        assert_eq!(b.len(), Meta::encoded_len(2, 8));
        let mut padded = b.clone();
        padded.resize(4096, 0);
        assert_eq!(Meta::decode(&padded), Ok(m));
        let mut bad = b.clone();
        bad[30] ^= 1;
        assert_eq!(Meta::decode(&bad), Err(HeaderError::Checksum));
        assert!(Meta::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn ring_file_names_round_trip() {
        assert_eq!(file_name(7), "buffer-007.ring");
        assert_eq!(index_of_file("buffer-007.ring"), Some(7));
        assert_eq!(index_of_file(&file_name(1234)), Some(1234));
        for bad in [
            "buffer-7.ring",
            "buffer-0007.ring",
            "buffer-abc.ring",
            "x.ring",
            "buffer-001.ring.tmp",
        ] {
            assert_eq!(index_of_file(bad), None, "{bad}");
        }
    }

    #[test]
    fn layout_areas_follow_each_other_page_aligned() {
        let l = Layout::new(1000, 256, 5000).expect("fits");
        assert_eq!(l.meta_len, 8192);
        assert_eq!(
            (l.meta_a, l.meta_b, l.live, l.table),
            (8192, 16384, 24576, 28672)
        );
        assert_eq!(l.data, (28672u64 + 64_000).next_multiple_of(4096));
        assert_eq!(l.total, (l.data + 256_000).next_multiple_of(4096));
        assert!(Layout::new(usize::MAX, usize::MAX, 0).is_none());
    }
}
