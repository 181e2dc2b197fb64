//! Tracing-session lifecycle decisions, kept pure: [`Session::on_event`]
//! takes an event and the time since the session began and returns the
//! actions to carry out. The event loop executes them; nothing here blocks,
//! reads a clock or touches a file, so every rule is unit-tested.
//!
//! States: waiting for a start trigger → recording → stopping → finished.
//! Trigger semantics follow Perfetto's service (facts §5.9–5.10):
//! - START_TRACING: idle until a listed trigger; then record for its
//!   `stop_delay_ms` (0: until stopped). `trigger_timeout_ms` first: end with
//!   nothing recorded.
//! - STOP_TRACING: record at once; the first matching trigger stops the
//!   session after its `stop_delay_ms`. `trigger_timeout_ms` first: the
//!   session ends and, as in Perfetto, the output stays empty.
//! - CLONE_SNAPSHOT: record at once; every matching trigger writes a
//!   snapshot after its `stop_delay_ms`; `trigger_timeout_ms` ends it.

use std::time::Duration;

/// How triggers drive the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TriggerMode {
    None,
    StartTracing,
    StopTracing,
    CloneSnapshot,
}

/// One trigger the config lists.
#[derive(Clone, Debug)]
pub struct TriggerRule {
    pub name: String,
    /// Pattern on the sending producer's name, compiled with [`anchored`].
    pub producer_regex: Option<regex::Regex>,
    pub stop_delay: Duration,
    /// 0: unlimited.
    pub max_per_24h: u32,
    pub skip_probability: f64,
}

/// The timing rules of one session, derived from its validated config.
#[derive(Clone, Debug)]
pub struct Timeline {
    /// `duration_ms`; `None` for "until stopped".
    pub duration: Option<Duration>,
    pub mode: TriggerMode,
    pub trigger_timeout: Duration,
    pub rules: Vec<TriggerRule>,
    /// The write period when streaming (`write_into_file`).
    pub write_period: Option<Duration>,
    /// How often a streaming session writes `trace_stats`, the sync marker and a clock snapshot.
    pub stats_period: Duration,
}

/// Where the session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    WaitingForTrigger,
    Recording,
    Stopping,
    Finished,
}

/// Why the session stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
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
    /// The output failed (the message names the error).
    OutputFailed(String),
    /// A data source failed.
    SourceFailed(String),
}

impl StopReason {
    /// Whether the final pass writes the buffers (a session that never got
    /// its trigger writes nothing, as Perfetto's does).
    pub fn writes_buffers(&self) -> bool {
        !matches!(
            self,
            StopReason::TriggerTimeout | StopReason::OutputFailed(_) | StopReason::SizeCap
        )
    }
}

/// Timers the session asks the event loop to keep. Setting one again moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Timer {
    /// `duration_ms`, or a trigger's stop delay.
    Stop,
    TriggerTimeout,
    /// A CLONE_SNAPSHOT trigger's delay; the number identifies the snapshot.
    Snapshot(u32),
}

/// Inputs to the session.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The session was configured; `now` is its time origin.
    Begin,
    TimerFired(Timer),
    /// A trigger arrived. `draw` is a uniform random number in [0, 1) for
    /// `skip_probability`; `matches_last_24h` is how many times this name
    /// was accepted in the last 24 hours (machine-wide).
    Trigger {
        name: String,
        producer: String,
        uid: u32,
        draw: f64,
        matches_last_24h: u32,
    },
    /// SIGINT or SIGTERM.
    Signal,
    /// `recorder stop`.
    StopRequest,
    SizeCapReached,
    OutputFailed(String),
    SourceFailed(String),
    /// Sources flushed (or the flush timed out) and stopped; the final pass ran.
    Finalized,
}

/// What the event loop must do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start the data sources and note `tracing_started`.
    StartSources,
    SetTimer(Timer, Duration),
    CancelTimer(Timer),
    /// Record an accepted trigger (a `trigger` packet, the 24 h history).
    AcceptTrigger {
        name: String,
        producer: String,
        uid: u32,
        stop_delay: Duration,
    },
    /// Write a snapshot of every buffer to the next `OUT.N` file.
    Snapshot(u32),
    /// Begin the stop sequence: flush sources (bounded by `flush_timeout_ms`)
    /// unless `skip_flush`, stop them, final write pass, fdatasync, close.
    /// Reply with [`Event::Finalized`].
    Finalize {
        reason: StopReason,
        skip_flush: bool,
    },
    /// Finalization was already under way and a second signal came: drop the
    /// source flush and finish with what is buffered.
    Hurry,
    /// The session is over.
    Exit(StopReason),
}

