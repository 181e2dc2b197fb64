//! `linux.sys_stats`: system counters from `/proc` and `/sys` at their
//! configured periods, one SysStats TracePacket per tick.
//!
//! Period rules (Perfetto's): a period under 10 ms is raised to
//! it; the tick is the smallest non-zero period; every period must be a
//! multiple of the tick, else nothing is scheduled ([`SysStatsError`]).
//! Ticks fall on wall-clock multiples of the tick period (the poller aligns
//! them). A counter with period P is read on every (P / tick)-th tick,
//! starting with the first.
//!
//! Each tick reads the files that are due first, then encodes them: the
//! packet's `timestamp` is BOOTTIME when reading starts, and
//! `collection_end_timestamp` when it ends. Files under `/proc` stay open
//! and are re-read with `pread`; lines are parsed in place.

mod counters;
mod readers;
mod vmstat_keys;

pub use counters::{
    MEMINFO_KEYS, STAT_CPU_TIMES, STAT_FORK_COUNT, STAT_IRQ_COUNTS, STAT_SOFTIRQ_COUNTS,
    VMSTAT_KEYS, enabled_keys, stat_mask,
};
/// The text parsers, each encoding SysStats fields from one file's text
/// (public for fuzzing and benchmarks).
pub use readers::{
    PSI_CPU_FULL, PSI_CPU_SOME, PSI_IO_FULL, PSI_IO_SOME, PSI_MEMORY_FULL, PSI_MEMORY_SOME,
    encode_buddyinfo, encode_diskstats, encode_meminfo, encode_psi, encode_stat, encode_vmstat,
};

use crate::config::spec::SysStatsSpec;
use crate::sources::poller::{PacketOutput, PolledSource, write_packet_header};
use crate::sources::procfs::HostPaths;
use crate::trace::encoder::ProtoEncoder;
use crate::wire::{sys_stats, trace_packet};
use readers::Readers;

/// First size of the packet buffer; it doubles when a tick needs more.
const INITIAL_PACKET_BYTES: usize = 64 * 1024;
/// A tick larger than this is not written (counted).
const MAX_PACKET_BYTES: usize = 16 * 1024 * 1024;

/// The counter groups, in the order a tick reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// `/proc/meminfo` counters.
    Meminfo,
    /// `/proc/vmstat` counters.
    Vmstat,
    /// `/proc/stat`: CPU times, interrupt and softirq counts, forks.
    Stat,
    /// Device frequencies from `/sys/class/devfreq`.
    Devfreq,
    /// Each CPU's current frequency (`cpufreq/scaling_cur_freq`).
    Cpufreq,
    /// `/proc/buddyinfo`: free pages per order, zone and node.
    Buddyinfo,
    /// `/proc/diskstats`.
    Diskstat,
    /// PSI: `/proc/pressure/{cpu,io,memory}`.
    Psi,
    /// Thermal zone temperatures from `/sys/class/thermal`.
    Thermal,
    /// Time in each CPU idle state (`cpuidle`).
    Cpuidle,
    /// GPU frequencies: not read by this recorder (a period only counts
    /// toward the tick).
    Gpufreq,
    /// Slab allocator counters: not read by this recorder (a period only
    /// counts toward the tick).
    Slab,
}

impl Group {
    /// Every group, in the order a tick reads them.
    pub const ALL: [Group; 12] = [
        Group::Meminfo,
        Group::Vmstat,
        Group::Stat,
        Group::Devfreq,
        Group::Cpufreq,
        Group::Buddyinfo,
        Group::Diskstat,
        Group::Psi,
        Group::Thermal,
        Group::Cpuidle,
        Group::Gpufreq,
        Group::Slab,
    ];

