//! The session's decisions, event sequence by event sequence.

use super::*;
use crate::storage::write_pass::{PassError, PassFailure, Take};
use crate::storage::{OutputError, SinkError};

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// The last write pass of a stop, synced.
const FINAL_PASS: Action = Action::WritePass {
    pass: Pass::Final,
    sync: true,
};

/// A write pass on the periodic timer, not synced.
const PERIODIC_PASS: Action = Action::WritePass {
    pass: Pass::Periodic,
    sync: false,
};

/// A pass written outside any segment, which reached the size cap or not.
fn written(cap_reached: bool) -> Event {
    Event::PassWritten {
        cap_reached,
        segment: None,
    }
}

fn rule(name: &str, delay_ms: u64) -> TriggerRule {
    TriggerRule {
        name: name.into(),
        producer_regex: None,
        stop_delay: ms(delay_ms),
        max_per_24h: 0,
        skip_probability: 0.0,
    }
}

fn timeline(mode: TriggerMode, rules: Vec<TriggerRule>) -> Timeline {
    Timeline {
        mode,
        trigger_timeout: Duration::from_secs(60),
        rules,
        ..Timeline::plain()
    }
}

/// A session begun at wall clock 0 and time 0 (its first actions dropped).
fn begun(t: Timeline) -> Session {
    let mut s = Session::new(t);
    s.on_event(Event::Begin { wall_ms: 0 }, ms(0));
    s
}

fn trig(name: &str) -> Event {
    Event::Triggers(TriggerArrival {
        request: None,
        producer: "p".into(),
        uid: 0,
        names: vec![TriggerName {
            name: name.into(),
            draw: 0.5,
            matches_last_24h: 0,
        }],
        at_ns: None,
    })
}

/// The outcome the session replied for a one-name trigger request.
fn outcome(s: &mut Session, name: &str, now: u64) -> (Result<(), TriggerRefusal>, Vec<Action>) {
    let Event::Triggers(mut a) = trig(name) else {
        unreachable!()
    };
    a.request = Some(RequestId(7));
    let actions = s.on_event(Event::Triggers(a), ms(now));
    let res = actions.iter().find_map(|a| match a {
        Action::Reply(RequestId(7), Answer::Triggers(o)) => Some(o[0].1),
        _ => None,
    });
    (res.expect("a reply"), actions)
}

/// A pass that failed with `e`, having kept nothing of its 10 bytes.
fn failed(e: SinkError) -> OutputError {
    OutputError::Pass(PassError {
        source: PassFailure::Sink(e),
        kept_bytes: 0,
        unwritten_bytes: 10,
    })
}

fn flush_id(a: &[Action]) -> Option<FlushId> {
    a.iter().find_map(|a| match a {
        Action::FlushSources { id, .. } => Some(*id),
        _ => None,
    })
}

fn exit_reason(a: &[Action]) -> Option<StopReason> {
    a.iter().find_map(|a| match a {
        Action::Exit(r) => Some(r.clone()),
        _ => None,
    })
}

/// Drives a begun stop sequence to its end with every step succeeding;
/// returns every action taken on the way.
fn finish_stop(s: &mut Session, first: Vec<Action>, now: u64) -> Vec<Action> {
    let mut all = first.clone();
    let mut last = first;
    for _ in 0..6 {
        let next = if let Some(id) = flush_id(&last) {
            Event::SourcesFlushed { id, complete: true }
        } else if last.contains(&Action::StopSources) {
            Event::SourcesStopped
        } else if last.contains(&FINAL_PASS) {
            written(false)
        } else if last.contains(&Action::SyncOutput) {
            Event::OutputSynced
        } else {
            break;
        };
        last = s.on_event(next, ms(now));
        all.extend(last.clone());
    }
    all
}

#[test]
fn plain_session_runs_the_whole_stop_sequence_in_order() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.duration = Some(Duration::from_secs(2));
    let mut s = Session::new(t);
    let a = s.on_event(Event::Begin { wall_ms: 0 }, ms(0));
    assert_eq!(
        a,
        vec![
            Action::SetTimer(Timer::Stop, ms(2000)),
            Action::StartSources,
            Action::SetTimer(Timer::StartDeadline, ms(20_000)),
            Action::SetTimer(Timer::Stats, ms(10_000)),
        ]
    );
    let a = s.on_event(Event::TimerFired(Timer::Stop), ms(2000));
    assert_eq!(
        a,
        vec![
            Action::AnnounceStop,
            Action::SetTimer(Timer::FlushDeadline(FlushId(0)), ms(7000)),
            Action::FlushSources {
                id: FlushId(0),
                timeout: ms(5000),
                for_stop: true,
            },
        ]
    );
    assert_eq!(s.state(), State::Stopping);
    let a = s.on_event(
        Event::SourcesFlushed {
            id: FlushId(0),
            complete: true,
        },
        ms(2010),
    );
    assert_eq!(
        a,
        vec![
            Action::CancelTimer(Timer::FlushDeadline(FlushId(0))),
            Action::ScrapeProducers,
            Action::Service(ServiceEvent::AllDataSourcesFlushed),
            Action::SetTimer(Timer::StopDeadline, ms(7010)),
            Action::StopSources,
        ]
    );
    let a = s.on_event(Event::SourcesStopped, ms(2020));
    assert_eq!(
        a,
        vec![
            Action::CancelTimer(Timer::StopDeadline),
            Action::ScrapeProducers,
            Action::Service(ServiceEvent::TracingDisabled),
            FINAL_PASS,
        ]
    );
    let a = s.on_event(written(false), ms(2030));
    assert_eq!(
        a,
        vec![
            Action::CloseOutput { failed: false },
            Action::Exit(StopReason::DurationElapsed)
        ]
    );
    assert_eq!(s.state(), State::Finished);
}

