//! Where the ftrace source puts its packets. The buffer engine's writer
//! implements [`PacketOutput`]; [`VecOutput`] keeps them in memory in the
//! trace file's framing (tests, benches).

/// A sink of whole TracePackets.
pub trait PacketOutput: Send {
    /// Appends one already-encoded packet.
    fn write_packet(&mut self, packet: &[u8]);
    /// Space to encode one packet in place: at least `min_len` and at most
    /// `max_len` bytes (an output may give less than `max_len` to use up
    /// what is left of its current chunk instead of leaving it as padding),
    /// or `None` when no space can be had (the packet is then dropped,
    /// counted).
    fn begin(&mut self, min_len: usize, max_len: usize) -> Option<&mut [u8]>;
    /// Commits the first `len` bytes of the space [`PacketOutput::begin`]
    /// gave; 0 stores nothing.
    fn commit(&mut self, len: usize);
}

/// Packets framed as a serialized `Trace` (`0x0A <varint len> <packet>`).
#[derive(Default)]
pub struct VecOutput {
    pub bytes: Vec<u8>,
    pub packets: usize,
    scratch: Vec<u8>,
}

impl VecOutput {
    pub fn new() -> Self {
        Self::default()
    }
}

impl PacketOutput for VecOutput {
    fn write_packet(&mut self, packet: &[u8]) {
        crate::wire::framing::push_record(&mut self.bytes, packet);
        self.packets += 1;
    }

    fn begin(&mut self, _min_len: usize, max_len: usize) -> Option<&mut [u8]> {
        self.scratch.resize(max_len, 0);
        Some(&mut self.scratch[..max_len])
    }

    fn commit(&mut self, len: usize) {
        if len == 0 {
            return;
        }
        let s = std::mem::take(&mut self.scratch);
        self.write_packet(&s[..len.min(s.len())]);
        self.scratch = s;
    }
}
