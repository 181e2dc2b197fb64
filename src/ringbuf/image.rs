//! Reading a buffer back from its bytes after its process is gone: a ring
//! file of `--ring-dir`, or the memfd of a recorder that died, read through
//! a descriptor ([`ReadAt`], `pread`), never mapped.
//!
//! Every byte is untrusted: the file may be damaged, truncated, half
//! written at the moment of death, or written by a hostile process. The
//! reader never panics on what it reads, never loops longer than the
//! file's size allows, and holds at most the table's region heads (one
//! entry per region, a 64th of the table at most) and one read window of
//! [`WINDOW`] bytes, or one record, which the header's chunk size bounds.
//!
//! ```text
//!  header A ─(damaged?)─► header B        either copy will do; both bad: not a ring
//!  meta A ───(damaged?)─► meta B          both bad: no config or clocks (counted)
//!  live page                              counters, when not caught mid-update
//!  chunk table ─► region heads            entries caught mid-update, out of range,
//!                                         overlapping: left out and counted
//!  per writer, in acquisition order:      a loss marker where the writer lost data;
//!    unread bytes [read, end)             whole records that parse as packets of that
//!                                         writer's sequence; the rest of a region
//!                                         after broken framing: left out, counted
//! ```
//!
//! A region still being written when the process died (its writer held it)
//! is read up to its committed length: a packet the writer had begun but
//! not committed is not in it (counted as the region being open).

use std::io;

use super::BufferStats;
use super::layout::{self, CoreHeader, DESC_BYTES, HeaderError, LIVE_STATS, Meta, flags, state};
use crate::wire::fields::{Value, fields};
use crate::wire::framing::{Step, step};
use crate::wire::trace_packet as tp;

/// Bytes read at once from a region.
pub(crate) const WINDOW: usize = 4 << 20;
/// Table entries read at once.
const TABLE_BLOCK: usize = 1024;

/// Positioned reads of a file (or of bytes in memory, for tests and the
/// fuzz target).
pub trait ReadAt {
    /// Reads at most `buf.len()` bytes at `offset`; fewer at the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// The size now.
    fn size(&self) -> io::Result<u64>;
    /// `len` bytes at `offset` in place, without a copy, where the source
    /// holds them in memory that cannot change (`None`: read them).
    fn slice(&self, _offset: u64, _len: usize) -> Option<&[u8]> {
        None
    }
}

/// Bytes in memory, read as a file.
#[derive(Clone, Copy, Debug)]
pub struct InMemory<'a>(pub &'a [u8]);

impl ReadAt for InMemory<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Ok(at) = usize::try_from(offset) else {
            return Ok(0);
        };
        let Some(rest) = self.0.get(at..) else {
            return Ok(0);
        };
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.len() as u64)
    }

    fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let at = usize::try_from(offset).ok()?;
        self.0.get(at..at.checked_add(len)?)
    }
}

