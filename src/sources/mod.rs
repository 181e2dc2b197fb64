//! Data sources: ftrace, /proc process and system stats, `for_testing`.
//!
//! Every built-in source appears under the producer name
//! [`PRODUCER_NAME`], so configs that filter on it work, and writes on its
//! own sequence (`trusted_packet_sequence_id` ≥ 2) through its own
//! [`crate::ringbuf::Writer`]. Sources have no threads of their own: the
//! event loop that hosts the session drives them ([`DataSource::next_due`],
//! [`DataSource::fds`], [`DataSource::run`]), so a service of a hundred
//! sessions runs on the threads of one. A write pass reads what they
//! committed without their cooperation, so `flush` only has to push out
//! data a source still holds back (ftrace's kernel buffers).

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

pub(crate) mod counter_watch;
pub mod for_testing;
pub mod ftrace;
pub(crate) mod ftrace_source;
pub(crate) mod output;
pub mod polled;
pub mod poller;
pub mod process_stats;
pub mod procfs;
pub mod rules;
pub mod sys_stats;

/// The producer name of the built-in sources (Perfetto's probes daemon).
pub(crate) const PRODUCER_NAME: &str = "perfetto.traced_probes";

/// Errors of data sources.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The cause is kept (and also shown, so a plain `to_string` is whole).
    #[error("{source_name}: {cause}")]
    Failed {
        /// The data source that failed (`linux.ftrace`, …).
        source_name: String,
        /// What failed, kept whole for the error chain.
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A flush the session asked for did not finish in the time it allowed.
    #[error("{source_name}: flush did not finish within {timeout:?}")]
    FlushTimeout {
        /// The data source that did not finish.
        source_name: String,
        /// How long the session waited.
        timeout: Duration,
    },
}

impl SourceError {
    /// What went wrong, without the source's name (which `Display` leads
    /// with).
    pub(crate) fn cause_text(&self) -> String {
        match self {
            SourceError::Failed { cause, .. } => cause.to_string(),
            SourceError::FlushTimeout { timeout, .. } => {
                format!("flush did not finish within {timeout:?}")
            }
        }
    }
}

/// A running count of events a source lost before its buffer, with what to
/// change to lose fewer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamLoss {
    /// Events lost since the source started.
    pub events: u64,
    /// The config change that loses fewer (ftrace: a bigger per-CPU buffer, or
    /// draining sooner).
    pub advice: &'static str,
}

/// A data source instance of one session.
pub trait DataSource: Send {
    /// The data source name (`linux.ftrace`, …).
    fn name(&self) -> &str;
    /// Does, while the process may still be privileged, whatever of the
    /// start needs privileges (kernel settings, descriptors), producing
    /// nothing yet. Called once, before the process gives up root; a failure
    /// is kept and returned by [`start`](DataSource::start), so the session
    /// treats it as any failure to start.
    fn prepare(&mut self) {}
    /// Starts producing. Needs no more privileges than
    /// [`prepare`](DataSource::prepare) left.
    fn start(&mut self) -> Result<(), SourceError>;
    /// Makes everything produced so far visible to the next write pass.
    fn flush(&mut self, timeout: Duration) -> Result<(), SourceError>;
    /// Stops producing; afterwards the source writes nothing more.
    fn stop(&mut self) -> Result<(), SourceError>;
    /// Drops incremental state (interning tables, "already emitted" sets), so
    /// the next packets stand on their own (`incremental_state_config`, and
    /// the start of each output segment).
    fn clear_incremental_state(&mut self) {}
    /// When the loop owes the source its next [`run`](DataSource::run): a
    /// sample, a batch of test packets, a drain of the kernel's buffers.
    /// `None`: nothing is due (not started, stopped, or driven only by its
    /// descriptors).
    fn next_due(&self) -> Option<Instant> {
        None
    }
    /// Descriptors whose readiness (to read) means work for
    /// [`run`](DataSource::run): ftrace's per-CPU pipes at the watermark.
    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }
    /// Does what is due by `now`; `woken` when one of its
    /// [`fds`](DataSource::fds) was ready. A failure here fails the
    /// session as a source failing while it runs.
    fn run(&mut self, _now: Instant, _woken: bool) -> Result<(), SourceError> {
        Ok(())
    }
    /// Packets the source could not store (buffer full), for the summary.
    fn packets_dropped(&self) -> u64 {
        0
    }
    /// Events lost before they reached the source's buffer (the kernel's,
    /// for ftrace), counted from the start; read at each segment's close so
    /// its sidecar accounts for them.
    fn upstream_loss(&self) -> Option<UpstreamLoss> {
        None
    }
    /// After [`stop`](DataSource::stop): losses the source saw upstream of
    /// the buffer (the kernel's, say), as summary warnings with advice.
    fn loss_warnings(&self) -> Vec<String> {
        Vec::new()
    }
    /// Gives the undoing of the source's kernel settings (tracefs) to the
    /// privileged broker before this process gives up root; the source will
    /// not undo them itself.
    fn hand_over_teardown(&mut self) -> Option<crate::sources::ftrace::tracefs::TracefsTeardown> {
        None
    }

    /// For ftrace: what reading the kernel's leftover needs if the recorder
    /// dies, once prepared (the broker reads it before the teardown).
    fn leftover(&self) -> Option<crate::sources::ftrace::Leftover> {
        None
    }
}
