//! What goes into the session ([`Event`]) and what comes out ([`Action`]).

use std::time::Duration;

use crate::storage::OutputError;
use crate::storage::segment::policy::RotateReason;
use crate::storage::write_pass::Take;
use crate::trace::service::ServiceEvent;

/// Identifies a control request the session answers (assigned by the loop).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RequestId(pub u64);

/// Identifies one flush of the data sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FlushId(pub u64);

/// Timers the session asks the loop to keep. Setting one again moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// `duration_ms`, or a trigger's stop delay.
    Stop,
    TriggerTimeout,
    /// A CLONE_SNAPSHOT trigger's delay; the number identifies the snapshot.
    Snapshot(u32),
    /// The next write pass (`write_into_file`).
    WritePass,
    /// The next `trace_stats` / sync marker / clock snapshot.
    Stats,
    /// The next periodic flush.
    Flush,
    /// The next incremental-state clear.
    ClearIncrementalState,
    /// The bound on one flush (`flush_timeout_ms`).
    FlushDeadline(FlushId),
    /// The bound on the data sources' stop (`data_source_stop_timeout_ms`).
    StopDeadline,
    /// How long the start acks of producers' data sources are awaited
    /// before the session notes which are slow (Perfetto's fixed 20 s).
    StartDeadline,
}

/// One trigger name as it arrived, with what the loop looked up for it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TriggerName {
    pub name: String,
    /// A uniform random number in [0, 1) for `skip_probability`.
    pub(crate) draw: f64,
    /// How many times this name was accepted in the last 24 hours
    /// (machine-wide), for `max_per_24_h`.
    pub(crate) matches_last_24h: u32,
}

/// Triggers from one sender.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TriggerArrival {
    /// The control request to answer (`None`: nobody waits for a reply).
    pub request: Option<RequestId>,
    /// The sender's producer name (matched by `producer_name_regex`).
    pub producer: String,
    /// The sender's uid, from the socket.
    pub uid: u32,
    pub names: Vec<TriggerName>,
    /// When what fired them happened (BOOTTIME ns): a rule's matched event,
    /// written as the `trigger` packet's time; `None`: when they arrived.
    pub(crate) at_ns: Option<u64>,
}

/// Inputs to the session.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Event {
    /// The session is configured. `wall_ms` is the wall clock (ms since the
    /// epoch) at the time origin, so periodic work aligns to wall-clock
    /// multiples of its period, as Perfetto's service does.
    Begin {
        wall_ms: u64,
    },
    TimerFired(Timer),
    Triggers(TriggerArrival),
    /// SIGINT or SIGTERM.
    Signal,
    /// `recorder start` (a `deferred_start` session).
    StartRequest(RequestId),
    /// `recorder stop`.
    StopRequest(RequestId),
    /// A consumer's Flush: answered when the flush ends.
    FlushRequest(RequestId),
    /// A consumer's ReadBuffers on a running session: a write pass now,
    /// answered once written.
    DrainRequest(RequestId),
    /// A consumer's CloneSession: a flush, then a copy of the buffers.
    CloneRequest(RequestId),
    /// `recorder rotate`, or a rule's `then rotate`: a write pass, then the
    /// segment closed and the next opened.
    RotateRequest(RequestId),
    /// The flush `id` finished; `complete` when every source acknowledged.
    SourcesFlushed {
        id: FlushId,
        complete: bool,
    },
    /// Every data source started, producers' ones that promised to say so
    /// (`will_notify_on_start`) included.
    SourcesStarted,
    /// Every data source stopped.
    SourcesStopped,
    /// A write pass finished; `cap_reached` when `max_file_size_bytes` cut
    /// it; `segment` is how full the segment being written now is (segmented
    /// output).
    PassWritten {
        cap_reached: bool,
        segment: Option<SegmentFill>,
    },
    /// The output's fdatasync ([`Action::SyncOutput`]) succeeded.
    OutputSynced,
    /// A write pass, a rotation or the output's sync failed; the output is
    /// poisoned.
    OutputFailed(OutputError),
    /// A data source failed.
    SourceFailed(SourceFailure),
}

/// When a data source failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourcePhase {
    /// Its start was refused (the session had asked it to start).
    Starting,
    /// It failed on its own thread while recording.
    Running,
}

/// A data source that failed: which, when, and why (the source's error
/// itself, shared: events are cloned, errors are not).
#[derive(Clone, Debug)]
pub(crate) struct SourceFailure {
    pub source: String,
    pub phase: SourcePhase,
    pub cause: std::sync::Arc<crate::sources::SourceError>,
}

/// Two failures are the same when they name the same source, phase and
/// error (the one shared error, or one worded alike).
impl PartialEq for SourceFailure {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
            && self.phase == other.phase
            && (std::sync::Arc::ptr_eq(&self.cause, &other.cause)
                || self.cause.to_string() == other.cause.to_string())
    }
}

