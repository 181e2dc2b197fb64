//! Tracing-session lifecycle decisions, kept pure: [`Session::on_event`]
//! takes an event and the time since the session's origin and returns the
//! actions to carry out. The event loop executes them and reports their
//! results back as events; nothing here blocks, reads a clock or touches a
//! file, so every rule is unit-tested (`tests.rs`).
//!
//! States: (deferred) → (waiting for a start trigger) → recording →
//! stopping → finished. Trigger semantics follow Perfetto's service (ARCHITECTURE.md
//! §8.7–8.8):
//! - START_TRACING: idle until a listed trigger; then record for its
//!   `stop_delay_ms` (0: until stopped). `trigger_timeout_ms` first: end with
//!   nothing recorded.
//! - STOP_TRACING: record at once; the first matching trigger stops the
//!   session after its `stop_delay_ms`. `trigger_timeout_ms` first: the
//!   session ends and, as in Perfetto, the output stays empty.
//! - CLONE_SNAPSHOT: record at once; every matching trigger writes a
//!   snapshot after its `stop_delay_ms`; `trigger_timeout_ms` ends it.
//!
//! Periodic work while recording, each on its own timer aligned to
//! wall-clock multiples of its period (ARCHITECTURE.md §8.3): write passes
//! (`write_into_file`), the stats tick, flushes, incremental-state clears.
//!
//! The stop sequence (ARCHITECTURE.md §8.7): flush the sources (bounded by
//! `flush_timeout_ms`; skipped by a second signal or when the output is
//! gone), stop them (bounded by `data_source_stop_timeout_ms`), note
//! `tracing_disabled`, run the final pass (or only fdatasync when nothing may
//! be written), exit.

use std::collections::BTreeMap;
use std::time::Duration;

mod event;
#[cfg(test)]
mod tests;
mod timeline;

pub(crate) use event::{
    AcceptedTrigger, Action, Answer, CloneRefusal, Event, FlushId, Pass, RequestId, RotateRefusal,
    SegmentFill, SourceFailure, SourcePhase, StartRefusal, StopReason, Timer, TriggerArrival,
    TriggerName, TriggerRefusal,
};
pub(crate) use timeline::{FlushCadence, Timeline, TimelineError, TriggerMode, anchored};
// What the unit tests build timelines from.
#[cfg(test)]
pub(crate) use timeline::{CloneRule, SnapshotBudget, TriggerRule};

use crate::storage::segment::policy::{RotateReason, rotation_due};
use crate::storage::write_pass::Take;

/// How long producers' start acks are awaited before the session notes the
/// slow ones (Perfetto's `kAllDataSourceStartedTimeout`, not configurable;
/// ARCHITECTURE.md §9.8). The session records meanwhile: nothing waits on it.
pub(crate) const ALL_STARTED_TIMEOUT: Duration = Duration::from_secs(20);
use crate::trace::service::ServiceEvent;

/// Where the session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// `deferred_start`: configured, waiting for `recorder start`.
    Deferred,
    /// START_TRACING: waiting for the trigger that starts the sources.
    WaitingForTrigger,
    Recording,
    Stopping,
    Finished,
}

/// Why a flush was asked for: what follows its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlushPurpose {
    Periodic,
    BeforePass,
    Snapshot(u32),
    Stop,
    /// A consumer's Flush, answered when it ends.
    Request(RequestId),
    /// A consumer's clone, written when the flush ends.
    Clone(RequestId),
}

/// Where the stop sequence is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopPhase {
    Flushing(FlushId),
    StoppingSources,
    FinalPass,
    /// No final pass: the output's fdatasync, whose failure is the exit's.
    FinalSync,
}

