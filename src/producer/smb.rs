//! The shared memory buffer (SMB) of one producer: a sealed memfd the
//! recorder creates and sends with SetupTracing; the producer writes chunks
//! into it and names them in CommitData; the recorder moves each named chunk
//! out (Complete → BeingRead, copy, free) and parses only its own copy.
//!
//! ```text
//!  page (page_size bytes, a multiple of 4096)
//!  ┌────────────────────┬──────────┬─────────┬───┬─────────┐
//!  │ bitmap u32 │ rsvd  │ chunk 0  │ chunk 1 │ … │ chunk n-1│
//!  └────────────────────┴──────────┴─────────┴───┴─────────┘
//!   bitmap: 2-bit state of chunk i at bits 2i..2i+1 (0 free, 1 being
//!   written, 2 being read, 3 complete); layout in bits 28..30
//!   (1, 2, 4, 7 or 14 chunks of ((page − 8) / n) & !3 bytes)
//! ```
//!
//! # Invariants
//!
//! * **S1** The mapping is created once and stays mapped, unmoved, while the
//!   [`SharedMemory`] lives; every access is within `[0, size)`: page
//!   offsets are `page < pages`, chunk ranges are bounded by the layout's
//!   chunk size, which keeps them inside their page.
//! * **S2** Page headers sit at multiples of the page size in a page-aligned
//!   mapping, so the `AtomicU32` view of a bitmap is aligned. The producer
//!   touches bitmaps only atomically (the ABI); whatever it stores there is
//!   read as untrusted.
//! * **S3** Chunk bytes are only copied out with a raw copy into memory of
//!   our own (no Rust reference into the shared bytes is formed); another
//!   process writing meanwhile can only change what the copy holds, and the
//!   copy is parsed as untrusted.
//! * **S4** Chunks start 4-byte aligned (page header 8 bytes, chunk sizes
//!   multiples of 4), so a chunk header's `packets` u16 at offset 6 is
//!   aligned for `AtomicU16`; the producer updates it only atomically (the
//!   ABI) and whatever it stores there is read as untrusted.
//! * **S5** A chunk is copied into a `Vec`'s spare capacity, reserved for
//!   its whole length first, and the length is set only after the copy has
//!   written every byte it covers.
//!
//! Scraping ([`SharedMemory::scrape`]) copies chunks the producer has not
//! committed yet and leaves their state alone: the producer still commits
//! them later, and the reader keeps what it already took from them
//! (ARCHITECTURE.md §9.7).
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{MemfdFlags, SealFlags};

/// The default SMB size and page (a hint of 0, or an invalid one).
pub(crate) const DEFAULT_SIZE: usize = 256 * 1024;
pub(crate) const DEFAULT_PAGE: usize = 4096;
/// What the service allows at most.
pub(crate) const MAX_SIZE: usize = 32 * 1024 * 1024;
pub(crate) const MAX_PAGE: usize = 32 * 1024;
/// Bytes of a page header.
const PAGE_HEADER: usize = 8;
/// CAS attempts on a page bitmap before giving up (the ABI's figure).
const CAS_RETRIES: usize = 64;
const STATE_FREE: u32 = 0;
const STATE_BEING_READ: u32 = 2;
const STATE_COMPLETE: u32 = 3;

/// Errors of creating the SMB.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SmbError {
    #[error("memfd: {0}")]
    Memfd(#[source] std::io::Error),
    #[error("mapping the shared memory: {0}")]
    Map(#[source] std::io::Error),
}

/// The SMB size and page size for a producer's hints, as Perfetto's service
/// picks them: 0 means the default, values are clamped to the maximum, and
/// an invalid pair falls back to the defaults (ARCHITECTURE.md §9.5).
pub(crate) fn sizes(page_hint: u32, size_hint: u32) -> (usize, usize) {
    let page = match page_hint as usize {
        0 => DEFAULT_PAGE,
        p => p.min(MAX_PAGE),
    };
    let size = match size_hint as usize {
        0 => DEFAULT_SIZE,
        s => s.min(MAX_SIZE),
    };
    let valid = page >= 4096
        && page % 4096 == 0
        && (page / 4096).is_power_of_two()
        && size >= page
        && size % page == 0;
    if valid {
        (page, size)
    } else {
        (DEFAULT_PAGE, DEFAULT_SIZE)
    }
}

/// Chunks of a page layout (0: not partitioned or reserved).
fn chunks_in_layout(layout: u32) -> u32 {
    match layout {
        1 => 1,
        2 => 2,
        3 => 4,
        4 => 7,
        5 => 14,
        _ => 0,
    }
}

/// Why a chunk named in CommitData could not be moved out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TakeRefusal {
    /// Page or chunk index outside the SMB or its page's layout.
    OutOfRange,
    /// The chunk is not Complete (or the producer kept changing the page).
    NotComplete,
}