#[test]
fn all_started_is_noted_once_when_the_acks_came_and_slow_starts_are_named() {
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    // Producers that never acknowledge do not hold anything up: the
    // deadline only notes them, and recording goes on.
    let a = s.on_event(Event::TimerFired(Timer::StartDeadline), ms(20_000));
    assert_eq!(a, vec![Action::NoteSlowStart]);
    assert_eq!(s.state(), State::Recording);
    // A late ack still completes the start, once.
    let a = s.on_event(Event::SourcesStarted, ms(21_000));
    assert_eq!(
        a,
        vec![
            Action::CancelTimer(Timer::StartDeadline),
            Action::Service(ServiceEvent::AllDataSourcesStarted),
        ]
    );
    assert!(s.on_event(Event::SourcesStarted, ms(21_001)).is_empty());
    assert!(
        s.on_event(Event::TimerFired(Timer::StartDeadline), ms(40_000))
            .is_empty()
    );
    // Before the start (deferred) an ack means nothing.
    let mut t = timeline(TriggerMode::None, vec![]);
    t.deferred_start = true;
    let mut d = begun(t);
    assert!(d.on_event(Event::SourcesStarted, ms(1)).is_empty());
}

#[test]
fn periodic_work_aligns_to_wall_clock_multiples() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.write_period = Some(ms(1000));
    t.stats_period = ms(10_000);
    t.flush = FlushCadence::Periodic(ms(5000));
    t.clear_period = Some(ms(2000));
    let mut s = Session::new(t);
    // Wall clock 12_345 ms at the origin.
    let a = s.on_event(Event::Begin { wall_ms: 12_345 }, ms(0));
    assert!(a.contains(&Action::SetTimer(Timer::WritePass, ms(655))));
    assert!(a.contains(&Action::SetTimer(Timer::Stats, ms(7655))));
    assert!(a.contains(&Action::SetTimer(Timer::Flush, ms(2655))));
    assert!(a.contains(&Action::SetTimer(Timer::ClearIncrementalState, ms(1655))));
    // A late timer still lands on the next multiple.
    let a = s.on_event(Event::TimerFired(Timer::WritePass), ms(1900));
    assert_eq!(
        a,
        vec![Action::SetTimer(Timer::WritePass, ms(2655)), PERIODIC_PASS]
    );
    let a = s.on_event(Event::TimerFired(Timer::Stats), ms(7655));
    assert_eq!(
        a,
        vec![
            Action::SetTimer(Timer::Stats, ms(17_655)),
            Action::StatsTick
        ]
    );
    let a = s.on_event(Event::TimerFired(Timer::ClearIncrementalState), ms(1655));
    assert_eq!(
        a,
        vec![
            Action::SetTimer(Timer::ClearIncrementalState, ms(3655)),
            Action::ClearIncrementalState
        ]
    );
}

#[test]
fn periodic_flush_marks_complete_flushes_only() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.flush = FlushCadence::Periodic(ms(5000));
    let mut s = begun(t);
    let a = s.on_event(Event::TimerFired(Timer::Flush), ms(5000));
    let id = flush_id(&a).expect("flushes");
    let a = s.on_event(Event::SourcesFlushed { id, complete: true }, ms(5001));
    assert!(a.contains(&Action::Service(ServiceEvent::AllDataSourcesFlushed)));
    let a = s.on_event(Event::TimerFired(Timer::Flush), ms(10_000));
    let id = flush_id(&a).expect("flushes");
    // Timed out: no claim that the data is complete (what producers left
    // in their memory is still read).
    let a = s.on_event(Event::TimerFired(Timer::FlushDeadline(id)), ms(15_000));
    assert_eq!(a, vec![Action::ScrapeProducers]);
    // A late acknowledgement of that flush changes nothing.
    let a = s.on_event(Event::SourcesFlushed { id, complete: true }, ms(15_001));
    assert_eq!(a, vec![Action::CancelTimer(Timer::FlushDeadline(id))]);
}

#[test]
fn flush_before_each_write_pass_then_the_pass() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.write_period = Some(ms(10_000));
    t.flush = FlushCadence::BeforeEachWritePass;
    let mut s = begun(t);
    let a = s.on_event(Event::TimerFired(Timer::WritePass), ms(10_000));
    assert!(!a.contains(&PERIODIC_PASS));
    let id = flush_id(&a).expect("flushes first");
    let a = s.on_event(Event::SourcesFlushed { id, complete: true }, ms(10_005));
    assert_eq!(
        a,
        vec![
            Action::CancelTimer(Timer::FlushDeadline(id)),
            Action::ScrapeProducers,
            Action::Service(ServiceEvent::AllDataSourcesFlushed),
            PERIODIC_PASS,
        ]
    );
    // A flush that times out still leads to the pass, after the scrape.
    let a = s.on_event(Event::TimerFired(Timer::WritePass), ms(20_000));
    let id = flush_id(&a).expect("flushes first");
    let a = s.on_event(Event::TimerFired(Timer::FlushDeadline(id)), ms(25_000));
    assert_eq!(a, vec![Action::ScrapeProducers, PERIODIC_PASS]);
}

#[test]
fn second_signal_skips_the_flush_and_a_third_changes_nothing() {
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let a = s.on_event(Event::Signal, ms(100));
    let id = flush_id(&a).expect("graceful stop flushes");
    let a = s.on_event(Event::Signal, ms(200));
    assert_eq!(
        a,
        vec![
            Action::CancelTimer(Timer::FlushDeadline(id)),
            Action::SetTimer(Timer::StopDeadline, ms(5200)),
            Action::StopSources,
        ]
    );
    assert!(s.on_event(Event::Signal, ms(300)).is_empty());
    // The abandoned flush's late answer is ignored.
    let a = s.on_event(Event::SourcesFlushed { id, complete: true }, ms(400));
    assert_eq!(a, vec![Action::CancelTimer(Timer::FlushDeadline(id))]);
    let a = s.on_event(Event::SourcesStopped, ms(500));
    assert!(a.contains(&FINAL_PASS));
    let a = s.on_event(written(false), ms(600));
    assert_eq!(exit_reason(&a), Some(StopReason::Signal));
}

