//! The buffer's one mapping: page-rounded, optionally prefaulted, alive (and
//! never moved) as long as its owner. Anonymous and private by default; or
//! shared, on a sealed memfd or on a file the caller made (`--ring-dir`), so
//! that another process can read what the buffer held after this one died.
//!
//! Huge pages make the writers' path cheaper (a TLB miss every 2 MiB, not
//! every 4 KiB): anonymous memory asks for them (`MADV_HUGEPAGE`); shared
//! memory (a memfd, a tmpfs file) gets them where the system's shmem
//! setting or the tmpfs mount allows, and otherwise by collapsing the
//! prefaulted pages into huge ones (`MADV_COLLAPSE`, Linux 6.1+, which the
//! `never` setting does not stop): the shared mapping is placed at a 2 MiB
//! boundary so that its file offsets line up with huge pages.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use super::RingbufError;

const PAGE_BYTES: usize = 4096;

/// `MADV_COLLAPSE` (Linux 6.1): make huge pages of the range now.
#[cfg(not(miri))]
const MADV_COLLAPSE: std::ffi::c_int = 25;

/// What the mapping lies on.
#[derive(Debug, Default)]
pub enum Backing {
    /// Private anonymous memory: gone with the process.
    #[default]
    Anonymous,
    /// A memfd made here, sized and sealed against shrinking or growing
    /// before it is mapped, so that a process it is passed to can read it
    /// without fear of the file changing size under it. Further seals stay
    /// possible: the process that saves it after this one died seals it
    /// against writes too, then maps it (`image::SealedMap`).
    Memfd,
    /// A regular file the caller created (empty, this process's own, made
    /// through `storage::create`): sized and allocated here, then mapped
    /// shared.
    File(OwnedFd),
}

/// A fixed, zero-initialised byte region addressed through a raw pointer.
pub(crate) struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    _backing: Mapped,
    /// The file behind a shared mapping.
    file: Option<OwnedFd>,
}

enum Mapped {
    #[cfg(not(miri))]
    Mmap(memmap2::MmapMut),
    /// A shared mapping placed by hand (2 MiB aligned), unmapped on drop.
    #[cfg(not(miri))]
    Shared,
    // Miri cannot map memory: a heap allocation stands in for the mapping.
    #[cfg(miri)]
    Heap(std::alloc::Layout),
}

// SAFETY: M1 — `Memory` owns its region and only hands out the base address;
// all reads and writes through it follow M2/M3/M5, which order them across
// threads (Release/Acquire on the committed length, the table mutex).
unsafe impl Send for Memory {}
// SAFETY: M1 — as above: shared references expose only the address.
unsafe impl Sync for Memory {}

impl Memory {
    /// Maps `size_bytes` rounded up to the page size on `backing`.
    pub(crate) fn new(
        size_bytes: usize,
        prefault: bool,
        backing: Backing,
    ) -> Result<Memory, RingbufError> {
        let map_err = |source| RingbufError::Map { size_bytes, source };
        let len = size_bytes
            .checked_next_multiple_of(PAGE_BYTES)
            .ok_or_else(|| map_err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        let file = match backing {
            Backing::Anonymous => None,
            Backing::Memfd => Some(memfd(len).map_err(map_err)?),
            Backing::File(fd) => {
                size_file(&fd, len).map_err(map_err)?;
                Some(fd)
            }
        };
        Self::map(len, prefault, file).map_err(map_err)
    }

    #[cfg(not(miri))]
    fn map(len: usize, prefault: bool, file: Option<OwnedFd>) -> std::io::Result<Memory> {
        use memmap2::{Advice, MmapOptions};
        if let Some(fd) = file {
            return Self::map_shared(len, prefault, fd);
        }
        let mut map = MmapOptions::new().len(len).map_anon()?;
        if prefault {
            // Huge pages make the first touch ~7x cheaper; not fatal where
            // THP is disabled (for shared memory, shmem_enabled decides).
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
            _backing: Mapped::Mmap(map),
            file: None,
        })
    }

