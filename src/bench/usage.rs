//! What a configuration cost the process: CPU seconds (user, system) and
//! peak RSS, read from procfs (no `getrusage` binding is needed: the same
//! kernel counters are in `/proc/self/stat` and `/proc/self/status`).

use serde::Serialize;

/// CPU time used by the whole process so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct CpuTimes {
    pub(crate) user_s: f64,
    pub(crate) sys_s: f64,
}

/// CPU seconds spent in one configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CpuUsage {
    /// User time (clock-tick resolution, usually 10 ms).
    pub(crate) user_s: f64,
    /// System time (clock-tick resolution).
    pub(crate) sys_s: f64,
    /// User + system from the process CPU clock (nanosecond resolution).
    pub(crate) total_s: f64,
}

/// Parses utime and stime (fields 14 and 15, in clock ticks) from the text
/// of `/proc/PID/stat`; the command name may hold spaces and parentheses.
pub(crate) fn parse_stat_times(stat: &str, ticks_per_s: u64) -> Option<CpuTimes> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is the first; utime is field 14.
    let mut it = after.split_ascii_whitespace().skip(11);
    let utime: u64 = it.next()?.parse().ok()?;
    let stime: u64 = it.next()?.parse().ok()?;
    let t = ticks_per_s.max(1) as f64;
    Some(CpuTimes {
        user_s: utime as f64 / t,
        sys_s: stime as f64 / t,
    })
}

/// This process's CPU times (zero if procfs is unreadable).
pub(crate) fn cpu_times() -> CpuTimes {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_stat_times(&s, rustix::param::clock_ticks_per_second()))
        .unwrap_or_default()
}

/// The process CPU clock, in seconds.
pub(crate) fn process_cpu_s() -> f64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// A point to measure CPU from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuMark {
    times: CpuTimes,
    total_s: f64,
}

impl CpuMark {
    pub(crate) fn now() -> Self {
        Self {
            times: cpu_times(),
            total_s: process_cpu_s(),
        }
    }

    pub(crate) fn since(&self) -> CpuUsage {
        let now = CpuMark::now();
        CpuUsage {
            user_s: (now.times.user_s - self.times.user_s).max(0.0),
            sys_s: (now.times.sys_s - self.times.sys_s).max(0.0),
            total_s: (now.total_s - self.total_s).max(0.0),
        }
    }
}

/// Resets the process's peak RSS (`clear_refs` 5), so that the next
/// [`peak_rss_kb`] measures one configuration. Returns false where the
/// kernel refuses, in which case the peak is the process's so far.
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// `VmHWM` of `/proc/self/status` text, in KiB.
pub(crate) fn parse_vm_hwm_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_ascii_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Peak resident set size in KiB (0 if unreadable).
pub(crate) fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_vm_hwm_kb(&s))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_with_a_tricky_name() {
        let stat = "1234 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 3 0 100";
        let t = parse_stat_times(stat, 100).expect("parses");
        assert_eq!(t.user_s, 2.5);
        assert_eq!(t.sys_s, 0.75);
    }

    #[test]
    fn vm_hwm_is_found() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    4321 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_vm_hwm_kb(status), Some(4321));
        assert_eq!(parse_vm_hwm_kb("Name: x\n"), None);
    }

    #[test]
    fn own_process_is_readable() {
        assert!(peak_rss_kb() > 0);
        let mark = CpuMark::now();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(mark.since().total_s > 0.0);
    }
}