/// A chunk copied by scraping; it stays in the SMB as it was.
#[derive(Debug)]
pub(crate) struct Scraped {
    /// The writer had finished it (Complete) and not yet committed it;
    /// otherwise it is the writer's current chunk, still being written.
    pub complete: bool,
    /// The chunk's bytes, header included; the header's packet count and
    /// flags are the ones loaded before the copy (the fragments they count
    /// were written before they were stored).
    pub bytes: Vec<u8>,
}

/// A producer's shared memory.
#[derive(Debug)]
pub(crate) struct SharedMemory {
    fd: OwnedFd,
    map: MmapRaw,
    size: usize,
    page: usize,
}

impl SharedMemory {
    /// A sealed memfd of `size` bytes (against shrink, grow and further
    /// seals: the producer cannot make it smaller under our mapping), mapped
    /// shared. `page` and `size` come from [`sizes`].
    pub(crate) fn create(size: usize, page: usize) -> Result<Self, SmbError> {
        let io = |e: rustix::io::Errno| std::io::Error::from_raw_os_error(e.raw_os_error());
        let fd = rustix::fs::memfd_create(
            "perfetto_shmem",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| SmbError::Memfd(io(e)))?;
        rustix::fs::ftruncate(&fd, size as u64).map_err(|e| SmbError::Memfd(io(e)))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| SmbError::Memfd(io(e)))?;
        let file = File::from(fd.try_clone().map_err(SmbError::Memfd)?);
        let map = MmapOptions::new()
            .len(size)
            .map_raw(&file)
            .map_err(SmbError::Map)?;
        Ok(Self {
            fd,
            map,
            size,
            page,
        })
    }

    /// The descriptor to send to the producer.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn page_size(&self) -> usize {
        self.page
    }

    pub(crate) fn pages(&self) -> usize {
        self.size / self.page
    }

    /// The bitmap of `page` (which must be < `pages()`).
    fn bitmap(&self, page: usize) -> &AtomicU32 {
        debug_assert!(page < self.pages());
        // SAFETY: S1 — page < pages keeps the 4 bytes inside the mapping;
        // S2 — the offset is a multiple of the page size in a page-aligned
        // mapping, so the pointer is aligned for AtomicU32, and the producer
        // accesses it only atomically.
        unsafe { &*(self.map.as_mut_ptr().add(page * self.page) as *const AtomicU32) }
    }

    /// Moves chunk `chunk` of page `page` out of the SMB to the end of
    /// `out` (one buffer serves every chunk of a commit, so moving a chunk
    /// allocates nothing once it has grown): marks it being read, copies
    /// its bytes (header included), frees it. Returns the chunk's length.
    /// The copy is untrusted; the indexes are the producer's and are
    /// checked here.
    pub(crate) fn take_chunk(
        &self,
        page_untrusted: u32,
        chunk_untrusted: u32,
        out: &mut Vec<u8>,
    ) -> Result<usize, TakeRefusal> {
        let page = page_untrusted as usize;
        if page >= self.pages() {
            return Err(TakeRefusal::OutOfRange);
        }
        let bitmap = self.bitmap(page);
        let shift = 2 * chunk_untrusted.min(13);
        let mut acquired = None;
        for _ in 0..CAS_RETRIES {
            let old = bitmap.load(Ordering::Acquire);
            let layout = (old >> 28) & 7;
            let n = chunks_in_layout(layout);
            if chunk_untrusted >= n {
                return Err(TakeRefusal::OutOfRange);
            }
            if (old >> shift) & 3 != STATE_COMPLETE {
                return Err(TakeRefusal::NotComplete);
            }
            let new = (old & !(3 << shift)) | (STATE_BEING_READ << shift);
            if bitmap
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                acquired = Some((layout, n));
                break;
            }
        }
        let Some((layout, n)) = acquired else {
            return Err(TakeRefusal::NotComplete);
        };
        let chunk_size = ((self.page - PAGE_HEADER) / n as usize) & !3;
        let offset = page * self.page + PAGE_HEADER + chunk_untrusted as usize * chunk_size;
        let start = out.len();
        out.reserve(chunk_size);
        // SAFETY: S1 — chunk < n keeps offset + chunk_size within the page
        // (n chunks of at most (page − 8) / n bytes after the header); S3 —
        // a raw copy into our own Vec, no reference into shared bytes. S5 —
        // `out` has room for chunk_size bytes past its length (reserved
        // above) and the copy initialises all of them before the length
        // covers them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(offset),
                out.as_mut_ptr().add(start),
                chunk_size,
            );
            out.set_len(start + chunk_size);
            // Freeing zeroes the chunk header first, as the ABI does.
            std::ptr::write_bytes(
                self.map.as_mut_ptr().add(offset),
                0,
                super::chunk::HEADER_BYTES.min(chunk_size),
            );
        }
        self.release(bitmap, layout, n, shift);
        Ok(chunk_size)
    }

    /// Copies every chunk that is not free without changing its state, in
    /// page order: complete ones the producer has not committed yet, and
    /// those still being written when they hold at least two fragments (the
    /// last one may be the packet under way; the reader takes the ones
    /// before it). Everything copied is untrusted.
    pub(crate) fn scrape(&self) -> Vec<Scraped> {
        let mut out = Vec::new();
        for page in 0..self.pages() {
            let bitmap = self.bitmap(page).load(Ordering::Acquire);
            let n = chunks_in_layout((bitmap >> 28) & 7);
            if n == 0 || bitmap & ((1u32 << (2 * n)) - 1) == 0 {
                continue;
            }
            let chunk_size = ((self.page - PAGE_HEADER) / n as usize) & !3;
            if chunk_size < super::chunk::HEADER_BYTES {
                continue;
            }
            for chunk in 0..n {
                let state = (bitmap >> (2 * chunk)) & 3;
                if state == STATE_FREE {
                    continue;
                }
                let complete = state == STATE_COMPLETE;
                let offset = page * self.page + PAGE_HEADER + chunk as usize * chunk_size;
                // SAFETY: S1 — chunk < n keeps offset + 8 within the page;
                // S4 — offset + 6 is 2-byte aligned and the producer stores
                // this field only atomically.
                let packets = unsafe {
                    (*(self.map.as_ptr().add(offset + 6) as *const AtomicU16))
                        .load(Ordering::Acquire)
                };
                if !complete && packets & 0x3FF < 2 {
                    continue;
                }
                let mut copy = vec![0u8; chunk_size];
                // SAFETY: S1 — as above, offset + chunk_size stays within
                // the page; S3 — a raw copy into our own Vec.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.map.as_ptr().add(offset),
                        copy.as_mut_ptr(),
                        chunk_size,
                    );
                }
                copy[6..8].copy_from_slice(&packets.to_le_bytes());
                out.push(Scraped {
                    complete,
                    bytes: copy,
                });
            }
        }
        out
    }

    /// BeingRead → Free; a page with every chunk free goes back to bitmap 0.
    /// A producer that changed the layout meanwhile keeps its page as is
    /// (it only harms itself).
    fn release(&self, bitmap: &AtomicU32, layout: u32, n: u32, shift: u32) {
        for _ in 0..CAS_RETRIES {
            let old = bitmap.load(Ordering::Acquire);
            if (old >> 28) & 7 != layout || (old >> shift) & 3 != STATE_BEING_READ {
                return;
            }
            let mut new = (old & !(3 << shift)) | (STATE_FREE << shift);
            let states = new & ((1u32 << (2 * n)) - 1);
            if states == 0 {
                new = 0;
            }
            if bitmap
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Test support: page `page` as one complete chunk holding `chunk`
    /// (header included), as a producer leaves it before its commit.
    #[cfg(test)]
    pub(crate) fn put_complete_chunk(&self, page: usize, chunk: &[u8]) {
        self.poke(
            page * self.page,
            &((1u32 << 28) | STATE_COMPLETE).to_le_bytes(),
        );
        self.poke(page * self.page + PAGE_HEADER, chunk);
    }

    /// Test and hostile-producer support: writes `bytes` at `offset`, as a
    /// producer would through its own mapping.
    #[cfg(test)]
    fn poke(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.size);
        // SAFETY: S1 — bounds asserted above; tests are single-threaded here.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(offset),
                bytes.len(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_clamp_then_validate_as_the_service_does() {
        assert_eq!(sizes(0, 0), (4096, 256 * 1024));
        assert_eq!(sizes(64 * 1024, 1024 * 1024), (32 * 1024, 1024 * 1024));
        assert_eq!(sizes(4096, 64 * 1024 * 1024), (4096, 32 * 1024 * 1024));
        assert_eq!(sizes(12 * 1024, 1024 * 1024), (4096, 256 * 1024)); // 3 pages: not a power of two
        assert_eq!(sizes(8192, 4096), (4096, 256 * 1024)); // smaller than a page
        assert_eq!(sizes(1000, 0), (4096, 256 * 1024));
    }

    #[test]
    fn the_memfd_is_sealed_against_shrinking_and_growing() {
        let smb = SharedMemory::create(64 * 1024, 4096).expect("memfd");
        let seals = rustix::fs::fcntl_get_seals(smb.fd()).expect("seals");
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
        assert!(rustix::fs::ftruncate(smb.fd(), 4096).is_err());
    }

    #[test]
    fn only_complete_chunks_in_range_are_taken_and_then_freed() {
        let smb = SharedMemory::create(4 * 4096, 4096).expect("memfd");
        // Page 1: layout 2 (two chunks), chunk 0 complete, chunk 1 being written.
        let bitmap: u32 = (2 << 28) | STATE_COMPLETE | (1 << 2);
        smb.poke(4096, &bitmap.to_le_bytes());
        let chunk_size = ((4096 - 8) / 2) & !3;
        smb.poke(4096 + 8, &[1, 0, 0, 0, 7, 0, 1, 0, 0xAB]);
        let mut copy = vec![0xEE; 3];
        assert_eq!(smb.take_chunk(1, 0, &mut copy), Ok(chunk_size));
        // Appended after what the buffer held.
        assert_eq!(copy.len(), 3 + chunk_size);
        assert_eq!(
            &copy[..12],
            &[0xEE, 0xEE, 0xEE, 1, 0, 0, 0, 7, 0, 1, 0, 0xAB]
        );
        // Freed: state 0 while chunk 1 stays being written.
        assert_eq!(smb.bitmap(1).load(Ordering::Relaxed), (2 << 28) | (1 << 2));
        let mut take = |page, chunk| smb.take_chunk(page, chunk, &mut copy);
        assert_eq!(take(1, 0), Err(TakeRefusal::NotComplete));
        assert_eq!(take(1, 1), Err(TakeRefusal::NotComplete));
        assert_eq!(take(1, 2), Err(TakeRefusal::OutOfRange));
        assert_eq!(take(4, 0), Err(TakeRefusal::OutOfRange));
        assert_eq!(take(u32::MAX, u32::MAX), Err(TakeRefusal::OutOfRange));
        // Reserved layouts have no chunks.
        smb.poke(0, &((7u32 << 28) | STATE_COMPLETE).to_le_bytes());
        assert_eq!(take(0, 0), Err(TakeRefusal::OutOfRange));
        // The last chunk of a page freed: the bitmap goes back to 0.
        smb.poke(2 * 4096, &((1u32 << 28) | STATE_COMPLETE).to_le_bytes());
        take(2, 0).expect("complete");
        assert_eq!(smb.bitmap(2).load(Ordering::Relaxed), 0);
    }

    #[test]
    fn scraping_copies_unfinished_chunks_and_leaves_them_in_place() {
        let smb = SharedMemory::create(4 * 4096, 4096).expect("memfd");
        let chunk_size = ((4096 - 8) / 4) & !3;
        // Page 0, four chunks: complete, being written with 3 fragments,
        // being written with 1 (nothing finished in it yet), free.
        let bitmap: u32 = (3 << 28) | STATE_COMPLETE | (1 << 2) | (1 << 4);
        smb.poke(0, &bitmap.to_le_bytes());
        smb.poke(8, &[1, 0, 0, 0, 5, 0, 2, 0]);
        smb.poke(8 + chunk_size, &[2, 0, 0, 0, 5, 0, 3, 0]);
        smb.poke(8 + 2 * chunk_size, &[3, 0, 0, 0, 5, 0, 1, 0]);
        let got = smb.scrape();
        assert_eq!(got.len(), 2);
        assert!(got[0].complete && !got[1].complete);
        assert_eq!(&got[0].bytes[..8], &[1, 0, 0, 0, 5, 0, 2, 0]);
        assert_eq!(&got[1].bytes[..8], &[2, 0, 0, 0, 5, 0, 3, 0]);
        assert_eq!(got[1].bytes.len(), chunk_size);
        // Nothing changed state: the commit still moves the complete one.
        assert_eq!(smb.bitmap(0).load(Ordering::Relaxed), bitmap);
        let mut copy = Vec::new();
        assert_eq!(smb.take_chunk(0, 0, &mut copy), Ok(chunk_size));
        assert_eq!(copy[0], 1);
        // Reserved layouts and free pages give nothing.
        smb.poke(4096, &((7u32 << 28) | STATE_COMPLETE).to_le_bytes());
        assert_eq!(smb.scrape().len(), 1);
    }
}
