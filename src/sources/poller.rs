//! The polled sources (process and system stats) and their schedule: a
//! [`Ticker`] says when a source's next sample is due; the host (the event
//! loop, through [`crate::sources::polled`]) calls the source then, and
//! at once for pids reported by the ftrace source.
//!
//! The first tick runs right after `start` (as Perfetto's probes do), the
//! following ones at wall-clock multiples of the period
//! ([`crate::clock::ms_to_next_multiple`]), so the samples of several
//! sources and sessions line up.

use std::time::{Duration, Instant};

use crate::trace::encoder::ProtoEncoder;
use crate::wire::trace_packet;

pub use super::output::PacketOutput;

/// Writes the fields every packet of a polled source starts with.
pub(crate) fn write_packet_header(e: &mut ProtoEncoder<'_>, timestamp_ns: u64, sequence_id: u32) {
    e.uint(trace_packet::TIMESTAMP, timestamp_ns);
    e.uint(
        trace_packet::TRUSTED_PACKET_SEQUENCE_ID,
        u64::from(sequence_id),
    );
}

/// A source driven on a [`Ticker`]'s schedule. All calls come from the
/// thread that hosts it.
pub trait PolledSource: Send + 'static {
    /// The tick period, or `None` for a source with no periodic work.
    fn tick_period_ms(&self) -> Option<u32>;
    /// Runs once before the first tick (the initial process dump).
    fn start(&mut self, out: &mut dyn PacketOutput);
    /// One periodic sample.
    fn tick(&mut self, out: &mut dyn PacketOutput);
    /// Pids the ftrace source saw (batched); the process source dumps new ones.
    fn on_pids_seen(&mut self, _pids: &[i32], _out: &mut dyn PacketOutput) {}
    /// The session cleared incremental state: forget what was already written.
    fn clear_incremental_state(&mut self) {}
    /// Right after [`clear_incremental_state`](PolledSource::clear_incremental_state):
    /// write again what a reader needs from the start (a new output segment
    /// begins).
    fn after_clear(&mut self, _out: &mut dyn PacketOutput) {}
}

/// When a polled source's next sample is due.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticker {
    period_ms: Option<u32>,
    next: Option<Instant>,
}

impl Ticker {
    /// A schedule for `period_ms` (none, or 0: no periodic samples).
    pub(crate) fn new(period_ms: Option<u32>) -> Self {
        Self {
            period_ms: period_ms.filter(|p| *p > 0),
            next: None,
        }
    }

    /// The source started: its first tick is due now.
    pub(crate) fn start(&mut self) {
        self.next = self.period_ms.map(|_| Instant::now());
    }

    /// Stopped: nothing more is due.
    pub(crate) fn stop(&mut self) {
        self.next = None;
    }

    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.next
    }

    /// Whether a tick is due at `now`; if so the next one is set to the
    /// following wall-clock multiple of the period.
    pub(crate) fn take_due(&mut self, now: Instant) -> bool {
        match (self.next, self.period_ms) {
            (Some(at), Some(p)) if at <= now => {
                self.next = Some(next_deadline(p));
                true
            }
            _ => false,
        }
    }
}

fn next_deadline(period_ms: u32) -> Instant {
    Instant::now() + Duration::from_millis(crate::clock::ms_to_next_multiple(u64::from(period_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_tick_is_due_at_start_and_the_next_on_the_period() {
        let mut t = Ticker::new(Some(3_600_000));
        assert_eq!(t.next_due(), None, "nothing before the start");
        t.start();
        let now = Instant::now();
        assert!(t.take_due(now), "the first tick at once");
        assert!(!t.take_due(now), "once");
        let next = t.next_due().expect("scheduled");
        assert!(next > now && next <= now + Duration::from_secs(3600));
        t.stop();
        assert_eq!(t.next_due(), None);
    }

    #[test]
    fn no_period_means_no_tick() {
        let mut t = Ticker::new(None);
        t.start();
        assert_eq!(t.next_due(), None);
        assert!(!t.take_due(Instant::now()));
        let mut z = Ticker::new(Some(0));
        z.start();
        assert!(!z.take_due(Instant::now()));
    }
}