impl Eq for SourceFailure {}

impl std::fmt::Display for SourceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let when = match self.phase {
            SourcePhase::Starting => "could not start",
            SourcePhase::Running => "failed while recording",
        };
        write!(f, "{} {when}: {}", self.source, self.cause.cause_text())
    }
}

/// The segment being written, after a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentFill {
    pub bytes: u64,
    /// Time since it was opened.
    pub(crate) age: Duration,
}

/// Which write pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// A periodic streaming pass: consume what is committed.
    Periodic,
    /// The last pass: consume everything, with `trace_stats`.
    Final,
}

/// A trigger the session acted on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AcceptedTrigger {
    pub name: String,
    pub producer: String,
    pub uid: u32,
    pub(crate) stop_delay: Duration,
    /// The snapshot this trigger takes (CLONE_SNAPSHOT).
    pub snapshot: Option<u32>,
    /// When what fired it happened (see [`TriggerArrival::at_ns`]).
    pub(crate) at_ns: Option<u64>,
}

/// Why a trigger was not acted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TriggerRefusal {
    NotListed,
    ProducerMismatch,
    Skipped,
    RateLimited,
    /// The session already acted on a trigger (STOP_TRACING takes only the
    /// first; START_TRACING only while waiting).
    AlreadyTriggered,
    /// The session is stopping or finished.
    NotRecording,
    /// CLONE_SNAPSHOT: the session's snapshot budget is spent.
    SnapshotBudget,
    /// CLONE_SNAPSHOT: the sender's uid has taken its share of the budget
    /// (or the uids other than root and the session's user all of theirs).
    SnapshotShare,
    /// CLONE_SNAPSHOT: a snapshot is already under way; this trigger adds
    /// nothing to it.
    SnapshotInProgress,
}

impl TriggerRefusal {
    /// The reason as the control protocol spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TriggerRefusal::NotListed => "not_listed",
            TriggerRefusal::ProducerMismatch => "producer_mismatch",
            TriggerRefusal::Skipped => "skipped",
            TriggerRefusal::RateLimited => "rate_limited",
            TriggerRefusal::AlreadyTriggered => "already_triggered",
            TriggerRefusal::NotRecording => "not_recording",
            TriggerRefusal::SnapshotBudget => "snapshot_budget_spent",
            TriggerRefusal::SnapshotShare => "snapshot_share_spent",
            TriggerRefusal::SnapshotInProgress => "snapshot_in_progress",
        }
    }
}

/// Why `recorder start` was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartRefusal {
    /// The session was not configured with `deferred_start`, or already started.
    AlreadyStarted,
    /// The session is stopping or finished.
    NotRecording,
}

impl StartRefusal {
    /// The reason as the control protocol spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StartRefusal::AlreadyStarted => "already_started",
            StartRefusal::NotRecording => "not_recording",
        }
    }
}

/// The session's answer to a control request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Answer {
    /// One outcome per trigger name, in the request's order.
    Triggers(Vec<(String, Result<(), TriggerRefusal>)>),
    Stopping,
    Started(Result<(), StartRefusal>),
    /// The flush ended; `true` when every source acknowledged it in time.
    Flushed(bool),
    /// What the buffers held is in the output.
    Drained,
    /// No clone, and why.
    NotCloned(CloneRefusal),
    /// The segment was cut, or why not.
    Rotated(Result<(), RotateRefusal>),
}

/// Why `recorder rotate` was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RotateRefusal {
    /// The output is one file, not segments.
    NotSegmented,
    /// Not recording (yet, or any more), or nothing written yet.
    NotRecording,
}

impl RotateRefusal {
    /// The reason as the control protocol spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RotateRefusal::NotSegmented => "not_segmented",
            RotateRefusal::NotRecording => "not_recording",
        }
    }
}

/// Why a consumer's clone was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CloneRefusal {
    /// Not recording (yet, or any more).
    NotRecording,
    /// A `write_into_file` session's data is in its file, not its buffers.
    WritesIntoFile,
}

impl CloneRefusal {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CloneRefusal::NotRecording => "the session is not recording",
            CloneRefusal::WritesIntoFile => {
                "a write_into_file session's data is in its file: read the file"
            }
        }
    }
}

/// Why the session stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StopReason {
    DurationElapsed,
    Signal,
    StopRequested,
    /// A STOP_TRACING trigger (or START_TRACING's stop delay after its trigger).
    Trigger(String),
    /// `trigger_timeout_ms` passed with no trigger: nothing is written.
    TriggerTimeout,
    /// CLONE_SNAPSHOT's `trigger_timeout_ms` passed (snapshots were taken or not).
    CloneTimeout,
    /// `max_file_size_bytes` was reached.
    SizeCap,
    /// The output failed.
    OutputFailed(OutputError),
    /// A data source failed.
    SourceFailed(SourceFailure),
}

