//! `linux.process_stats`: the process tree (ProcessTree packets) and periodic
//! per-process memory counters (ProcessStats packets), read from `/proc`.
//!
//! - At start, with `scan_all_processes_on_start`, every process and thread.
//! - On demand, the pids the ftrace source reports ([`ProcessStatsSource::on_pids_seen`]),
//!   each once until incremental state is cleared, unless `DISABLE_ON_DEMAND`.
//! - Every `proc_stats_poll_ms`, the memory counters of every process that
//!   changed since last written (a cache forgotten every
//!   `proc_stats_cache_ttl_ms`), then the tree entries of processes not yet
//!   written.
//!
//! Kernel threads have a status but no memory counters; they are skipped by
//! the poll from then on. Packets stay under
//! [`packets::SOFT_PACKET_LIMIT_BYTES`]: a big tree spans several packets.

mod packets;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

pub use packets::{
    MAX_PACKET_BYTES, ProcessRecord, SOFT_PACKET_LIMIT_BYTES, SplitOutcome, StatsRecord,
    ThreadRecord, TreeEntry,
};

use crate::config::spec::ProcessStatsSpec;
use crate::sources::poller::{PacketOutput, PolledSource};
use crate::sources::procfs::{self, HostPaths};
use crate::wire::{process_stats, process_tree, trace_packet};
use packets::{PacketPlan, encode_stats_record, encode_tree_entry, write_split};

/// `PF_KTHREAD` in the flags of `/proc/PID/stat`: the kthread test for
/// kernels without the `Kthread:` status line (before 6.4).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Polls of the counter cache's life: the validated TTL is a whole number
/// of polls (at least one).
fn cache_ttl_ticks(spec: &ProcessStatsSpec) -> u32 {
    match (spec.poll_period, spec.cache_ttl) {
        (Some(poll), Some(ttl)) if !poll.is_zero() => {
            (ttl.as_millis() / poll.as_millis()).clamp(1, u128::from(u32::MAX)) as u32
        }
        _ => 1,
    }
}

/// The last written counters of one process (`None`: not written yet):
/// the fields of a record that wrote them all (its `pid` is not used).
type CachedCounters = StatsRecord;

/// Counters of what the source wrote and skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessStatsCounters {
    /// ProcessTree packets written.
    pub tree_packets: u64,
    pub(crate) stats_packets: u64,
    pub(crate) processes_written: u64,
    pub(crate) threads_written: u64,
    /// Entries too large for any packet.
    pub(crate) entries_dropped: u64,
}

/// The `linux.process_stats` source: call its methods from one thread (the
/// host's [`crate::sources::poller::Ticker`] does).
pub struct ProcessStatsSource {
    opts: ProcessStatsSpec,
    poll_ms: u32,
    ttl_ticks: u32,
    paths: HostPaths,
    sequence_id: u32,
    /// Tids (and pids) already in the tree since the last clear.
    seen: HashSet<i32>,
    /// Pids with a status but no memory counters (kernel threads).
    skip_mem: HashSet<i32>,
    cache: HashMap<i32, CachedCounters>,
    cache_ticks: u32,
    did_clear: bool,
    tree: Vec<TreeEntry>,
    stats: Vec<StatsRecord>,
    status: Vec<u8>,
    scratch: Vec<u8>,
    packet: Vec<u8>,
    soft_limit: usize,
    counters: ProcessStatsCounters,
}

impl ProcessStatsSource {
    /// A source reading `paths.proc_root`, writing on `sequence_id`.
    pub fn new(opts: ProcessStatsSpec, paths: HostPaths, sequence_id: u32) -> Self {
        Self {
            poll_ms: opts
                .poll_period
                .map_or(0, |p| p.as_millis().min(u128::from(u32::MAX)) as u32),
            ttl_ticks: cache_ttl_ticks(&opts),
            opts,
            paths,
            sequence_id,
            seen: HashSet::new(),
            skip_mem: HashSet::new(),
            cache: HashMap::new(),
            cache_ticks: 0,
            did_clear: false,
            tree: Vec::new(),
            stats: Vec::new(),
            status: Vec::with_capacity(4096),
            scratch: Vec::with_capacity(4096),
            packet: Vec::new(),
            soft_limit: SOFT_PACKET_LIMIT_BYTES,
            counters: ProcessStatsCounters::default(),
        }
    }

