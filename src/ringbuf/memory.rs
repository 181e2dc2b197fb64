//! The buffer's one mapping: anonymous, page-rounded, optionally prefaulted,
//! alive (and never moved) as long as its owner.

use std::ptr::NonNull;

use super::RingbufError;

const PAGE_BYTES: usize = 4096;

/// A fixed, zero-initialised byte region addressed through a raw pointer.
pub(crate) struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    _backing: Backing,
}

enum Backing {
    #[cfg(not(miri))]
    Mmap(#[allow(dead_code)] memmap2::MmapMut),
    // Miri cannot map memory: a heap allocation stands in for the mapping.
    #[cfg(miri)]
    Heap(std::alloc::Layout),
}

// SAFETY: M1 — `Memory` owns its region and only hands out the base address;
// all reads and writes through it follow M2/M3, which order them across
// threads (Release/Acquire on the committed length, the table mutex).
unsafe impl Send for Memory {}
// SAFETY: M1 — as above: shared references expose only the address.
unsafe impl Sync for Memory {}

impl Memory {
    /// Maps `size_bytes` rounded up to the page size.
    pub(crate) fn new(size_bytes: usize, prefault: bool) -> Result<Memory, RingbufError> {
        let len = size_bytes
            .checked_next_multiple_of(PAGE_BYTES)
            .ok_or_else(|| RingbufError::Map {
                size_bytes,
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            })?;
        Self::map(len, prefault).map_err(|source| RingbufError::Map { size_bytes, source })
    }

    #[cfg(not(miri))]
    fn map(len: usize, prefault: bool) -> std::io::Result<Memory> {
        use memmap2::{Advice, MmapOptions};
        let mut map = MmapOptions::new().len(len).map_anon()?;
        if prefault {
            // Huge pages make the first touch ~7x cheaper; not fatal where
            // THP is disabled.
            let _ = map.advise(Advice::HugePage);
            if map.advise(Advice::PopulateWrite).is_err() {
                // Kernels before 5.14: touch every page by hand.
                for i in (0..len).step_by(PAGE_BYTES) {
                    map[i] = 0;
                }
            }
        }
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| std::io::Error::other("mmap returned a null mapping"))?;
        Ok(Memory {
            ptr,
            len,
            _backing: Backing::Mmap(map),
        })
    }

    #[cfg(miri)]
    fn map(len: usize, _prefault: bool) -> std::io::Result<Memory> {
        let layout = std::alloc::Layout::from_size_align(len, PAGE_BYTES)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: M1 — `len` is a non-zero multiple of the page size (callers
        // ask for at least two chunks), so the layout is non-zero-sized.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| std::io::Error::other("allocation failed"))?;
        Ok(Memory {
            ptr,
            len,
            _backing: Backing::Heap(layout),
        })
    }

    /// Base address of the region.
    #[inline]
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Mapped length in bytes (page-rounded).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(miri)]
impl Drop for Memory {
    fn drop(&mut self) {
        let Backing::Heap(layout) = self._backing;
        // SAFETY: M1 — allocated in `map` with this layout, freed once here,
        // after every `Arc<Buffer>` (and so every writer and batch) is gone.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}
