//! The kernel's memory mapping of one CPU's ftrace ring buffer
//! (`per_cpu/cpuN/trace_pipe_raw`, Linux 6.10+): a meta page, then every
//! sub-buffer by id. `TRACE_MMAP_IOCTL_GET_READER` hands the reader
//! sub-buffer over (swapping in the next one once it is read through) and
//! marks what it holds as consumed; events are then walked where they lie.
//!
//! ```text
//!  meta page: meta_page_size, meta_struct_len, subbuf_size, nr_subbufs,
//!             reader { lost_events u64, id u32, read u32 }, flags,
//!             entries, overrun, read (u64 each)
//!  data:      sub-buffer 0 | sub-buffer 1 | ... (subbuf_size each)
//!  sub-buffer: | time_stamp u64 | commit (long) | data ..................|
//! ```
//!
//! Invariants:
//! - TM1 Both mappings stay valid for reads of their whole length while the
//!   [`TraceMap`] lives: the kernel pins a mapped ring buffer (it refuses to
//!   resize it) and the mappings are only unmapped in `Drop`.
//! - TM2 Between two GET_READER calls the reader sub-buffer is outside the
//!   writer's ring: the kernel writes none of its data below the `read`
//!   offset the last call reported (those events were committed before it
//!   returned); only the header's commit word and bytes past `read` may
//!   change (the writer appends there while the reader sub-buffer is also
//!   its commit page). A `&[u8]` is made only over that committed range, and
//!   it borrows the [`TraceMap`], so it ends before the next GET_READER,
//!   which takes `&mut self`.
//! - TM3 Everything else (the meta page, the header, bytes past `read`) is
//!   read with volatile reads of plain integers; no reference to it is made.
//! - TM4 The sizes and ids the kernel reports are checked against the
//!   mapping before any address is formed from them.
//!
//! TM2 assumes no other reader consumes this buffer meanwhile; the recorder
//! reads its own instance, whose files only root can open. A concurrent
//! root reader could make the kernel reuse the sub-buffer, so the bytes
//! could change under the slice: they are only ever read as bytes, and the
//! page walker checks every length against the slice.

use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;

use rustix::mm::{MapFlags, ProtFlags, mmap, munmap};

/// `_IO('R', 0x20)`.
const TRACE_MMAP_IOCTL_GET_READER: libc::c_ulong = (b'R' as libc::c_ulong) << 8 | 0x20;
/// `statfs.f_type` of tracefs.
const TRACEFS_MAGIC: u64 = 0x7472_6163;
/// Bytes of the meta page read here (through `read`).
const META_STRUCT_MIN: u32 = 64;
/// Where a sub-buffer's data starts: `time_stamp` u64 and `commit` long.
pub(crate) const SUBBUF_DATA_OFFSET: usize = 8 + std::mem::size_of::<libc::c_long>();

/// Why a CPU buffer cannot be read through the mapping.
#[derive(Debug, thiserror::Error)]
pub enum TraceMapError {
    #[error("not a tracefs file (statfs type {0:#x})")]
    NotTracefs(u64),
    #[error("statfs: {0}")]
    Statfs(#[source] rustix::io::Errno),
    #[error(
        "the kernel does not map this ring buffer (mmap: {0}; Linux 6.10+ maps trace_pipe_raw)"
    )]
    Mmap(#[source] rustix::io::Errno),
    #[error("TRACE_MMAP_IOCTL_GET_READER: {0}")]
    Ioctl(#[source] std::io::Error),
    #[error("unexpected meta page: null mapping")]
    NullMapping,
    #[error(
        "unexpected meta page: meta_page_size {meta_page_size}, struct {struct_len} bytes, {nr_subbufs} sub-buffers of {subbuf_size} bytes"
    )]
    Geometry {
        meta_page_size: u32,
        struct_len: u32,
        nr_subbufs: u32,
        subbuf_size: usize,
    },
    #[error("unexpected meta page: ring size overflows")]
    Overflow,
    #[error("unexpected meta page: reader id {id} of {nr_subbufs} sub-buffers")]
    ReaderId { id: u32, nr_subbufs: u32 },
    /// The mapped sub-buffers are not laid out as `header_page` says.
    #[error(
        "unexpected meta page: sub-buffers of {mapped} bytes, data at {data_at}; header_page says {page} and {data_offset}"
    )]
    Layout {
        mapped: usize,
        data_at: usize,
        page: usize,
        data_offset: usize,
    },
}

/// The reader sub-buffer as the last GET_READER left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reader {
    /// Sub-buffer id, `< nr_subbufs`.
    pub id: u32,
    /// Bytes of its data the kernel counts as consumed (all it held).
    pub read: usize,
}

/// The kernel's counters on the meta page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaCounters {
    pub entries: u64,
    pub overrun: u64,
    pub read: u64,
    /// Events lost when the reader sub-buffer was swapped in.
    pub(crate) reader_lost_events: u64,
}