/// The lifecycle state machine.
#[derive(Debug)]
pub(crate) struct Session {
    timeline: Timeline,
    state: State,
    /// Wall clock (ms) at the origin, from [`Event::Begin`].
    wall_origin_ms: u64,
    stop_reason: Option<StopReason>,
    phase: Option<StopPhase>,
    triggered: bool,
    /// The sources were started (a deferred session may never be).
    started: bool,
    /// `all_data_sources_started` was noted.
    all_started: bool,
    snapshots: u32,
    /// The snapshot accepted and not yet handed to the writer.
    snapshot_pending: Option<u32>,
    /// Triggers refused by the snapshot budget or a snapshot under way.
    snapshots_refused: u64,
    /// Snapshots taken by each uid other than root and the session's user.
    snapshots_by_uid: BTreeMap<u32, u32>,
    /// The trigger whose delayed stop is pending.
    stop_trigger_name: Option<String>,
    flushes: BTreeMap<FlushId, FlushPurpose>,
    next_flush: u64,
    flush_counts: FlushCounts,
    /// Drain requests waiting for their write pass.
    drains: Vec<RequestId>,
    /// Rotation requests waiting for their write pass.
    rotations: Vec<RequestId>,
}

/// The flushes asked of the data sources so far, as `trace_stats` reports
/// them (ARCHITECTURE.md §8.6). Every flush requested ends as exactly one of
/// succeeded (all acked in time) or failed (timed out, or cut short by the
/// stop or a second signal), so once none is pending `requested =
/// succeeded + failed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FlushCounts {
    pub requested: u64,
    pub succeeded: u64,
    pub failed: u64,
}

impl Session {
    pub(crate) fn new(timeline: Timeline) -> Self {
        Self {
            timeline,
            state: State::Deferred,
            wall_origin_ms: 0,
            stop_reason: None,
            phase: None,
            triggered: false,
            started: false,
            all_started: false,
            snapshots: 0,
            snapshot_pending: None,
            snapshots_refused: 0,
            snapshots_by_uid: BTreeMap::new(),
            stop_trigger_name: None,
            flushes: BTreeMap::new(),
            next_flush: 0,
            flush_counts: FlushCounts::default(),
            drains: Vec::new(),
            rotations: Vec::new(),
        }
    }

    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// The flushes so far, for `trace_stats`.
    pub(crate) fn flush_counts(&self) -> FlushCounts {
        self.flush_counts
    }

    pub(crate) fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// Whether a trigger has been accepted.
    pub(crate) fn triggered(&self) -> bool {
        self.triggered
    }

    /// CLONE_SNAPSHOT triggers refused (budget spent, or one under way).
    pub(crate) fn snapshots_refused(&self) -> u64 {
        self.snapshots_refused
    }

    /// Whether the session still waits for what makes its data count (a
    /// trigger, or `recorder start`): until then nothing is written, not even
    /// the recorder's own packets (ARCHITECTURE.md §8.8).
    pub(crate) fn waiting_for_trigger(&self) -> bool {
        if self.timeline.deferred_start && !self.started {
            return true;
        }
        match self.timeline.mode {
            TriggerMode::None => false,
            TriggerMode::StopTracing if self.timeline.streams_before_trigger() => false,
            TriggerMode::StartTracing | TriggerMode::StopTracing => !self.triggered,
            // A clone-snapshot session's own output stays empty.
            TriggerMode::CloneSnapshot => true,
        }
    }

