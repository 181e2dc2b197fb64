//! Encoding ProcessTree and ProcessStats records into TracePackets, split so
//! that no packet grows past a soft size limit (a big process tree becomes
//! several packets, each with its own `collection_end_timestamp`).

use crate::sources::poller::{PacketOutput, write_packet_header};
use crate::trace::encoder::ProtoEncoder;
use crate::wire::{
    process_stats, process_stats_process as psp, process_tree, process_tree_process as ptp,
    process_tree_thread as ptt, trace_packet,
};

/// Packets close before the entry that would take them past this size.
pub const SOFT_PACKET_LIMIT_BYTES: usize = 64 * 1024;
/// One entry alone larger than this (a pathological cmdline) is dropped.
pub const MAX_PACKET_BYTES: usize = 4 * 1024 * 1024;
/// Room kept for `collection_end_timestamp` (tag + 10-byte varint).
const TAIL_BYTES: usize = 16;

/// One process of a ProcessTree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRecord {
    /// The process id (the thread group id).
    pub pid: i32,
    /// The parent's pid (`PPid` in `/proc/PID/status`).
    pub ppid: i32,
    /// The real user id (first number of `Uid`).
    pub uid: i32,
    /// The arguments of `/proc/PID/cmdline`; the process's name alone when
    /// that is empty.
    pub cmdline: Vec<String>,
    /// `cmdline` is the name from `status` (kernel threads, zombies).
    pub cmdline_is_comm: bool,
    /// Its pids in nested PID namespaces, outermost first (`NSpid` without
    /// the root namespace's); empty when it is in the root one.
    pub nspid: Vec<i32>,
    /// Whether it is a kernel thread (`Kthread` in `status`, else
    /// PF_KTHREAD in `stat`); `None` when neither says.
    pub is_kthread: Option<bool>,
    /// Start time, ns after boot (`record_process_age`).
    pub(crate) start_from_boot_ns: Option<u64>,
}

/// One (non-main) thread of a ProcessTree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadRecord {
    /// The thread id.
    pub tid: i32,
    /// The pid of its process.
    pub tgid: i32,
    /// Its name from `/proc/PID/comm`, when thread names are recorded.
    pub name: Option<String>,
    pub(crate) nstid: Vec<i32>,
}

/// ProcessTree entries in scan order (a process, then its threads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeEntry {
    /// A process (`ProcessTree.processes`).
    Process(ProcessRecord),
    /// A thread other than the main one (`ProcessTree.threads`).
    Thread(ThreadRecord),
}

/// The memory counters of one process that changed since the cache last
/// saw them (unchanged ones are `None` and not written).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsRecord {
    /// The process the counters belong to.
    pub pid: i32,
    /// `VmSize`: virtual memory size, KiB.
    pub vm_size_kb: Option<u64>,
    /// `VmRSS`: resident set size, KiB.
    pub vm_rss_kb: Option<u64>,
    /// `RssAnon`: resident anonymous memory, KiB.
    pub rss_anon_kb: Option<u64>,
    /// `RssFile`: resident file mappings, KiB.
    pub rss_file_kb: Option<u64>,
    /// `RssShmem`: resident shared memory, KiB.
    pub rss_shmem_kb: Option<u64>,
    /// `VmSwap`: anonymous memory swapped out, KiB.
    pub vm_swap_kb: Option<u64>,
    /// `VmLck`: locked memory, KiB.
    pub vm_locked_kb: Option<u64>,
    /// `VmHWM`: peak resident set size, KiB.
    pub vm_hwm_kb: Option<u64>,
    /// `/proc/PID/oom_score_adj`.
    pub oom_score_adj: Option<i64>,
    /// CPU time in user and kernel mode, ns (`record_process_runtime`).
    pub(crate) runtime_user_ns: Option<u64>,
    pub(crate) runtime_kernel_ns: Option<u64>,
    /// From smaps_rollup (`scan_smaps_rollup`).
    pub smr_rss_kb: Option<u64>,
    /// `Pss` from smaps_rollup, KiB.
    pub smr_pss_kb: Option<u64>,
    pub(crate) smr_pss_anon_kb: Option<u64>,
    pub(crate) smr_pss_file_kb: Option<u64>,
    pub(crate) smr_pss_shmem_kb: Option<u64>,
    pub(crate) smr_swap_pss_kb: Option<u64>,
}