#[test]
fn slow_sources_are_bounded_by_their_timeouts() {
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let a = s.on_event(Event::StopRequest(RequestId(1)), ms(0));
    assert_eq!(a[0], Action::Reply(RequestId(1), Answer::Stopping));
    let id = flush_id(&a).expect("flushes");
    let a = s.on_event(Event::TimerFired(Timer::FlushDeadline(id)), ms(5000));
    assert!(!a.contains(&Action::Service(ServiceEvent::AllDataSourcesFlushed)));
    assert!(a.contains(&Action::StopSources));
    let a = s.on_event(Event::TimerFired(Timer::StopDeadline), ms(10_000));
    assert_eq!(
        a,
        vec![
            Action::ScrapeProducers,
            Action::Service(ServiceEvent::TracingDisabled),
            FINAL_PASS
        ]
    );
    // Sources that stop after the deadline change nothing.
    assert!(s.on_event(Event::SourcesStopped, ms(10_001)).is_empty());
}

#[test]
fn size_cap_stops_without_flush_or_final_pass() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.write_period = Some(ms(100));
    let mut s = begun(t);
    let a = s.on_event(written(true), ms(100));
    assert!(flush_id(&a).is_none());
    assert!(a.contains(&Action::StopSources));
    let a = s.on_event(Event::SourcesStopped, ms(101));
    assert_eq!(
        a,
        vec![
            Action::CancelTimer(Timer::StopDeadline),
            Action::Service(ServiceEvent::TracingDisabled),
            Action::SyncOutput,
        ]
    );
    // The end waits for the sync.
    assert_eq!(
        s.on_event(Event::OutputSynced, ms(102)),
        vec![
            Action::CloseOutput { failed: false },
            Action::Exit(StopReason::SizeCap),
        ]
    );
}

#[test]
fn a_failed_sync_at_a_stop_without_a_final_pass_fails_the_session() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.write_period = Some(ms(100));
    let mut s = begun(t);
    let a = s.on_event(written(true), ms(100));
    assert!(a.contains(&Action::StopSources));
    let a = s.on_event(Event::SourcesStopped, ms(101));
    assert!(a.contains(&Action::SyncOutput));
    let e = failed(SinkError::Sync(rustix::io::Errno::IO));
    let a = s.on_event(Event::OutputFailed(e.clone()), ms(102));
    assert_eq!(
        a,
        vec![
            Action::CloseOutput { failed: true },
            Action::Exit(StopReason::OutputFailed(e.clone())),
        ]
    );
    assert!(StopReason::OutputFailed(e).is_failure());
}

#[test]
fn output_failure_stops_without_touching_the_output_again() {
    let e = failed(SinkError::Write {
        errno: rustix::io::Errno::NOSPC,
        offset: 10,
    });
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let a = s.on_event(Event::OutputFailed(e.clone()), ms(100));
    let all = finish_stop(&mut s, a, 100);
    assert!(!all.contains(&Action::SyncOutput));
    assert!(!all.contains(&FINAL_PASS));
    assert!(all.contains(&Action::CloseOutput { failed: true }));
    assert_eq!(exit_reason(&all), Some(StopReason::OutputFailed(e.clone())));
    assert!(StopReason::OutputFailed(e).is_failure());
}

#[test]
fn a_failed_final_pass_becomes_the_exit_reason() {
    let e = failed(SinkError::Sync(rustix::io::Errno::IO));
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let a = s.on_event(Event::StopRequest(RequestId(1)), ms(0));
    let id = flush_id(&a).expect("flushes");
    s.on_event(Event::SourcesFlushed { id, complete: true }, ms(1));
    s.on_event(Event::SourcesStopped, ms(2));
    let a = s.on_event(Event::OutputFailed(e.clone()), ms(3));
    assert_eq!(
        a,
        vec![
            Action::CloseOutput { failed: true },
            Action::Exit(StopReason::OutputFailed(e))
        ]
    );
}

#[test]
fn timers_do_nothing_while_stopping() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.write_period = Some(ms(100));
    t.duration = Some(ms(1000));
    let mut s = begun(t);
    s.on_event(Event::TimerFired(Timer::Stop), ms(1000));
    for timer in [
        Timer::WritePass,
        Timer::Stats,
        Timer::Flush,
        Timer::ClearIncrementalState,
        Timer::Stop,
        Timer::TriggerTimeout,
        Timer::Snapshot(0),
    ] {
        assert!(
            s.on_event(Event::TimerFired(timer), ms(1100)).is_empty(),
            "{timer:?}"
        );
    }
}

#[test]
fn source_failure_stops_with_a_flush() {
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let gone = SourceFailure {
        source: "linux.ftrace".into(),
        phase: SourcePhase::Running,
        cause: std::sync::Arc::new(crate::sources::SourceError::Failed {
            source_name: "linux.ftrace".into(),
            cause: "tracefs went away".into(),
        }),
    };
    assert_eq!(
        gone.to_string(),
        "linux.ftrace failed while recording: tracefs went away"
    );
    let a = s.on_event(Event::SourceFailed(gone.clone()), ms(5));
    let all = finish_stop(&mut s, a, 5);
    assert!(all.contains(&FINAL_PASS));
    let r = exit_reason(&all).expect("exits");
    assert_eq!(r, StopReason::SourceFailed(gone));
    assert!(r.is_failure());
}