/// One CPU's mapped ring buffer (meta page and sub-buffers).
pub(crate) struct TraceMap {
    fd: std::os::fd::OwnedFd,
    meta: NonNull<u8>,
    meta_len: usize,
    data: NonNull<u8>,
    data_len: usize,
    subbuf_size: usize,
    nr_subbufs: u32,
    reader: Option<Reader>,
}

// SAFETY: TM1 — the mappings belong to this value alone and are valid from
// any thread; all access follows TM2/TM3 (`&mut self` for the ioctl).
unsafe impl Send for TraceMap {}

fn sys_page_size() -> usize {
    rustix::param::page_size()
}

/// Volatile read of a native-endian integer of `n` (≤ 8) bytes at `p`,
/// byte by byte (the trailing count after a page's data is only 4-aligned).
///
/// # Safety
/// `p..p+n` is inside a live mapping (TM1, TM4).
unsafe fn read_word(p: *const u8, n: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, slot) in b.iter_mut().enumerate().take(n.min(8)) {
        // SAFETY: the caller's range covers `p + i` (TM1, TM4); TM3 — volatile,
        // as the kernel may write it meanwhile.
        *slot = unsafe { std::ptr::read_volatile(p.add(i)) };
    }
    if n == 4 {
        u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    } else {
        u64::from_ne_bytes(b)
    }
}

impl TraceMap {
    /// Maps `file` (an opened `trace_pipe_raw`).
    pub(crate) fn new(file: &File) -> Result<Self, TraceMapError> {
        let st = rustix::fs::fstatfs(file).map_err(TraceMapError::Statfs)?;
        #[allow(clippy::unnecessary_cast)]
        let f_type = st.f_type as u64;
        if f_type != TRACEFS_MAGIC {
            // A file elsewhere could be mapped past its end (SIGBUS on read).
            return Err(TraceMapError::NotTracefs(f_type));
        }
        let fd = file
            .as_fd()
            .try_clone_to_owned()
            .map_err(TraceMapError::Ioctl)?;
        let page = sys_page_size();
        // SAFETY: TM1 — a fresh shared read-only mapping of one page at
        // offset 0; the kernel gives the meta page there or fails.
        let meta = unsafe {
            mmap(
                std::ptr::null_mut(),
                page,
                ProtFlags::READ,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(TraceMapError::Mmap)?;
        let meta = NonNull::new(meta.cast::<u8>()).ok_or(TraceMapError::NullMapping)?;
        let mut this = TraceMap {
            fd,
            meta,
            meta_len: page,
            data: NonNull::dangling(),
            data_len: 0,
            subbuf_size: 0,
            nr_subbufs: 0,
            reader: None,
        };
        let meta_page_size = this.meta_u32(0);
        let struct_len = this.meta_u32(4);
        let subbuf_size = this.meta_u32(8) as usize;
        let nr_subbufs = this.meta_u32(12);
        if struct_len < META_STRUCT_MIN
            || !(meta_page_size as usize).is_multiple_of(page)
            || meta_page_size == 0
            || subbuf_size <= SUBBUF_DATA_OFFSET
            || nr_subbufs < 2
        {
            return Err(TraceMapError::Geometry {
                meta_page_size,
                struct_len,
                nr_subbufs,
                subbuf_size,
            });
        }
        let data_len = subbuf_size
            .checked_mul(nr_subbufs as usize)
            .ok_or(TraceMapError::Overflow)?;
        // SAFETY: TM1 — a fresh shared read-only mapping of the sub-buffers,
        // which the kernel places right after the meta page.
        let data = unsafe {
            mmap(
                std::ptr::null_mut(),
                data_len,
                ProtFlags::READ,
                MapFlags::SHARED,
                &this.fd,
                u64::from(meta_page_size),
            )
        }
        .map_err(TraceMapError::Mmap)?;
        this.data = NonNull::new(data.cast::<u8>()).ok_or(TraceMapError::NullMapping)?;
        for (addr, len) in [(meta.as_ptr(), page), (this.data.as_ptr(), data_len)] {
            // Not into children: the kernel counts each mapping of the ring,
            // and a child has no use for it. Advisory; a refusal is harmless.
            // SAFETY: TM1 — the range is one of the two mappings just made.
            let _ =
                unsafe { rustix::mm::madvise(addr.cast(), len, rustix::mm::Advice::LinuxDontFork) };
        }
        this.data_len = data_len;
        this.subbuf_size = subbuf_size;
        this.nr_subbufs = nr_subbufs;
        Ok(this)
    }

    fn meta_u32(&self, off: usize) -> u32 {
        debug_assert!(off + 4 <= META_STRUCT_MIN as usize);
        // SAFETY: TM1/TM4 — `off + 4 <= 64 <= meta_len` (one page).
        unsafe { read_word(self.meta.as_ptr().add(off), 4) as u32 }
    }

    fn meta_u64(&self, off: usize) -> u64 {
        debug_assert!(off + 8 <= META_STRUCT_MIN as usize);
        // SAFETY: TM1/TM4 — `off + 8 <= 64 <= meta_len` (one page).
        unsafe { read_word(self.meta.as_ptr().add(off), 8) }
    }

    /// Bytes of one sub-buffer (header included).
    pub(crate) fn subbuf_size(&self) -> usize {
        self.subbuf_size
    }

    /// The kernel's counters as of the last GET_READER.
    pub(crate) fn counters(&self) -> MetaCounters {
        MetaCounters {
            reader_lost_events: self.meta_u64(16),
            entries: self.meta_u64(40),
            overrun: self.meta_u64(48),
            read: self.meta_u64(56),
        }
    }

    /// GET_READER: swaps in the next sub-buffer once the current one is
    /// read through, and marks everything it holds now as consumed.
    pub(crate) fn get_reader(&mut self) -> Result<Reader, TraceMapError> {
        // SAFETY: the request takes no argument; the fd is ours.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), TRACE_MMAP_IOCTL_GET_READER as _) };
        if rc < 0 {
            self.reader = None;
            return Err(TraceMapError::Ioctl(std::io::Error::last_os_error()));
        }
        let id = self.meta_u32(24);
        let read = self.meta_u32(28) as usize;
        if id >= self.nr_subbufs {
            self.reader = None;
            return Err(TraceMapError::ReaderId {
                id,
                nr_subbufs: self.nr_subbufs,
            });
        }
        // TM4: never past the sub-buffer.
        let read = read.min(self.subbuf_size - SUBBUF_DATA_OFFSET);
        let r = Reader { id, read };
        self.reader = Some(r);
        Ok(r)
    }

    /// The reader sub-buffer the last successful GET_READER reported.
    pub(crate) fn reader(&self) -> Option<ReaderView<'_>> {
        let r = self.reader?;
        // SAFETY: TM4 — `id < nr_subbufs`, so the sub-buffer lies inside the
        // data mapping of `nr_subbufs * subbuf_size` bytes.
        let base = unsafe { self.data.as_ptr().add(r.id as usize * self.subbuf_size) };
        Some(ReaderView {
            base,
            size: self.subbuf_size,
            read: r.read,
            _map: PhantomData,
        })
    }
}

impl Drop for TraceMap {
    fn drop(&mut self) {
        if self.data_len > 0 {
            // SAFETY: TM1 — mapped in `new` with this length, unmapped once;
            // no view outlives `self`.
            let _ = unsafe { munmap(self.data.as_ptr().cast(), self.data_len) };
        }
        // SAFETY: as above, for the meta page.
        let _ = unsafe { munmap(self.meta.as_ptr().cast(), self.meta_len) };
    }
}

/// A borrowed view of the reader sub-buffer, valid until the next
/// GET_READER (which needs the map mutably).
#[derive(Clone, Copy)]
pub(crate) struct ReaderView<'m> {
    base: *const u8,
    size: usize,
    read: usize,
    _map: PhantomData<&'m TraceMap>,
}