impl StatsRecord {
    /// Whether no counter changed (nothing but the pid to write).
    pub fn is_empty(&self) -> bool {
        *self
            == StatsRecord {
                pid: self.pid,
                ..StatsRecord::default()
            }
    }
}

pub(super) fn encode_tree_entry(e: &mut ProtoEncoder<'_>, entry: &TreeEntry) {
    match entry {
        TreeEntry::Process(p) => {
            let n = e.begin_nested(process_tree::PROCESSES);
            e.int(ptp::PID, i64::from(p.pid));
            e.int(ptp::PPID, i64::from(p.ppid));
            for arg in &p.cmdline {
                e.string(ptp::CMDLINE, arg);
            }
            e.int(ptp::UID, i64::from(p.uid));
            for id in &p.nspid {
                e.int(ptp::NSPID, i64::from(*id));
            }
            if let Some(k) = p.is_kthread {
                e.bool(ptp::IS_KTHREAD, k);
            }
            if let Some(ns) = p.start_from_boot_ns {
                e.uint(ptp::PROCESS_START_FROM_BOOT, ns);
            }
            if p.cmdline_is_comm {
                e.bool(ptp::CMDLINE_IS_COMM, true);
            }
            e.end_nested(n);
        }
        TreeEntry::Thread(t) => {
            let n = e.begin_nested(process_tree::THREADS);
            e.int(ptt::TID, i64::from(t.tid));
            if let Some(name) = &t.name {
                e.string(ptt::NAME, name);
            }
            e.int(ptt::TGID, i64::from(t.tgid));
            for id in &t.nstid {
                e.int(ptt::NSTID, i64::from(*id));
            }
            e.end_nested(n);
        }
    }
}

pub(super) fn encode_stats_record(e: &mut ProtoEncoder<'_>, r: &StatsRecord) {
    let n = e.begin_nested(process_stats::PROCESSES);
    e.int(psp::PID, i64::from(r.pid));
    let fields = [
        (psp::VM_SIZE_KB, r.vm_size_kb),
        (psp::VM_RSS_KB, r.vm_rss_kb),
        (psp::RSS_ANON_KB, r.rss_anon_kb),
        (psp::RSS_FILE_KB, r.rss_file_kb),
        (psp::RSS_SHMEM_KB, r.rss_shmem_kb),
        (psp::VM_SWAP_KB, r.vm_swap_kb),
        (psp::VM_LOCKED_KB, r.vm_locked_kb),
        (psp::VM_HWM_KB, r.vm_hwm_kb),
        (psp::SMR_RSS_KB, r.smr_rss_kb),
        (psp::SMR_PSS_KB, r.smr_pss_kb),
        (psp::SMR_PSS_ANON_KB, r.smr_pss_anon_kb),
        (psp::SMR_PSS_FILE_KB, r.smr_pss_file_kb),
        (psp::SMR_PSS_SHMEM_KB, r.smr_pss_shmem_kb),
        (psp::RUNTIME_USER_MODE, r.runtime_user_ns),
        (psp::RUNTIME_KERNEL_MODE, r.runtime_kernel_ns),
        (psp::SMR_SWAP_PSS_KB, r.smr_swap_pss_kb),
    ];
    for (field, v) in fields {
        if let Some(v) = v {
            e.uint(field, v);
        }
    }
    if let Some(v) = r.oom_score_adj {
        e.int(psp::OOM_SCORE_ADJ, v);
    }
    e.end_nested(n);
}

/// How a run of entries becomes packets.
pub(super) struct PacketPlan {
    pub(crate) timestamp_ns: u64,
    pub sequence_id: u32,
    /// TracePacket field of the payload (ProcessTree or ProcessStats).
    pub(crate) payload_field: u32,
    /// `collection_end_timestamp` field inside the payload.
    pub(crate) end_field: u32,
    /// Set `incremental_state_cleared` on the first packet.
    pub incremental_state_cleared: bool,
    pub(crate) soft_limit: usize,
}

/// Counts of what `write_split` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitOutcome {
    /// Packets written.
    pub packets: usize,
    /// Entries too large for even a packet of their own.
    pub dropped: usize,
}

