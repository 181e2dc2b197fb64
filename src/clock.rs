//! Clocks. Trace timestamps are BOOTTIME nanoseconds (Perfetto's default
//! trace clock); clock snapshots relate it to the other builtin clocks.

use rustix::time::{ClockId, clock_gettime};

/// Perfetto's BuiltinClock ids (ARCHITECTURE.md §7.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum BuiltinClock {
    Realtime = 1,
    RealtimeCoarse = 2,
    Monotonic = 3,
    MonotonicCoarse = 4,
    MonotonicRaw = 5,
    Boottime = 6,
}

impl BuiltinClock {
    /// The order in which Perfetto's service reads clocks for a snapshot.
    pub const SNAPSHOT_ORDER: [BuiltinClock; 6] = [
        BuiltinClock::Boottime,
        BuiltinClock::RealtimeCoarse,
        BuiltinClock::MonotonicCoarse,
        BuiltinClock::Realtime,
        BuiltinClock::Monotonic,
        BuiltinClock::MonotonicRaw,
    ];

    fn clock_id(self) -> ClockId {
        match self {
            BuiltinClock::Realtime => ClockId::Realtime,
            BuiltinClock::RealtimeCoarse => ClockId::RealtimeCoarse,
            BuiltinClock::Monotonic => ClockId::Monotonic,
            BuiltinClock::MonotonicCoarse => ClockId::MonotonicCoarse,
            BuiltinClock::MonotonicRaw => ClockId::MonotonicRaw,
            BuiltinClock::Boottime => ClockId::Boottime,
        }
    }

    /// Reads this clock in nanoseconds.
    pub fn now_ns(self) -> u64 {
        let ts = clock_gettime(self.clock_id());
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

/// BOOTTIME in nanoseconds: the trace clock.
#[inline]
pub fn boottime_ns() -> u64 {
    BuiltinClock::Boottime.now_ns()
}

/// REALTIME in milliseconds since the epoch: used to align periodic work to
/// wall-clock multiples of its period, as Perfetto's service does.
pub fn realtime_ms() -> u64 {
    BuiltinClock::Realtime.now_ns() / 1_000_000
}

/// Milliseconds from now until the next wall-clock multiple of `period_ms`
/// (`period − now % period`; a full period when exactly on a multiple).
pub fn ms_to_next_multiple(period_ms: u64) -> u64 {
    let period = period_ms.max(1);
    period - realtime_ms() % period
}

/// One reading of every snapshot clock, taken back to back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClockReadings(pub Vec<(BuiltinClock, u64)>);

/// Reads every clock in [`BuiltinClock::SNAPSHOT_ORDER`].
pub fn snapshot() -> ClockReadings {
    ClockReadings(
        BuiltinClock::SNAPSHOT_ORDER
            .iter()
            .map(|c| (*c, c.now_ns()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boottime_is_monotonic_and_at_least_monotonic() {
        let a = boottime_ns();
        let m = BuiltinClock::Monotonic.now_ns();
        let b = boottime_ns();
        assert!(b >= a);
        assert!(
            b >= m,
            "BOOTTIME includes suspend, so it never trails MONOTONIC"
        );
    }

    #[test]
    fn next_multiple_is_within_one_period() {
        let d = ms_to_next_multiple(250);
        assert!((1..=250).contains(&d));
    }
}
