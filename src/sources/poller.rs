//! The runner of the polled sources (process and system stats): one thread
//! per source that sleeps until the next wall-clock-aligned tick, wakes at
//! once for stop, flush, incremental-state clears and pids reported by the
//! ftrace source, and writes every packet to a [`PacketOutput`].
//!
//! The first tick runs right after `start` (as Perfetto's probes do), the
//! following ones at wall-clock multiples of the period
//! ([`crate::clock::ms_to_next_multiple`]), so the samples of several
//! sources and sessions line up.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
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

/// A source the [`Poller`] drives. All calls come from the poller's thread.
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

/// Errors of the poller thread.
#[derive(Debug, thiserror::Error)]
pub enum PollerError {
    #[error("cannot start the {name} thread: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the {0} thread panicked")]
    Panicked(String),
}

#[derive(Default)]
struct Control {
    stop: bool,
    clear_incremental: bool,
    pending_pids: Vec<i32>,
    flush_requested: u64,
    flush_done: u64,
}

#[derive(Default)]
struct Shared {
    control: Mutex<Control>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Control> {
        // The control block holds plain flags and queues, valid whatever a
        // panicking holder was doing, so poisoning is ignored.
        self.control.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A cheap, clonable handle for other threads (the ftrace source, the
/// session) to feed a running [`Poller`].
#[derive(Clone)]
pub struct PollerHandle {
    shared: Arc<Shared>,
}

impl PollerHandle {
    /// Queues pids seen by ftrace; the poller thread handles them promptly.
    pub fn on_pids_seen(&self, pids: &[i32]) {
        if pids.is_empty() {
            return;
        }
        self.shared.lock().pending_pids.extend_from_slice(pids);
        self.shared.wake.notify_all();
    }

    /// Asks the source to clear its incremental state before its next write.
    pub fn clear_incremental_state(&self) {
        self.shared.lock().clear_incremental = true;
        self.shared.wake.notify_all();
    }
}

/// Runs one [`PolledSource`] on its own thread; owns the output until
/// [`Poller::stop`] hands it back.
pub struct Poller<O> {
    name: String,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<O>>,
}

impl<O: PacketOutput + Send + 'static> Poller<O> {
    /// Starts the thread: `source.start`, a first tick at once, then a tick
    /// at every wall-clock multiple of the period.
    pub fn start<S: PolledSource>(name: &str, source: S, output: O) -> Result<Self, PollerError> {
        let shared = Arc::new(Shared::default());
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(source, output, &thread_shared))
            .map_err(|source| PollerError::Spawn {
                name: name.to_string(),
                source,
            })?;
        Ok(Self {
            name: name.to_string(),
            shared,
            thread: Some(thread),
        })
    }

    pub fn handle(&self) -> PollerHandle {
        PollerHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Waits until everything queued before this call (start, pending pids)
    /// is written and the output flushed, or `timeout` passes. Returns
    /// whether it completed in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut c = self.shared.lock();
        c.flush_requested += 1;
        let ticket = c.flush_requested;
        self.shared.wake.notify_all();
        while c.flush_done < ticket {
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            c = self
                .shared
                .wake
                .wait_timeout(c, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Stops the thread (after it writes the pids already queued), flushes
    /// the output and returns it.
    pub fn stop(mut self) -> Result<O, PollerError> {
        self.signal_stop();
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| PollerError::Panicked(self.name.clone())),
            None => Err(PollerError::Panicked(self.name.clone())),
        }
    }

    fn signal_stop(&self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
    }
}

impl<O> Drop for Poller<O> {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.shared.lock().stop = true;
            self.shared.wake.notify_all();
            let _ = t.join();
        }
    }
}

/// What the thread found to do after a wait.
#[derive(Default)]
struct Work {
    stop: bool,
    clear: bool,
    pids: Vec<i32>,
    flush_ticket: Option<u64>,
    tick: bool,
}

