//! `linux.ftrace` as a session's data source: the ftrace recorder writing
//! straight into its ring-buffer writer, telling process_stats the pids it
//! saw; the event loop drives its drains.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use std::sync::Arc;

use super::ftrace::refusal::Refusal;
use super::ftrace::remote::{FtraceRequest, RemoteTracefs};
use super::ftrace::{FtraceError, FtraceOptions, FtraceSource, FtraceSummary, events_lost};
use super::polled::PidRoute;
use super::{DataSource, SourceError, UpstreamLoss};
use crate::ringbuf::Writer;

/// The running (or ready) ftrace source of one session.
pub(crate) struct FtraceDataSource {
    name: String,
    inner: FtraceSource<Writer>,
    started: bool,
    /// Why the preparation failed, reported by `start`.
    prepare_failed: Option<SourceError>,
    /// Prepared (here or by the privileged side).
    prepared: bool,
    /// A served session's: who prepares its instance, for which consumer
    /// uid, and the instance's key once prepared.
    remote: Option<(Arc<dyn RemoteTracefs>, u32, Option<u64>)>,
    /// Set at stop when the kernel dropped events.
    loss: Option<String>,
}

impl FtraceDataSource {
    /// Finds tracefs; nothing is changed in it before `start`.
    pub(crate) fn new(
        name: &str,
        opts: FtraceOptions,
        writer: Writer,
        pids: PidRoute,
    ) -> Result<Self, SourceError> {
        let mut inner = FtraceSource::new(opts, writer).map_err(|e| SourceError::Failed {
            source_name: name.to_string(),
            cause: Box::new(e),
        })?;
        inner.on_pids(pid_sink(pids));
        Ok(Self {
            name: name.to_string(),
            inner,
            started: false,
            prepare_failed: None,
            prepared: false,
            remote: None,
            loss: None,
        })
    }

    /// A served session's source: its instance is prepared by `remote` (the
    /// privileged side) for consumer `uid`, from a request made of the
    /// config; it reads it through the descriptors it is handed.
    pub(crate) fn served(
        name: &str,
        opts: FtraceOptions,
        writer: Writer,
        pids: PidRoute,
        remote: Arc<dyn RemoteTracefs>,
        uid: u32,
    ) -> Self {
        let mut inner = FtraceSource::detached(opts, writer);
        inner.on_pids(pid_sink(pids));
        Self {
            name: name.to_string(),
            inner,
            started: false,
            prepare_failed: None,
            prepared: false,
            remote: Some((remote, uid, None)),
            loss: None,
        }
    }

    fn prepare_remotely(&mut self) -> Result<(), SourceError> {
        let Some((remote, uid, key)) = &mut self.remote else {
            return Ok(());
        };
        let spec = &self.inner.options().spec;
        let request = FtraceRequest::from_spec(spec).map_err(|e| SourceError::Failed {
            source_name: self.name.clone(),
            cause: Box::new(e),
        })?;
        let prepared = remote
            .prepare(*uid, &request)
            .map_err(|why| SourceError::Failed {
                source_name: self.name.clone(),
                cause: Box::new(FtraceError::Refused(Refusal::Remote(why))),
            })?;
        *key = Some(prepared.key);
        let adopted = self.inner.adopt(prepared.info, prepared.fds);
        adopted.map_err(|e| self.failed(e))
    }

    /// Gives a remotely prepared instance back (its files closed first).
    fn release(&mut self) {
        self.inner.close_files();
        if let Some((remote, _, key)) = &mut self.remote
            && let Some(k) = key.take()
        {
            remote.release(k);
        }
    }

    fn failed(&self, e: crate::sources::ftrace::FtraceError) -> SourceError {
        SourceError::Failed {
            source_name: self.name.clone(),
            cause: Box::new(e),
        }
    }
}