    /// The config field that sets this group's period.
    pub(crate) fn period_field(self) -> &'static str {
        match self {
            Group::Meminfo => "meminfo_period_ms",
            Group::Vmstat => "vmstat_period_ms",
            Group::Stat => "stat_period_ms",
            Group::Devfreq => "devfreq_period_ms",
            Group::Cpufreq => "cpufreq_period_ms",
            Group::Buddyinfo => "buddyinfo_period_ms",
            Group::Diskstat => "diskstat_period_ms",
            Group::Psi => "psi_period_ms",
            Group::Thermal => "thermal_period_ms",
            Group::Cpuidle => "cpuidle_period_ms",
            Group::Gpufreq => "gpufreq_period_ms",
            Group::Slab => "slab_period_ms",
        }
    }

    fn period_in(self, o: &SysStatsSpec) -> u32 {
        let p = match self {
            Group::Meminfo => o.meminfo_period,
            Group::Vmstat => o.vmstat_period,
            Group::Stat => o.stat_period,
            Group::Devfreq => o.devfreq_period,
            Group::Cpufreq => o.cpufreq_period,
            Group::Buddyinfo => o.buddyinfo_period,
            Group::Diskstat => o.diskstat_period,
            Group::Psi => o.psi_period,
            Group::Thermal => o.thermal_period,
            Group::Cpuidle => o.cpuidle_period,
            Group::Gpufreq => o.gpufreq_period,
            Group::Slab => o.slab_period,
        };
        p.map_or(0, |d| d.as_millis().min(u128::from(u32::MAX)) as u32)
    }

    /// Groups this build reads; others only take part in the tick rules.
    pub(crate) fn is_supported(self) -> bool {
        !matches!(self, Group::Gpufreq | Group::Slab)
    }
}

/// Errors of `linux.sys_stats`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SysStatsError {
    /// A configured period is not a multiple of the smallest one (the tick).
    #[error(
        "sys_stats_config.{field} = {period_ms} ms is not a multiple of the tick ({tick_ms} ms, \
         the smallest period); every sys_stats period must be a multiple of the smallest one, \
         so no counter is scheduled"
    )]
    PeriodNotMultiple {
        /// The config field of that period.
        field: &'static str,
        /// Its value.
        period_ms: u32,
        /// The tick: the smallest non-zero period.
        tick_ms: u32,
    },
}

/// When each group is read: every `ticks[g]`-th tick of `tick_ms` (0 = never).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The tick period: the smallest non-zero configured period.
    pub tick_ms: u32,
    ticks: [u32; Group::ALL.len()],
}

impl Schedule {
    /// The tick and each group's share of it; `Ok(None)` when no period is
    /// set. Periods are as validated (at least 10 ms).
    pub fn from_spec(o: &SysStatsSpec) -> Result<Option<Schedule>, SysStatsError> {
        let mut periods = [0u32; Group::ALL.len()];
        for (i, g) in Group::ALL.iter().enumerate() {
            periods[i] = g.period_in(o);
        }
        let Some(tick_ms) = periods.iter().copied().filter(|p| *p > 0).min() else {
            return Ok(None);
        };
        let mut ticks = [0u32; Group::ALL.len()];
        for (i, g) in Group::ALL.iter().enumerate() {
            let p = periods[i];
            if p % tick_ms != 0 {
                return Err(SysStatsError::PeriodNotMultiple {
                    field: g.period_field(),
                    period_ms: p,
                    tick_ms,
                });
            }
            ticks[i] = p / tick_ms;
        }
        Ok(Some(Schedule { tick_ms, ticks }))
    }

    /// Every `n`-th tick the group is read on (0 = never).
    pub fn every(&self, g: Group) -> u32 {
        self.ticks[g as usize]
    }

    /// Whether `g` is read on tick number `tick` (0-based).
    pub(crate) fn is_due(&self, g: Group, tick: u64) -> bool {
        let n = self.every(g);
        n != 0 && tick.is_multiple_of(u64::from(n))
    }
}

/// The `linux.sys_stats` source.
pub struct SysStatsSource {
    schedule: Option<Schedule>,
    sequence_id: u32,
    tick: u64,
    readers: Readers,
    packet: Vec<u8>,
    oversized_ticks: u64,
}