/// A memfd sealed against every change — shrinking and growing since it
/// was made, writes from now on — mapped read-only: a ring read in place,
/// without a copy, once its recorder is gone.
///
/// Invariant (with M1):
/// - **M6** The mapping is of a memfd that carries `F_SEAL_SHRINK`,
///   `F_SEAL_GROW` and `F_SEAL_WRITE`, added or checked before it was
///   mapped: its size cannot change and nobody can write it (sealing
///   against writes fails while any writable mapping of it exists), so a
///   shared slice of it stays what it was for as long as it lives; it is
///   unmapped only when the `SealedMap` is dropped, which no slice outlives.
pub(crate) struct SealedMap {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: M6 — read-only, unchangeable memory owned by the value.
unsafe impl Send for SealedMap {}
// SAFETY: M6 — as above.
unsafe impl Sync for SealedMap {}

impl SealedMap {
    /// Seals `fd` against writes and maps it read-only; `None` where that
    /// cannot be done (not a sealable memfd, not sealed against resizing, a
    /// writable mapping of it still alive somewhere): read it instead.
    pub(crate) fn of(fd: std::os::fd::BorrowedFd<'_>) -> Option<SealedMap> {
        use rustix::fs::SealFlags;
        let seals = rustix::fs::fcntl_get_seals(fd).ok()?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return None;
        }
        if !seals.contains(SealFlags::WRITE) {
            rustix::fs::fcntl_add_seals(fd, SealFlags::WRITE).ok()?;
        }
        let len = usize::try_from(rustix::fs::fstat(fd).ok()?.st_size).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: M6 — the memfd is sealed against resizing and writes
        // (checked just above), so the mapping's bytes never change and
        // never go away while it lives.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )
            .ok()?
        };
        Some(SealedMap {
            ptr: std::ptr::NonNull::new(p.cast::<u8>())?,
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: M6 — `len` readable bytes that cannot change, alive as
        // long as `self`, which the slice borrows.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SealedMap {
    fn drop(&mut self) {
        // SAFETY: M6 — mapped in `of`, unmapped once; no slice of it
        // outlives `self`.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl ReadAt for SealedMap {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        InMemory(self.bytes()).read_at(buf, offset)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.len as u64)
    }

    fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let at = usize::try_from(offset).ok()?;
        self.bytes().get(at..at.checked_add(len)?)
    }
}

impl<T: std::os::fd::AsFd> ReadAt for T {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match rustix::io::pread(self.as_fd(), &mut *buf, offset) {
                Ok(n) => return Ok(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn size(&self) -> io::Result<u64> {
        Ok(rustix::fs::fstat(self.as_fd())?.st_size.max(0) as u64)
    }
}

/// Reads until `buf` is full or the end; returns the bytes read.
fn read_full(src: &dyn ReadAt, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = src.read_at(&mut buf[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// Why a file is not a ring at all.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Reading the file failed.
    #[error("cannot read: {0}")]
    Io(#[from] io::Error),
    /// Neither header copy could be read: `a` and `b` say why.
    #[error("not a ring buffer, or its header is damaged in both copies (first: {a}; second: {b})")]
    Header {
        /// Why the first copy was not taken.
        a: HeaderError,
        /// Why the second copy was not taken.
        b: HeaderError,
    },
}

/// One region with unread data, as the chunk table describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionView {
    /// Its first chunk.
    pub head: u32,
    /// Its length in chunks.
    pub chunks: u32,
    /// The writer sequence (its packets' `trusted_packet_sequence_id`).
    pub writer: u32,
    /// Acquisition number: a writer's regions in write order.
    pub order: u64,
    /// Unread bytes: `[from, to)` within the region.
    pub from: u32,
    /// End of the unread bytes, exclusive.
    pub to: u32,
    /// Packets in those bytes, as the table counted them.
    pub packets: u32,
    /// The writer held it (still writing) when the process died.
    pub open: bool,
    /// The writer lost data right before these bytes: a loss marker goes
    /// first.
    pub(crate) loss_before: bool,
}

/// What was left out of a ring, and why; every count is also what the
/// trace reports (`trace::salvage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Damage {
    /// The first header copy was damaged (the second was used).
    pub(crate) header_copy_damaged: bool,
    /// Both meta copies were damaged: no config, no clock snapshot.
    pub(crate) meta_damaged: bool,
    /// The counters were caught mid-update or damaged.
    pub(crate) stats_unreadable: bool,
    /// The file is shorter than its header says.
    pub truncated: bool,
    /// Table entries the process was rewriting when it died.
    pub(crate) entries_mid_update: u64,
    /// Table entries that cannot be (out of range, impossible lengths).
    pub(crate) entries_invalid: u64,
    /// Region heads inside another region.
    pub(crate) regions_overlapping: u64,
    /// Regions a writer held when the process died (a packet it had begun
    /// and not committed is left out of each).
    pub(crate) regions_open: u64,
    /// Regions a write pass held (its bytes were on their way to the file).
    pub(crate) regions_in_flight: u64,
    /// Regions (or their ends) past the end of a truncated file.
    pub(crate) regions_beyond_end: u64,
    /// Records whose framing broke, and the bytes after them in their
    /// region.
    pub(crate) bytes_unframed: u64,
    /// Whole records that are not packets of their region's writer.
    pub(crate) packets_invalid: u64,
    pub(crate) bytes_invalid: u64,
}

impl Damage {
    /// Something was left out because it was damaged (not merely because
    /// a writer or a pass was busy with it when the process died).
    pub(crate) fn is_damaged(&self) -> bool {
        self.header_copy_damaged
            || self.meta_damaged
            || self.stats_unreadable
            || self.truncated
            || self.entries_invalid > 0
            || self.regions_overlapping > 0
            || self.regions_beyond_end > 0
            || self.bytes_unframed > 0
            || self.packets_invalid > 0
    }

    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &Damage) {
        self.header_copy_damaged |= o.header_copy_damaged;
        self.meta_damaged |= o.meta_damaged;
        self.stats_unreadable |= o.stats_unreadable;
        self.truncated |= o.truncated;
        self.entries_mid_update += o.entries_mid_update;
        self.entries_invalid += o.entries_invalid;
        self.regions_overlapping += o.regions_overlapping;
        self.regions_open += o.regions_open;
        self.regions_in_flight += o.regions_in_flight;
        self.regions_beyond_end += o.regions_beyond_end;
        self.bytes_unframed += o.bytes_unframed;
        self.packets_invalid += o.packets_invalid;
        self.bytes_invalid += o.bytes_invalid;
    }
}

/// How closely packets are checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Check {
    /// Framing only: whole `0x0A <len> <bytes>` records within the region.
    Framing,
    /// Framing, and each packet must parse as protobuf and, where it names
    /// its sequence, name its region's writer.
    #[default]
    Packets,
}

/// What one region gave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionRead {
    /// Whole packets handed on.
    pub packets: u64,
    /// Framed bytes handed on.
    pub bytes: u64,
}

/// A ring, as read from its file: its header and meta, its counters, the
/// regions holding unread data (grouped by writer, ascending, each writer's
/// in write order) and what was left out so far.
#[derive(Clone, Debug)]
pub struct RingImage {
    /// The core header, from whichever copy was intact.
    pub header: CoreHeader,
    /// The clock snapshot and TraceConfig; `None` when both meta copies
    /// are damaged.
    pub meta: Option<Meta>,
    /// The counters of the live page; `None` when caught mid-update or
    /// unreadable.
    pub stats: Option<BufferStats>,
    /// The regions holding unread data, grouped by writer (ascending),
    /// each writer's in write order.
    pub regions: Vec<RegionView>,
    /// Every writer the table names (loss markers may name ones with no
    /// data left).
    pub writers: Vec<u32>,
    /// What was found damaged and left out so far.
    pub damage: Damage,
}

impl RingImage {
    /// Reads the header, meta, counters and chunk table of the ring in
    /// `src`. Damage is counted in [`RingImage::damage`]; only a file with
    /// no readable header at all is an error.
    pub fn read(src: &dyn ReadAt) -> Result<RingImage, ImageError> {
        let file_len = src.size()?;
        let mut damage = Damage::default();
        let mut core = [0u8; layout::CORE_LEN];
        let header = {
            let n = read_full(src, &mut core, 0)?;
            match CoreHeader::decode(&core[..n]) {
                Ok(h) => h,
                Err(a) => {
                    let n = read_full(src, &mut core, layout::PAGE as u64)?;
                    match CoreHeader::decode(&core[..n]) {
                        Ok(h) => {
                            damage.header_copy_damaged = true;
                            h
                        }
                        Err(b) => return Err(ImageError::Header { a, b }),
                    }
                }
            }
        };
        if file_len < header.file_len {
            damage.truncated = true;
        }
        let meta = Self::read_meta(src, &header)?;
        damage.meta_damaged = meta.is_none();
        let stats = Self::read_stats(src, &header)?;
        damage.stats_unreadable = stats.is_none();
        let mut image = RingImage {
            header,
            meta,
            stats,
            regions: Vec::new(),
            writers: Vec::new(),
            damage,
        };
        image.read_table(src)?;
        Ok(image)
    }

