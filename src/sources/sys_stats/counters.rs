//! Counter tables: `/proc/meminfo` and `/proc/vmstat` keys with their
//! MeminfoCounters / VmstatCounters numbers (ARCHITECTURE.md §7.5).

use std::collections::HashMap;

pub use super::vmstat_keys::VMSTAT_KEYS;

/// `(/proc/meminfo key, MeminfoCounters number)`, numbers 1..=38 in order.
pub const MEMINFO_KEYS: &[(&str, u32)] = &[
    ("MemTotal", 1),
    ("MemFree", 2),
    ("MemAvailable", 3),
    ("Buffers", 4),
    ("Cached", 5),
    ("SwapCached", 6),
    ("Active", 7),
    ("Inactive", 8),
    ("Active(anon)", 9),
    ("Inactive(anon)", 10),
    ("Active(file)", 11),
    ("Inactive(file)", 12),
    ("Unevictable", 13),
    ("Mlocked", 14),
    ("SwapTotal", 15),
    ("SwapFree", 16),
    ("Dirty", 17),
    ("Writeback", 18),
    ("AnonPages", 19),
    ("Mapped", 20),
    ("Shmem", 21),
    ("Slab", 22),
    ("SReclaimable", 23),
    ("SUnreclaim", 24),
    ("KernelStack", 25),
    ("PageTables", 26),
    ("CommitLimit", 27),
    ("Committed_AS", 28),
    ("VmallocTotal", 29),
    ("VmallocUsed", 30),
    ("VmallocChunk", 31),
    ("CmaTotal", 32),
    ("CmaFree", 33),
    ("Gpu", 34),
    ("Zram", 35),
    ("Misc", 36),
    ("ION_heap", 37),
    ("ION_heap_pool", 38),
];

/// StatCounters (SysStatsConfig.stat_counters).
pub const STAT_CPU_TIMES: u32 = 1;
/// StatCounters IRQ_COUNTS: the interrupt counts of `/proc/stat`'s
/// `intr` line.
pub const STAT_IRQ_COUNTS: u32 = 2;
/// StatCounters SOFTIRQ_COUNTS: the softirq counts of the `softirq`
/// line.
pub const STAT_SOFTIRQ_COUNTS: u32 = 3;
/// StatCounters FORK_COUNT: the `processes` line (forks since boot).
pub const STAT_FORK_COUNT: u32 = 4;

/// A key → number map of the enabled counters of `table`: all of them when
/// `enabled` is empty, else those listed (unknown numbers are ignored, with
/// a warning naming them).
pub fn enabled_keys(
    table: &'static [(&'static str, u32)],
    enabled: &[u32],
    what: &str,
) -> HashMap<&'static [u8], u32> {
    let max = table.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let unknown: Vec<u32> = enabled
        .iter()
        .copied()
        .filter(|n| *n == 0 || *n > max)
        .collect();
    if !unknown.is_empty() {
        log::warn!("{what}: unknown counter numbers {unknown:?} ignored (valid: 1..={max})");
    }
    table
        .iter()
        .filter(|(_, n)| enabled.is_empty() || enabled.contains(n))
        .map(|(k, n)| (k.as_bytes(), *n))
        .collect()
}

/// The bit set of enabled StatCounters (all when `enabled` is empty).
pub fn stat_mask(enabled: &[u32]) -> u32 {
    if enabled.is_empty() {
        return !0;
    }
    enabled
        .iter()
        .filter(|n| **n < 32)
        .fold(0, |m, n| m | (1 << n))
}