    /// Overrides the packet size limit (tests of the split).
    pub fn set_soft_packet_limit(&mut self, bytes: usize) {
        self.soft_limit = bytes.clamp(256, MAX_PACKET_BYTES);
    }

    /// The validated `ProcessStatsConfig` the source runs with.
    pub fn options(&self) -> &ProcessStatsSpec {
        &self.opts
    }

    /// What the source has written and skipped so far.
    pub fn counters(&self) -> ProcessStatsCounters {
        self.counters
    }

    fn proc_path(&self, pid: i32, file: &str) -> PathBuf {
        let mut p = self.paths.proc_root.join(pid.to_string());
        p.push(file);
        p
    }

    fn task_path(&self, pid: i32, tid: i32, file: &str) -> PathBuf {
        let mut p = self.paths.proc_root.join(pid.to_string());
        p.push("task");
        p.push(tid.to_string());
        p.push(file);
        p
    }

    /// The pids under `/proc`; `None` (said in the log) when it cannot be
    /// listed.
    fn list_pids(&self) -> Option<Vec<i32>> {
        match procfs::numeric_dirs(&self.paths.proc_root) {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn!("listing {}: {e}", self.paths.proc_root.display());
                None
            }
        }
    }

    /// Writes every process and thread under `/proc` (the start dump).
    pub fn write_all_processes(&mut self, out: &mut dyn PacketOutput) {
        let ts = crate::clock::boottime_ns();
        self.tree.clear();
        let Some(pids) = self.list_pids() else {
            return;
        };
        let mut status = std::mem::take(&mut self.status);
        for pid in pids {
            if procfs::read_file(&self.proc_path(pid, "status"), &mut status).is_err() {
                continue; // exited since the listing
            }
            let namespaced = self.collect_process(pid, &status);
            let Ok(tids) =
                procfs::numeric_dirs(&self.paths.proc_root.join(pid.to_string()).join("task"))
            else {
                continue;
            };
            for tid in tids {
                if tid == pid {
                    continue;
                }
                let nstid = if namespaced {
                    match procfs::read_file(&self.task_path(pid, tid, "status"), &mut status) {
                        Ok(_) => procfs::namespaced_ids(&status),
                        Err(_) => continue,
                    }
                } else {
                    Vec::new()
                };
                let name = self.thread_name(&self.task_path(pid, tid, "comm"));
                self.push_thread(tid, pid, name, nstid);
            }
        }
        self.status = status;
        self.emit_tree(ts, out);
    }

    /// Writes the tree entries of the reported pids (or tids) not written
    /// since the last clear, unless on-demand dumps are disabled.
    pub fn on_pids_seen(&mut self, pids: &[i32], out: &mut dyn PacketOutput) {
        if self.opts.disable_on_demand {
            return;
        }
        self.write_process_tree(pids, out);
    }

    fn write_process_tree(&mut self, pids: &[i32], out: &mut dyn PacketOutput) {
        let ts = crate::clock::boottime_ns();
        self.tree.clear();
        let mut sorted = pids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        for pid in sorted {
            if pid <= 0 || self.seen.contains(&pid) {
                continue;
            }
            self.write_process_or_thread(pid);
        }
        self.emit_tree(ts, out);
    }

    fn write_process_or_thread(&mut self, pid: i32) {
        let mut status = std::mem::take(&mut self.status);
        if procfs::read_file(&self.proc_path(pid, "status"), &mut status).is_ok() {
            let field = |k: &[u8]| {
                procfs::status_field(&status, k).map_or(0, |v| procfs::parse_i64(v) as i32)
            };
            let (tgid, tid) = (field(b"Tgid"), field(b"Pid"));
            if tgid > 0 && tid > 0 {
                let nstid = procfs::namespaced_ids(&status);
                if !self.seen.contains(&tgid) {
                    if tgid == tid {
                        self.collect_process(tgid, &status);
                    } else {
                        let mut main = std::mem::take(&mut self.scratch);
                        if procfs::read_file(&self.proc_path(tgid, "status"), &mut main).is_ok() {
                            self.collect_process(tgid, &main);
                        }
                        self.scratch = main;
                    }
                }
                if tid != tgid {
                    let name = self.thread_name(&self.proc_path(tid, "comm"));
                    self.push_thread(tid, tgid, name, nstid);
                }
            }
        }
        self.status = status;
    }

    fn thread_name(&self, comm_path: &std::path::Path) -> Option<String> {
        if !self.opts.record_thread_names {
            return None;
        }
        let comm = std::fs::read(comm_path).ok()?;
        Some(String::from_utf8_lossy(procfs::trim_newline(&comm)).into_owned())
    }

    fn push_thread(&mut self, tid: i32, tgid: i32, name: Option<String>, nstid: Vec<i32>) {
        self.tree.push(TreeEntry::Thread(ThreadRecord {
            tid,
            tgid,
            name,
            nstid,
        }));
        self.seen.insert(tid);
    }

    /// Adds the process entry of `pid` from its status; returns whether it
    /// lives in a nested PID namespace (its threads then need their status).
    fn collect_process(&mut self, pid: i32, status: &[u8]) -> bool {
        let field = |k: &[u8]| procfs::status_field(status, k).map(procfs::parse_i64);
        // The pid may have been reused by a thread since the listing.
        if field(b"Tgid") != Some(i64::from(pid)) {
            return false;
        }
        let nspid = procfs::namespaced_ids(status);
        let namespaced = !nspid.is_empty();
        let mut cmdline: Vec<String> = Vec::new();
        let mut cmdline_is_comm = false;
        let mut buf = std::mem::take(&mut self.scratch);
        if procfs::read_file(&self.proc_path(pid, "cmdline"), &mut buf).is_ok() && !buf.is_empty() {
            cmdline = buf
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
        }
        if cmdline.is_empty() {
            // Kernel threads and zombies: the name stands in for the cmdline.
            let name = procfs::status_field(status, b"Name").unwrap_or_default();
            cmdline.push(String::from_utf8_lossy(name).into_owned());
            cmdline_is_comm = true;
        }
        let is_kthread =
            match procfs::status_field(status, b"Kthread").and_then(procfs::parse_i32_exact) {
                Some(k @ (0 | 1)) => Some(k == 1),
                _ => match procfs::read_file(&self.proc_path(pid, "stat"), &mut buf) {
                    Ok(_) => stat_flags(&buf).map(|f| f & PF_KTHREAD != 0),
                    Err(_) => None,
                },
            };
        let start_from_boot_ns = if self.opts.record_process_age {
            procfs::read_file(&self.proc_path(pid, "stat"), &mut buf)
                .ok()
                .and_then(|_| stat_times(&buf))
                .map(|t| t.start * self.paths.ns_per_tick())
        } else {
            None
        };
        self.scratch = buf;
        self.tree.push(TreeEntry::Process(ProcessRecord {
            pid,
            ppid: field(b"PPid").unwrap_or(0) as i32,
            uid: field(b"Uid").unwrap_or(0) as i32,
            cmdline,
            cmdline_is_comm,
            nspid,
            is_kthread,
            start_from_boot_ns,
        }));
        self.seen.insert(pid);
        namespaced
    }

    /// The split packets' plan at `ts`: the first one carries the cleared
    /// incremental state, if a clear is pending.
    fn plan(&mut self, ts: u64, payload_field: u32, end_field: u32) -> PacketPlan {
        PacketPlan {
            timestamp_ns: ts,
            sequence_id: self.sequence_id,
            payload_field,
            end_field,
            incremental_state_cleared: std::mem::take(&mut self.did_clear),
            soft_limit: self.soft_limit,
        }
    }

    fn emit_tree(&mut self, ts: u64, out: &mut dyn PacketOutput) {
        if self.tree.is_empty() {
            return;
        }
        let plan = self.plan(
            ts,
            trace_packet::PROCESS_TREE,
            process_tree::COLLECTION_END_TIMESTAMP,
        );
        let tree = std::mem::take(&mut self.tree);
        let outcome = write_split(&mut self.packet, &plan, &tree, out, encode_tree_entry);
        for e in &tree {
            match e {
                TreeEntry::Process(_) => self.counters.processes_written += 1,
                TreeEntry::Thread(_) => self.counters.threads_written += 1,
            }
        }
        self.counters.tree_packets += outcome.packets as u64;
        self.counters.entries_dropped += outcome.dropped as u64;
        self.tree = tree;
        self.tree.clear();
    }

    /// One poll: the changed memory counters of every process, then the tree
    /// entries of processes not written yet.
    pub fn write_process_stats(&mut self, out: &mut dyn PacketOutput) {
        let ts = crate::clock::boottime_ns();
        self.stats.clear();
        let Some(pids) = self.list_pids() else {
            return;
        };
        let mut live = Vec::with_capacity(pids.len());
        let mut status = std::mem::take(&mut self.status);
        let mut buf = std::mem::take(&mut self.scratch);
        for pid in pids {
            let Some(now) = self.read_process(pid, &mut status, &mut buf) else {
                continue;
            };
            let rec = now.changes(pid, self.cache.entry(pid).or_default());
            if !rec.is_empty() {
                self.stats.push(rec);
            }
            live.push(pid);
        }
        self.status = status;
        self.scratch = buf;
        self.emit_stats(ts, out);

        self.cache_ticks += 1;
        if self.cache_ticks >= self.ttl_ticks {
            self.cache_ticks = 0;
            self.cache.clear();
        }
        // Processes that appeared since the last dump get their tree entry
        // once (whatever the on-demand quirk says, as Perfetto does).
        self.write_process_tree(&live, out);
    }

    /// The counters of process `pid` now; `None` for a thread, a process
    /// gone, or one whose status cannot be read (then never read again).
    fn read_process(
        &mut self,
        pid: i32,
        status: &mut Vec<u8>,
        buf: &mut Vec<u8>,
    ) -> Option<Reading> {
        if self.skip_mem.contains(&pid) {
            return None;
        }
        if procfs::read_file(&self.proc_path(pid, "status"), status).is_err() || status.is_empty() {
            return None;
        }
        let Some(mem) = MemCounters::parse(status) else {
            self.skip_mem.insert(pid);
            return None;
        };
        if mem.tgid != Some(i64::from(pid)) {
            return None; // a thread id: only processes are polled
        }
        let oom = procfs::read_file(&self.proc_path(pid, "oom_score_adj"), buf)
            .ok()
            .filter(|n| *n > 0)
            .map(|_| procfs::parse_i64(buf));
        let (mut user, mut kernel) = (None, None);
        if self.opts.record_process_runtime
            && procfs::read_file(&self.proc_path(pid, "stat"), buf).is_ok()
            && let Some(t) = stat_times(buf)
        {
            let ns = self.paths.ns_per_tick();
            (user, kernel) = (Some(t.user * ns), Some(t.kernel * ns));
        }
        let smr = if self.opts.scan_smaps_rollup
            && procfs::read_file(&self.proc_path(pid, "smaps_rollup"), buf).is_ok()
        {
            SmapsRollup::parse(buf)
        } else {
            SmapsRollup::default()
        };
        Some(Reading {
            mem,
            oom,
            user,
            kernel,
            smr,
        })
    }

    /// The poll's records as `process_stats` packets.
    fn emit_stats(&mut self, ts: u64, out: &mut dyn PacketOutput) {
        if self.stats.is_empty() {
            return;
        }
        let plan = self.plan(
            ts,
            trace_packet::PROCESS_STATS,
            process_stats::COLLECTION_END_TIMESTAMP,
        );
        let stats = std::mem::take(&mut self.stats);
        let outcome = write_split(&mut self.packet, &plan, &stats, out, encode_stats_record);
        self.counters.stats_packets += outcome.packets as u64;
        self.counters.entries_dropped += outcome.dropped as u64;
        self.stats = stats;
    }

    /// Forgets which pids were written and the counter cache; the next
    /// packet carries `incremental_state_cleared`.
    pub fn clear_incremental_state(&mut self) {
        self.seen.clear();
        self.skip_mem.clear();
        self.cache.clear();
        self.cache_ticks = 0;
        self.did_clear = true;
    }
}