    fn read_meta(src: &dyn ReadAt, h: &CoreHeader) -> io::Result<Option<Meta>> {
        let len = h.meta_len as usize;
        let mut buf = vec![0u8; len];
        for at in [h.meta_a, h.meta_b] {
            let n = read_full(src, &mut buf, at)?;
            if let Ok(m) = Meta::decode(&buf[..n]) {
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    fn read_stats(src: &dyn ReadAt, h: &CoreHeader) -> io::Result<Option<BufferStats>> {
        let mut buf = [0u8; 8 + 8 * LIVE_STATS.len()];
        if read_full(src, &mut buf, h.live)? < buf.len() {
            return Ok(None);
        }
        let seq = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if seq % 2 == 1 {
            return Ok(None);
        }
        let mut words = [0u64; LIVE_STATS.len()];
        for (i, w) in words.iter_mut().enumerate() {
            let at = 8 + 8 * i;
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[at..at + 8]);
            *w = u64::from_ne_bytes(b);
        }
        let mut s = layout::stats_from_words(&words);
        s.buffer_size = u64::from(h.chunk_count) * u64::from(h.chunk_size);
        Ok(Some(s))
    }

    /// Walks the chunk table in blocks and keeps the region heads that
    /// hold unread data, checked and in order.
    fn read_table(&mut self, src: &dyn ReadAt) -> io::Result<()> {
        let h = &self.header;
        let count = h.chunk_count as usize;
        let chunk_size = u64::from(h.chunk_size);
        let mut block = vec![0u8; TABLE_BLOCK * DESC_BYTES];
        let mut covered_until = 0usize;
        let mut writers = std::collections::BTreeSet::new();
        let mut regions = Vec::new();
        let d = &mut self.damage;
        let mut i = 0usize;
        while i < count {
            let n = (count - i).min(TABLE_BLOCK);
            let want = n * DESC_BYTES;
            let got = read_full(src, &mut block[..want], h.table + (i * DESC_BYTES) as u64)?;
            if got < want {
                // The rest of the table is past the end of the file.
                d.truncated = true;
            }
            for j in 0..n {
                let e = &block[j * DESC_BYTES..(j + 1) * DESC_BYTES];
                let idx = i + j;
                if (j + 1) * DESC_BYTES > got {
                    break;
                }
                let Some(entry) = Entry::parse(e) else {
                    d.entries_mid_update += 1;
                    continue;
                };
                if entry.state != state::WRITING && entry.state != state::COMPLETE {
                    if entry.state > state::COMPLETE {
                        d.entries_invalid += 1;
                    }
                    continue;
                }
                let chunks = entry.chunks as usize;
                let (end, end_packets) = if entry.state == state::WRITING {
                    unpack(entry.committed)
                } else {
                    unpack(entry.used)
                };
                let (read, read_packets) = unpack(entry.read);
                let fits = chunks >= 1
                    && chunks <= count - idx
                    && u64::from(end) <= chunks as u64 * chunk_size
                    && read <= end
                    && read_packets <= end_packets
                    && entry.order > 0;
                if !fits {
                    d.entries_invalid += 1;
                    continue;
                }
                if idx < covered_until {
                    d.regions_overlapping += 1;
                    continue;
                }
                covered_until = idx + chunks;
                writers.insert(entry.writer);
                let open = entry.state == state::WRITING;
                if open {
                    d.regions_open += 1;
                }
                if entry.pins > 0 {
                    d.regions_in_flight += 1;
                }
                let loss_before = entry.flags & flags::LOSS_BEFORE != 0;
                if end == read && !loss_before {
                    continue;
                }
                regions.push(RegionView {
                    head: idx as u32,
                    chunks: chunks as u32,
                    writer: entry.writer,
                    order: entry.order,
                    from: read,
                    to: end,
                    packets: end_packets - read_packets,
                    open,
                    loss_before,
                });
            }
            i += n;
        }
        regions.sort_by_key(|r| (r.writer, r.order));
        self.regions = regions;
        self.writers = writers.into_iter().collect();
        Ok(())
    }

    /// Where region `r`'s byte `at` lies in the file.
    fn offset_of(&self, r: &RegionView, at: u32) -> u64 {
        self.header.data + u64::from(r.head) * u64::from(self.header.chunk_size) + u64::from(at)
    }

    /// The longest record a region may hold: what the engine takes (a
    /// chunk, or 1 MiB) with its header.
    pub(crate) fn max_record(&self) -> usize {
        (self.header.chunk_size as usize).max(super::BufferParams::MAX_PACKET_LEN)
            + super::MAX_SLOT_HEADER_BYTES
    }

    /// Unread bytes in every region, as the table says (before checking).
    pub fn unread_bytes(&self) -> u64 {
        self.regions.iter().map(|r| u64::from(r.to - r.from)).sum()
    }

    /// Reads region `r`'s unread bytes from `src` and hands `emit` runs of
    /// whole records that pass `check`, in order, each with where it lies
    /// in the file. Where the region turns
    /// out damaged (a record that does not pass, broken framing, the file's
    /// end), the record before is left out too: the damage most likely
    /// began inside it, where no check can see it (inside a string, say).
    /// Broken framing ends the region there, its rest counted. `buf` is
    /// reused between calls.
    pub(crate) fn read_region(
        &mut self,
        src: &dyn ReadAt,
        r: &RegionView,
        check: Check,
        buf: &mut Vec<u8>,
        emit: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
    ) -> io::Result<RegionRead> {
        use crate::wire::framing::{Header, MAX_HEADER_BYTES, parse_header};
        let mut out = RegionRead::default();
        let max_record = self.max_record() as u64;
        let to = u64::from(r.to);
        let mut pos = u64::from(r.from);
        // The window holds region bytes [wstart, wstart + wlen): the whole
        // region in place where the source has it in memory, else read.
        let (mut wstart, mut wlen) = (pos, 0usize);
        let base = self.offset_of(r, 0);
        let whole = src.slice(self.offset_of(r, r.from), (to - pos) as usize);
        if let Some(w) = whole {
            wlen = w.len();
        }
        let mut run = Run::default();
        while pos < to {
            let data: &[u8] = match whole {
                Some(w) => w,
                None => &buf[..wlen],
            };
            let avail = &data[(pos - wstart) as usize..wlen];
            // Where the records checked so far are, for handing them on.
            let window = Window {
                buf: data,
                wstart,
                base,
            };
            match step(avail, pos) {
                Step::Frame(f) => {
                    let len = f.record_len();
                    if check == Check::Framing || valid_packet(f.packet, r.writer) {
                        run.push(pos);
                    } else {
                        // Damage: this record, and the one before it.
                        let held = run.all_but_last(&window, emit, &mut out)?;
                        self.count_invalid(held.map(|last| pos - last));
                        self.count_invalid(Some(len));
                    }
                    pos += len;
                }
                Step::NeedMore => {
                    let need = match parse_header(avail, pos) {
                        Header::Whole { header_len, len } => header_len as u64 + len,
                        _ => (MAX_HEADER_BYTES as u64).min(to - pos),
                    };
                    // In place, the whole region is at hand already.
                    if whole.is_some()
                        || pos + need > to
                        || need > max_record
                        || avail.len() as u64 >= need
                    {
                        let held = run.all_but_last(&window, emit, &mut out)?;
                        self.left_unframed(pos, to, held);
                        return Ok(out);
                    }
                    // All but the last record checked go on; the window
                    // starts again at that one, so it is still at hand.
                    let from = match run.all_but_last(&window, emit, &mut out)? {
                        Some(last) => {
                            run.push(last);
                            last
                        }
                        None => pos,
                    };
                    let need = (pos - from) + need;
                    let want = (to - from).min((WINDOW as u64).max(need)) as usize;
                    if buf.len() < want {
                        buf.resize(want, 0);
                    }
                    let got = read_full(src, &mut buf[..want], self.offset_of(r, from as u32))?;
                    wstart = from;
                    wlen = got;
                    if (got as u64) < need {
                        self.damage.regions_beyond_end += 1;
                        self.damage.truncated = true;
                        let held =
                            run.all_but_last(&Window { buf, wstart, base }, emit, &mut out)?;
                        self.left_unframed(pos, to, held);
                        return Ok(out);
                    }
                }
                Step::Corrupt(_) => {
                    let held = run.all_but_last(&window, emit, &mut out)?;
                    self.left_unframed(pos, to, held);
                    return Ok(out);
                }
            }
        }
        let data: &[u8] = match whole {
            Some(w) => w,
            None => &buf[..wlen],
        };
        run.all(
            &Window {
                buf: data,
                wstart,
                base,
            },
            pos,
            emit,
            &mut out,
        )?;
        Ok(out)
    }

    /// One record of `bytes` left out as invalid, if any.
    /// The walk stops at `pos` short of `to`: the record held since `last`
    /// (if any) is invalid, the rest of the region unframed.
    fn left_unframed(&mut self, pos: u64, to: u64, last: Option<u64>) {
        self.count_invalid(last.map(|last| pos - last));
        self.damage.bytes_unframed += to - pos;
    }

    fn count_invalid(&mut self, bytes: Option<u64>) {
        if let Some(b) = bytes {
            self.damage.packets_invalid += 1;
            self.damage.bytes_invalid += b;
        }
    }
}

/// Region bytes at hand: `buf` holds those from `wstart` on; the region
/// starts at `base` in the file.
struct Window<'a> {
    buf: &'a [u8],
    wstart: u64,
    base: u64,
}

impl Window<'_> {
    fn slice(&self, from: u64, to: u64) -> &[u8] {
        &self.buf[(from - self.wstart) as usize..(to - self.wstart) as usize]
    }
}

/// Records checked and not handed on yet: from `start`, `packets` of them,
/// the last starting at `last`.
#[derive(Default)]
struct Run {
    start: u64,
    last: u64,
    packets: u64,
}

impl Run {
    fn push(&mut self, at: u64) {
        if self.packets == 0 {
            self.start = at;
        }
        self.last = at;
        self.packets += 1;
    }

