//! Clocks. Trace timestamps are BOOTTIME nanoseconds (Perfetto's default
//! trace clock); clock snapshots relate it to the other builtin clocks.

use rustix::time::{ClockId, clock_gettime};

/// Perfetto's BuiltinClock ids (ARCHITECTURE.md §7.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum BuiltinClock {
    Realtime = 1,
    RealtimeCoarse = 2,
    Monotonic = 3,
    MonotonicCoarse = 4,
    MonotonicRaw = 5,
    Boottime = 6,
}

impl BuiltinClock {
    /// The order in which Perfetto's service reads clocks for a snapshot.
    pub(crate) const SNAPSHOT_ORDER: [BuiltinClock; 6] = [
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
    pub(crate) fn now_ns(self) -> u64 {
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
pub(crate) fn realtime_ms() -> u64 {
    BuiltinClock::Realtime.now_ns() / 1_000_000
}

/// Milliseconds from now until the next wall-clock multiple of `period_ms`
/// (`period − now % period`; a full period when exactly on a multiple).
pub(crate) fn ms_to_next_multiple(period_ms: u64) -> u64 {
    let period = period_ms.max(1);
    period - realtime_ms() % period
}

/// One reading of every snapshot clock, taken back to back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClockReadings(pub Vec<(BuiltinClock, u64)>);

impl BuiltinClock {
    /// The clock with Perfetto's id `id`, if it is a snapshot clock.
    pub(crate) fn from_id(id: u32) -> Option<BuiltinClock> {
        Self::SNAPSHOT_ORDER.into_iter().find(|c| *c as u32 == id)
    }
}

/// Which boot BOOTTIME counts from: `/proc/sys/kernel/random/boot_id` as
/// 16 bytes (all zero when it cannot be read). Timestamps of another boot
/// cannot be related to this one's clocks.
pub(crate) fn boot_id() -> [u8; 16] {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .and_then(|t| parse_uuid(t.trim()))
        .unwrap_or([0; 16])
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` as 16 bytes.
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// Reads every clock in [`BuiltinClock::SNAPSHOT_ORDER`].
pub(crate) fn snapshot() -> ClockReadings {
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
    fn boot_ids_are_read_as_uuids() {
        assert_eq!(
            parse_uuid("0123abcd-0000-1111-2222-33334444ffff"),
            Some([
                0x01, 0x23, 0xab, 0xcd, 0, 0, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0xff,
                0xff
            ])
        );
        assert_eq!(parse_uuid("nope"), None);
        assert_eq!(boot_id(), boot_id());
    }

    #[test]
    fn next_multiple_is_within_one_period() {
        let d = ms_to_next_multiple(250);
        assert!((1..=250).contains(&d));
    }
}