impl PolledSource for ProcessStatsSource {
    fn tick_period_ms(&self) -> Option<u32> {
        (self.poll_ms > 0).then_some(self.poll_ms)
    }

    fn start(&mut self, out: &mut dyn PacketOutput) {
        if self.opts.scan_all_processes_on_start {
            self.write_all_processes(out);
        }
    }

    fn tick(&mut self, out: &mut dyn PacketOutput) {
        self.write_process_stats(out);
    }

    fn on_pids_seen(&mut self, pids: &[i32], out: &mut dyn PacketOutput) {
        ProcessStatsSource::on_pids_seen(self, pids, out);
    }

    fn clear_incremental_state(&mut self) {
        ProcessStatsSource::clear_incremental_state(self);
    }

    /// A new segment gets the whole process tree again, as the start did.
    fn after_clear(&mut self, out: &mut dyn PacketOutput) {
        if self.opts.scan_all_processes_on_start {
            self.write_all_processes(out);
        }
    }
}

/// One process's counters as read in one poll.
struct Reading {
    mem: MemCounters,
    oom: Option<i64>,
    user: Option<u64>,
    kernel: Option<u64>,
    smr: SmapsRollup,
}

impl Reading {
    /// The record of what changed since `cached` (which it brings up to
    /// date): only changed counters are written.
    fn changes(&self, pid: i32, cached: &mut CachedCounters) -> StatsRecord {
        let (mem, smr) = (&self.mem, &self.smr);
        let mut rec = StatsRecord {
            pid,
            ..StatsRecord::default()
        };
        let pairs = [
            (mem.vm_size_kb, &mut cached.vm_size_kb, &mut rec.vm_size_kb),
            (mem.vm_rss_kb, &mut cached.vm_rss_kb, &mut rec.vm_rss_kb),
            (
                mem.rss_anon_kb,
                &mut cached.rss_anon_kb,
                &mut rec.rss_anon_kb,
            ),
            (
                mem.rss_file_kb,
                &mut cached.rss_file_kb,
                &mut rec.rss_file_kb,
            ),
            (
                mem.rss_shmem_kb,
                &mut cached.rss_shmem_kb,
                &mut rec.rss_shmem_kb,
            ),
            (mem.vm_swap_kb, &mut cached.vm_swap_kb, &mut rec.vm_swap_kb),
            (
                mem.vm_locked_kb,
                &mut cached.vm_locked_kb,
                &mut rec.vm_locked_kb,
            ),
            (mem.vm_hwm_kb, &mut cached.vm_hwm_kb, &mut rec.vm_hwm_kb),
            (
                self.user,
                &mut cached.runtime_user_ns,
                &mut rec.runtime_user_ns,
            ),
            (
                self.kernel,
                &mut cached.runtime_kernel_ns,
                &mut rec.runtime_kernel_ns,
            ),
            (smr.rss_kb, &mut cached.smr_rss_kb, &mut rec.smr_rss_kb),
            (smr.pss_kb, &mut cached.smr_pss_kb, &mut rec.smr_pss_kb),
            (
                smr.pss_anon_kb,
                &mut cached.smr_pss_anon_kb,
                &mut rec.smr_pss_anon_kb,
            ),
            (
                smr.pss_file_kb,
                &mut cached.smr_pss_file_kb,
                &mut rec.smr_pss_file_kb,
            ),
            (
                smr.pss_shmem_kb,
                &mut cached.smr_pss_shmem_kb,
                &mut rec.smr_pss_shmem_kb,
            ),
            (
                smr.swap_pss_kb,
                &mut cached.smr_swap_pss_kb,
                &mut rec.smr_swap_pss_kb,
            ),
        ];
        for (now, last, field) in pairs {
            if now.is_some() && now != *last {
                *last = now;
                *field = now;
            }
        }
        if self.oom.is_some() && self.oom != cached.oom_score_adj {
            cached.oom_score_adj = self.oom;
            rec.oom_score_adj = self.oom;
        }
        rec
    }
}