#[test]
fn start_trigger_starts_then_stops_after_delay() {
    let mut t = timeline(TriggerMode::StartTracing, vec![rule("go", 500)]);
    t.write_period = Some(ms(1000));
    let mut s = Session::new(t);
    let a = s.on_event(Event::Begin { wall_ms: 0 }, ms(0));
    assert_eq!(a, vec![Action::SetTimer(Timer::TriggerTimeout, ms(60_000))]);
    assert!(s.waiting_for_trigger());
    // Passes write nothing while waiting: the pass timer is not even set.
    assert_eq!(
        outcome(&mut s, "other", 10).0,
        Err(TriggerRefusal::NotListed)
    );
    let (res, a) = outcome(&mut s, "go", 300);
    assert_eq!(res, Ok(()));
    assert!(a.contains(&Action::StartSources));
    assert!(a.contains(&Action::CancelTimer(Timer::TriggerTimeout)));
    assert!(a.contains(&Action::SetTimer(Timer::WritePass, ms(1000))));
    assert!(a.contains(&Action::SetTimer(Timer::Stop, ms(800))));
    assert!(!s.waiting_for_trigger());
    let (res, a) = outcome(&mut s, "go", 400);
    assert_eq!(res, Err(TriggerRefusal::AlreadyTriggered));
    assert_eq!(a.len(), 1, "only the reply: {a:?}");
    let a = s.on_event(Event::TimerFired(Timer::Stop), ms(800));
    let all = finish_stop(&mut s, a, 800);
    assert_eq!(exit_reason(&all), Some(StopReason::Trigger("go".into())));
    assert!(all.contains(&FINAL_PASS));
}

#[test]
fn start_trigger_timeout_writes_nothing() {
    let mut s = begun(timeline(TriggerMode::StartTracing, vec![rule("go", 0)]));
    let a = s.on_event(Event::TimerFired(Timer::TriggerTimeout), ms(60_000));
    assert!(flush_id(&a).is_none(), "nothing to flush: {a:?}");
    let all = finish_stop(&mut s, a, 60_000);
    assert!(!all.contains(&FINAL_PASS));
    assert!(all.contains(&Action::SyncOutput));
    assert_eq!(exit_reason(&all), Some(StopReason::TriggerTimeout));
    // A trigger after the timeout is refused.
    assert_eq!(
        outcome(&mut s, "go", 60_001).0,
        Err(TriggerRefusal::NotRecording)
    );
}

#[test]
fn stop_trigger_first_one_wins_and_timeout_is_then_ignored() {
    let mut s = begun(timeline(
        TriggerMode::StopTracing,
        vec![rule("a", 0), rule("b", 2000)],
    ));
    assert!(s.waiting_for_trigger());
    let (res, a) = outcome(&mut s, "b", 100);
    assert_eq!(res, Ok(()));
    assert!(a.contains(&Action::SetTimer(Timer::Stop, ms(2100))));
    assert_eq!(
        outcome(&mut s, "a", 200).0,
        Err(TriggerRefusal::AlreadyTriggered)
    );
    assert!(
        s.on_event(Event::TimerFired(Timer::TriggerTimeout), ms(60_000))
            .is_empty()
    );
    let a = s.on_event(Event::TimerFired(Timer::Stop), ms(2100));
    let all = finish_stop(&mut s, a, 2100);
    assert_eq!(exit_reason(&all), Some(StopReason::Trigger("b".into())));
    assert!(all.contains(&FINAL_PASS));
}

#[test]
fn stop_trigger_with_zero_delay_stops_at_once() {
    let mut s = begun(timeline(TriggerMode::StopTracing, vec![rule("a", 0)]));
    let (res, a) = outcome(&mut s, "a", 5);
    assert_eq!(res, Ok(()));
    assert!(matches!(&a[0], Action::AcceptTrigger(t) if t.name == "a"));
    assert!(flush_id(&a).is_some());
    assert_eq!(s.state(), State::Stopping);
}

#[test]
fn stop_trigger_timeout_without_trigger_writes_nothing() {
    let mut s = begun(timeline(TriggerMode::StopTracing, vec![rule("a", 0)]));
    let a = s.on_event(Event::TimerFired(Timer::TriggerTimeout), ms(60_000));
    let all = finish_stop(&mut s, a, 60_000);
    assert_eq!(exit_reason(&all), Some(StopReason::TriggerTimeout));
    assert!(!all.contains(&FINAL_PASS));
}

#[test]
fn stop_before_any_trigger_writes_nothing() {
    let mut s = begun(timeline(TriggerMode::StopTracing, vec![rule("a", 0)]));
    let a = s.on_event(Event::Signal, ms(10));
    let all = finish_stop(&mut s, a, 10);
    assert!(!all.contains(&FINAL_PASS));
    assert!(all.contains(&Action::SyncOutput));
    assert_eq!(exit_reason(&all), Some(StopReason::Signal));
}

#[test]
fn clone_snapshots_are_numbered_prepared_flushed_then_written() {
    let mut s = begun(Timeline {
        // Buffer 0 is copied and cleared first; buffer 1 is handed over.
        clone: vec![
            CloneRule {
                transfer: false,
                clear_first: true,
            },
            CloneRule {
                transfer: true,
                clear_first: false,
            },
        ],
        ..timeline(
            TriggerMode::CloneSnapshot,
            vec![rule("snap", 0), rule("late", 100)],
        )
    });
    let prepare = |n| Action::PrepareSnapshot { n, clear: vec![0] };
    let snapshot = |n| Action::Snapshot {
        n,
        takes: vec![Take::Snapshot, Take::Consume],
    };
    let (res, a) = outcome(&mut s, "snap", 10);
    assert_eq!(res, Ok(()));
    assert!(matches!(&a[0], Action::AcceptTrigger(t) if t.snapshot == Some(0)));
    assert!(a.contains(&prepare(0)));
    let id = flush_id(&a).expect("flushes before the snapshot");
    let a = s.on_event(Event::SourcesFlushed { id, complete: true }, ms(11));
    assert!(a.contains(&snapshot(0)));

    let (_, a) = outcome(&mut s, "late", 20);
    assert!(matches!(&a[0], Action::AcceptTrigger(t) if t.snapshot == Some(1)));
    assert!(a.contains(&Action::SetTimer(Timer::Snapshot(1), ms(120))));
    let a = s.on_event(Event::TimerFired(Timer::Snapshot(1)), ms(120));
    assert_eq!(a[0], prepare(1));
    let id = flush_id(&a).expect("flushes");
    // Even a flush that times out is followed by its snapshot.
    let a = s.on_event(Event::TimerFired(Timer::FlushDeadline(id)), ms(5120));
    assert_eq!(a, vec![Action::ScrapeProducers, snapshot(1)]);

    let a = s.on_event(Event::TimerFired(Timer::TriggerTimeout), ms(60_000));
    let all = finish_stop(&mut s, a, 60_000);
    assert_eq!(exit_reason(&all), Some(StopReason::CloneTimeout));
    // The clone session's own output stays empty.
    assert!(!all.contains(&FINAL_PASS));
}

