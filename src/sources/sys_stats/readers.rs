//! Reading and encoding each counter group of a SysStats packet. Reading
//! fills per-file buffers; encoding parses them in place (no per-line
//! allocation), so a packet that outgrows its buffer is re-encoded from the
//! same reading.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::counters::{
    self, MEMINFO_KEYS, STAT_CPU_TIMES, STAT_FORK_COUNT, STAT_IRQ_COUNTS, STAT_SOFTIRQ_COUNTS,
    VMSTAT_KEYS,
};
use super::{Group, Schedule};
use crate::config::spec::{StatCounter, SysStatsSpec};
use crate::sources::procfs::{self, HostPaths, PolledFile, lines, parse_u64, words};
use crate::trace::encoder::ProtoEncoder;
use crate::wire::{
    buddy_info, cpu_times, cpuidle_state, cpuidle_state_entry, disk_stat, interrupt_count,
    key_value, psi_sample, sys_stats as field, thermal_zone,
};

/// PsiSample.PsiResource values.
pub const PSI_CPU_SOME: u64 = 1;
/// PSI resource: CPU, `full` line.
pub const PSI_CPU_FULL: u64 = 2;
/// PSI resource: IO, `some` line.
pub const PSI_IO_SOME: u64 = 3;
/// PSI resource: IO, `full` line.
pub const PSI_IO_FULL: u64 = 4;
/// PSI resource: memory, `some` line.
pub const PSI_MEMORY_SOME: u64 = 5;
/// PSI resource: memory, `full` line.
pub const PSI_MEMORY_FULL: u64 = 6;

/// One file under `/proc`, kept open, with its last reading.
struct ProcFile {
    file: Option<PolledFile>,
    buf: Vec<u8>,
}

impl ProcFile {
    fn new(path: PathBuf, wanted: bool) -> Self {
        Self {
            file: wanted.then(|| PolledFile::open(path)),
            buf: Vec::new(),
        }
    }