    /// The session's decision on `ev`, which happened `now` after the origin.
    pub(crate) fn on_event(&mut self, ev: Event, now: Duration) -> Vec<Action> {
        match ev {
            Event::Begin { wall_ms } => {
                self.wall_origin_ms = wall_ms;
                if self.timeline.deferred_start {
                    Vec::new()
                } else {
                    self.begin(now)
                }
            }
            Event::StartRequest(req) => {
                let (res, mut out) = match self.state {
                    State::Deferred => (Ok(()), self.begin(now)),
                    State::Stopping | State::Finished => (Err(StartRefusal::NotRecording), vec![]),
                    _ => (Err(StartRefusal::AlreadyStarted), vec![]),
                };
                out.insert(0, Action::Reply(req, Answer::Started(res)));
                out
            }
            Event::TimerFired(t) => self.timer(t, now),
            Event::Triggers(arrival) => self.triggers(arrival, now),
            Event::Signal => match self.phase {
                // A second signal: finish with what is buffered.
                Some(StopPhase::Flushing(id)) => {
                    if self.flushes.remove(&id).is_some() {
                        self.flush_counts.failed += 1;
                    }
                    let mut out = vec![Action::CancelTimer(Timer::FlushDeadline(id))];
                    out.extend(self.stop_sources(now));
                    out
                }
                Some(_) => Vec::new(),
                None => self.stop(StopReason::Signal, false, now),
            },
            Event::StopRequest(req) => {
                let mut out = vec![Action::Reply(req, Answer::Stopping)];
                out.extend(self.stop(StopReason::StopRequested, false, now));
                out
            }
            Event::FlushRequest(req) => {
                if self.state == State::Recording {
                    self.flush(FlushPurpose::Request(req), now)
                } else {
                    // Nothing records: there is nothing to flush.
                    vec![Action::Reply(req, Answer::Flushed(false))]
                }
            }
            Event::CloneRequest(req) => {
                if self.state != State::Recording {
                    vec![Action::Reply(
                        req,
                        Answer::NotCloned(CloneRefusal::NotRecording),
                    )]
                } else if self.timeline.write_period.is_some() {
                    vec![Action::Reply(
                        req,
                        Answer::NotCloned(CloneRefusal::WritesIntoFile),
                    )]
                } else {
                    let mut out = vec![Action::PrepareClone {
                        clear: self.clone_clears(),
                    }];
                    out.extend(self.flush(FlushPurpose::Clone(req), now));
                    out
                }
            }
            Event::DrainRequest(req) => {
                if self.state == State::Recording && !self.waiting_for_trigger() {
                    self.drains.push(req);
                    vec![self.periodic_pass()]
                } else {
                    // Nothing may be written yet, or the final pass writes
                    // the rest.
                    vec![Action::Reply(req, Answer::Drained)]
                }
            }
            Event::RotateRequest(req) => {
                if self.timeline.rotation.is_none() {
                    vec![Action::Reply(
                        req,
                        Answer::Rotated(Err(RotateRefusal::NotSegmented)),
                    )]
                } else if self.state != State::Recording || self.waiting_for_trigger() {
                    vec![Action::Reply(
                        req,
                        Answer::Rotated(Err(RotateRefusal::NotRecording)),
                    )]
                } else {
                    // The segment closes with everything recorded so far.
                    self.rotations.push(req);
                    vec![self.periodic_pass()]
                }
            }
            Event::SourcesFlushed { id, complete } => {
                let mut out = vec![Action::CancelTimer(Timer::FlushDeadline(id))];
                out.extend(self.flushed(id, complete, now));
                out
            }
            Event::SourcesStarted => {
                if !self.started || self.all_started || self.state != State::Recording {
                    return Vec::new();
                }
                self.all_started = true;
                vec![
                    Action::CancelTimer(Timer::StartDeadline),
                    Action::Service(ServiceEvent::AllDataSourcesStarted),
                ]
            }
            Event::SourcesStopped => match self.phase {
                Some(StopPhase::StoppingSources) => {
                    let mut out = vec![Action::CancelTimer(Timer::StopDeadline)];
                    out.extend(self.final_output());
                    out
                }
                _ => Vec::new(),
            },
            Event::PassWritten {
                cap_reached,
                segment,
            } => {
                let mut out = self.answer_drains();
                out.extend(match self.phase {
                    Some(StopPhase::FinalPass) => self.finish(),
                    None if cap_reached => self.stop(StopReason::SizeCap, true, now),
                    None if !self.rotations.is_empty() => self.rotate_requested(),
                    None => self.rotate_if_due(segment),
                    _ => Vec::new(),
                });
                out
            }
            Event::OutputSynced => match self.phase {
                Some(StopPhase::FinalSync) => self.finish(),
                _ => Vec::new(),
            },
            Event::OutputFailed(e) => match self.phase {
                Some(StopPhase::FinalPass | StopPhase::FinalSync) => {
                    self.stop_reason = Some(StopReason::OutputFailed(e));
                    self.finish()
                }
                _ => self.stop(StopReason::OutputFailed(e), true, now),
            },
            Event::SourceFailed(e) => self.stop(StopReason::SourceFailed(e), false, now),
        }
    }