impl SysStatsSource {
    /// Checks the periods and opens the files of the configured groups.
    pub fn new(
        opts: &SysStatsSpec,
        paths: HostPaths,
        sequence_id: u32,
    ) -> Result<Self, SysStatsError> {
        let schedule = Schedule::from_spec(opts)?;
        if let Some(s) = &schedule {
            for g in Group::ALL {
                if s.every(g) != 0 && !g.is_supported() {
                    log::warn!(
                        "sys_stats: {} is not collected by this recorder; ignored",
                        g.period_field()
                    );
                }
            }
        }
        let readers = Readers::new(opts, schedule.as_ref(), paths);
        Ok(Self {
            schedule,
            sequence_id,
            tick: 0,
            readers,
            packet: vec![0; INITIAL_PACKET_BYTES],
            oversized_ticks: 0,
        })
    }

    /// When each group is read; `None` when no period is set.
    pub fn schedule(&self) -> Option<&Schedule> {
        self.schedule.as_ref()
    }

    /// Reads what is due on the next tick and writes its packet.
    pub fn write_tick(&mut self, out: &mut dyn PacketOutput) {
        let Some(schedule) = &self.schedule else {
            return;
        };
        let tick = self.tick;
        self.tick += 1;
        let ts = crate::clock::boottime_ns();
        let due = |g| schedule.is_due(g, tick);
        self.readers.read(&due);
        let end_ts = crate::clock::boottime_ns();
        loop {
            let mut e = ProtoEncoder::new(&mut self.packet);
            write_packet_header(&mut e, ts, self.sequence_id);
            let n = e.begin_nested(trace_packet::SYS_STATS);
            self.readers.encode(&mut e, &due);
            e.uint(sys_stats::COLLECTION_END_TIMESTAMP, end_ts);
            e.end_nested(n);
            match e.finish() {
                Ok(len) => {
                    out.write_packet(&self.packet[..len]);
                    return;
                }
                Err(_) if self.packet.len() < MAX_PACKET_BYTES => {
                    let grown = (self.packet.len() * 2).min(MAX_PACKET_BYTES);
                    self.packet.resize(grown, 0);
                }
                Err(_) => {
                    log::warn!("a sys_stats tick exceeds {MAX_PACKET_BYTES} bytes; not written");
                    self.oversized_ticks += 1;
                    return;
                }
            }
        }
    }
}

impl PolledSource for SysStatsSource {
    fn tick_period_ms(&self) -> Option<u32> {
        self.schedule.as_ref().map(|s| s.tick_ms)
    }

    fn start(&mut self, _out: &mut dyn PacketOutput) {}

    fn tick(&mut self, out: &mut dyn PacketOutput) {
        self.write_tick(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn period_rules() {
        use std::time::Duration;
        let ms = |v| Some(Duration::from_millis(v));
        assert_eq!(Schedule::from_spec(&SysStatsSpec::default()), Ok(None));

        let o = SysStatsSpec {
            meminfo_period: ms(10),
            vmstat_period: ms(20),
            ..SysStatsSpec::default()
        };
        let s = Schedule::from_spec(&o).expect("valid").expect("scheduled");
        assert_eq!(s.tick_ms, 10);
        assert_eq!(
            (
                s.every(Group::Meminfo),
                s.every(Group::Vmstat),
                s.every(Group::Stat)
            ),
            (1, 2, 0)
        );
        assert!(
            s.is_due(Group::Vmstat, 0) && !s.is_due(Group::Vmstat, 1) && s.is_due(Group::Vmstat, 2)
        );
        assert!(!s.is_due(Group::Stat, 0));

        let bad = SysStatsSpec {
            meminfo_period: ms(100),
            stat_period: ms(250),
            ..SysStatsSpec::default()
        };
        let err = Schedule::from_spec(&bad).expect_err("250 is not a multiple of 100");
        assert_eq!(
            err,
            SysStatsError::PeriodNotMultiple {
                field: "stat_period_ms",
                period_ms: 250,
                tick_ms: 100
            }
        );
        assert!(err.to_string().contains("stat_period_ms = 250 ms"));
        let g = SysStatsSpec {
            gpufreq_period: ms(30),
            meminfo_period: ms(90),
            ..SysStatsSpec::default()
        };
        assert_eq!(
            Schedule::from_spec(&g)
                .expect("valid")
                .expect("some")
                .tick_ms,
            30
        );
    }
}