/// The memory lines of `/proc/PID/status`, in one pass.
#[derive(Debug, Default, PartialEq, Eq)]
struct MemCounters {
    tgid: Option<i64>,
    vm_size_kb: Option<u64>,
    vm_rss_kb: Option<u64>,
    rss_anon_kb: Option<u64>,
    rss_file_kb: Option<u64>,
    rss_shmem_kb: Option<u64>,
    vm_swap_kb: Option<u64>,
    vm_locked_kb: Option<u64>,
    vm_hwm_kb: Option<u64>,
}

impl MemCounters {
    /// `None` when the status has no `VmSize` (a kernel thread or zombie).
    fn parse(status: &[u8]) -> Option<Self> {
        let mut m = MemCounters::default();
        for line in procfs::lines(status) {
            let Some(colon) = line.iter().position(|b| *b == b':') else {
                continue;
            };
            let (key, rest) = (&line[..colon], &line[colon + 1..]);
            let value = || Some(procfs::parse_i64(rest).max(0) as u64);
            match key {
                b"Tgid" => m.tgid = Some(procfs::parse_i64(rest)),
                b"VmSize" => m.vm_size_kb = value(),
                b"VmRSS" => m.vm_rss_kb = value(),
                b"RssAnon" => m.rss_anon_kb = value(),
                b"RssFile" => m.rss_file_kb = value(),
                b"RssShmem" => m.rss_shmem_kb = value(),
                b"VmSwap" => m.vm_swap_kb = value(),
                b"VmLck" => m.vm_locked_kb = value(),
                b"VmHWM" => m.vm_hwm_kb = value(),
                _ => {}
            }
        }
        m.vm_size_kb.is_some().then_some(m)
    }
}