#[test]
fn clone_triggers_in_a_burst_make_one_snapshot_and_the_budget_bounds_them_all() {
    let mut t = timeline(TriggerMode::CloneSnapshot, vec![rule("snap", 0)]);
    t.snapshot_budget = crate::session::SnapshotBudget {
        max_count: 3,
        max_bytes: 10 << 20,
        bytes_each: 4 << 20,
        owner_uid: 0,
    };
    let mut s = begun(t);
    let mut written = 0;
    let mut refused = (0, 0);
    // 300 triggers, 20 at a time between flushes: one snapshot per burst
    // while the budget lasts (two of 4 MiB fit in 10 MiB), then none.
    for burst in 0..15u64 {
        let mut flush = None;
        for i in 0..20u64 {
            let at = burst * 100 + i;
            let (res, a) = outcome(&mut s, "snap", at);
            match res {
                Ok(()) => flush = flush_id(&a),
                Err(TriggerRefusal::SnapshotInProgress) => refused.0 += 1,
                Err(TriggerRefusal::SnapshotBudget) => refused.1 += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        if let Some(id) = flush {
            let a = s.on_event(
                Event::SourcesFlushed { id, complete: true },
                ms(burst * 100 + 50),
            );
            written += a
                .iter()
                .filter(|a| matches!(a, Action::Snapshot { .. }))
                .count();
        }
    }
    assert_eq!(written, 2);
    assert_eq!(refused, (2 * 19, 300 - 2 * 20));
    assert_eq!(s.snapshots_refused(), 298);
}

/// A snapshot trigger from `uid`, its outcome; a snapshot it starts is
/// written at once (its flush completes), so the next may start.
fn snap_from(s: &mut Session, uid: u32, now: u64) -> Result<(), TriggerRefusal> {
    let a = s.on_event(
        Event::Triggers(TriggerArrival {
            request: Some(RequestId(9)),
            producer: "p".into(),
            uid,
            at_ns: None,
            names: vec![TriggerName {
                name: "snap".into(),
                draw: 0.5,
                matches_last_24h: 0,
            }],
        }),
        ms(now),
    );
    let res = a
        .iter()
        .find_map(|a| match a {
            Action::Reply(RequestId(9), Answer::Triggers(o)) => Some(o[0].1),
            _ => None,
        })
        .expect("a reply");
    if let Some(id) = flush_id(&a) {
        s.on_event(Event::SourcesFlushed { id, complete: true }, ms(now));
    }
    res
}

#[test]
fn one_uids_flood_takes_its_share_of_the_snapshot_budget_not_all_of_it() {
    let mut t = timeline(TriggerMode::CloneSnapshot, vec![rule("snap", 0)]);
    t.snapshot_budget = crate::session::SnapshotBudget {
        max_count: 16,
        max_bytes: 4 << 30,
        bytes_each: 1 << 20,
        owner_uid: 500,
    };
    let b = t.snapshot_budget;
    assert_eq!((b.total(), b.reserved(), b.share()), (16, 4, 3));
    let mut s = begun(t);
    let mut now = 0;
    let mut tally = |s: &mut Session, uid: u32, n: u32| {
        let mut ok = 0;
        let mut refused = Vec::new();
        for _ in 0..n {
            now += 10;
            match snap_from(s, uid, now) {
                Ok(()) => ok += 1,
                Err(e) => refused.push(e),
            }
        }
        (ok, refused)
    };
    // 200 triggers of one uid: its share, the rest refused as such.
    let (ok, refused) = tally(&mut s, 65534, 200);
    assert_eq!(ok, 3);
    assert!(refused.iter().all(|r| *r == TriggerRefusal::SnapshotShare));
    assert_eq!(
        TriggerRefusal::SnapshotShare.as_str(),
        "snapshot_share_spent"
    );
    // Three more uids take theirs; a fifth finds the others' part spent.
    for uid in [65533, 65532, 65531] {
        assert_eq!(tally(&mut s, uid, 10).0, 3, "uid {uid}");
    }
    assert_eq!(tally(&mut s, 65530, 10).0, 0);
    // Root and the session's user still have the reserve: 4 left in all.
    assert_eq!(tally(&mut s, 0, 2).0, 2);
    assert_eq!(tally(&mut s, 500, 5).0, 2);
    assert_eq!(
        snap_from(&mut s, 0, 100_000),
        Err(TriggerRefusal::SnapshotBudget)
    );
    // A small budget: one snapshot for others, one kept.
    let small = crate::session::SnapshotBudget {
        max_count: 16,
        max_bytes: 2 << 20,
        bytes_each: 1 << 20,
        owner_uid: 500,
    };
    assert_eq!((small.total(), small.reserved(), small.share()), (2, 1, 1));
    let one = crate::session::SnapshotBudget {
        max_bytes: 1 << 20,
        ..small
    };
    assert_eq!((one.total(), one.reserved(), one.share()), (1, 1, 0));
}

#[test]
fn one_request_gets_one_reply_with_every_outcome_in_order() {
    let mut s = begun(timeline(TriggerMode::StopTracing, vec![rule("b", 1000)]));
    let names = ["a", "b", "b"]
        .iter()
        .map(|n| TriggerName {
            name: (*n).into(),
            draw: 0.5,
            matches_last_24h: 0,
        })
        .collect();
    let a = s.on_event(
        Event::Triggers(TriggerArrival {
            request: Some(RequestId(3)),
            producer: "app".into(),
            uid: 1000,
            names,
            at_ns: None,
        }),
        ms(0),
    );
    let replies: Vec<&Action> = a
        .iter()
        .filter(|a| matches!(a, Action::Reply(..)))
        .collect();
    assert_eq!(
        replies,
        vec![&Action::Reply(
            RequestId(3),
            Answer::Triggers(vec![
                ("a".into(), Err(TriggerRefusal::NotListed)),
                ("b".into(), Ok(())),
                ("b".into(), Err(TriggerRefusal::AlreadyTriggered)),
            ])
        )]
    );
    assert!(a.contains(&Action::AcceptTrigger(AcceptedTrigger {
        name: "b".into(),
        producer: "app".into(),
        uid: 1000,
        stop_delay: ms(1000),
        snapshot: None,
        at_ns: None,
    })));
}

#[test]
fn rule_filters() {
    let mut r = rule("t", 0);
    r.producer_regex = Some(anchored("app.*").expect("valid"));
    r.skip_probability = 0.3;
    r.max_per_24h = 2;
    let mut s = begun(timeline(TriggerMode::StopTracing, vec![r]));
    let mut send = |producer: &str, draw: f64, n: u32| {
        let a = s.on_event(
            Event::Triggers(TriggerArrival {
                request: Some(RequestId(1)),
                producer: producer.into(),
                uid: 1000,
                names: vec![TriggerName {
                    name: "t".into(),
                    draw,
                    matches_last_24h: n,
                }],
                at_ns: None,
            }),
            ms(0),
        );
        a.iter()
            .find_map(|a| match a {
                Action::Reply(_, Answer::Triggers(o)) => Some(o[0].1),
                _ => None,
            })
            .expect("reply")
    };
    assert_eq!(send("xapp", 0.9, 0), Err(TriggerRefusal::ProducerMismatch));
    assert_eq!(send("app1", 0.1, 0), Err(TriggerRefusal::Skipped));
    assert_eq!(send("app1", 0.9, 2), Err(TriggerRefusal::RateLimited));
    assert_eq!(send("app1", 0.9, 1), Ok(()));
}

#[test]
fn deferred_session_waits_for_start() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.deferred_start = true;
    t.duration = Some(ms(1000));
    let mut s = Session::new(t);
    assert!(s.on_event(Event::Begin { wall_ms: 0 }, ms(0)).is_empty());
    assert_eq!(s.state(), State::Deferred);
    assert!(s.waiting_for_trigger());
    let a = s.on_event(Event::StartRequest(RequestId(1)), ms(500));
    assert_eq!(a[0], Action::Reply(RequestId(1), Answer::Started(Ok(()))));
    assert!(a.contains(&Action::StartSources));
    // The duration counts from the start.
    assert!(a.contains(&Action::SetTimer(Timer::Stop, ms(1500))));
    let a = s.on_event(Event::StartRequest(RequestId(2)), ms(600));
    assert_eq!(
        a,
        vec![Action::Reply(
            RequestId(2),
            Answer::Started(Err(StartRefusal::AlreadyStarted))
        )]
    );
}

#[test]
fn deferred_session_stopped_before_start_writes_nothing() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.deferred_start = true;
    let mut s = begun(t);
    let a = s.on_event(Event::Signal, ms(10));
    assert!(flush_id(&a).is_none());
    let all = finish_stop(&mut s, a, 10);
    assert!(!all.contains(&FINAL_PASS));
    assert_eq!(exit_reason(&all), Some(StopReason::Signal));
    let a = s.on_event(Event::StartRequest(RequestId(1)), ms(20));
    assert_eq!(
        a,
        vec![Action::Reply(
            RequestId(1),
            Answer::Started(Err(StartRefusal::NotRecording))
        )]
    );
}

