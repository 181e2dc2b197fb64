//! Per-buffer counters, with Perfetto's `BufferStats` names where they apply.

/// A snapshot of a buffer's counters. Byte counts are framed bytes
/// (`0x0A <varint len> <packet>`), the bytes the file receives; chunk counts
/// count chunks (a span of k chunks counts k).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferStats {
    /// Configured size in bytes.
    pub buffer_size: u64,
    /// Bytes committed by writers (including the committed prefix of chunks
    /// still being written).
    pub bytes_written: u64,
    /// Chunks completed with data in them.
    pub chunks_written: u64,
    /// Chunks reused by RING_BUFFER while they still held unread data.
    pub chunks_overwritten: u64,
    /// Unread bytes lost to reuse.
    pub bytes_overwritten: u64,
    /// Chunk acquisitions refused because no chunk could be had.
    pub chunks_discarded: u64,
    /// Framed bytes of the packets dropped because no chunk could be had.
    pub bytes_discarded: u64,
    /// Packets committed by writers.
    pub packets_written: u64,
    /// Unread packets lost to reuse.
    pub packets_overwritten: u64,
    /// Packets dropped because no chunk could be had, for any reason (the
    /// two counters below single out the reasons other than a full DISCARD
    /// buffer).
    pub packets_discarded: u64,
    /// Of `packets_discarded`: dropped while the space was pinned by a write
    /// pass in flight.
    pub packets_discarded_pinned: u64,
    /// Of `bytes_discarded`: framed bytes of those packets.
    pub(crate) bytes_discarded_pinned: u64,
    /// Of `packets_discarded`: dropped while every other chunk was held by
    /// another writer (more writers than chunks).
    pub packets_discarded_held: u64,
    /// Of `bytes_discarded`: framed bytes of those packets.
    pub(crate) bytes_discarded_held: u64,
    /// Packets refused as too big.
    pub packets_refused: u64,
    /// Framed bytes of the packets refused as too big.
    pub bytes_refused: u64,
    /// Bytes handed to the flusher by `take_flush`.
    pub bytes_read: u64,
    /// Chunks read to their end.
    pub chunks_read: u64,
    /// Packets handed to the flusher.
    pub packets_read: u64,
    /// Times the write cursor went round the buffer.
    pub write_wrap_count: u64,
    /// Unused bytes at the end of completed chunks (never flushed): the
    /// engine's own figure, bytes of buffer space that held no packet.
    pub unused_chunk_bytes: u64,
    /// Perfetto's `BufferStats.padding_bytes_written`: bytes allocated as
    /// padding *between* chunks (its variable-size chunk records leave gaps
    /// at a wrap). Chunks here are fixed slots that need no padding, so this
    /// stays 0; the unused end of a chunk is [`Self::unused_chunk_bytes`],
    /// which Perfetto counts inside its chunk records, not as padding.
    pub padding_bytes_written: u64,
    /// Chunks that held unread data dropped by `clear`.
    pub(crate) chunks_cleared: u64,
    /// Unread bytes dropped by `clear`.
    pub(crate) bytes_cleared: u64,
    /// Unread packets dropped by `clear`.
    pub packets_cleared: u64,
    /// Committed bytes not yet read (counted chunk by chunk, independently of
    /// the other counters, so that the balance below is a real check).
    pub bytes_buffered: u64,
    /// Committed packets not yet read.
    pub packets_buffered: u64,
}

impl BufferStats {
    /// Packets and framed bytes discarded because DISCARD's buffer was full
    /// of unread data (the rest of the discards have their own reasons).
    pub(crate) fn discarded_full(&self) -> (u64, u64) {
        (
            self.packets_discarded
                .saturating_sub(self.packets_discarded_pinned + self.packets_discarded_held),
            self.bytes_discarded
                .saturating_sub(self.bytes_discarded_pinned + self.bytes_discarded_held),
        )
    }

    /// R3: every byte and packet written is read, overwritten, cleared or
    /// still buffered.
    pub fn is_balanced(&self) -> bool {
        self.bytes_written
            == self.bytes_read + self.bytes_overwritten + self.bytes_cleared + self.bytes_buffered
            && self.packets_written
                == self.packets_read
                    + self.packets_overwritten
                    + self.packets_cleared
                    + self.packets_buffered
    }
}