    /// Maps `fd` shared at a 2 MiB boundary (a reservation, then the file
    /// over it), prefaulted and, where the file is shared memory, collapsed
    /// into huge pages.
    #[cfg(not(miri))]
    fn map_shared(len: usize, prefault: bool, fd: OwnedFd) -> std::io::Result<Memory> {
        use rustix::mm::{Advice, MapFlags, ProtFlags};
        const HUGE: usize = 2 << 20;
        let span = len
            .checked_add(HUGE)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: M1 — a fresh reservation of address space (no access),
        // placed by the kernel; nothing else refers to it.
        let reserved = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                span,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )?
        };
        let start = reserved as usize;
        let aligned = start.next_multiple_of(HUGE);
        // SAFETY: M1, M5 — `[aligned, aligned + len)` lies in the
        // reservation just made, which MAP_FIXED replaces with a shared
        // mapping of a file that is this process's own (a sealed memfd, or
        // a ring file created new with mode 0600): no other process writes
        // it while we run, and one that reads it does so through its
        // descriptor, never through a reference into this mapping. The
        // file's size was fixed above and cannot shrink under us (sealed,
        // or only this process holds it writable).
        let mapped = unsafe {
            rustix::mm::mmap(
                aligned as *mut std::ffi::c_void,
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                &fd,
                0,
            )
        };
        // The reservation's slack before and after the mapping goes.
        // SAFETY: M1 — both ranges are the reservation's own, outside the
        // mapping; nothing refers to them.
        unsafe {
            let _ = rustix::mm::munmap(reserved, aligned - start);
            let end = aligned + len;
            let _ = rustix::mm::munmap(end as *mut std::ffi::c_void, start + span - end);
        }
        let mapped = match mapped {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: M1 — the reservation's middle, never handed out.
                unsafe {
                    let _ = rustix::mm::munmap(aligned as *mut std::ffi::c_void, len);
                }
                return Err(e.into());
            }
        };
        let ptr = NonNull::new(mapped.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null mapping"))?;
        let memory = Memory {
            ptr,
            len,
            _backing: Mapped::Shared,
            file: Some(fd),
        };
        if prefault {
            // SAFETY: M1 — advice over exactly this mapping, which nothing
            // reads or writes yet; none of it changes its contents (zeros).
            unsafe {
                let base = memory.ptr.as_ptr().cast::<std::ffi::c_void>();
                let _ = rustix::mm::madvise(base, len, Advice::LinuxHugepage);
                if rustix::mm::madvise(base, len, Advice::LinuxPopulateWrite).is_err() {
                    for i in (0..len).step_by(PAGE_BYTES) {
                        memory.ptr.as_ptr().add(i).write_volatile(0);
                    }
                }
                // Huge pages for shared memory even where the system's
                // setting says never (not on a disk file: refused, ignored).
                let _ = libc::madvise(base, len, MADV_COLLAPSE);
            }
        }
        Ok(memory)
    }

    #[cfg(miri)]
    fn map(len: usize, _prefault: bool, file: Option<OwnedFd>) -> std::io::Result<Memory> {
        let layout = std::alloc::Layout::from_size_align(len, PAGE_BYTES)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: M1 — `len` is a non-zero multiple of the page size (callers
        // ask for at least two chunks), so the layout is non-zero-sized.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| std::io::Error::other("allocation failed"))?;
        Ok(Memory {
            ptr,
            len,
            _backing: Mapped::Heap(layout),
            file,
        })
    }

    /// Base address of the region.
    #[inline]
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Base address of the region, never null.
    pub(crate) fn base_nonnull(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Mapped length in bytes (page-rounded).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Writes a file-backed mapping's dirty pages back to its file and
    /// waits (`msync(MS_SYNC)`); nothing to do for other mappings.
    pub(crate) fn sync(&self) -> std::io::Result<()> {
        if self.file.is_none() {
            return Ok(());
        }
        match &self._backing {
            #[cfg(not(miri))]
            Mapped::Mmap(map) => map.flush(),
            #[cfg(not(miri))]
            // SAFETY: M1 — exactly this mapping; msync reads nothing of it
            // into Rust values.
            Mapped::Shared => unsafe {
                rustix::mm::msync(
                    self.ptr.as_ptr().cast(),
                    self.len,
                    rustix::mm::MsyncFlags::SYNC,
                )
                .map_err(Into::into)
            },
            #[cfg(miri)]
            Mapped::Heap(_) => Ok(()),
        }
    }

    /// The file behind a shared mapping.
    pub(crate) fn file(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(AsFd::as_fd)
    }

    /// Writes the first `len` bytes of `bytes` at `offset` (the header
    /// areas, before any writer or batch exists).
    ///
    /// # Safety
    /// M1, M5: `[offset, offset + bytes.len())` lies in the mapping below
    /// the chunk table, and nothing else accesses those bytes meanwhile.
    pub(crate) unsafe fn write_at(&self, offset: usize, bytes: &[u8]) {
        debug_assert!(offset + bytes.len() <= self.len);
        // SAFETY: by the caller's contract; `bytes` is ours, not the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset),
                bytes.len(),
            )
        };
    }
}

/// A sealed memfd of `len` bytes: sized, its pages reserved, then sealed
/// against shrinking and growing.
fn memfd(len: usize) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "recorder-ring",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    size_file(&fd, len)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)?;
    Ok(fd)
}

/// Sizes a new file to `len` and reserves its blocks, so that a full disk
/// or tmpfs is an error now, not a SIGBUS in a writer later (where the file
/// system cannot reserve, the size alone).
fn size_file(fd: &OwnedFd, len: usize) -> std::io::Result<()> {
    rustix::fs::ftruncate(fd, len as u64)?;
    match rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, len as u64) {
        Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(not(miri))]
impl Drop for Memory {
    fn drop(&mut self) {
        if let Mapped::Shared = self._backing {
            // SAFETY: M1 — mapped in `map_shared`, unmapped once here, after
            // every `Arc<Buffer>` (and so every writer and batch) is gone.
            unsafe {
                let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
            }
        }
    }
}

#[cfg(miri)]
impl Drop for Memory {
    fn drop(&mut self) {
        let Mapped::Heap(layout) = self._backing;
        // SAFETY: M1 — allocated in `map` with this layout, freed once here,
        // after every `Arc<Buffer>` (and so every writer and batch) is gone.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}