#[test]
fn stop_cancels_flushes_under_way() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.flush = FlushCadence::Periodic(ms(1000));
    let mut s = begun(t);
    let a = s.on_event(Event::TimerFired(Timer::Flush), ms(1000));
    let periodic = flush_id(&a).expect("flushes");
    let a = s.on_event(Event::StopRequest(RequestId(1)), ms(1001));
    assert!(a.contains(&Action::CancelTimer(Timer::FlushDeadline(periodic))));
    let stop = flush_id(&a).expect("the stop's own flush");
    assert_ne!(stop, periodic);
    // The periodic flush's answer does not advance the stop sequence.
    let a = s.on_event(
        Event::SourcesFlushed {
            id: periodic,
            complete: true,
        },
        ms(1002),
    );
    assert_eq!(a, vec![Action::CancelTimer(Timer::FlushDeadline(periodic))]);
    let a = s.on_event(
        Event::SourcesFlushed {
            id: stop,
            complete: true,
        },
        ms(1003),
    );
    assert!(a.contains(&Action::StopSources));
}

fn rotating(mode: TriggerMode, rules: Vec<TriggerRule>) -> Timeline {
    use crate::storage::segment::policy::RotationPolicy;
    timeline(mode, rules).with_rotation(RotationPolicy {
        size: Some(1000),
        period: Some(Duration::from_secs(60)),
        ..RotationPolicy::default()
    })
}

fn pass(bytes: u64, age_s: u64) -> Event {
    Event::PassWritten {
        cap_reached: false,
        segment: Some(SegmentFill {
            bytes,
            age: Duration::from_secs(age_s),
        }),
    }
}

