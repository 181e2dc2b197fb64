//! Flush batches: byte ranges of the mapping, pinned until released, as a
//! whole or region by region as their bytes reach the file (M4).

use std::cell::Cell;
use std::sync::Arc;

use super::WriterId;
use super::buffer::Buffer;
use super::table::{Pin, RawItem, Taken};

/// One piece of a batch, in file order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushItem<'a> {
    /// Whole framed packets (`0x0A <varint len> <packet>` ...), ready to be
    /// an iovec.
    Data(&'a [u8]),
    /// The writer's data was lost here (overwritten, discarded or cleared);
    /// its next packet should carry `previous_packet_dropped`.
    Loss {
        /// The writer that lost data.
        writer: WriterId,
    },
}

/// What one `take_flush` (or `snapshot`) gathered. The ranges stay pinned —
/// never overwritten — until [`release`](FlushBatch::release) (or drop), or,
/// region by region, until [`release_written`](FlushBatch::release_written)
/// lets go of them.
pub struct FlushBatch {
    buffer: Arc<Buffer>,
    items: Vec<RawItem>,
    /// The regions pinned, in data order (`data_end` ascending).
    pins: Vec<Pin>,
    /// `pins[..released]` were let go of by `release_written`.
    released: Cell<usize>,
    len_bytes: u64,
}

impl std::fmt::Debug for FlushBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushBatch")
            .field("items", &self.items)
            .field("len_bytes", &self.len_bytes)
            .finish_non_exhaustive()
    }
}

impl FlushBatch {
    pub(crate) fn new(buffer: Arc<Buffer>, taken: Taken) -> FlushBatch {
        FlushBatch {
            buffer,
            items: taken.items,
            pins: taken.pins,
            released: Cell::new(0),
            len_bytes: taken.bytes,
        }
    }

    /// The batch's pieces in file order: grouped by writer (ascending id),
    /// each writer's data in write order.
    pub fn items(&self) -> impl Iterator<Item = FlushItem<'_>> + '_ {
        let base = self.buffer.base();
        self.items.iter().map(move |item| match *item {
            RawItem::Data { offset, len } => {
                // SAFETY: M1, M3, M4 — the range lies in the mapping, below
                // the committed length it was read at (M2: never written
                // again), and its region is pinned by this batch until
                // release, which needs `self` by value and so outlives this
                // borrow, or until `release_written`, whose caller promised
                // never to read the range again.
                FlushItem::Data(unsafe { std::slice::from_raw_parts(base.add(offset), len) })
            }
            RawItem::Loss(writer) => FlushItem::Loss { writer },
        })
    }

    /// Total data bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Nothing in it.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The first `data_bytes` bytes of the batch's data (its
    /// [`FlushItem::Data`] ranges, in order) are in the file: unpins every
    /// region whose range ends within them, so that writers may take those
    /// chunks while the rest of the batch is still being written. Returns
    /// where the last region let go of ends in the batch's data (0 if none
    /// yet): a packet boundary, since a region holds whole packets (R1).
    ///
    /// # Safety
    /// M4: the caller never reads the first `data_bytes` bytes of the data
    /// again — through a slice [`items`](Self::items) returned, or anything
    /// (an `IoSlice`, an iovec handed to the kernel) made from one — since
    /// a writer may overwrite them as soon as this returns. (A write pass
    /// keeps this through `storage::WriteList`, storage P1.)
    pub(crate) unsafe fn release_written(&self, data_bytes: u64) -> u64 {
        let from = self.released.get();
        let done = self.pins[from..].partition_point(|p| p.data_end <= data_bytes);
        if done > 0 {
            self.buffer.release(&self.pins[from..from + done]);
            self.released.set(from + done);
        }
        self.released_through()
    }

    /// Where the regions let go of by [`release_written`](Self::release_written)
    /// end in the batch's data.
    pub(crate) fn released_through(&self) -> u64 {
        match self.released.get() {
            0 => 0,
            n => self.pins[n - 1].data_end,
        }
    }

    /// The I/O is done (or failed): unpin, and free what was fully read.
    pub fn release(self) {}
}

impl Drop for FlushBatch {
    fn drop(&mut self) {
        let rest = &self.pins[self.released.get()..];
        if !rest.is_empty() {
            self.buffer.release(rest);
        }
    }
}
