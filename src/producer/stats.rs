//! What each producer did, for `trace_stats` and the summary (Perfetto's
//! names where they exist).

/// Counters of one producer connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Chunks named in CommitData and moved out of the SMB.
    pub(crate) chunks_committed: u64,
    /// Chunks whose packets were read into a ring buffer.
    pub(crate) chunks_stored: u64,
    /// Chunks read by scraping before their commit (at flushes, the stop
    /// and a disconnect); their commit adds only what came after.
    pub(crate) chunks_scraped: u64,
    /// Packets stored, and their bytes (without the trusted fields).
    pub packets: u64,
    /// Bytes of those packets, without the trusted fields.
    pub bytes: u64,
    /// Chunks refused: not complete, out of range, a buffer the producer may
    /// not write, or given up waiting for patches.
    pub chunks_discarded: u64,
    /// Chunks that were not the next of their sequence: the packet spanning
    /// the gap is given up and the next stored one marked as after a loss.
    pub chunks_committed_out_of_order: u64,
    pub(crate) patches_succeeded: u64,
    /// Patches not applied (no such chunk waiting, out of its bounds, or
    /// malformed), and chunks still waiting for patches at the end.
    pub patches_failed: u64,
    /// Bad fragment lengths and other breaches of the shared-memory ABI.
    pub abi_violations: u64,
    /// Packets the writer itself marked dropped (its SMB was full).
    pub trace_writer_packet_loss: u64,
    /// Packets that set a service-only field or are malformed.
    pub invalid_packets: u64,
    /// Packets larger than the buffer takes.
    pub(crate) packets_too_big: u64,
    /// IPC frames or requests refused (oversized, garbage, unknown).
    pub(crate) ipc_refusals: u64,
}

impl ProducerStats {
    /// Chunks and packets refused or lost on the way in, in all.
    pub fn lost(&self) -> u64 {
        self.chunks_discarded
            + self.chunks_committed_out_of_order
            + self.patches_failed
            + self.abi_violations
            + self.trace_writer_packet_loss
            + self.invalid_packets
            + self.packets_too_big
    }

    /// What was refused or lost, by reason (for people), non-zero ones only.
    pub fn losses(&self) -> Vec<(&'static str, u64)> {
        [
            ("chunks refused", self.chunks_discarded),
            ("chunks out of order", self.chunks_committed_out_of_order),
            ("patches failed", self.patches_failed),
            ("ABI violations", self.abi_violations),
            (
                "packets the app dropped (its shared memory was full)",
                self.trace_writer_packet_loss,
            ),
            (
                "packets refused (service-only fields or malformed)",
                self.invalid_packets,
            ),
            ("packets too big", self.packets_too_big),
            ("IPC requests refused", self.ipc_refusals),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }

    /// Adds what changed from `before` to `after` (counters only grow).
    pub(crate) fn add_change(&mut self, before: &ProducerStats, after: &ProducerStats) {
        macro_rules! each {
            ($($f:ident),*) => {
                $(self.$f += after.$f.saturating_sub(before.$f);)*
            };
        }
        each!(
            chunks_committed,
            chunks_stored,
            chunks_scraped,
            packets,
            bytes,
            chunks_discarded,
            chunks_committed_out_of_order,
            patches_succeeded,
            patches_failed,
            abi_violations,
            trace_writer_packet_loss,
            invalid_packets,
            packets_too_big,
            ipc_refusals
        );
    }
}

/// The producers of a session in all.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProducerTotals {
    /// What producers wrote into each buffer (by index).
    pub(crate) per_buffer: Vec<ProducerStats>,
    /// Everything, including what no buffer can be charged with.
    pub all: ProducerStats,
    pub connected: u32,
    pub seen: u64,
    pub(crate) data_sources_registered: u32,
}