    fn read(&mut self) {
        match &mut self.file {
            Some(f) => {
                f.read(&mut self.buf);
            }
            None => self.buf.clear(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ThermalZone {
    pub name: String,
    pub(crate) temp_c: Option<u64>,
    pub kind: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CpuIdle {
    pub cpu: u32,
    pub states: Vec<(String, u64)>,
}

pub(super) struct Readers {
    paths: HostPaths,
    ns_per_tick: u64,
    meminfo_keys: HashMap<&'static [u8], u32>,
    vmstat_keys: HashMap<&'static [u8], u32>,
    stat_mask: u32,
    meminfo: ProcFile,
    vmstat: ProcFile,
    stat: ProcFile,
    diskstats: ProcFile,
    buddyinfo: ProcFile,
    psi: [(ProcFile, u64, u64); 3],
    /// `cpufreq/scaling_cur_freq` of every CPU, by CPU number.
    cpufreq_paths: Vec<PathBuf>,
    cpufreq: Vec<u32>,
    thermal: Vec<ThermalZone>,
    cpuidle: Vec<CpuIdle>,
    devfreq: Vec<(String, u64)>,
    small: Vec<u8>,
}

impl Readers {
    pub(super) fn new(o: &SysStatsSpec, schedule: Option<&Schedule>, paths: HostPaths) -> Self {
        let ids = |c: &[crate::config::spec::Counter]| {
            c.iter().map(|c| c.id as u32).collect::<Vec<u32>>()
        };
        let stat: Vec<u32> = o
            .stat_counters
            .iter()
            .map(|c| match c {
                StatCounter::CpuTimes => counters::STAT_CPU_TIMES,
                StatCounter::IrqCounts => counters::STAT_IRQ_COUNTS,
                StatCounter::SoftirqCounts => counters::STAT_SOFTIRQ_COUNTS,
                StatCounter::ForkCount => counters::STAT_FORK_COUNT,
            })
            .collect();
        let wanted = |g| schedule.is_some_and(|s| s.every(g) != 0);
        let proc = |name: &str| paths.proc_root.join(name);
        let psi = |name: &str, some, full| {
            (
                ProcFile::new(proc(&format!("pressure/{name}")), wanted(Group::Psi)),
                some,
                full,
            )
        };
        let cpufreq_paths = if wanted(Group::Cpufreq) {
            let cpu_dir = paths.sys_root.join("devices/system/cpu");
            procfs::numbered_entries(&cpu_dir, "cpu")
                .into_iter()
                .map(|(_, name)| cpu_dir.join(name).join("cpufreq/scaling_cur_freq"))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            ns_per_tick: paths.ns_per_tick(),
            meminfo_keys: counters::enabled_keys(
                MEMINFO_KEYS,
                &ids(&o.meminfo_counters),
                "meminfo_counters",
            ),
            vmstat_keys: counters::enabled_keys(
                VMSTAT_KEYS,
                &ids(&o.vmstat_counters),
                "vmstat_counters",
            ),
            stat_mask: counters::stat_mask(&stat),
            meminfo: ProcFile::new(proc("meminfo"), wanted(Group::Meminfo)),
            vmstat: ProcFile::new(proc("vmstat"), wanted(Group::Vmstat)),
            stat: ProcFile::new(proc("stat"), wanted(Group::Stat)),
            diskstats: ProcFile::new(proc("diskstats"), wanted(Group::Diskstat)),
            buddyinfo: ProcFile::new(proc("buddyinfo"), wanted(Group::Buddyinfo)),
            psi: [
                psi("cpu", PSI_CPU_SOME, PSI_CPU_FULL),
                psi("io", PSI_IO_SOME, PSI_IO_FULL),
                psi("memory", PSI_MEMORY_SOME, PSI_MEMORY_FULL),
            ],
            cpufreq_paths,
            cpufreq: Vec::new(),
            thermal: Vec::new(),
            cpuidle: Vec::new(),
            devfreq: Vec::new(),
            small: Vec::with_capacity(256),
            paths,
        }
    }

    /// Reads every due group.
    pub(super) fn read(&mut self, due: &dyn Fn(Group) -> bool) {
        if due(Group::Meminfo) {
            self.meminfo.read();
        }
        if due(Group::Vmstat) {
            self.vmstat.read();
        }
        if due(Group::Stat) {
            self.stat.read();
        }
        if due(Group::Devfreq) {
            self.read_devfreq();
        }
        if due(Group::Cpufreq) {
            self.read_cpufreq();
        }
        if due(Group::Buddyinfo) {
            self.buddyinfo.read();
        }
        if due(Group::Diskstat) {
            self.diskstats.read();
        }
        if due(Group::Psi) {
            for (f, _, _) in &mut self.psi {
                f.read();
            }
        }
        if due(Group::Thermal) {
            self.read_thermal();
        }
        if due(Group::Cpuidle) {
            self.read_cpuidle();
        }
    }

    /// Encodes the due groups from the last reading.
    pub(super) fn encode(&self, e: &mut ProtoEncoder<'_>, due: &dyn Fn(Group) -> bool) {
        if due(Group::Meminfo) {
            encode_meminfo(e, &self.meminfo.buf, &self.meminfo_keys);
        }
        if due(Group::Vmstat) {
            encode_vmstat(e, &self.vmstat.buf, &self.vmstat_keys);
        }
        if due(Group::Stat) {
            encode_stat(e, &self.stat.buf, self.stat_mask, self.ns_per_tick);
        }
        if due(Group::Devfreq) {
            for (key, value) in &self.devfreq {
                let n = e.begin_nested(field::DEVFREQ);
                e.string(key_value::KEY, key);
                e.uint(key_value::VALUE, *value);
                e.end_nested(n);
            }
        }
        if due(Group::Cpufreq) {
            for f in &self.cpufreq {
                e.uint(field::CPUFREQ_KHZ, u64::from(*f));
            }
        }
        if due(Group::Buddyinfo) {
            encode_buddyinfo(e, &self.buddyinfo.buf);
        }
        if due(Group::Diskstat) {
            encode_diskstats(e, &self.diskstats.buf);
        }
        if due(Group::Psi) {
            for (f, some, full) in &self.psi {
                encode_psi(e, &f.buf, *some, *full);
            }
        }
        if due(Group::Thermal) {
            for z in &self.thermal {
                let n = e.begin_nested(field::THERMAL_ZONE);
                e.string(thermal_zone::NAME, &z.name);
                if let Some(t) = z.temp_c {
                    e.uint(thermal_zone::TEMP, t);
                }
                if let Some(k) = &z.kind {
                    e.string(thermal_zone::TYPE, k);
                }
                e.end_nested(n);
            }
        }
        if due(Group::Cpuidle) {
            for c in &self.cpuidle {
                let n = e.begin_nested(field::CPUIDLE_STATE);
                e.uint(cpuidle_state::CPU_ID, u64::from(c.cpu));
                for (state, us) in &c.states {
                    let s = e.begin_nested(cpuidle_state::CPUIDLE_STATE_ENTRY);
                    e.string(cpuidle_state_entry::STATE, state);
                    e.uint(cpuidle_state_entry::DURATION_US, *us);
                    e.end_nested(s);
                }
                e.end_nested(n);
            }
        }
    }

    fn read_small(&mut self, path: &Path) -> Option<&[u8]> {
        procfs::read_file(path, &mut self.small).ok()?;
        let s = procfs::trim_newline(&self.small);
        (!s.is_empty()).then_some(s)
    }

    fn read_cpufreq(&mut self) {
        // An offline CPU, or one without cpufreq, reads as 0 (as in Perfetto).
        self.cpufreq.clear();
        let paths = std::mem::take(&mut self.cpufreq_paths);
        for p in &paths {
            let khz = self
                .read_small(p)
                .map_or(0, |s| parse_u64(s).min(u64::from(u32::MAX)) as u32);
            self.cpufreq.push(khz);
        }
        self.cpufreq_paths = paths;
    }

    fn read_thermal(&mut self) {
        self.thermal.clear();
        let dir = self.paths.sys_root.join("class/thermal");
        for (_, name) in procfs::numbered_entries(&dir, "thermal_zone") {
            let zone = dir.join(&name);
            // The kernel reports millidegrees Celsius; the trace holds degrees.
            let temp_c = self
                .read_small(&zone.join("temp"))
                .map(|s| parse_u64(s) / 1000);
            let kind = self
                .read_small(&zone.join("type"))
                .map(|s| String::from_utf8_lossy(s).into_owned());
            self.thermal.push(ThermalZone { name, temp_c, kind });
        }
    }

    fn read_cpuidle(&mut self) {
        self.cpuidle.clear();
        let cpu_dir = self.paths.sys_root.join("devices/system/cpu");
        for (cpu, name) in procfs::numbered_entries(&cpu_dir, "cpu") {
            let idle_dir = cpu_dir.join(name).join("cpuidle");
            if !idle_dir.is_dir() {
                continue;
            }
            let mut states = Vec::new();
            for (_, state) in procfs::numbered_entries(&idle_dir, "state") {
                let d = idle_dir.join(state);
                let Some(name) = self
                    .read_small(&d.join("name"))
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                else {
                    continue;
                };
                let Some(us) = self.read_small(&d.join("time")).map(parse_u64) else {
                    continue;
                };
                states.push((name, us));
            }
            self.cpuidle.push(CpuIdle { cpu, states });
        }
    }

    fn read_devfreq(&mut self) {
        self.devfreq.clear();
        let dir = self.paths.sys_root.join("class/devfreq");
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return;
        };
        let mut names: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names {
            let v = self
                .read_small(&dir.join(&name).join("cur_freq"))
                .map_or(0, parse_u64);
            self.devfreq.push((name, v));
        }
    }
}

fn encode_key_values(e: &mut ProtoEncoder<'_>, field: u32, key: u32, value: u64) {
    let n = e.begin_nested(field);
    e.uint(key_value::KEY, u64::from(key));
    e.uint(key_value::VALUE, value);
    e.end_nested(n);
}

/// `/proc/meminfo`: `Key:   value kB` lines, values in kB.
pub fn encode_meminfo(e: &mut ProtoEncoder<'_>, buf: &[u8], keys: &HashMap<&'static [u8], u32>) {
    for line in lines(buf) {
        let mut w = words(line);
        let (Some(key), Some(value)) = (w.next(), w.next()) else {
            continue;
        };
        let key = key.strip_suffix(b":").unwrap_or(key);
        if let Some(id) = keys.get(key) {
            encode_key_values(e, field::MEMINFO, *id, parse_u64(value));
        }
    }
}

/// `/proc/vmstat`: `key value` lines.
pub fn encode_vmstat(e: &mut ProtoEncoder<'_>, buf: &[u8], keys: &HashMap<&'static [u8], u32>) {
    for line in lines(buf) {
        let mut w = words(line);
        let (Some(key), Some(value)) = (w.next(), w.next()) else {
            continue;
        };
        if let Some(id) = keys.get(key) {
            encode_key_values(e, field::VMSTAT, *id, parse_u64(value));
        }
    }
}

/// `/proc/stat`: per-CPU times (USER_HZ ticks → ns; the all-CPU `cpu` line
/// is skipped), interrupt totals and non-zero per-IRQ counts, softirq totals
/// and every per-softirq count, and the fork count.
pub fn encode_stat(e: &mut ProtoEncoder<'_>, buf: &[u8], mask: u32, ns_per_tick: u64) {
    let on = |c: u32| mask & (1 << c) != 0;
    for line in lines(buf) {
        let mut w = words(line);
        let Some(key) = w.next() else { continue };
        if on(STAT_CPU_TIMES) && key.len() > 3 && key.starts_with(b"cpu") {
            let cpu = parse_u64(&key[3..]);
            let mut times = [0u64; 8];
            for (t, v) in times.iter_mut().zip(w) {
                *t = parse_u64(v).saturating_mul(ns_per_tick);
            }
            let n = e.begin_nested(field::CPU_STAT);
            e.uint(cpu_times::CPU_ID, cpu);
            for (i, t) in times.iter().enumerate() {
                e.uint(cpu_times::USER_NS + i as u32, *t);
            }
            e.end_nested(n);
        } else if on(STAT_IRQ_COUNTS) && key == b"intr" {
            for (i, v) in w.enumerate() {
                let v = parse_u64(v);
                if i == 0 {
                    e.uint(field::NUM_IRQ_TOTAL, v);
                } else if v > 0 {
                    encode_interrupt(e, field::NUM_IRQ, i - 1, v);
                }
            }
        } else if on(STAT_SOFTIRQ_COUNTS) && key == b"softirq" {
            for (i, v) in w.enumerate() {
                let v = parse_u64(v);
                if i == 0 {
                    e.uint(field::NUM_SOFTIRQ_TOTAL, v);
                } else {
                    encode_interrupt(e, field::NUM_SOFTIRQ, i - 1, v);
                }
            }
        } else if on(STAT_FORK_COUNT)
            && key == b"processes"
            && let Some(v) = w.next()
        {
            e.uint(field::NUM_FORKS, parse_u64(v));
        }
    }
}

fn encode_interrupt(e: &mut ProtoEncoder<'_>, field: u32, irq: usize, count: u64) {
    let n = e.begin_nested(field);
    e.int(interrupt_count::IRQ, irq as i64);
    e.uint(interrupt_count::COUNT, count);
    e.end_nested(n);
}

/// `/proc/diskstats`: per device, the fields SysStats.DiskStat holds (the
/// discard and flush ones only where the kernel reports them).
pub fn encode_diskstats(e: &mut ProtoEncoder<'_>, buf: &[u8]) {
    // (word index in the line, DiskStat field)
    const COLUMNS: [(usize, u32); 8] = [
        (5, disk_stat::READ_SECTORS),
        (6, disk_stat::READ_TIME_MS),
        (9, disk_stat::WRITE_SECTORS),
        (10, disk_stat::WRITE_TIME_MS),
        (16, disk_stat::DISCARD_SECTORS),
        (17, disk_stat::DISCARD_TIME_MS),
        (18, disk_stat::FLUSH_COUNT),
        (19, disk_stat::FLUSH_TIME_MS),
    ];
    for line in lines(buf) {
        let n = e.begin_nested(field::DISK_STAT);
        let mut col = COLUMNS.iter().peekable();
        for (i, w) in words(line).enumerate() {
            if i == 2 {
                e.bytes(disk_stat::DEVICE_NAME, w);
            }
            if let Some((_, f)) = col.next_if(|(idx, _)| *idx == i) {
                e.uint(*f, parse_u64(w));
            }
            if i >= 19 {
                break;
            }
        }
        e.end_nested(n);
    }
}

/// `/proc/buddyinfo`: `Node 0, zone   Normal  n0 n1 …` lines.
pub fn encode_buddyinfo(e: &mut ProtoEncoder<'_>, buf: &[u8]) {
    for line in lines(buf) {
        let n = e.begin_nested(field::BUDDY_INFO);
        for (i, w) in words(line).enumerate() {
            match i {
                1 => e.bytes(buddy_info::NODE, w.strip_suffix(b",").unwrap_or(w)),
                3 => e.bytes(buddy_info::ZONE, w),
                i if i > 3 => e.uint(buddy_info::ORDER_PAGES, parse_u64(w)),
                _ => {}
            }
        }
        e.end_nested(n);
    }
}

/// `/proc/pressure/*`: `some|full avg10=… avg60=… avg300=… total=µs` lines.
pub fn encode_psi(e: &mut ProtoEncoder<'_>, buf: &[u8], some: u64, full: u64) {
    for line in lines(buf) {
        let mut w = words(line);
        let resource = match w.next() {
            Some(b"some") => some,
            Some(b"full") => full,
            _ => 0,
        };
        let total_us = w
            .find_map(|t| t.strip_prefix(b"total="))
            .map_or(0, parse_u64);
        let n = e.begin_nested(field::PSI);
        e.uint(psi_sample::RESOURCE, resource);
        e.uint(psi_sample::TOTAL_NS, total_us.saturating_mul(1000));
        e.end_nested(n);
    }
}