#[test]
fn segments_are_cut_after_the_pass_that_fills_them() {
    use crate::storage::segment::policy::RotateReason;
    let t = rotating(TriggerMode::None, vec![]);
    // Segments stream even when the config does not.
    assert_eq!(t.write_period, Some(ms(5000)));
    let mut s = Session::new(t);
    let a = s.on_event(Event::Begin { wall_ms: 0 }, ms(0));
    assert!(a.contains(&Action::SetTimer(Timer::WritePass, ms(5000))));
    assert!(s.on_event(pass(999, 1), ms(5000)).is_empty());
    assert_eq!(
        s.on_event(pass(1000, 2), ms(10_000)),
        vec![
            Action::Rotate(RotateReason::Size),
            Action::ClearIncrementalState
        ]
    );
    assert_eq!(
        s.on_event(pass(10, 61), ms(70_000)),
        vec![
            Action::Rotate(RotateReason::Period),
            Action::ClearIncrementalState
        ]
    );
    // An empty segment is never cut.
    assert!(s.on_event(pass(0, 600), ms(600_000)).is_empty());
}

#[test]
fn an_on_disk_flight_recorder_streams_before_its_trigger_and_keeps_it_all() {
    let t = rotating(TriggerMode::StopTracing, vec![rule("crash", 100)]);
    let mut s = begun(t);
    assert!(!s.waiting_for_trigger(), "segments count from the start");
    let a = s.on_event(Event::TimerFired(Timer::WritePass), ms(5000));
    assert!(a.contains(&PERIODIC_PASS));
    let (res, _) = outcome(&mut s, "crash", 6000);
    assert_eq!(res, Ok(()));
    let a = s.on_event(Event::TimerFired(Timer::Stop), ms(6100));
    let all = finish_stop(&mut s, a, 6100);
    assert!(all.contains(&FINAL_PASS));
    assert_eq!(exit_reason(&all), Some(StopReason::Trigger("crash".into())));

    // No trigger before the timeout: what was written stays, with a final pass.
    let mut s = begun(rotating(TriggerMode::StopTracing, vec![rule("crash", 0)]));
    let a = s.on_event(Event::TimerFired(Timer::TriggerTimeout), ms(60_000));
    let all = finish_stop(&mut s, a, 60_000);
    assert!(all.contains(&FINAL_PASS));
    assert!(all.contains(&Action::CloseOutput { failed: false }));
}

#[test]
fn flushes_are_counted_as_they_end() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.write_period = Some(ms(10_000));
    t.flush = FlushCadence::BeforeEachWritePass;
    let mut s = begun(t);
    assert_eq!(s.flush_counts(), FlushCounts::default());
    // One acked in time, one timed out.
    let a = s.on_event(Event::TimerFired(Timer::WritePass), ms(10_000));
    let id = flush_id(&a).expect("flushes first");
    s.on_event(Event::SourcesFlushed { id, complete: true }, ms(10_005));
    let a = s.on_event(Event::TimerFired(Timer::WritePass), ms(20_000));
    let id = flush_id(&a).expect("flushes first");
    s.on_event(Event::TimerFired(Timer::FlushDeadline(id)), ms(25_000));
    // An ack after the deadline changes nothing: the flush has ended.
    s.on_event(Event::SourcesFlushed { id, complete: true }, ms(25_001));
    let counts = |requested, succeeded, failed| FlushCounts {
        requested,
        succeeded,
        failed,
    };
    assert_eq!(s.flush_counts(), counts(2, 1, 1));
    // A flush under way when the stop begins is cut short: failed. The
    // stop's own flush, acked, succeeds.
    let a = s.on_event(Event::TimerFired(Timer::WritePass), ms(30_000));
    assert!(flush_id(&a).is_some());
    let a = s.on_event(Event::Signal, ms(30_001));
    assert_eq!(s.flush_counts(), counts(4, 1, 2));
    finish_stop(&mut s, a, 30_002);
    assert_eq!(s.flush_counts(), counts(4, 2, 2));
}

#[test]
fn a_second_signal_counts_the_stop_flush_as_failed() {
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let a = s.on_event(Event::Signal, ms(100));
    assert!(flush_id(&a).is_some());
    s.on_event(Event::Signal, ms(200));
    assert_eq!(
        s.flush_counts(),
        FlushCounts {
            requested: 1,
            succeeded: 0,
            failed: 1
        }
    );
}

#[test]
fn the_session_says_when_a_pass_syncs() {
    for each in [false, true] {
        let mut t = timeline(TriggerMode::None, vec![]);
        t.write_period = Some(ms(1000));
        t.sync_each_pass = each;
        let mut s = begun(t);
        let a = s.on_event(Event::TimerFired(Timer::WritePass), ms(1000));
        assert!(a.contains(&Action::WritePass {
            pass: Pass::Periodic,
            sync: each,
        }));
        // The final pass reaches the disk whatever the config says.
        let a = s.on_event(Event::Signal, ms(1500));
        let all = finish_stop(&mut s, a, 1500);
        assert!(all.contains(&FINAL_PASS));
    }
}

#[test]
fn only_the_stops_flush_is_marked_for_the_producers() {
    let mut t = timeline(TriggerMode::None, vec![]);
    t.flush = FlushCadence::Periodic(ms(1000));
    let mut s = begun(t);
    let a = s.on_event(Event::TimerFired(Timer::Flush), ms(1000));
    assert!(a.iter().any(|a| matches!(
        a,
        Action::FlushSources {
            for_stop: false,
            ..
        }
    )));
    let a = s.on_event(Event::Signal, ms(1100));
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::FlushSources { for_stop: true, .. }))
    );
}

