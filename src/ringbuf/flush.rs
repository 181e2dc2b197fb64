//! Flush batches: byte ranges of the mapping, pinned until released.

use std::sync::Arc;

use super::WriterId;
use super::buffer::Buffer;
use super::table::{RawItem, Taken};

/// One piece of a batch, in file order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushItem<'a> {
    /// Whole framed packets (`0x0A <varint len> <packet>` ...), ready to be
    /// an iovec.
    Data(&'a [u8]),
    /// The writer's data was lost here (overwritten, discarded or cleared);
    /// its next packet should carry `previous_packet_dropped`.
    Loss { writer: WriterId },
}

/// What one `take_flush` (or `snapshot`) gathered. The ranges stay pinned —
/// never overwritten — until [`release`](FlushBatch::release) (or drop).
pub struct FlushBatch {
    buffer: Arc<Buffer>,
    items: Vec<RawItem>,
    pins: Vec<u32>,
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
            len_bytes: taken.bytes,
        }
    }

    /// The batch's pieces in file order: grouped by writer (ascending id),
    /// each writer's data in write order.
    pub fn items(&self) -> impl Iterator<Item = FlushItem<'_>> + '_ {
        let base = self.buffer.base();
        self.items.iter().map(move |item| match *item {
            RawItem::Data { offset, len } => {
                // SAFETY: M1, M3 — the range lies in the mapping, below the
                // committed length it was read at (M2: never written again),
                // and its region is pinned by this batch until release, which
                // needs `self` by value and so outlives this borrow.
                FlushItem::Data(unsafe { std::slice::from_raw_parts(base.add(offset), len) })
            }
            RawItem::Loss(writer) => FlushItem::Loss { writer },
        })
    }

    /// Total data bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Number of items (data ranges and loss markers).
    pub fn len_items(&self) -> usize {
        self.items.len()
    }

    /// Nothing in it.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The I/O is done (or failed): unpin, and free what was fully read.
    pub fn release(self) {}
}

impl Drop for FlushBatch {
    fn drop(&mut self) {
        if !self.pins.is_empty() {
            self.buffer.release(&self.pins);
        }
    }
}
