//! What each producer did, for `trace_stats` and the summary (Perfetto's
//! names where they exist).

/// Counters of one producer connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Chunks named in CommitData and moved out of the SMB.
    pub chunks_committed: u64,
    /// Chunks whose packets were read into a ring buffer.
    pub chunks_stored: u64,
    /// Packets stored, and their bytes (without the trusted fields).
    pub packets: u64,
    pub bytes: u64,
    /// Chunks refused: not complete, out of range, a buffer the producer may
    /// not write, or given up waiting for patches.
    pub chunks_discarded: u64,
    pub chunks_committed_out_of_order: u64,
    pub patches_succeeded: u64,
    pub patches_failed: u64,
    /// Bad fragment lengths and other breaches of the shared-memory ABI.
    pub abi_violations: u64,
    /// Packets the writer itself marked dropped (its SMB was full).
    pub trace_writer_packet_loss: u64,
    /// Packets that set a service-only field or are malformed.
    pub invalid_packets: u64,
    /// Packets larger than the buffer takes.
    pub packets_too_big: u64,
    /// IPC frames or requests refused (oversized, garbage, unknown).
    pub ipc_refusals: u64,
}