#[test]
fn a_consumers_flush_is_answered_when_it_ends_or_is_cut_short() {
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let a = s.on_event(Event::FlushRequest(RequestId(3)), ms(100));
    let id = flush_id(&a).expect("a flush");
    assert!(!a.iter().any(|a| matches!(a, Action::Reply(..))), "not yet");
    let a = s.on_event(Event::SourcesFlushed { id, complete: true }, ms(150));
    assert!(a.contains(&Action::Reply(RequestId(3), Answer::Flushed(true))));
    assert_eq!(s.flush_counts().succeeded, 1);
    // One cut short by the stop is answered at once, as failed.
    let a = s.on_event(Event::FlushRequest(RequestId(4)), ms(200));
    let id = flush_id(&a).expect("a flush");
    let a = s.on_event(Event::StopRequest(RequestId(5)), ms(210));
    assert!(a.contains(&Action::CancelTimer(Timer::FlushDeadline(id))));
    assert!(a.contains(&Action::Reply(RequestId(4), Answer::Flushed(false))));
    // Once stopping there is nothing to flush.
    let a = s.on_event(Event::FlushRequest(RequestId(6)), ms(220));
    assert_eq!(a, vec![Action::Reply(RequestId(6), Answer::Flushed(false))]);
}

#[test]
fn a_drain_writes_a_pass_and_is_answered_by_it() {
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let a = s.on_event(Event::DrainRequest(RequestId(1)), ms(100));
    assert_eq!(a, vec![PERIODIC_PASS]);
    let a = s.on_event(written(false), ms(120));
    assert_eq!(a, vec![Action::Reply(RequestId(1), Answer::Drained)]);
    // One whose pass the stop overtook is answered at the end.
    s.on_event(Event::DrainRequest(RequestId(2)), ms(200));
    let a = s.on_event(Event::StopRequest(RequestId(3)), ms(201));
    let all = finish_stop(&mut s, a, 201);
    assert!(all.contains(&Action::Reply(RequestId(2), Answer::Drained)));
    // A session that may not write yet answers at once, writing nothing.
    let mut t = timeline(TriggerMode::None, vec![]);
    t.deferred_start = true;
    let mut s = begun(t);
    assert_eq!(
        s.on_event(Event::DrainRequest(RequestId(9)), ms(10)),
        vec![Action::Reply(RequestId(9), Answer::Drained)]
    );
}

#[test]
fn a_consumers_clone_flushes_then_copies_and_is_refused_when_it_cannot() {
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    let a = s.on_event(Event::CloneRequest(RequestId(1)), ms(100));
    assert!(matches!(&a[0], Action::PrepareClone { clear } if clear.is_empty()));
    let id = flush_id(&a).expect("a flush first");
    // Acked or timed out, the copy follows.
    let a = s.on_event(
        Event::SourcesFlushed {
            id,
            complete: false,
        },
        ms(150),
    );
    assert!(a.iter().any(|a| matches!(
        a,
        Action::CloneInto { id: RequestId(1), takes }
            if takes.iter().all(|t| *t == Take::Snapshot)
    )));
    // A write_into_file session's data is in its file.
    let mut t = timeline(TriggerMode::None, vec![]);
    t.write_period = Some(ms(1000));
    let mut s = begun(t);
    assert_eq!(
        s.on_event(Event::CloneRequest(RequestId(2)), ms(10)),
        vec![Action::Reply(
            RequestId(2),
            Answer::NotCloned(CloneRefusal::WritesIntoFile)
        )]
    );
    // A clone whose flush the stop overtakes is refused.
    let mut s = begun(timeline(TriggerMode::None, vec![]));
    s.on_event(Event::CloneRequest(RequestId(3)), ms(10));
    let a = s.on_event(Event::StopRequest(RequestId(4)), ms(20));
    assert!(a.contains(&Action::Reply(
        RequestId(3),
        Answer::NotCloned(CloneRefusal::NotRecording)
    )));
}

#[test]
fn a_rotation_on_request_writes_what_is_recorded_then_cuts() {
    use crate::storage::segment::policy::RotateReason;
    let mut s = begun(rotating(TriggerMode::None, vec![]));
    assert_eq!(
        s.on_event(Event::RotateRequest(RequestId(7)), ms(100)),
        vec![PERIODIC_PASS]
    );
    // The next pass closes the segment, however little it holds.
    assert_eq!(
        s.on_event(pass(10, 0), ms(110)),
        vec![
            Action::Rotate(RotateReason::Requested),
            Action::ClearIncrementalState,
            Action::Reply(RequestId(7), Answer::Rotated(Ok(())))
        ]
    );
    assert!(s.on_event(pass(20, 0), ms(120)).is_empty());
    // A stop answers a rotation still waiting for its pass.
    s.on_event(Event::RotateRequest(RequestId(8)), ms(130));
    let a = s.on_event(Event::Signal, ms(140));
    assert!(a.contains(&Action::Reply(
        RequestId(8),
        Answer::Rotated(Err(RotateRefusal::NotRecording))
    )));
    // One file is not cut.
    let mut one = begun(timeline(TriggerMode::None, vec![]));
    assert_eq!(
        one.on_event(Event::RotateRequest(RequestId(1)), ms(0)),
        vec![Action::Reply(
            RequestId(1),
            Answer::Rotated(Err(RotateRefusal::NotSegmented))
        )]
    );
}

#[test]
fn a_rules_firing_carries_its_events_time_into_the_trigger() {
    let mut s = begun(timeline(TriggerMode::StopTracing, vec![rule("crash", 0)]));
    let a = s.on_event(
        Event::Triggers(TriggerArrival {
            request: Some(RequestId(2)),
            producer: "recorder".into(),
            uid: 0,
            names: vec![TriggerName {
                name: "crash".into(),
                draw: 0.5,
                matches_last_24h: 0,
            }],
            at_ns: Some(12_345),
        }),
        ms(50),
    );
    assert!(a.contains(&Action::AcceptTrigger(AcceptedTrigger {
        name: "crash".into(),
        producer: "recorder".into(),
        uid: 0,
        stop_delay: ms(0),
        snapshot: None,
        at_ns: Some(12_345),
    })));
    assert!(a.contains(&Action::Reply(
        RequestId(2),
        Answer::Triggers(vec![("crash".into(), Ok(()))])
    )));
}
