//! The timing rules of one session, derived once from its validated spec:
//! how long it runs, how triggers act, and the cadence of its periodic work
//! (write passes, stats, flushes, incremental-state clears).

use std::time::Duration;

use crate::config::spec::{self, FlushPlan, RecorderSpec};
use crate::config::validate::DEFAULT_WRITE_PERIOD_MS;
use crate::storage::segment::policy::RotationPolicy;
use crate::storage::write_pass::Take;

/// How triggers drive the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TriggerMode {
    None,
    StartTracing,
    StopTracing,
    CloneSnapshot,
}

/// One trigger the config lists.
#[derive(Clone, Debug)]
pub(crate) struct TriggerRule {
    pub name: String,
    /// Pattern on the sending producer's name, compiled with [`anchored`].
    pub(crate) producer_regex: Option<regex::Regex>,
    pub(crate) stop_delay: Duration,
    /// 0: unlimited.
    pub(crate) max_per_24h: u32,
    pub skip_probability: f64,
}

/// When data sources are asked to flush while the session records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushCadence {
    /// Only at stop (and before snapshots).
    AtStop,
    /// Every period, aligned to wall-clock multiples.
    Periodic(Duration),
    /// Before every write pass (`write_into_file` with a long period).
    BeforeEachWritePass,
}

/// The timing rules of one session.
#[derive(Clone, Debug)]
pub(crate) struct Timeline {
    /// `duration_ms`; `None` for "until stopped".
    pub duration: Option<Duration>,
    pub mode: TriggerMode,
    pub(crate) trigger_timeout: Duration,
    pub rules: Vec<TriggerRule>,
    /// The write period when streaming (`write_into_file`).
    pub write_period: Option<Duration>,
    /// How often the trace gets `trace_stats`, the sync marker and a clock
    /// snapshot (`builtin_data_sources.snapshot_interval_ms`, default 10 s).
    pub(crate) stats_period: Duration,
    pub flush: FlushCadence,
    /// Bound on one flush of the data sources (`flush_timeout_ms`).
    pub(crate) flush_timeout: Duration,
    /// Bound on the data sources' stop (`data_source_stop_timeout_ms`).
    pub(crate) stop_timeout: Duration,
    /// `incremental_state_config.clear_period_ms`.
    pub(crate) clear_period: Option<Duration>,
    /// `deferred_start`: configured, but records only after `recorder start`.
    pub deferred_start: bool,
    /// Segmented output: when to cut (`--rotate-size`, `--rotate-period`).
    pub rotation: Option<RotationPolicy>,
    /// How many CLONE_SNAPSHOT snapshots the session may write.
    pub(crate) snapshot_budget: SnapshotBudget,
    /// fdatasync after every write pass (`fdatasync_each_pass`); the final
    /// pass always syncs.
    pub(crate) sync_each_pass: bool,
    /// What a snapshot does to each buffer, in the config's order.
    pub clone: Vec<CloneRule>,
}

/// What a CLONE_SNAPSHOT snapshot does to one buffer
/// (`transfer_on_clone`, `clear_before_clone`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CloneRule {
    /// The snapshot consumes the buffer's data instead of copying it.
    pub(crate) transfer: bool,
    /// The buffer is emptied when the snapshot begins, before its flush.
    pub(crate) clear_first: bool,
}

impl CloneRule {
    /// How the snapshot's pass takes this buffer's data.
    pub(crate) fn take(self) -> Take {
        if self.transfer {
            Take::Consume
        } else {
            Take::Snapshot
        }
    }
}

/// Snapshots a CLONE_SNAPSHOT session may write: each trigger beyond it is
/// refused (and counted), so that any local user who may send triggers
/// cannot fill the disk or keep the ring pinned by snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotBudget {
    /// Snapshots in all.
    pub(crate) max_count: u32,
    /// Bytes in all, counting each snapshot at its largest (`bytes_each`).
    pub(crate) max_bytes: u64,
    /// The most one snapshot can hold: every buffer full.
    pub(crate) bytes_each: u64,
    /// The session's user. Its triggers and root's always find room: a
    /// quarter of the budget ([`SnapshotBudget::reserved`]) is theirs alone,
    /// and every other uid may take at most its share of the rest
    /// ([`SnapshotBudget::share`]).
    pub(crate) owner_uid: u32,
}

/// Snapshots a session writes at most unless told otherwise.
pub(super) const DEFAULT_MAX_SNAPSHOTS: u32 = 16;
/// Bytes of snapshots a session writes at most unless `--max-disk` says.
pub(super) const DEFAULT_MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

impl SnapshotBudget {
    /// Whether the snapshot after `taken` ones still fits.
    pub(crate) fn allows(&self, taken: u32) -> bool {
        taken < self.max_count
            && u64::from(taken + 1).saturating_mul(self.bytes_each) <= self.max_bytes
    }

    /// Snapshots the budget holds in all, by count and by bytes.
    pub(crate) fn total(&self) -> u32 {
        match self.max_bytes.checked_div(self.bytes_each) {
            Some(fit) => self.max_count.min(u32::try_from(fit).unwrap_or(u32::MAX)),
            None => self.max_count,
        }
    }

    /// Snapshots kept for root and the session's user alone: a quarter of
    /// all, rounded up.
    pub(crate) fn reserved(&self) -> u32 {
        self.total().div_ceil(4)
    }

    /// Snapshots every other uid may take, at most: a quarter of what is
    /// not reserved (at least one while anything is left to others).
    pub(crate) fn share(&self) -> u32 {
        match self.total() - self.reserved() {
            0 => 0,
            others => (others / 4).max(1),
        }
    }

