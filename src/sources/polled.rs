//! Adapts the polled sources (process and system stats) to [`DataSource`]:
//! the source and its ring-buffer writer wait until `start`, then run on
//! their [`Poller`] thread.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::poller::{PolledSource, Poller, PollerHandle};
use super::{DataSource, SourceError};
use crate::ringbuf::Writer;

/// Where the ftrace source reports the pids it saw: the process-stats
/// poller, once it runs.
pub type PidRoute = Arc<Mutex<Option<PollerHandle>>>;

/// A polled source as a session's data source.
pub struct PolledDataSource<S: PolledSource> {
    name: String,
    pending: Option<(S, Writer)>,
    poller: Option<Poller<Writer>>,
    pid_route: Option<PidRoute>,
}

impl<S: PolledSource> PolledDataSource<S> {
    pub fn new(name: &str, source: S, writer: Writer) -> Self {
        Self {
            name: name.to_string(),
            pending: Some((source, writer)),
            poller: None,
            pid_route: None,
        }
    }

    /// Publishes this poller's handle in `route` when it starts (process stats).
    pub fn route_pids(mut self, route: PidRoute) -> Self {
        self.pid_route = Some(route);
        self
    }

    fn failed(&self, cause: impl std::error::Error + Send + Sync + 'static) -> SourceError {
        SourceError::Failed {
            source_name: self.name.clone(),
            cause: Box::new(cause),
        }
    }
}

impl<S: PolledSource> DataSource for PolledDataSource<S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&mut self) -> Result<(), SourceError> {
        let Some((source, writer)) = self.pending.take() else {
            return Ok(());
        };
        let poller = Poller::start(&self.name, source, writer).map_err(|e| self.failed(e))?;
        if let Some(route) = &self.pid_route {
            *route.lock().unwrap_or_else(PoisonError::into_inner) = Some(poller.handle());
        }
        self.poller = Some(poller);
        Ok(())
    }

    fn flush(&mut self, timeout: Duration) -> Result<(), SourceError> {
        match &self.poller {
            Some(p) if !p.flush(timeout) => Err(SourceError::FlushTimeout {
                source_name: self.name.clone(),
                timeout,
            }),
            _ => Ok(()),
        }
    }

    fn clear_incremental_state(&mut self) {
        // Before start there is nothing to forget; the poller thread clears
        // before its next write (process_stats: the pids and counters it
        // wrote; sys_stats keeps no such state).
        if let Some(p) = &self.poller {
            p.handle().clear_incremental_state();
        }
    }

    fn stop(&mut self) -> Result<(), SourceError> {
        if let Some(route) = &self.pid_route {
            *route.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        self.pending = None;
        if let Some(p) = self.poller.take() {
            // Dropping the returned writer commits what it holds.
            p.stop().map_err(|e| self.failed(e))?;
        }
        Ok(())
    }
}