    /// Hands on every record but the last and empties the run; returns
    /// where the one held back starts, if there was one.
    fn all_but_last(
        &mut self,
        w: &Window<'_>,
        emit: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
        out: &mut RegionRead,
    ) -> io::Result<Option<u64>> {
        if self.packets == 0 {
            return Ok(None);
        }
        if self.packets > 1 {
            emit(w.base + self.start, w.slice(self.start, self.last))?;
            out.packets += self.packets - 1;
            out.bytes += self.last - self.start;
        }
        self.packets = 0;
        Ok(Some(self.last))
    }

    /// Hands on the whole run, which ends at `end`.
    fn all(
        &mut self,
        w: &Window<'_>,
        end: u64,
        emit: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
        out: &mut RegionRead,
    ) -> io::Result<()> {
        if self.packets > 0 {
            emit(w.base + self.start, w.slice(self.start, end))?;
            out.packets += self.packets;
            out.bytes += end - self.start;
            self.packets = 0;
        }
        Ok(())
    }
}

/// Whether `packet` parses as protobuf and, if it names its sequence,
/// names `writer`'s.
fn valid_packet(packet: &[u8], writer: u32) -> bool {
    let mut seq = None;
    for f in fields(packet) {
        match f {
            Err(_) => return false,
            Ok(f) if f.number == tp::TRUSTED_PACKET_SEQUENCE_ID => match f.value {
                Value::Varint(v) => seq = Some(v),
                _ => return false,
            },
            Ok(_) => {}
        }
    }
    seq.is_none_or(|s| s == u64::from(writer))
}

fn unpack(word: u64) -> (u32, u32) {
    (word as u32, (word >> 32) as u32)
}

/// One table entry as read (native byte order: the header's mark checked
/// it); `None` when it was caught mid-rewrite.
struct Entry {
    committed: u64,
    state: u32,
    chunks: u32,
    writer: u32,
    order: u64,
    used: u64,
    read: u64,
    flags: u32,
    pins: u32,
}

impl Entry {
    fn parse(e: &[u8]) -> Option<Entry> {
        let u32_at = |at: usize| u32::from_ne_bytes([e[at], e[at + 1], e[at + 2], e[at + 3]]);
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&e[at..at + 8]);
            u64::from_ne_bytes(b)
        };
        if u32_at(8) % 2 == 1 {
            return None;
        }
        Some(Entry {
            committed: u64_at(0),
            state: u32_at(12),
            chunks: u32_at(16),
            writer: u32_at(20),
            order: u64_at(24),
            used: u64_at(32),
            read: u64_at(40),
            flags: u32_at(48),
            pins: u32_at(52),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ringbuf::{Backing, Buffer, BufferParams, FillPolicy, RingIdentity, WriterId};

    fn identity() -> RingIdentity {
        RingIdentity {
            index: 0,
            count: 1,
            uuid: (1, 2),
            uid: 7,
            pid: 99,
            clocks: vec![(6, 1000), (1, 2000)],
            config: vec![0x08, 0x01],
            ..RingIdentity::default()
        }
    }

    fn memfd_buffer(size: usize, chunk: usize) -> std::sync::Arc<Buffer> {
        let params = BufferParams {
            size_bytes: size,
            chunk_size: chunk,
            region_chunks: 2,
            policy: FillPolicy::RingBuffer,
            prefault: false,
        };
        Buffer::create(params, Backing::Memfd, &identity()).expect("memfd buffer")
    }

    /// A descriptor of `b`'s memfd, as the process that saves it holds one.
    fn ring_fd(b: &Buffer) -> std::os::fd::OwnedFd {
        b.shared_file()
            .expect("shared")
            .try_clone_to_owned()
            .expect("dup")
    }

    fn packet(seq: u32, n: u16) -> Vec<u8> {
        // trusted_packet_sequence_id, then a for_testing-like blob.
        let [lo, hi] = n.to_le_bytes();
        let mut p = vec![0x50, seq as u8];
        p.extend_from_slice(&[0xA2, 0x38, 3, lo, hi, 0]);
        p
    }

    fn number(p: &[u8]) -> u16 {
        u16::from_le_bytes([p[5], p[6]])
    }

    fn records(image: &mut RingImage, src: &dyn ReadAt) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for r in image.regions.clone() {
            let mut got = Vec::new();
            image
                .read_region(src, &r, Check::Packets, &mut buf, &mut |_, b| {
                    got.extend_from_slice(b);
                    Ok(())
                })
                .expect("reads");
            for f in crate::wire::framing::frames(&got) {
                out.push((r.writer, f.packet.to_vec()));
            }
        }
        out
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd is not available under miri")]
    fn what_a_buffer_holds_is_read_back_from_its_file_in_write_order() {
        let b = memfd_buffer(64 * 256, 256);
        let mut w2 = b.writer(WriterId(2));
        let mut w3 = b.writer(WriterId(3));
        for n in 0..200u16 {
            w2.write_packet(&packet(2, n)).expect("fits");
            if n % 2 == 0 {
                w3.write_packet(&packet(3, n)).expect("fits");
            }
        }
        // A pass took some: it is not unread any more.
        let taken = b.take_flush();
        let taken_bytes = taken.len_bytes();
        taken.release();
        assert!(taken_bytes > 0);
        for n in 200..210u16 {
            w2.write_packet(&packet(2, n)).expect("fits");
        }
        let fd = ring_fd(&b);
        let mut image = RingImage::read(&fd).expect("a ring");
        assert_eq!(image.header.uuid, (1, 2));
        assert_eq!(image.meta.as_ref().expect("meta").config, vec![0x08, 0x01]);
        assert!(!image.damage.is_damaged(), "{:?}", image.damage);
        assert_eq!(image.damage.regions_open, 2, "both writers hold a region");
        let got = records(&mut image, &fd);
        let ns: Vec<u16> = got.iter().map(|(_, p)| number(p)).collect();
        assert_eq!(ns, (200..210).collect::<Vec<u16>>());
        assert!(got.iter().all(|(w, p)| p[1] as u32 == *w));
        let stats = image.stats.expect("counters");
        assert_eq!(stats.bytes_read, taken_bytes);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd is not available under miri")]
    fn a_region_shorter_than_a_record_header_is_read_whole() {
        let b = memfd_buffer(64 * 256, 256);
        let mut w = b.writer(WriterId(2));
        w.write_packet(&[]).expect("fits");
        let fd = ring_fd(&b);
        let mut image = RingImage::read(&fd).expect("a ring");
        assert_eq!(records(&mut image, &fd), vec![(2, vec![])]);
        assert!(!image.damage.is_damaged(), "{:?}", image.damage);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd is not available under miri")]
    fn an_overwritten_ring_reads_back_its_newest_run_after_a_loss_marker() {
        let b = memfd_buffer(16 * 256, 256);
        let mut w = b.writer(WriterId(2));
        for n in 0..1000u16 {
            w.write_packet(&packet(2, n)).expect("fits");
        }
        drop(w);
        let fd = ring_fd(&b);
        let mut image = RingImage::read(&fd).expect("a ring");
        assert!(image.regions[0].loss_before, "{:?}", image.regions[0]);
        let got = records(&mut image, &fd);
        let ns: Vec<u16> = got.iter().map(|(_, p)| number(p)).collect();
        assert_eq!(*ns.last().expect("some"), 999);
        assert!(ns[0] > 500, "{ns:?}");
        assert!(ns.windows(2).all(|w| w[1] == w[0] + 1), "{ns:?}");
        assert_eq!(image.damage.regions_open, 0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd is not available under miri")]
    fn damage_is_left_out_and_counted_and_the_rest_kept() {
        let b = memfd_buffer(64 * 256, 256);
        let mut w = b.writer(WriterId(2));
        for n in 0..100u16 {
            w.write_packet(&packet(2, n)).expect("fits");
        }
        drop(w);
        let fd = ring_fd(&b);
        let mut bytes = vec![0u8; fd.size().expect("size") as usize];
        read_full(&fd, &mut bytes, 0).expect("reads");
        let clean = {
            let mut image = RingImage::read(&InMemory(&bytes)).expect("a ring");
            records(&mut image, &InMemory(&bytes)).len()
        };
        assert_eq!(clean, 100);
        // The first header copy and the first chunk's bytes are garbage.
        let h = CoreHeader::decode(&bytes).expect("header");
        bytes[..100].fill(0xEE);
        let data = h.data as usize;
        bytes[data + 10..data + 40].fill(0x0A);
        let mut image = RingImage::read(&InMemory(&bytes)).expect("the second copy");
        assert!(image.damage.header_copy_damaged);
        let got = records(&mut image, &InMemory(&bytes));
        assert!(got.len() < 100 && got.len() >= 40, "{}", got.len());
        assert!(image.damage.is_damaged());
        assert!(image.damage.bytes_unframed + image.damage.bytes_invalid > 0);
        // Both copies gone: not a ring.
        bytes[4096..4200].fill(0);
        assert!(RingImage::read(&InMemory(&bytes)).is_err());
    }
}