    /// Whether `uid` is one whose triggers always find room.
    pub(crate) fn privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner_uid
    }
}

/// A trigger's `producer_name_regex` does not compile.
#[derive(Debug, thiserror::Error)]
#[error("trigger_config.triggers[{index}].producer_name_regex: {source}")]
pub(crate) struct TimelineError {
    pub index: usize,
    #[source]
    pub source: regex::Error,
}

impl Timeline {
    /// The timeline a validated spec asks for.
    pub(crate) fn from_spec(spec: &RecorderSpec) -> Result<Timeline, TimelineError> {
        let (mode, trigger_timeout, rules) = match &spec.trigger {
            None => (TriggerMode::None, Duration::ZERO, Vec::new()),
            Some(plan) => {
                let mode = match plan.mode {
                    spec::TriggerMode::StartTracing => TriggerMode::StartTracing,
                    spec::TriggerMode::StopTracing => TriggerMode::StopTracing,
                    spec::TriggerMode::CloneSnapshot => TriggerMode::CloneSnapshot,
                };
                let mut rules = Vec::with_capacity(plan.triggers.len());
                for (index, t) in plan.triggers.iter().enumerate() {
                    let producer_regex = t
                        .producer_name_regex
                        .as_deref()
                        .map(anchored)
                        .transpose()
                        .map_err(|source| TimelineError { index, source })?;
                    rules.push(TriggerRule {
                        name: t.name.clone(),
                        producer_regex,
                        stop_delay: t.stop_delay,
                        max_per_24h: t.max_per_24_h.unwrap_or(0),
                        skip_probability: t.skip_probability,
                    });
                }
                (mode, plan.timeout, rules)
            }
        };
        Ok(Timeline {
            duration: spec.duration,
            mode,
            trigger_timeout,
            rules,
            write_period: spec.file.as_ref().map(|f| f.write_period),
            stats_period: spec.builtin.snapshot_interval,
            flush: match spec.flush {
                FlushPlan::AtStop => FlushCadence::AtStop,
                FlushPlan::Periodic(p) => FlushCadence::Periodic(p),
                FlushPlan::BeforeEachWritePass => FlushCadence::BeforeEachWritePass,
            },
            flush_timeout: spec.flush_timeout,
            stop_timeout: spec.data_source_stop_timeout,
            clear_period: spec.incremental_state_clear_period,
            deferred_start: spec.deferred_start,
            rotation: None,
            snapshot_budget: SnapshotBudget {
                max_count: DEFAULT_MAX_SNAPSHOTS,
                max_bytes: DEFAULT_MAX_SNAPSHOT_BYTES,
                bytes_each: spec.buffers.iter().map(|b| b.size.bytes()).sum(),
                owner_uid: 0,
            },
            sync_each_pass: spec.file.as_ref().is_some_and(|f| f.fdatasync_each_pass),
            clone: spec
                .buffers
                .iter()
                .map(|b| CloneRule {
                    transfer: b.transfer_on_clone,
                    clear_first: b.clear_before_clone,
                })
                .collect(),
        })
    }

    /// The session's user, whose snapshot triggers (like root's) always
    /// find room in the budget.
    pub(crate) fn with_snapshot_owner(mut self, uid: u32) -> Timeline {
        self.snapshot_budget.owner_uid = uid;
        self
    }

    /// `--max-disk` for the snapshots of a session that does not rotate.
    pub(crate) fn with_snapshot_disk(mut self, max_disk: Option<u64>) -> Timeline {
        if let Some(d) = max_disk {
            self.snapshot_budget.max_bytes = d;
        }
        self
    }

    /// Segmented output. Segments stream: a config without
    /// `write_into_file` is written every 5 s (its default period), so a
    /// STOP_TRACING flight recorder becomes an on-disk one whose disk budget
    /// keeps the newest segments until the trigger.
    pub(crate) fn with_rotation(mut self, policy: RotationPolicy) -> Timeline {
        if policy.rotates() {
            self.write_period
                .get_or_insert(Duration::from_millis(u64::from(DEFAULT_WRITE_PERIOD_MS)));
            self.rotation = Some(policy);
        }
        self
    }

    /// Whether the data counts before a trigger: a STOP_TRACING session
    /// writing segments streams from the start.
    pub(crate) fn streams_before_trigger(&self) -> bool {
        self.mode == TriggerMode::StopTracing && self.rotation.is_some()
    }

    /// A timeline with no triggers, no streaming and default cadences: the
    /// base that tests and benches adjust.
    #[cfg(test)]
    pub(crate) fn plain() -> Timeline {
        Timeline {
            duration: None,
            mode: TriggerMode::None,
            trigger_timeout: Duration::ZERO,
            rules: Vec::new(),
            write_period: None,
            stats_period: Duration::from_secs(10),
            flush: FlushCadence::AtStop,
            flush_timeout: Duration::from_secs(5),
            stop_timeout: Duration::from_secs(5),
            clear_period: None,
            deferred_start: false,
            rotation: None,
            snapshot_budget: SnapshotBudget {
                max_count: DEFAULT_MAX_SNAPSHOTS,
                max_bytes: DEFAULT_MAX_SNAPSHOT_BYTES,
                bytes_each: 0,
                owner_uid: 0,
            },
            sync_each_pass: false,
            clone: Vec::new(),
        }
    }
}

pub(crate) use crate::config::pattern::anchored;