    /// The session starts: sources now, or a wait for the start trigger.
    fn begin(&mut self, now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        match self.timeline.mode {
            TriggerMode::StartTracing => {
                self.state = State::WaitingForTrigger;
                out.push(Action::SetTimer(
                    Timer::TriggerTimeout,
                    now + self.timeline.trigger_timeout,
                ));
            }
            TriggerMode::StopTracing | TriggerMode::CloneSnapshot => {
                out.push(Action::SetTimer(
                    Timer::TriggerTimeout,
                    now + self.timeline.trigger_timeout,
                ));
                out.extend(self.start_sources(now));
            }
            TriggerMode::None => {
                if let Some(d) = self.timeline.duration {
                    out.push(Action::SetTimer(Timer::Stop, now + d));
                }
                out.extend(self.start_sources(now));
            }
        }
        out
    }

    /// Starts the sources and the periodic work that goes with recording.
    fn start_sources(&mut self, now: Duration) -> Vec<Action> {
        self.state = State::Recording;
        self.started = true;
        let mut out = vec![
            Action::StartSources,
            Action::SetTimer(Timer::StartDeadline, now + ALL_STARTED_TIMEOUT),
        ];
        let t = &self.timeline;
        let cadences = [
            (Timer::WritePass, t.write_period),
            (Timer::Stats, Some(t.stats_period)),
            (
                Timer::Flush,
                match t.flush {
                    FlushCadence::Periodic(p) => Some(p),
                    _ => None,
                },
            ),
            (Timer::ClearIncrementalState, t.clear_period),
        ];
        for (timer, period) in cadences {
            if let Some(p) = period {
                out.push(Action::SetTimer(timer, self.next_multiple(p, now)));
            }
        }
        out
    }

    /// The next wall-clock multiple of `period` after `now` (since the origin).
    fn next_multiple(&self, period: Duration, now: Duration) -> Duration {
        let period_ms = (period.as_millis() as u64).max(1);
        let wall = self.wall_origin_ms + now.as_millis() as u64;
        now + Duration::from_millis(period_ms - wall % period_ms)
    }