impl<'m> ReaderView<'m> {
    /// The committed data the kernel counted as read (TM2): stable bytes.
    pub(crate) fn data(&self) -> &'m [u8] {
        // SAFETY: TM1 — inside the mapping (TM4: `SUBBUF_DATA_OFFSET + read
        // <= size`); TM2 — the kernel does not write these bytes while the
        // view (a borrow of the map) lives.
        unsafe { std::slice::from_raw_parts(self.base.add(SUBBUF_DATA_OFFSET), self.read) }
    }

    /// A header or trailing word (4 or 8 bytes) at `off` from the
    /// sub-buffer's start, read volatile (TM3); `None` outside it.
    pub(crate) fn word(&self, off: usize, size: usize) -> Option<u64> {
        let end = off.checked_add(size)?;
        if end > self.size {
            return None;
        }
        if size != 4 && size != 8 {
            return None;
        }
        // SAFETY: TM1/TM4 — `off + size <= subbuf_size`; TM3 — volatile.
        Some(unsafe { read_word(self.base.add(off), size) })
    }

    /// Bytes of the whole sub-buffer.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_outside_tracefs_is_refused_before_any_mapping() {
        let f = File::open("/proc/self/status").expect("open");
        match TraceMap::new(&f) {
            Err(TraceMapError::NotTracefs(t)) => assert_ne!(t, TRACEFS_MAGIC),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("procfs file mapped as a ring buffer"),
        }
    }

    #[test]
    fn ioctl_number_is_io_r_0x20() {
        assert_eq!(TRACE_MMAP_IOCTL_GET_READER, 0x5220);
    }
}