impl DataSource for FtraceDataSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn prepare(&mut self) {
        if std::mem::replace(&mut self.prepared, true) {
            return;
        }
        let r = if self.remote.is_some() {
            self.prepare_remotely()
        } else {
            self.inner.prepare().map_err(|e| self.failed(e))
        };
        if let Err(e) = r {
            self.prepare_failed = Some(e);
        }
    }

    fn start(&mut self) -> Result<(), SourceError> {
        self.prepare();
        if let Some(e) = self.prepare_failed.take() {
            return Err(e);
        }
        self.inner.arm().map_err(|e| self.failed(e))?;
        self.started = true;
        Ok(())
    }

    fn flush(&mut self, _timeout: Duration) -> Result<(), SourceError> {
        if !self.started {
            return Ok(());
        }
        self.inner.flush().map_err(|e| self.failed(e))
    }

    fn next_due(&self) -> Option<Instant> {
        self.inner.next_due()
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.inner.watched()
    }

    fn run(&mut self, now: Instant, woken: bool) -> Result<(), SourceError> {
        self.inner.on_due(now, woken);
        Ok(())
    }

    fn clear_incremental_state(&mut self) {
        if self.started
            && let Err(e) = self.inner.clear_incremental_state()
        {
            log::warn!("{}: clearing incremental state: {e}", self.name);
        }
    }

    fn hand_over_teardown(&mut self) -> Option<crate::sources::ftrace::tracefs::TracefsTeardown> {
        self.inner.hand_over_teardown()
    }

    fn leftover(&self) -> Option<crate::sources::ftrace::Leftover> {
        self.inner.leftover()
    }

    fn upstream_loss(&self) -> Option<UpstreamLoss> {
        Some(UpstreamLoss {
            events: self.inner.kernel_lost(),
            advice: KERNEL_LOSS_ADVICE,
        })
    }

    fn loss_warnings(&self) -> Vec<String> {
        self.loss.iter().cloned().collect()
    }

    fn stop(&mut self) -> Result<(), SourceError> {
        if !std::mem::take(&mut self.started) {
            return Ok(());
        }
        let summary = self.inner.stop().map_err(|e| self.failed(e))?;
        log::info!(
            "linux.ftrace: {} events from {} bytes of raw pages in {} bundles; \
             {} early drains at the watermark; {} pages flagged with lost events",
            summary.encode.events,
            summary.bytes_read,
            summary.encode.bundles,
            summary.watermark_drains,
            summary.encode.lost_pages
        );
        if !summary.unknown_events.is_empty() {
            log::warn!(
                "linux.ftrace: unknown events: {}",
                summary.unknown_events.join(", ")
            );
        }
        self.loss = kernel_loss(&self.name, &summary);
        if let Some((kb, why)) = &summary.subbuf_refused {
            // Not a loss: the kernel's own sub-buffers cost more per event.
            let note = format!(
                "{}: the kernel refused {kb} KiB sub-buffers ({why}): recorded with its own size",
                self.name
            );
            self.loss = Some(match self.loss.take() {
                Some(l) => format!("{l}; {note}"),
                None => note,
            });
        }
        // Dropping the writer commits what it holds.
        drop(self.inner.take_output());
        self.release();
        Ok(())
    }
}

impl Drop for FtraceDataSource {
    fn drop(&mut self) {
        if self.started {
            let _ = self.inner.stop();
        }
        self.release();
    }
}

/// The callback that tells process_stats the pids ftrace saw.
fn pid_sink(pids: PidRoute) -> super::ftrace::PidSink {
    Box::new(move |seen: &[i32]| pids.push(seen))
}

/// What to change when the kernel loses events before they are read.
const KERNEL_LOSS_ADVICE: &str =
    "raise buffer_size_kb, lower drain_period_ms or drain_buffer_percent";

/// The summary line for events the kernel dropped before we read them
/// (overruns, per-CPU `dropped events`, pages flagged RB_MISSED_EVENTS).
fn kernel_loss(name: &str, s: &FtraceSummary) -> Option<String> {
    let overrun = events_lost(&s.cpu_stats);
    if overrun == 0 && s.encode.lost_pages == 0 {
        return None;
    }
    let cpus: Vec<String> = s
        .cpu_stats
        .iter()
        .filter(|c| c.overrun + c.dropped_events > 0)
        .map(|c| format!("cpu{} {}", c.cpu, c.overrun + c.dropped_events))
        .collect();
    Some(format!(
        "{name}: the kernel lost {overrun} events before they were read ({}; {} pages flagged \
         RB_MISSED_EVENTS): {KERNEL_LOSS_ADVICE}",
        if cpus.is_empty() {
            "count not reported".to_string()
        } else {
            cpus.join(", ")
        },
        s.encode.lost_pages
    ))
}
