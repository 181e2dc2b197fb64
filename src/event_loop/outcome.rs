//! How a session ended and what it wrote: the loop's result, read by the
//! summary and the exit code.

use std::path::PathBuf;
use std::time::Duration;

use crate::ringbuf::BufferStats;
use crate::session::StopReason;
use crate::storage::segment::SegmentsStatus;

/// One buffer's figures at the end.
#[derive(Clone, Debug)]
pub(crate) struct BufferSummary {
    pub policy: &'static str,
    pub stats: BufferStats,
}

/// How the session ended and what it wrote.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    pub reason: StopReason,
    pub(crate) output_label: String,
    pub bytes_written: u64,
    pub elapsed: Duration,
    pub buffers: Vec<BufferSummary>,
    pub snapshots: Vec<PathBuf>,
    /// CLONE_SNAPSHOT triggers refused: the budget was spent, or a
    /// snapshot was under way.
    pub(crate) snapshots_refused: u64,
    pub passes: u64,
    pub triggered: bool,
    /// Which sink carried the data (io_uring, pwritev, stream).
    pub(crate) sink_kind: String,
    /// Errors met on the way that did not stop the session.
    pub warnings: Vec<String>,
    /// Segmented output: every segment, its size and fate.
    pub segments: Option<SegmentsStatus>,
    /// With compression: (bytes before, bytes after) over every pass.
    pub compression: Option<(u64, u64)>,
    /// Bytes `max_file_size_bytes` left out of the file.
    pub(crate) cut_bytes: u64,
    /// Every producer (SDK app) that connected, and what it did.
    pub producers: Vec<crate::producer::host::ProducerReport>,
    /// Every uid that hit a producer quota or whose closed producers were
    /// folded into one line.
    pub quotas: Vec<crate::producer::quota::UidReport>,
    /// What each trigger rule did.
    pub rules: Vec<super::rules::RuleReport>,
}