/// Why a trigger was not acted on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TriggerRefusal {
    NotListed,
    ProducerMismatch,
    Skipped,
    RateLimited,
    /// The session already acted on a trigger (STOP_TRACING takes only the
    /// first; START_TRACING only while waiting).
    AlreadyTriggered,
    /// The session is stopping or finished.
    NotRecording,
}

/// The lifecycle state machine.
#[derive(Debug)]
pub struct Session {
    timeline: Timeline,
    state: State,
    stop_reason: Option<StopReason>,
    triggered: bool,
    snapshots: u32,
    /// The trigger whose delayed stop is pending.
    stop_trigger_name: Option<String>,
    /// The outcome of the last trigger, for the control plane's reply.
    last_trigger: Option<Result<(), TriggerRefusal>>,
}

impl Session {
    pub fn new(timeline: Timeline) -> Self {
        Self {
            timeline,
            state: State::Recording,
            stop_reason: None,
            triggered: false,
            snapshots: 0,
            stop_trigger_name: None,
            last_trigger: None,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// Whether a trigger has been accepted.
    pub fn triggered(&self) -> bool {
        self.triggered
    }

    /// How many snapshots were started.
    pub fn snapshots(&self) -> u32 {
        self.snapshots
    }

    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.stop_reason.as_ref()
    }

    /// Whether the session still waits for the trigger that makes its data
    /// count: until then periodic write passes write nothing.
    pub fn waiting_for_trigger(&self) -> bool {
        match self.timeline.mode {
            TriggerMode::None => false,
            TriggerMode::StartTracing | TriggerMode::StopTracing => !self.triggered,
            // A clone-snapshot session's own output stays empty.
            TriggerMode::CloneSnapshot => true,
        }
    }

    /// The outcome of the most recent [`Event::Trigger`].
    pub fn last_trigger(&self) -> Option<&Result<(), TriggerRefusal>> {
        self.last_trigger.as_ref()
    }

    pub fn on_event(&mut self, ev: Event) -> Vec<Action> {
        match ev {
            Event::Begin => self.begin(),
            Event::TimerFired(t) => self.timer(t),
            Event::Trigger {
                name,
                producer,
                uid,
                draw,
                matches_last_24h,
            } => {
                let (res, actions) = self.trigger(name, producer, uid, draw, matches_last_24h);
                self.last_trigger = Some(res);
                actions
            }
            Event::Signal => match self.state {
                State::Stopping => vec![Action::Hurry],
                State::Finished => vec![],
                _ => self.stop(StopReason::Signal, false),
            },
            Event::StopRequest => self.stop(StopReason::StopRequested, false),
            Event::SizeCapReached => self.stop(StopReason::SizeCap, true),
            Event::OutputFailed(e) => self.stop(StopReason::OutputFailed(e), true),
            Event::SourceFailed(e) => self.stop(StopReason::SourceFailed(e), false),
            Event::Finalized => {
                self.state = State::Finished;
                let reason = self
                    .stop_reason
                    .clone()
                    .unwrap_or(StopReason::StopRequested);
                vec![Action::Exit(reason)]
            }
        }
    }

    fn begin(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        match self.timeline.mode {
            TriggerMode::StartTracing => {
                self.state = State::WaitingForTrigger;
                out.push(Action::SetTimer(
                    Timer::TriggerTimeout,
                    self.timeline.trigger_timeout,
                ));
            }
            TriggerMode::StopTracing | TriggerMode::CloneSnapshot => {
                self.state = State::Recording;
                out.push(Action::StartSources);
                out.push(Action::SetTimer(
                    Timer::TriggerTimeout,
                    self.timeline.trigger_timeout,
                ));
            }
            TriggerMode::None => {
                self.state = State::Recording;
                out.push(Action::StartSources);
                if let Some(d) = self.timeline.duration {
                    out.push(Action::SetTimer(Timer::Stop, d));
                }
            }
        }
        out
    }

    fn timer(&mut self, t: Timer) -> Vec<Action> {
        match (t, self.state) {
            (_, State::Stopping | State::Finished) => vec![],
            (Timer::Stop, _) => {
                let reason = if self.timeline.mode == TriggerMode::None {
                    StopReason::DurationElapsed
                } else {
                    let name = self.stop_trigger_name.take().unwrap_or_default();
                    StopReason::Trigger(name)
                };
                self.stop(reason, false)
            }
            (Timer::TriggerTimeout, State::WaitingForTrigger) => {
                self.stop(StopReason::TriggerTimeout, true)
            }
            (Timer::TriggerTimeout, _) => match self.timeline.mode {
                // STOP_TRACING: once a trigger arrived its delayed stop owns the session.
                TriggerMode::StopTracing if self.triggered => vec![],
                TriggerMode::StopTracing => self.stop(StopReason::TriggerTimeout, false),
                TriggerMode::CloneSnapshot => self.stop(StopReason::CloneTimeout, false),
                _ => vec![],
            },
            (Timer::Snapshot(n), _) => vec![Action::Snapshot(n)],
        }
    }

    fn trigger(
        &mut self,
        name: String,
        producer: String,
        uid: u32,
        draw: f64,
        matches_last_24h: u32,
    ) -> (Result<(), TriggerRefusal>, Vec<Action>) {
        let Some(rule) = self.timeline.rules.iter().find(|r| r.name == name) else {
            return (Err(TriggerRefusal::NotListed), vec![]);
        };
        if matches!(self.state, State::Stopping | State::Finished) {
            return (Err(TriggerRefusal::NotRecording), vec![]);
        }
        if let Some(re) = &rule.producer_regex
            && !full_match(re, &producer)
        {
            return (Err(TriggerRefusal::ProducerMismatch), vec![]);
        }
        if draw < rule.skip_probability {
            return (Err(TriggerRefusal::Skipped), vec![]);
        }
        if rule.max_per_24h > 0 && matches_last_24h >= rule.max_per_24h {
            return (Err(TriggerRefusal::RateLimited), vec![]);
        }
        let stop_delay = rule.stop_delay;
        let accept = Action::AcceptTrigger {
            name: name.clone(),
            producer,
            uid,
            stop_delay,
        };
        match self.timeline.mode {
            TriggerMode::StartTracing => {
                if self.state != State::WaitingForTrigger {
                    return (Err(TriggerRefusal::AlreadyTriggered), vec![]);
                }
                self.triggered = true;
                self.state = State::Recording;
                let mut out = vec![
                    accept,
                    Action::CancelTimer(Timer::TriggerTimeout),
                    Action::StartSources,
                ];
                if !stop_delay.is_zero() {
                    self.stop_trigger_name = Some(name);
                    out.push(Action::SetTimer(Timer::Stop, stop_delay));
                }
                (Ok(()), out)
            }
            TriggerMode::StopTracing => {
                if self.triggered {
                    return (Err(TriggerRefusal::AlreadyTriggered), vec![]);
                }
                self.triggered = true;
                if stop_delay.is_zero() {
                    let mut out = vec![accept];
                    out.extend(self.stop(StopReason::Trigger(name), false));
                    (Ok(()), out)
                } else {
                    self.stop_trigger_name = Some(name);
                    (
                        Ok(()),
                        vec![accept, Action::SetTimer(Timer::Stop, stop_delay)],
                    )
                }
            }
            TriggerMode::CloneSnapshot => {
                self.triggered = true;
                let n = self.snapshots;
                self.snapshots += 1;
                let act = if stop_delay.is_zero() {
                    Action::Snapshot(n)
                } else {
                    Action::SetTimer(Timer::Snapshot(n), stop_delay)
                };
                (Ok(()), vec![accept, act])
            }
            // Validation refuses triggers without a mode; be inert if it happens.
            TriggerMode::None => (Err(TriggerRefusal::NotListed), vec![]),
        }
    }

    fn stop(&mut self, reason: StopReason, skip_flush: bool) -> Vec<Action> {
        match self.state {
            State::Stopping | State::Finished => vec![],
            _ => {
                self.state = State::Stopping;
                self.stop_reason = Some(reason.clone());
                vec![Action::Finalize { reason, skip_flush }]
            }
        }
    }
}

/// Compiles `pattern` for whole-string matching, as Perfetto's producer
/// filters and trigger regexes match.
pub fn anchored(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
}

/// Whether an [`anchored`] pattern matches `s`.
fn full_match(re: &regex::Regex, s: &str) -> bool {
    re.is_match(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, delay_ms: u64) -> TriggerRule {
        TriggerRule {
            name: name.into(),
            producer_regex: None,
            stop_delay: Duration::from_millis(delay_ms),
            max_per_24h: 0,
            skip_probability: 0.0,
        }
    }

    fn timeline(mode: TriggerMode, rules: Vec<TriggerRule>) -> Timeline {
        Timeline {
            duration: None,
            mode,
            trigger_timeout: Duration::from_secs(60),
            rules,
            write_period: None,
            stats_period: Duration::from_secs(10),
        }
    }

    fn trig(name: &str) -> Event {
        Event::Trigger {
            name: name.into(),
            producer: "p".into(),
            uid: 0,
            draw: 0.5,
            matches_last_24h: 0,
        }
    }

    fn finalize_reason(a: &[Action]) -> Option<StopReason> {
        a.iter().find_map(|a| match a {
            Action::Finalize { reason, .. } => Some(reason.clone()),
            _ => None,
        })
    }

    #[test]
    fn plain_session_stops_after_duration() {
        let mut t = timeline(TriggerMode::None, vec![]);
        t.duration = Some(Duration::from_secs(2));
        let mut s = Session::new(t);
        let a = s.on_event(Event::Begin);
        assert_eq!(
            a,
            vec![
                Action::StartSources,
                Action::SetTimer(Timer::Stop, Duration::from_secs(2))
            ]
        );
        let a = s.on_event(Event::TimerFired(Timer::Stop));
        assert_eq!(finalize_reason(&a), Some(StopReason::DurationElapsed));
        assert_eq!(s.state(), State::Stopping);
        assert_eq!(
            s.on_event(Event::Finalized),
            vec![Action::Exit(StopReason::DurationElapsed)]
        );
    }

    #[test]
    fn second_signal_hurries() {
        let mut s = Session::new(timeline(TriggerMode::None, vec![]));
        s.on_event(Event::Begin);
        assert!(matches!(
            s.on_event(Event::Signal)[..],
            [Action::Finalize {
                skip_flush: false,
                ..
            }]
        ));
        assert_eq!(s.on_event(Event::Signal), vec![Action::Hurry]);
    }

    #[test]
    fn start_trigger_starts_then_stops_after_delay() {
        let mut s = Session::new(timeline(TriggerMode::StartTracing, vec![rule("go", 500)]));
        let a = s.on_event(Event::Begin);
        assert_eq!(
            a,
            vec![Action::SetTimer(
                Timer::TriggerTimeout,
                Duration::from_secs(60)
            )]
        );
        assert!(s.waiting_for_trigger());
        assert!(s.on_event(trig("other")).is_empty());
        assert_eq!(s.last_trigger(), Some(&Err(TriggerRefusal::NotListed)));
        let a = s.on_event(trig("go"));
        assert!(a.contains(&Action::StartSources));
        assert!(a.contains(&Action::SetTimer(Timer::Stop, Duration::from_millis(500))));
        assert!(!s.waiting_for_trigger());
        // A second trigger does nothing.
        assert!(s.on_event(trig("go")).is_empty());
        let a = s.on_event(Event::TimerFired(Timer::Stop));
        assert_eq!(finalize_reason(&a), Some(StopReason::Trigger("go".into())));
    }

    #[test]
    fn start_trigger_timeout_writes_nothing() {
        let mut s = Session::new(timeline(TriggerMode::StartTracing, vec![rule("go", 0)]));
        s.on_event(Event::Begin);
        let a = s.on_event(Event::TimerFired(Timer::TriggerTimeout));
        let r = finalize_reason(&a).expect("stops");
        assert_eq!(r, StopReason::TriggerTimeout);
        assert!(!r.writes_buffers());
        // A trigger after the timeout is refused.
        assert!(s.on_event(trig("go")).is_empty());
        assert_eq!(s.last_trigger(), Some(&Err(TriggerRefusal::NotRecording)));
    }

    #[test]
    fn stop_trigger_first_one_wins_and_timeout_is_then_ignored() {
        let mut s = Session::new(timeline(
            TriggerMode::StopTracing,
            vec![rule("a", 0), rule("b", 2000)],
        ));
        assert!(s.on_event(Event::Begin).contains(&Action::StartSources));
        assert!(s.waiting_for_trigger());
        let a = s.on_event(trig("b"));
        assert!(a.contains(&Action::SetTimer(Timer::Stop, Duration::from_millis(2000))));
        assert!(s.on_event(trig("a")).is_empty());
        assert_eq!(
            s.last_trigger(),
            Some(&Err(TriggerRefusal::AlreadyTriggered))
        );
        assert!(
            s.on_event(Event::TimerFired(Timer::TriggerTimeout))
                .is_empty()
        );
        let a = s.on_event(Event::TimerFired(Timer::Stop));
        assert_eq!(finalize_reason(&a), Some(StopReason::Trigger("b".into())));
    }

    #[test]
    fn stop_trigger_with_zero_delay_stops_at_once() {
        let mut s = Session::new(timeline(TriggerMode::StopTracing, vec![rule("a", 0)]));
        s.on_event(Event::Begin);
        let a = s.on_event(trig("a"));
        assert_eq!(finalize_reason(&a), Some(StopReason::Trigger("a".into())));
    }

    #[test]
    fn stop_trigger_timeout_without_trigger_writes_nothing() {
        let mut s = Session::new(timeline(TriggerMode::StopTracing, vec![rule("a", 0)]));
        s.on_event(Event::Begin);
        let r =
            finalize_reason(&s.on_event(Event::TimerFired(Timer::TriggerTimeout))).expect("stops");
        assert_eq!(r, StopReason::TriggerTimeout);
    }

    #[test]
    fn clone_snapshot_counts_snapshots() {
        let mut s = Session::new(timeline(
            TriggerMode::CloneSnapshot,
            vec![rule("snap", 0), rule("late", 100)],
        ));
        s.on_event(Event::Begin);
        assert!(s.on_event(trig("snap")).contains(&Action::Snapshot(0)));
        assert!(s.on_event(trig("late")).contains(&Action::SetTimer(
            Timer::Snapshot(1),
            Duration::from_millis(100)
        )));
        assert_eq!(
            s.on_event(Event::TimerFired(Timer::Snapshot(1))),
            vec![Action::Snapshot(1)]
        );
        assert_eq!(s.snapshots(), 2);
        let r = finalize_reason(&s.on_event(Event::TimerFired(Timer::TriggerTimeout)));
        assert_eq!(r, Some(StopReason::CloneTimeout));
    }

    #[test]
    fn rule_filters() {
        let mut r = rule("t", 0);
        r.producer_regex = Some(anchored("app.*").expect("valid"));
        r.skip_probability = 0.3;
        r.max_per_24h = 2;
        let mut s = Session::new(timeline(TriggerMode::StopTracing, vec![r]));
        s.on_event(Event::Begin);
        let mk = |producer: &str, draw: f64, n: u32| Event::Trigger {
            name: "t".into(),
            producer: producer.into(),
            uid: 1000,
            draw,
            matches_last_24h: n,
        };
        s.on_event(mk("xapp", 0.9, 0));
        assert_eq!(
            s.last_trigger(),
            Some(&Err(TriggerRefusal::ProducerMismatch))
        );
        s.on_event(mk("app1", 0.1, 0));
        assert_eq!(s.last_trigger(), Some(&Err(TriggerRefusal::Skipped)));
        s.on_event(mk("app1", 0.9, 2));
        assert_eq!(s.last_trigger(), Some(&Err(TriggerRefusal::RateLimited)));
        let a = s.on_event(mk("app1", 0.9, 1));
        assert_eq!(s.last_trigger(), Some(&Ok(())));
        assert!(matches!(&a[0], Action::AcceptTrigger { uid: 1000, .. }));
    }
}