/// Encodes `items` into packets of at most `plan.soft_limit` bytes (an entry
/// larger than that gets a packet of its own, up to [`MAX_PACKET_BYTES`]),
/// writing each to `out`. Writes nothing for no items.
pub(super) fn write_split<T>(
    buf: &mut Vec<u8>,
    plan: &PacketPlan,
    items: &[T],
    out: &mut dyn PacketOutput,
    encode: impl Fn(&mut ProtoEncoder<'_>, &T),
) -> SplitOutcome {
    let mut outcome = SplitOutcome::default();
    let mut i = 0;
    let mut budget = plan.soft_limit;
    while i < items.len() {
        if buf.len() < budget + TAIL_BYTES {
            buf.resize(budget + TAIL_BYTES, 0);
        }
        let start = i;
        let mut e = ProtoEncoder::new(&mut buf[..budget + TAIL_BYTES]);
        write_packet_header(&mut e, plan.timestamp_ns, plan.sequence_id);
        if plan.incremental_state_cleared && outcome.packets == 0 {
            e.bool(trace_packet::INCREMENTAL_STATE_CLEARED, true);
        }
        let payload = e.begin_nested(plan.payload_field);
        while i < items.len() {
            let mark = e.len();
            encode(&mut e, &items[i]);
            if e.overflowed() || e.len() > budget {
                e.truncate(mark);
                break;
            }
            i += 1;
            if budget > plan.soft_limit {
                break; // an enlarged packet holds its one big entry only
            }
        }
        if i == start {
            // Not even one entry fits: give it a bigger packet of its own, or
            // drop it when it is beyond reason.
            if budget >= MAX_PACKET_BYTES {
                log::warn!("a process entry is larger than {MAX_PACKET_BYTES} bytes; dropped");
                outcome.dropped += 1;
                i += 1;
                budget = plan.soft_limit;
            } else {
                budget = (budget * 2).min(MAX_PACKET_BYTES);
            }
            continue;
        }
        e.uint(plan.end_field, crate::clock::boottime_ns());
        e.end_nested(payload);
        let len = e
            .finish()
            .expect("the tail room reserved past the budget holds the closing fields");
        out.write_packet(&buf[..len]);
        outcome.packets += 1;
        budget = plan.soft_limit;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(soft_limit: usize) -> PacketPlan {
        PacketPlan {
            timestamp_ns: 5,
            sequence_id: 3,
            payload_field: trace_packet::PROCESS_TREE,
            end_field: process_tree::COLLECTION_END_TIMESTAMP,
            incremental_state_cleared: false,
            soft_limit,
        }
    }

    fn process(pid: i32, cmdline_bytes: usize) -> TreeEntry {
        TreeEntry::Process(ProcessRecord {
            pid,
            ppid: 1,
            uid: 0,
            cmdline: vec!["x".repeat(cmdline_bytes)],
            cmdline_is_comm: false,
            nspid: Vec::new(),
            is_kthread: None,
            start_from_boot_ns: None,
        })
    }

    #[test]
    fn an_entry_larger_than_the_limit_gets_a_packet_of_its_own() {
        let items = [process(1, 10), process(2, 3000), process(3, 10)];
        let mut buf = Vec::new();
        let mut out: Vec<Vec<u8>> = Vec::new();
        let o = write_split(&mut buf, &plan(1024), &items, &mut out, encode_tree_entry);
        assert_eq!(
            o,
            SplitOutcome {
                packets: 3,
                dropped: 0
            }
        );
        let sizes: Vec<usize> = out.iter().map(Vec::len).collect();
        assert!(
            sizes[0] <= 1024 && sizes[2] <= 1024 && sizes[1] > 3000,
            "{sizes:?}"
        );
    }

    #[test]
    fn an_entry_beyond_the_maximum_is_dropped_and_counted() {
        let items = [process(1, MAX_PACKET_BYTES + 1), process(2, 10)];
        let mut buf = Vec::new();
        let mut out: Vec<Vec<u8>> = Vec::new();
        let o = write_split(&mut buf, &plan(1024), &items, &mut out, encode_tree_entry);
        assert_eq!(
            o,
            SplitOutcome {
                packets: 1,
                dropped: 1
            }
        );
    }

    #[test]
    fn no_items_no_packet() {
        let mut out: Vec<Vec<u8>> = Vec::new();
        let o = write_split(
            &mut Vec::new(),
            &plan(1024),
            &[] as &[TreeEntry],
            &mut out,
            encode_tree_entry,
        );
        assert_eq!((o.packets, out.len()), (0, 0));
    }
}