    fn timer(&mut self, t: Timer, now: Duration) -> Vec<Action> {
        match t {
            Timer::FlushDeadline(id) => return self.flushed(id, false, now),
            Timer::StopDeadline => {
                return match self.phase {
                    Some(StopPhase::StoppingSources) => self.final_output(),
                    _ => Vec::new(),
                };
            }
            _ => {}
        }
        if matches!(self.state, State::Stopping | State::Finished) {
            return Vec::new();
        }
        match t {
            Timer::Stop => {
                let reason = if self.timeline.mode == TriggerMode::None {
                    StopReason::DurationElapsed
                } else {
                    StopReason::Trigger(self.stop_trigger_name.take().unwrap_or_default())
                };
                self.stop(reason, false, now)
            }
            Timer::TriggerTimeout => match (self.state, self.timeline.mode) {
                (State::WaitingForTrigger, _) => self.stop(StopReason::TriggerTimeout, true, now),
                // STOP_TRACING: once a trigger arrived its delayed stop owns the session.
                (_, TriggerMode::StopTracing) if self.triggered => Vec::new(),
                (_, TriggerMode::StopTracing) => self.stop(StopReason::TriggerTimeout, false, now),
                (_, TriggerMode::CloneSnapshot) => self.stop(StopReason::CloneTimeout, false, now),
                _ => Vec::new(),
            },
            Timer::Snapshot(n) => self.begin_snapshot(n, now),
            // Some producer has not acknowledged its start: say which; the
            // session goes on (a later ack still notes all started).
            Timer::StartDeadline if !self.all_started => vec![Action::NoteSlowStart],
            Timer::StartDeadline => Vec::new(),
            Timer::WritePass => self.periodic(t, self.timeline.write_period, now, |s, now| {
                if s.waiting_for_trigger() {
                    Vec::new()
                } else if s.timeline.flush == FlushCadence::BeforeEachWritePass {
                    s.flush(FlushPurpose::BeforePass, now)
                } else {
                    vec![s.periodic_pass()]
                }
            }),
            Timer::Stats => {
                let period = Some(self.timeline.stats_period);
                self.periodic(t, period, now, |_, _| vec![Action::StatsTick])
            }
            Timer::Flush => {
                let period = match self.timeline.flush {
                    FlushCadence::Periodic(p) => Some(p),
                    _ => None,
                };
                self.periodic(t, period, now, |s, now| {
                    s.flush(FlushPurpose::Periodic, now)
                })
            }
            Timer::ClearIncrementalState => {
                let period = self.timeline.clear_period;
                self.periodic(t, period, now, |_, _| vec![Action::ClearIncrementalState])
            }
            Timer::FlushDeadline(_) | Timer::StopDeadline => Vec::new(),
        }
    }

    /// A periodic timer fired: schedule the next one, then do `work` if the
    /// session records.
    fn periodic(
        &mut self,
        timer: Timer,
        period: Option<Duration>,
        now: Duration,
        work: impl FnOnce(&mut Self, Duration) -> Vec<Action>,
    ) -> Vec<Action> {
        let Some(period) = period else {
            return Vec::new();
        };
        let mut out = vec![Action::SetTimer(timer, self.next_multiple(period, now))];
        if self.state == State::Recording {
            out.extend(work(self, now));
        }
        out
    }

    /// Asks the sources to flush, for `purpose`.
    fn flush(&mut self, purpose: FlushPurpose, now: Duration) -> Vec<Action> {
        let id = FlushId(self.next_flush);
        self.next_flush += 1;
        self.flushes.insert(id, purpose);
        self.flush_counts.requested += 1;
        let timeout = self.timeline.flush_timeout;
        vec![
            Action::SetTimer(Timer::FlushDeadline(id), now + timeout),
            Action::FlushSources {
                id,
                timeout,
                for_stop: purpose == FlushPurpose::Stop,
            },
        ]
    }

    /// Flush `id` ended (acknowledged by all when `complete`, else timed out).
    fn flushed(&mut self, id: FlushId, complete: bool, now: Duration) -> Vec<Action> {
        let Some(purpose) = self.flushes.remove(&id) else {
            return Vec::new();
        };
        if complete {
            self.flush_counts.succeeded += 1;
        } else {
            self.flush_counts.failed += 1;
        }
        // Whether acked or timed out, the flush ends by reading what the
        // producers left in their chunks (ARCHITECTURE.md §9.7).
        let mut out = vec![Action::ScrapeProducers];
        // Perfetto's readers release sorted data at this marker: only a
        // complete flush may claim it (ARCHITECTURE.md §6).
        if complete && purpose != FlushPurpose::Stop && self.state == State::Recording {
            out.push(Action::Service(ServiceEvent::AllDataSourcesFlushed));
        }
        match purpose {
            FlushPurpose::Periodic => {}
            FlushPurpose::Request(req) => out.push(Action::Reply(req, Answer::Flushed(complete))),
            // A clone holds what the flush brought, acked or not (as traced).
            FlushPurpose::Clone(req) => out.push(if self.state == State::Recording {
                Action::CloneInto {
                    id: req,
                    takes: self.clone_takes(),
                }
            } else {
                Action::Reply(req, Answer::NotCloned(CloneRefusal::NotRecording))
            }),
            FlushPurpose::BeforePass => {
                if self.state == State::Recording && !self.waiting_for_trigger() {
                    out.push(self.periodic_pass());
                }
            }
            FlushPurpose::Snapshot(n) => {
                if self.snapshot_pending == Some(n) {
                    self.snapshot_pending = None;
                }
                if self.state == State::Recording {
                    out.push(Action::Snapshot {
                        n,
                        takes: self.clone_takes(),
                    });
                }
            }
            FlushPurpose::Stop => {
                if self.phase == Some(StopPhase::Flushing(id)) {
                    if complete {
                        out.push(Action::Service(ServiceEvent::AllDataSourcesFlushed));
                    }
                    out.extend(self.stop_sources(now));
                }
            }
        }
        out
    }