impl StopReason {
    /// Whether the final pass writes the buffers (a session that never got
    /// its trigger writes nothing, as Perfetto's does).
    pub(crate) fn writes_buffers(&self) -> bool {
        !matches!(
            self,
            StopReason::TriggerTimeout | StopReason::OutputFailed(_) | StopReason::SizeCap
        )
    }

    /// Whether the process should exit with a failure.
    pub(crate) fn is_failure(&self) -> bool {
        matches!(
            self,
            StopReason::OutputFailed(_) | StopReason::SourceFailed(_)
        )
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::DurationElapsed => f.write_str("duration_ms elapsed"),
            StopReason::Signal => f.write_str("stopped by a signal"),
            StopReason::StopRequested => f.write_str("stopped by `recorder stop`"),
            StopReason::Trigger(n) => write!(f, "stop trigger {n:?}"),
            StopReason::TriggerTimeout => f.write_str("trigger_timeout_ms passed with no trigger"),
            StopReason::CloneTimeout => {
                f.write_str("trigger_timeout_ms passed (clone-snapshot session ends)")
            }
            StopReason::SizeCap => f.write_str("max_file_size_bytes reached"),
            StopReason::OutputFailed(e) => write!(f, "writing the output failed: {e}"),
            StopReason::SourceFailed(e) => write!(f, "a data source failed: {e}"),
        }
    }
}

/// What the event loop must do, in order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// Start the data sources and note `tracing_started`; answer with
    /// [`Event::SourcesStarted`] once every one that acknowledges its start
    /// has.
    StartSources,
    /// Fire `Timer` at this time since the origin.
    SetTimer(Timer, Duration),
    CancelTimer(Timer),
    /// Record an accepted trigger (a `trigger` packet, the 24 h history).
    AcceptTrigger(AcceptedTrigger),
    /// Answer a control request.
    Reply(RequestId, Answer),
    /// Ask every data source to flush, bounded by `timeout`; answer with
    /// [`Event::SourcesFlushed`] carrying `id`. `for_stop`: the flush is the
    /// stop's, and producers are told so (their flush flags).
    FlushSources {
        id: FlushId,
        timeout: Duration,
        for_stop: bool,
    },
    /// Run a write pass, then fdatasync the output when `sync`; answer with
    /// [`Event::PassWritten`] or [`Event::OutputFailed`].
    WritePass {
        pass: Pass,
        sync: bool,
    },
    /// fdatasync the output (a stop that writes no final pass); answer
    /// with [`Event::OutputSynced`] or [`Event::OutputFailed`].
    SyncOutput,
    /// Close the segment being written and open the next; answer a failure
    /// with [`Event::OutputFailed`].
    Rotate(RotateReason),
    /// The output is complete: close it (the last segment's rename and
    /// sidecar); `failed` when the output failed on the way.
    CloseOutput {
        failed: bool,
    },
    /// The periodic stats tick: a clock snapshot now, the sync marker and
    /// `trace_stats` in the next pass.
    StatsTick,
    /// Ask the data sources to drop their incremental state.
    ClearIncrementalState,
    /// Read what producers wrote into their shared memory and have not
    /// committed yet (SMB scraping, where they allow it): after every flush
    /// and once the sources have stopped, as Perfetto's service does.
    ScrapeProducers,
    /// Snapshot `n` begins (its flush follows): note `clone_started` and
    /// clear the buffers listed in `clear` (indices, `clear_before_clone`).
    PrepareSnapshot {
        n: u32,
        clear: Vec<usize>,
    },
    /// Write snapshot `n` to the next `OUT.N` file, taking each buffer's
    /// data as `takes` says (one per buffer, in order: `transfer_on_clone`
    /// consumes, the rest are copied).
    Snapshot {
        n: u32,
        takes: Vec<Take>,
    },
    /// A consumer's clone begins (its flush follows): note `clone_started`
    /// and clear the buffers listed in `clear`, as for a snapshot.
    PrepareClone {
        clear: Vec<usize>,
    },
    /// Write a copy of every buffer into the output that came with request
    /// `id`, taking each as `takes` says, and answer it.
    CloneInto {
        id: RequestId,
        takes: Vec<Take>,
    },
    /// Note a lifecycle event in the trace.
    Service(ServiceEvent),
    /// The stop sequence begins: tell whoever asks (a further `recorder
    /// stop` is answered at once).
    AnnounceStop,
    /// Stop every data source; answer with [`Event::SourcesStopped`].
    StopSources,
    /// Note in the trace which producers' data sources have not
    /// acknowledged their start yet (`slow_starting_data_sources`).
    NoteSlowStart,
    /// The session is over.
    Exit(StopReason),
}
