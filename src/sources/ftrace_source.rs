//! `linux.ftrace` as a session's data source: the ftrace recorder writing
//! straight into its ring-buffer writer, telling process_stats the pids it
//! saw, and reporting its reader thread's failures to the session.

use std::sync::PoisonError;
use std::time::Duration;

use super::ftrace::{FtraceOptions, FtraceSource, PacketOutput};
use super::polled::PidRoute;
use super::{DataSource, SourceError};
use crate::ringbuf::Writer;

/// Bundles are encoded in place in the ring (zero-copy), into what is left
/// of the writer's chunk when that holds at least `min_len`.
impl PacketOutput for Writer {
    fn write_packet(&mut self, packet: &[u8]) {
        // A refused packet (DISCARD full, too big) is counted by the buffer.
        let _ = Writer::write_packet(self, packet);
    }

    fn begin(&mut self, min_len: usize, max_len: usize) -> Option<&mut [u8]> {
        self.reserve_at_least(min_len, max_len).ok()
    }

    fn commit(&mut self, len: usize) {
        self.commit_reserved(len);
    }
}

/// The running (or ready) ftrace source of one session.
pub struct FtraceDataSource {
    name: String,
    inner: FtraceSource<Writer>,
    started: bool,
}

impl FtraceDataSource {
    /// Finds tracefs; nothing is changed in it before `start`.
    pub fn new(
        name: &str,
        opts: FtraceOptions,
        writer: Writer,
        pids: PidRoute,
    ) -> Result<Self, SourceError> {
        let mut inner = FtraceSource::new(opts, writer).map_err(|e| SourceError::Failed {
            source_name: name.to_string(),
            msg: e.to_string(),
        })?;
        inner.on_pids(Box::new(move |seen: &[i32]| {
            if let Some(h) = pids.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
                h.on_pids_seen(seen);
            }
        }));
        Ok(Self {
            name: name.to_string(),
            inner,
            started: false,
        })
    }

    fn failed(&self, e: impl std::fmt::Display) -> SourceError {
        SourceError::Failed {
            source_name: self.name.clone(),
            msg: e.to_string(),
        }
    }
}

impl DataSource for FtraceDataSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&mut self) -> Result<(), SourceError> {
        self.inner.start().map_err(|e| self.failed(e))?;
        self.started = true;
        Ok(())
    }

    fn flush(&mut self, _timeout: Duration) -> Result<(), SourceError> {
        if !self.started {
            return Ok(());
        }
        self.inner.flush().map_err(|e| self.failed(e))
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
        // Dropping the writer commits what it holds.
        drop(self.inner.take_output());
        Ok(())
    }
}