    fn begin_snapshot(&mut self, n: u32, now: Duration) -> Vec<Action> {
        let mut out = vec![Action::PrepareSnapshot {
            n,
            clear: self.clone_clears(),
        }];
        out.extend(self.flush(FlushPurpose::Snapshot(n), now));
        out
    }

    /// How a copy of the buffers takes each one (`transfer_on_clone`
    /// consumes, the rest are copied), in buffer order.
    fn clone_takes(&self) -> Vec<Take> {
        self.timeline.clone.iter().map(|c| c.take()).collect()
    }

    /// The buffers a copy empties before its flush (`clear_before_clone`).
    fn clone_clears(&self) -> Vec<usize> {
        (self.timeline.clone.iter().enumerate())
            .filter(|(_, c)| c.clear_first)
            .map(|(i, _)| i)
            .collect()
    }

    /// A streaming pass, synced when the config asks for it after each.
    fn periodic_pass(&self) -> Action {
        Action::WritePass {
            pass: Pass::Periodic,
            sync: self.timeline.sync_each_pass,
        }
    }

    fn triggers(&mut self, arrival: TriggerArrival, now: Duration) -> Vec<Action> {
        let TriggerArrival {
            request,
            producer,
            uid,
            names,
            at_ns,
        } = arrival;
        let mut out = Vec::new();
        let mut outcomes = Vec::with_capacity(names.len());
        for t in names {
            let res = self.trigger(&t, &producer, uid, at_ns, now, &mut out);
            outcomes.push((t.name, res));
        }
        if let Some(req) = request {
            out.push(Action::Reply(req, Answer::Triggers(outcomes)));
        }
        out
    }

