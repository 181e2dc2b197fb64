//! Adapts the polled sources (process and system stats) to [`DataSource`]:
//! the source and its ring-buffer writer wait until `start`, then the event
//! loop calls them when their [`Ticker`] says a sample is due, and at once
//! when the ftrace source reported new pids.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::counter_watch::{CounterWatch, Tap};
use super::poller::{PolledSource, Ticker};
use super::{DataSource, SourceError};
use crate::ringbuf::Writer;

/// Pids queued at most between two runs of process_stats: a burst beyond
/// is left to its next scan.
const MAX_QUEUED_PIDS: usize = 1 << 16;

/// Where the ftrace source reports the pids it saw, for process_stats to
/// dump the new ones. Both ends run on the loop's thread; the lock only
/// makes the route `Send`.
#[derive(Clone, Default)]
pub struct PidRoute(Arc<Mutex<Vec<i32>>>);

impl PidRoute {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<i32>> {
        // A plain queue of pids: whatever a panicking holder left is valid.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues pids ftrace saw.
    pub fn push(&self, pids: &[i32]) {
        let mut q = self.lock();
        let room = MAX_QUEUED_PIDS.saturating_sub(q.len());
        q.extend_from_slice(&pids[..pids.len().min(room)]);
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Swaps the queue with `into` (empty), so neither side reallocates.
    fn take(&self, into: &mut Vec<i32>) {
        into.clear();
        std::mem::swap(&mut *self.lock(), into);
    }
}

/// A polled source as a session's data source.
pub struct PolledDataSource<S: PolledSource> {
    name: String,
    source: S,
    /// Until the stop; dropping it commits what it holds.
    writer: Option<Writer>,
    ticker: Ticker,
    running: bool,
    pid_route: Option<PidRoute>,
    pids: Vec<i32>,
    /// Counter rules looking at what it writes.
    counters: Option<CounterWatch>,
}

impl<S: PolledSource> PolledDataSource<S> {
    /// `source` as the data source `name`, run on its tick period and writing
    /// through `writer`.
    pub fn new(name: &str, source: S, writer: Writer) -> Self {
        let ticker = Ticker::new(source.tick_period_ms());
        Self {
            name: name.to_string(),
            source,
            writer: Some(writer),
            ticker,
            running: false,
            pid_route: None,
            pids: Vec::new(),
            counters: None,
        }
    }

    /// Shows every packet it writes to `watch`'s counter rules.
    pub(crate) fn watch_counters(mut self, watch: Option<CounterWatch>) -> Self {
        self.counters = watch;
        self
    }

    /// Reads the pids ftrace reports on `route` (process stats).
    pub fn route_pids(mut self, route: PidRoute) -> Self {
        self.pid_route = Some(route);
        self
    }

    /// Dumps the pids queued since the last call.
    fn take_pids(&mut self) {
        let (Some(route), Some(w)) = (&self.pid_route, &mut self.writer) else {
            return;
        };
        route.take(&mut self.pids);
        if !self.pids.is_empty() {
            match &mut self.counters {
                Some(watch) => self
                    .source
                    .on_pids_seen(&self.pids, &mut Tap { out: w, watch }),
                None => self.source.on_pids_seen(&self.pids, w),
            }
        }
    }
}

impl<S: PolledSource> DataSource for PolledDataSource<S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&mut self) -> Result<(), SourceError> {
        let Some(w) = &mut self.writer else {
            return Ok(());
        };
        if std::mem::replace(&mut self.running, true) {
            return Ok(());
        }
        match &mut self.counters {
            Some(watch) => self.source.start(&mut Tap { out: w, watch }),
            None => self.source.start(w),
        }
        self.ticker.start();
        self.run(Instant::now(), false)
    }

    fn next_due(&self) -> Option<Instant> {
        if !self.running {
            return None;
        }
        if self.pid_route.as_ref().is_some_and(|r| !r.is_empty()) {
            return Some(Instant::now());
        }
        self.ticker.next_due()
    }

    fn run(&mut self, now: Instant, _woken: bool) -> Result<(), SourceError> {
        if !self.running {
            return Ok(());
        }
        self.take_pids();
        if self.ticker.take_due(now)
            && let Some(w) = &mut self.writer
        {
            match &mut self.counters {
                Some(watch) => self.source.tick(&mut Tap { out: w, watch }),
                None => self.source.tick(w),
            }
        }
        Ok(())
    }

    fn flush(&mut self, _timeout: Duration) -> Result<(), SourceError> {
        if self.running {
            self.take_pids();
        }
        if let Some(w) = &mut self.writer {
            w.flush();
        }
        Ok(())
    }

    fn clear_incremental_state(&mut self) {
        // Before start there is nothing to forget (process_stats: the pids
        // and counters it wrote; sys_stats keeps no such state).
        if !self.running {
            return;
        }
        self.source.clear_incremental_state();
        if let Some(w) = &mut self.writer {
            self.source.after_clear(w);
        }
    }

    fn stop(&mut self) -> Result<(), SourceError> {
        if self.running {
            self.take_pids();
        }
        self.running = false;
        self.ticker.stop();
        // Dropping the writer commits what it holds.
        self.writer = None;
        Ok(())
    }
}