fn run<S: PolledSource, O: PacketOutput>(mut source: S, mut out: O, shared: &Shared) -> O {
    source.start(&mut out);
    let period = source.tick_period_ms().filter(|p| *p > 0);
    let mut next_tick = period.map(|p| {
        source.tick(&mut out);
        next_deadline(p)
    });
    let mut pids = Vec::new();
    loop {
        let work = wait_for_work(shared, next_tick, std::mem::take(&mut pids));
        if work.clear {
            source.clear_incremental_state();
            source.after_clear(&mut out);
        }
        if !work.pids.is_empty() {
            source.on_pids_seen(&work.pids, &mut out);
        }
        pids = work.pids;
        pids.clear();
        if work.tick
            && let Some(p) = period
        {
            source.tick(&mut out);
            next_tick = Some(next_deadline(p));
        }
        if let Some(ticket) = work.flush_ticket {
            out.flush();
            let mut c = shared.lock();
            c.flush_done = c.flush_done.max(ticket);
            drop(c);
            shared.wake.notify_all();
        }
        if work.stop {
            out.flush();
            return out;
        }
    }
}

fn next_deadline(period_ms: u32) -> Instant {
    Instant::now() + Duration::from_millis(crate::clock::ms_to_next_multiple(u64::from(period_ms)))
}

/// Blocks until there is something to do; `spare` is an empty vector to
/// swap with the pending-pid queue (so neither side reallocates).
fn wait_for_work(shared: &Shared, next_tick: Option<Instant>, mut spare: Vec<i32>) -> Work {
    let mut c = shared.lock();
    loop {
        let mut work = Work {
            stop: c.stop,
            clear: std::mem::take(&mut c.clear_incremental),
            ..Work::default()
        };
        if !c.pending_pids.is_empty() {
            std::mem::swap(&mut c.pending_pids, &mut spare);
            work.pids = std::mem::take(&mut spare);
        }
        if c.flush_requested > c.flush_done {
            work.flush_ticket = Some(c.flush_requested);
        }
        let now = Instant::now();
        work.tick = !work.stop && next_tick.is_some_and(|t| now >= t);
        if work.stop
            || work.clear
            || !work.pids.is_empty()
            || work.flush_ticket.is_some()
            || work.tick
        {
            return work;
        }
        c = match next_tick {
            Some(t) => {
                shared
                    .wake
                    .wait_timeout(c, t - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => shared.wake.wait(c).unwrap_or_else(PoisonError::into_inner),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the calls it receives as one-byte packets.
    struct Script {
        period: Option<u32>,
    }

    impl PolledSource for Script {
        fn tick_period_ms(&self) -> Option<u32> {
            self.period
        }
        fn start(&mut self, out: &mut dyn PacketOutput) {
            out.write_packet(b"s");
        }
        fn tick(&mut self, out: &mut dyn PacketOutput) {
            out.write_packet(b"t");
        }
        fn on_pids_seen(&mut self, pids: &[i32], out: &mut dyn PacketOutput) {
            for p in pids {
                out.write_packet(p.to_string().as_bytes());
            }
        }
        fn clear_incremental_state(&mut self) {}
    }

    #[test]
    fn start_first_tick_pids_then_stop() {
        // An hour-long period: only the immediate first tick can happen, and
        // stop must still return at once.
        let p = Poller::start(
            "test-poller",
            Script {
                period: Some(3_600_000),
            },
            Vec::new(),
        )
        .expect("spawn");
        let h = p.handle();
        h.on_pids_seen(&[7, 8]);
        assert!(p.flush(Duration::from_secs(60)));
        h.on_pids_seen(&[9]);
        let out = p.stop().expect("joins");
        assert_eq!(
            out,
            vec![
                b"s".to_vec(),
                b"t".to_vec(),
                b"7".to_vec(),
                b"8".to_vec(),
                b"9".to_vec()
            ]
        );
    }

    #[test]
    fn no_period_means_no_tick() {
        let p = Poller::start("test-poller", Script { period: None }, Vec::new()).expect("spawn");
        assert!(p.flush(Duration::from_secs(60)));
        assert_eq!(p.stop().expect("joins"), vec![b"s".to_vec()]);
    }
}