    /// One trigger name: the refusal, or the actions it causes (into `out`).
    fn trigger(
        &mut self,
        t: &TriggerName,
        producer: &str,
        uid: u32,
        at_ns: Option<u64>,
        now: Duration,
        out: &mut Vec<Action>,
    ) -> Result<(), TriggerRefusal> {
        let Some(rule) = self.timeline.rules.iter().find(|r| r.name == t.name) else {
            return Err(TriggerRefusal::NotListed);
        };
        if matches!(
            self.state,
            State::Stopping | State::Finished | State::Deferred
        ) {
            return Err(TriggerRefusal::NotRecording);
        }
        if let Some(re) = &rule.producer_regex
            && !re.is_match(producer)
        {
            return Err(TriggerRefusal::ProducerMismatch);
        }
        if t.draw < rule.skip_probability {
            return Err(TriggerRefusal::Skipped);
        }
        if rule.max_per_24h > 0 && t.matches_last_24h >= rule.max_per_24h {
            return Err(TriggerRefusal::RateLimited);
        }
        let stop_delay = rule.stop_delay;
        let mut accept = AcceptedTrigger {
            name: t.name.clone(),
            producer: producer.to_string(),
            uid,
            stop_delay,
            snapshot: None,
            at_ns,
        };
        match self.timeline.mode {
            TriggerMode::StartTracing => {
                if self.state != State::WaitingForTrigger {
                    return Err(TriggerRefusal::AlreadyTriggered);
                }
                self.triggered = true;
                out.push(Action::AcceptTrigger(accept));
                out.push(Action::CancelTimer(Timer::TriggerTimeout));
                out.extend(self.start_sources(now));
                if !stop_delay.is_zero() {
                    self.stop_trigger_name = Some(t.name.clone());
                    out.push(Action::SetTimer(Timer::Stop, now + stop_delay));
                }
            }
            TriggerMode::StopTracing => {
                if self.triggered {
                    return Err(TriggerRefusal::AlreadyTriggered);
                }
                self.triggered = true;
                out.push(Action::AcceptTrigger(accept));
                if stop_delay.is_zero() {
                    out.extend(self.stop(StopReason::Trigger(t.name.clone()), false, now));
                } else {
                    self.stop_trigger_name = Some(t.name.clone());
                    out.push(Action::SetTimer(Timer::Stop, now + stop_delay));
                }
            }
            TriggerMode::CloneSnapshot => {
                // A burst of triggers makes one snapshot, and the budget
                // bounds them all: each pins the ring while it is written.
                if self.snapshot_pending.is_some() {
                    self.snapshots_refused += 1;
                    return Err(TriggerRefusal::SnapshotInProgress);
                }
                let budget = self.timeline.snapshot_budget;
                if !budget.allows(self.snapshots) {
                    self.snapshots_refused += 1;
                    return Err(TriggerRefusal::SnapshotBudget);
                }
                // A fair share per uid: one uid's flood takes its share, not
                // the budget; root and the session's user keep a reserve.
                if !budget.privileged(uid) {
                    let by_others: u32 = self.snapshots_by_uid.values().sum();
                    let mine = self.snapshots_by_uid.get(&uid).copied().unwrap_or(0);
                    if by_others >= budget.total() - budget.reserved() || mine >= budget.share() {
                        self.snapshots_refused += 1;
                        return Err(TriggerRefusal::SnapshotShare);
                    }
                    *self.snapshots_by_uid.entry(uid).or_default() += 1;
                }
                self.triggered = true;
                let n = self.snapshots;
                self.snapshot_pending = Some(n);
                self.snapshots += 1;
                accept.snapshot = Some(n);
                out.push(Action::AcceptTrigger(accept));
                if stop_delay.is_zero() {
                    out.extend(self.begin_snapshot(n, now));
                } else {
                    out.push(Action::SetTimer(Timer::Snapshot(n), now + stop_delay));
                }
            }
            // Validation refuses triggers without a mode; be inert if it happens.
            TriggerMode::None => return Err(TriggerRefusal::NotListed),
        }
        Ok(())
    }

    /// After a periodic pass: cut the segment when the policy says so; the
    /// sources then write their context again into the new one.
    fn rotate_if_due(&mut self, segment: Option<SegmentFill>) -> Vec<Action> {
        let (Some(policy), Some(fill), State::Recording) =
            (&self.timeline.rotation, segment, self.state)
        else {
            return Vec::new();
        };
        match rotation_due(policy, fill.bytes, fill.age) {
            Some(reason) => vec![Action::Rotate(reason), Action::ClearIncrementalState],
            None => Vec::new(),
        }
    }

    /// The requested rotations: the pass just written closes the segment.
    fn rotate_requested(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        if self.state == State::Recording {
            out.push(Action::Rotate(RotateReason::Requested));
            out.push(Action::ClearIncrementalState);
        }
        let answer = if self.state == State::Recording {
            Ok(())
        } else {
            Err(RotateRefusal::NotRecording)
        };
        out.extend(
            self.rotations
                .drain(..)
                .map(|req| Action::Reply(req, Answer::Rotated(answer))),
        );
        out
    }

