//! Where a source's `TracePacket`s go: one trait for every source. At run
//! time it is the source's ring-buffer [`Writer`]; tests, benches and tools
//! collect packets in memory ([`VecOutput`], `Vec<Vec<u8>>`).
//!
//! Packets are encoded in place into the engine's own [`PacketSlot`] (zero
//! copy), or handed over whole with [`PacketOutput::write_packet`].

use std::sync::Arc;

use crate::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, PacketSlot, Writer, WriterId};

/// A sink of whole TracePackets.
pub trait PacketOutput: Send {
    /// Stores one already-encoded packet. A refused one (a full DISCARD
    /// buffer, a packet too big for it) is counted by the buffer.
    fn write_packet(&mut self, packet: &[u8]);

    /// The engine's slot for one packet encoded in place: at least `min_len`
    /// and at most `max_len` bytes (a ring writer gives less than `max_len`
    /// to use up what is left of its current chunk instead of leaving it as
    /// padding), or `None` when no space can be had (the packet is then
    /// dropped, counted). Dropping the slot without committing it stores
    /// nothing.
    ///
    /// Outputs that only collect whole packets lend none (the default).
    fn begin(&mut self, _min_len: usize, _max_len: usize) -> Option<PacketSlot<'_>> {
        None
    }

    /// Makes what was written so far visible to the reader.
    fn flush(&mut self) {}
}

/// Each packet goes straight into the ring, in place where the source
/// encodes in place. Nothing to do on `flush`: a write pass reads a writer's
/// committed packets without its help, and committing half-empty chunks
/// would only waste ring space.
impl PacketOutput for Writer {
    fn write_packet(&mut self, packet: &[u8]) {
        // A refused packet (DISCARD full, too big) is counted by the buffer.
        let _ = Writer::write_packet(self, packet);
    }

    fn begin(&mut self, min_len: usize, max_len: usize) -> Option<PacketSlot<'_>> {
        self.begin_packet_at_least(min_len, max_len).ok()
    }
}

impl<T: PacketOutput + ?Sized> PacketOutput for &mut T {
    fn write_packet(&mut self, packet: &[u8]) {
        (**self).write_packet(packet);
    }

    fn begin(&mut self, min_len: usize, max_len: usize) -> Option<PacketSlot<'_>> {
        (**self).begin(min_len, max_len)
    }

    fn flush(&mut self) {
        (**self).flush();
    }
}

/// Collects whole packets in memory (tests, tools).
impl PacketOutput for Vec<Vec<u8>> {
    fn write_packet(&mut self, packet: &[u8]) {
        self.push(packet.to_vec());
    }
}

/// Packets framed as a serialized `Trace` (`0x0A <varint len> <packet>`),
/// in memory (tests, benches). Slots come from a ring buffer of its own, so
/// in-place encoders run as they do against a session's buffer; what they
/// commit is moved into [`bytes`](Self::bytes) at the next packet and at
/// [`flush`](PacketOutput::flush).
pub struct VecOutput {
    /// The framed `Trace` so far: every packet committed and moved out of the
    /// staging ring.
    pub bytes: Vec<u8>,
    /// Packets framed into `bytes` so far.
    pub packets: usize,
    ring: Arc<Buffer>,
    writer: Writer,
}

impl VecOutput {
    /// Bytes of the staging ring: four times the largest packet, as the
    /// engine needs to take a packet of [`BufferParams::MAX_PACKET_LEN`].
    const RING_BYTES: usize = 4 * BufferParams::MAX_PACKET_LEN;

    /// An empty output with its own staging ring.
    pub fn new() -> Self {
        let params = BufferParams {
            prefault: false,
            ..BufferParams::new(Self::RING_BYTES, FillPolicy::Discard)
        };
        let ring = Buffer::new(params).expect("an anonymous mapping of a few MiB");
        let writer = ring.writer(WriterId(1));
        Self {
            bytes: Vec::new(),
            packets: 0,
            ring,
            writer,
        }
    }

    /// Moves the packets committed to the ring into `bytes`, in order.
    fn drain(&mut self) {
        let batch = self.ring.take_flush();
        for item in batch.items() {
            if let FlushItem::Data(d) = item {
                self.packets += crate::wire::framing::frames(d).count();
                self.bytes.extend_from_slice(d);
            }
        }
        batch.release();
    }
}

impl Default for VecOutput {
    fn default() -> Self {
        Self::new()
    }
}

impl PacketOutput for VecOutput {
    fn write_packet(&mut self, packet: &[u8]) {
        self.drain();
        crate::wire::framing::push_record(&mut self.bytes, packet);
        self.packets += 1;
    }

    fn begin(&mut self, min_len: usize, max_len: usize) -> Option<PacketSlot<'_>> {
        self.drain();
        self.writer.begin_packet_at_least(min_len, max_len).ok()
    }

    fn flush(&mut self) {
        self.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_output_keeps_slots_and_whole_packets_in_order() {
        let mut out = VecOutput::new();
        out.write_packet(b"one");
        let mut slot = out.begin(2, 100).expect("a slot");
        slot.buf()[..3].copy_from_slice(b"two");
        slot.commit(3);
        // Dropped uncommitted: nothing.
        let _ = out.begin(2, 100);
        out.write_packet(b"three");
        let mut slot = out.begin(1, 10).expect("a slot");
        slot.buf()[0] = b'4';
        slot.commit(1);
        out.flush();
        let got: Vec<&[u8]> = crate::wire::framing::frames(&out.bytes)
            .map(|f| f.packet)
            .collect();
        assert_eq!(got, [&b"one"[..], b"two", b"three", b"4"]);
        assert_eq!(out.packets, 4);
    }
}