/// CPU times and start time of `/proc/PID/stat`, in clock ticks.
#[derive(Debug, PartialEq, Eq)]
struct StatTimes {
    user: u64,
    kernel: u64,
    start: u64,
}

/// utime, stime and starttime (fields 14, 15 and 22) of `/proc/PID/stat`,
/// read after the `(comm)`, which may hold spaces and parentheses.
fn stat_times(stat: &[u8]) -> Option<StatTimes> {
    let after = stat.iter().rposition(|b| *b == b')')?;
    let mut w = procfs::words(&stat[after + 1..]).skip(11);
    let user = procfs::parse_u64(w.next()?);
    let kernel = procfs::parse_u64(w.next()?);
    let start = procfs::parse_u64(w.nth(6)?);
    Some(StatTimes {
        user,
        kernel,
        start,
    })
}

/// The proportional-set counters of `/proc/PID/smaps_rollup`, in kB.
#[derive(Debug, Default, PartialEq, Eq)]
struct SmapsRollup {
    rss_kb: Option<u64>,
    pss_kb: Option<u64>,
    pss_anon_kb: Option<u64>,
    pss_file_kb: Option<u64>,
    pss_shmem_kb: Option<u64>,
    swap_pss_kb: Option<u64>,
}

impl SmapsRollup {
    fn parse(text: &[u8]) -> Self {
        let mut m = SmapsRollup::default();
        for line in procfs::lines(text) {
            let Some(colon) = line.iter().position(|b| *b == b':') else {
                continue;
            };
            let v = Some(procfs::parse_i64(&line[colon + 1..]).max(0) as u64);
            match &line[..colon] {
                b"Rss" => m.rss_kb = v,
                b"Pss" => m.pss_kb = v,
                b"Pss_Anon" => m.pss_anon_kb = v,
                b"Pss_File" => m.pss_file_kb = v,
                b"Pss_Shmem" => m.pss_shmem_kb = v,
                b"SwapPss" => m.swap_pss_kb = v,
                _ => {}
            }
        }
        m
    }
}