    /// Begins the stop sequence (once).
    fn stop(&mut self, reason: StopReason, skip_flush: bool, now: Duration) -> Vec<Action> {
        if matches!(self.state, State::Stopping | State::Finished) {
            return Vec::new();
        }
        self.state = State::Stopping;
        self.stop_reason = Some(reason);
        // Flushes still under way no longer lead anywhere.
        let mut out = vec![Action::AnnounceStop];
        // The stop's final pass ends the segment: no rotation follows.
        out.extend(
            self.rotations
                .drain(..)
                .map(|req| Action::Reply(req, Answer::Rotated(Err(RotateRefusal::NotRecording)))),
        );
        let cut_short = std::mem::take(&mut self.flushes);
        self.flush_counts.failed += cut_short.len() as u64;
        for (id, purpose) in cut_short {
            out.push(Action::CancelTimer(Timer::FlushDeadline(id)));
            // A consumer waiting for its flush hears that it was cut short.
            match purpose {
                FlushPurpose::Request(req) => {
                    out.push(Action::Reply(req, Answer::Flushed(false)));
                }
                FlushPurpose::Clone(req) => out.push(Action::Reply(
                    req,
                    Answer::NotCloned(CloneRefusal::NotRecording),
                )),
                _ => {}
            }
        }
        // Sources that never started have nothing to flush.
        if skip_flush || !self.started {
            out.extend(self.stop_sources(now));
        } else {
            let id = FlushId(self.next_flush);
            self.phase = Some(StopPhase::Flushing(id));
            out.extend(self.flush(FlushPurpose::Stop, now));
        }
        out
    }

    fn stop_sources(&mut self, now: Duration) -> Vec<Action> {
        self.phase = Some(StopPhase::StoppingSources);
        vec![
            Action::SetTimer(Timer::StopDeadline, now + self.timeline.stop_timeout),
            Action::StopSources,
        ]
    }

    /// Sources are stopped: the final pass, or only a sync when nothing may
    /// be written.
    fn final_output(&mut self) -> Vec<Action> {
        let mut out = vec![Action::Service(ServiceEvent::TracingDisabled)];
        let reason = self
            .stop_reason
            .clone()
            .unwrap_or(StopReason::StopRequested);
        // A streaming STOP_TRACING session keeps what it wrote when no
        // trigger came; otherwise an untriggered session writes nothing.
        let writes = match reason {
            StopReason::TriggerTimeout => self.timeline.streams_before_trigger(),
            _ => reason.writes_buffers() && !self.waiting_for_trigger(),
        };
        if writes {
            self.phase = Some(StopPhase::FinalPass);
            // The stopped producers' open chunks, before the last pass.
            out.insert(0, Action::ScrapeProducers);
            // The final pass always reaches the disk.
            out.push(Action::WritePass {
                pass: Pass::Final,
                sync: true,
            });
            return out;
        }
        if !matches!(reason, StopReason::OutputFailed(_)) {
            // What was written must reach the disk; a failure there fails
            // the session (ARCHITECTURE.md §5.2).
            self.phase = Some(StopPhase::FinalSync);
            out.push(Action::SyncOutput);
            return out;
        }
        out.extend(self.finish());
        out
    }

    fn finish(&mut self) -> Vec<Action> {
        self.state = State::Finished;
        self.phase = None;
        let reason = self
            .stop_reason
            .clone()
            .unwrap_or(StopReason::StopRequested);
        let failed = matches!(reason, StopReason::OutputFailed(_));
        let mut out = self.answer_drains();
        out.extend([Action::CloseOutput { failed }, Action::Exit(reason)]);
        out
    }

    /// Drain requests are answered by the next pass (or the end).
    fn answer_drains(&mut self) -> Vec<Action> {
        self.drains
            .drain(..)
            .map(|req| Action::Reply(req, Answer::Drained))
            .collect()
    }
}