/// The `flags` field (9th) of `/proc/PID/stat`, read after the `(comm)`,
/// which may itself hold spaces and parentheses.
fn stat_flags(stat: &[u8]) -> Option<u64> {
    let after = stat.iter().rposition(|b| *b == b')')?;
    procfs::words(&stat[after + 1..])
        .nth(6)
        .map(procfs::parse_u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_in_polls() {
        use std::time::Duration;
        let o = |poll: Option<u64>, ttl: Option<u64>| ProcessStatsSpec {
            poll_period: poll.map(Duration::from_millis),
            cache_ttl: ttl.map(Duration::from_millis),
            ..ProcessStatsSpec::default()
        };
        assert_eq!(cache_ttl_ticks(&o(None, None)), 1);
        assert_eq!(cache_ttl_ticks(&o(Some(250), None)), 1);
        assert_eq!(cache_ttl_ticks(&o(Some(250), Some(750))), 3);
        assert_eq!(cache_ttl_ticks(&o(None, Some(750))), 1);
    }

    #[test]
    fn stat_flags_after_tricky_comm() {
        let stat = b"7 (a) b (c)) S 2 0 0 0 -1 69238880 0 0";
        assert_eq!(stat_flags(stat), Some(69238880));
        assert_eq!(stat_flags(b"garbage"), None);
    }

    #[test]
    fn stat_times_and_smaps_rollup() {
        let stat = b"7 (a b) c) S 1 7 7 0 -1 4194560 100 0 0 0 25 7 0 0 20 0 1 0 4242 1000 100";
        assert_eq!(
            stat_times(stat),
            Some(StatTimes {
                user: 25,
                kernel: 7,
                start: 4242
            })
        );
        assert_eq!(stat_times(b"7 (x) S 1"), None);
        let smr = SmapsRollup::parse(
            b"55d0-7ffd ---p 00000000 00:00 0  [rollup]\nRss:    1844 kB\nPss:     900 kB\nPss_Anon:   100 kB\nPss_File:   800 kB\nPss_Shmem:  0 kB\nSwapPss:   3 kB\n",
        );
        assert_eq!(
            (
                smr.rss_kb,
                smr.pss_kb,
                smr.pss_anon_kb,
                smr.pss_file_kb,
                smr.pss_shmem_kb,
                smr.swap_pss_kb
            ),
            (
                Some(1844),
                Some(900),
                Some(100),
                Some(800),
                Some(0),
                Some(3)
            )
        );
    }

    #[test]
    fn kernel_thread_status_has_no_mem_counters() {
        assert_eq!(MemCounters::parse(b"Name:\tkthreadd\nTgid:\t2\n"), None);
        let m =
            MemCounters::parse(b"Tgid:\t5\nVmSize:\t  10 kB\nVmRSS:\t 4 kB\n").expect("has VmSize");
        assert_eq!(
            (m.tgid, m.vm_size_kb, m.vm_rss_kb, m.vm_swap_kb),
            (Some(5), Some(10), Some(4), None)
        );
    }
}
