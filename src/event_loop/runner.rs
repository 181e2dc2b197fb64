//! One session's executor ([`Runner`]): the session's decisions carried
//! out against its buffers, sources and output, on its host's thread.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;

use super::host::{CloneError, Command, Response, SessionEvent, Ticket};
use super::outcome::{BufferSummary, Outcome};
use super::reactor::Timers;
use super::rules::{RuleBook, StateView};
use super::status_line::StatusFigures;
use super::{Recording, quota_reports, trace_stats};
use crate::config::rule::{self, RuleAction};
use crate::control::history;
use crate::control::server::Incoming;
use crate::control::wire::{
    BufferStatus, MAX_PRODUCERS_SHOWN, ProducerStatus, Reply, Request, SessionStatus,
    TriggerOutcome,
};
use crate::producer::host::{HostEvent, QuotaView};
use crate::ringbuf::Buffer;
use crate::session::{
    AcceptedTrigger, Action, Answer, Event, FlushId, Pass, RequestId, SegmentFill, SourceFailure,
    SourcePhase, State, StopReason, TriggerArrival, TriggerName,
};
use crate::sources::DataSource;
use crate::storage::segment::Output;
use crate::storage::segment::policy::RotateReason;
use crate::storage::write_pass::{PassReport, PassStage, Take, write_pass_staged};
use crate::storage::{OutputError, OutputPath};
use crate::trace::service::{ServiceEvent, TriggerRecord};

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

/// One session's executor: its decider, what it is made of, its timers,
/// the queue of events its actions raised and the requests waiting for its
/// answer. It never waits: its host (the main job's loop, or the one loop of
/// `recorder serve` that hosts every session) waits on what
/// [`Runner::interest`] and [`Runner::next_due`] say, then calls
/// [`Runner::on_wake`] and [`Runner::settle`].
pub(crate) struct Runner {
    rec: Recording,
    timers: Timers,
    queue: VecDeque<Event>,
    /// Requests waiting for the session's answer.
    pending: HashMap<RequestId, Waiting>,
    next_request: u64,
    exit: Option<StopReason>,
    passes: u64,
    snapshots: Vec<PathBuf>,
    /// The trigger that took each snapshot, by snapshot number.
    snapshot_triggers: BTreeMap<u32, TriggerRecord>,
    /// The lowest `OUT.K` a snapshot may still take (names skipped past a
    /// directory someone put there are not used again).
    next_snapshot_name: u32,
    warnings: Vec<String>,
    /// Bytes before and after compression, over every pass.
    compressed: (u64, u64),
    /// Bytes `max_file_size_bytes` left out of the passes.
    cut_bytes: u64,
    /// Flushes waiting for producers' acks, with whether the built-in
    /// sources finished theirs.
    producer_flushes: HashMap<FlushId, bool>,
    /// The stop waits for producers' acks.
    producer_stop: bool,
    /// The start waits for producers' acks.
    producer_start: bool,
    /// What the session published for its host since the last take.
    published: Vec<SessionEvent>,
}

/// Who waits for the answer to a request.
enum Waiting {
    /// A client of the control socket (the main job).
    Control(Incoming),
    /// The host's own request (a consumer's, under `recorder serve`), with
    /// the descriptor a clone writes into.
    Host {
        ticket: Ticket,
        attachment: Option<OwnedFd>,
    },
    /// A firing of the session's rule of this index.
    Rule(usize),
}

/// Runs every source whose work is due, or whose descriptor was ready
/// (`ready` from `at` on, in the sources' order; empty: only time is
/// known); a failure is queued for the session to decide on.
fn run_due(
    sources: &mut [Box<dyn DataSource>],
    queue: &mut VecDeque<Event>,
    ready: &[bool],
    mut at: usize,
) {
    let now = Instant::now();
    for s in sources {
        let n = s.fds().len();
        let woken = ready.get(at..at + n).is_some_and(|r| r.iter().any(|b| *b));
        at += n;
        if !woken && s.next_due().is_none_or(|due| due > now) {
            continue;
        }
        if let Err(e) = s.run(now, woken) {
            queue.push_back(Event::SourceFailed(SourceFailure {
                source: s.name().to_string(),
                phase: SourcePhase::Running,
                cause: std::sync::Arc::new(e),
            }));
        }
    }
}

impl Runner {
    /// A runner of `rec`, its time origin now; the session begins at the
    /// first [`settle`](Self::settle).
    pub(crate) fn new(rec: Recording) -> Self {
        let mut queue = VecDeque::new();
        queue.push_back(Event::Begin {
            wall_ms: crate::clock::realtime_ms(),
        });
        Self {
            rec,
            timers: Timers::new(),
            queue,
            pending: HashMap::new(),
            next_request: 0,
            exit: None,
            passes: 0,
            snapshots: Vec::new(),
            snapshot_triggers: BTreeMap::new(),
            next_snapshot_name: 0,
            warnings: Vec::new(),
            compressed: (0, 0),
            cut_bytes: 0,
            producer_flushes: HashMap::new(),
            producer_stop: false,
            producer_start: false,
            published: Vec::new(),
        }
    }

    /// Hands every queued event to the session and carries out its
    /// decisions, until the queue is empty.
    pub(crate) fn settle(&mut self) {
        while let Some(ev) = self.queue.pop_front() {
            let now = self.timers.now();
            for action in self.rec.session.on_event(ev, now) {
                self.execute(action);
            }
        }
    }

    /// The session ended: its exit is decided and its output holds nothing
    /// its reader has not taken (a stream's backlog). The host reads the
    /// [`outcome`](Self::outcome).
    pub(crate) fn is_over(&self) -> bool {
        self.exit.is_some() && self.rec.sink.as_ref_sink().pending_fd().is_none()
    }

    /// The earliest of the session's timers and its sources' next work.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        let timer = self.timers.next_due();
        let sources = self.rec.sources.iter().filter_map(|s| s.next_due()).min();
        let rules = self.rec.rules.as_ref().and_then(RuleBook::next_due);
        [timer, sources, rules].into_iter().flatten().min()
    }

    /// Descriptors whose readiness brings the session work, in the order
    /// [`on_wake`](Self::on_wake) expects their readiness: the control
    /// server's wake-up, the producer socket (the main job's own), each
    /// source's, then the output's room when it holds what its reader has
    /// not taken.
    pub(crate) fn interest(&self) -> Vec<(BorrowedFd<'_>, PollFlags)> {
        let mut fds = Vec::new();
        if let Some(c) = &self.rec.control {
            fds.push((c.wake_fd(), PollFlags::IN));
        }
        if let Some(p) = &self.rec.producers {
            fds.extend(p.fds().into_iter().map(|f| (f, PollFlags::IN)));
        }
        for s in &self.rec.sources {
            fds.extend(s.fds().into_iter().map(|f| (f, PollFlags::IN)));
        }
        if let Some(fd) = self.rec.sink.as_ref_sink().pending_fd() {
            fds.push((fd, PollFlags::OUT));
        }
        fds
    }

    /// Takes what happened since the last wake-up: control requests,
    /// producers' events, due timers, the sources' due work (`ready` is the
    /// readiness of [`interest`](Self::interest), in its order; empty: none
    /// known). Queues the events; [`settle`](Self::settle) decides on them.
    pub(crate) fn on_wake(&mut self, ready: &[bool]) {
        self.take_control_requests();
        self.take_producer_events();
        for t in self.timers.due() {
            self.queue.push_back(Event::TimerFired(t));
        }
        self.run_sources(ready);
        self.take_rule_firings();
        self.push_output();
    }

    /// The rules on the session's state look at it when due; every firing
    /// queued (by them or the sources) goes to the session as a trigger
    /// from producer `recorder` at the matched event's time, or as a
    /// rotation.
    fn take_rule_firings(&mut self) {
        let Some(book) = self.rec.rules.as_mut() else {
            return;
        };
        let now = Instant::now();
        if book.state_due(now) && self.exit.is_none() {
            let buffers: Vec<_> = self.rec.buffers.iter().map(|b| b.buffer.stats()).collect();
            let segments = self.rec.sink.segments();
            let view = StateView {
                buffers: &buffers,
                upstream_lost: self
                    .rec
                    .sources
                    .iter()
                    .filter_map(|s| s.upstream_loss())
                    .map(|u| u.events)
                    .sum(),
                segments_deleted: segments.as_ref().map_or(0, |s| s.deleted),
                written: self.rec.sink.bytes_written(),
                max_size: self.rec.max_file_size,
            };
            book.check_state(now, &view);
        }
        let firings = book.take();
        let uid = self.rec.log.uid();
        for (f, action) in firings {
            let Some(name) = self
                .rec
                .rules
                .as_ref()
                .and_then(|b| b.rules().get(f.rule))
                .map(|r| r.name.clone())
            else {
                continue;
            };
            log::info!(
                "rule {name:?} fired: {} ({:.1} ms after the event)",
                f.note,
                crate::clock::boottime_ns().saturating_sub(f.ts_ns) as f64 / 1e6
            );
            let id = RequestId(self.next_request);
            self.next_request += 1;
            self.pending.insert(id, Waiting::Rule(f.rule));
            match action {
                RuleAction::Trigger => {
                    let names = vec![self.trigger_name(&name)];
                    self.queue.push_back(Event::Triggers(TriggerArrival {
                        request: Some(id),
                        producer: rule::PRODUCER_NAME.to_string(),
                        uid,
                        names,
                        at_ns: Some(f.ts_ns),
                    }));
                }
                RuleAction::Rotate => {
                    // Every firing is a trigger packet, a rotation's too.
                    self.rec.log.trigger(TriggerRecord {
                        name,
                        producer: rule::PRODUCER_NAME.to_string(),
                        uid,
                        stop_delay_ms: 0,
                        boot_ns: f.ts_ns,
                    });
                    self.queue.push_back(Event::RotateRequest(id));
                }
            }
        }
    }

    /// A `recorder rotate` of the control socket.
    fn rotate_request(&mut self, id: RequestId) -> Event {
        Event::RotateRequest(id)
    }

    /// Writes out what a stream output holds as its reader makes room; a
    /// failure is the session's (before its end) or a warning (after).
    fn push_output(&mut self) {
        let sink = self.rec.sink.as_sink();
        if sink.pending_fd().is_none() {
            return;
        }
        if let Err(e) = sink.drain_pending() {
            if self.exit.is_none() {
                self.queue
                    .push_back(Event::OutputFailed(OutputError::from(e)));
            } else {
                self.warn(format!("the output's last bytes: {e}"));
            }
        }
    }

    /// Whether the session serves producers (its events come from the
    /// producer socket).
    pub(crate) fn has_producers(&self) -> bool {
        self.rec.producers.is_some()
    }

    /// SIGINT or SIGTERM reached the session's process.
    pub(crate) fn signal(&mut self) {
        self.queue.push_back(Event::Signal);
    }

    /// A request of the host's (a consumer's, under `recorder serve`): its
    /// answer is published as [`SessionEvent::Answered`] with `ticket`.
    pub(crate) fn command(&mut self, command: Command, ticket: Ticket) {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        let (ev, attachment) = match command {
            Command::Start => (Event::StartRequest(id), None),
            Command::Stop => (Event::StopRequest(id), None),
            Command::Flush => (Event::FlushRequest(id), None),
            Command::Drain => (Event::DrainRequest(id), None),
            Command::Clone(fd) => (Event::CloneRequest(id), Some(fd)),
        };
        self.pending
            .insert(id, Waiting::Host { ticket, attachment });
        self.queue.push_back(ev);
    }

    /// What the session published since the last call.
    pub(crate) fn take_published(&mut self) -> Vec<SessionEvent> {
        std::mem::take(&mut self.published)
    }

    /// Runs every source whose work is due, or whose descriptor was ready;
    /// a failure is the session's to decide on.
    fn run_sources(&mut self, ready: &[bool]) {
        // The sources' descriptors follow the control and producer ones.
        let at = self.rec.control.is_some() as usize
            + self.rec.producers.as_ref().map_or(0, |p| p.fds().len());
        run_due(&mut self.rec.sources, &mut self.queue, ready, at);
    }

    fn take_control_requests(&mut self) {
        let incoming = match &self.rec.control {
            Some(c) => c.pending(),
            None => return,
        };
        for inc in incoming {
            let id = RequestId(self.next_request);
            self.next_request += 1;
            let ev = match &inc.request {
                Request::Query {} => {
                    // The control socket is open to every local user: a
                    // caller sees the quota lines of its own uid only.
                    let st = self.status(QuotaView::for_consumer(Some(inc.peer_uid)));
                    inc.answer(Reply::Status(Box::new(st)));
                    continue;
                }
                Request::Stop {} => Event::StopRequest(id),
                Request::Start {} => Event::StartRequest(id),
                Request::Rotate {} => self.rotate_request(id),
                Request::Trigger { names, producer } => Event::Triggers(TriggerArrival {
                    request: Some(id),
                    producer: producer.clone(),
                    uid: inc.peer_uid,
                    names: names.iter().map(|n| self.trigger_name(n)).collect(),
                    at_ns: None,
                }),
            };
            self.pending.insert(id, Waiting::Control(inc));
            self.queue.push_back(ev);
        }
    }

    fn take_producer_events(&mut self) {
        let Some(host) = self.rec.producers.as_mut() else {
            return;
        };
        for ev in host.poll() {
            match ev {
                HostEvent::Triggers {
                    producer,
                    uid,
                    names,
                } => {
                    let names = names.iter().map(|n| self.trigger_name(n)).collect();
                    self.queue.push_back(Event::Triggers(TriggerArrival {
                        request: None,
                        producer,
                        uid,
                        names,
                        at_ns: None,
                    }));
                }
                HostEvent::Flushed(id) => {
                    if let Some(complete) = self.producer_flushes.remove(&FlushId(id)) {
                        self.queue.push_back(Event::SourcesFlushed {
                            id: FlushId(id),
                            complete,
                        });
                    }
                }
                HostEvent::Started => {
                    if std::mem::take(&mut self.producer_start) {
                        self.queue.push_back(Event::SourcesStarted);
                    }
                }
                HostEvent::Stopped => {
                    if std::mem::take(&mut self.producer_stop) {
                        self.queue.push_back(Event::SourcesStopped);
                    }
                }
            }
        }
    }

    /// A trigger name with the draw and 24 h count the session needs.
    fn trigger_name(&self, name: &str) -> TriggerName {
        let matches_last_24h = self
            .rec
            .history
            .as_ref()
            .and_then(|h| h.count(name, history::now_secs()).ok())
            .unwrap_or(0);
        TriggerName {
            name: name.to_string(),
            draw: rand::random::<f64>(),
            matches_last_24h,
        }
    }

    fn execute(&mut self, action: Action) {
        match action {
            Action::StartSources => {
                self.start_sources();
            }
            Action::SetTimer(t, at) => self.timers.set(t, at),
            Action::CancelTimer(t) => self.timers.cancel(t),
            Action::AcceptTrigger(t) => self.accept_trigger(t),
            Action::Reply(id, answer) => self.reply(id, answer),
            Action::FlushSources {
                id,
                timeout,
                for_stop,
            } => self.flush_sources(id, timeout, for_stop),
            Action::WritePass { pass, sync } => self.write_pass(pass, sync),
            Action::SyncOutput => {
                let ev = match self.rec.sink.sync_data() {
                    Ok(()) => Event::OutputSynced,
                    Err(e) => {
                        log::error!("fdatasync failed: {e}");
                        Event::OutputFailed(OutputError::from(e))
                    }
                };
                self.queue.push_back(ev);
            }
            Action::Rotate(reason) => self.rotate(reason),
            Action::CloseOutput { failed } => self.close_output(failed),
            Action::StatsTick => self.rec.log.tick(),
            Action::ClearIncrementalState => {
                for s in &mut self.rec.sources {
                    s.clear_incremental_state();
                }
                if let Some(p) = &mut self.rec.producers {
                    p.clear_incremental_state();
                }
            }
            Action::ScrapeProducers => {
                if let Some(p) = &mut self.rec.producers {
                    p.scrape();
                }
            }
            Action::PrepareSnapshot { n: _, clear } | Action::PrepareClone { clear } => {
                self.rec.log.event(ServiceEvent::CloneStarted);
                for b in clear.iter().filter_map(|&i| self.rec.buffers.get(i)) {
                    b.buffer.clear();
                }
            }
            Action::Snapshot { n, takes } => self.snapshot(n, &takes),
            Action::CloneInto { id, takes } => self.clone_into(id, &takes),
            Action::Service(ev) => {
                if ev == ServiceEvent::AllDataSourcesStarted {
                    self.published.push(SessionEvent::AllDataSourcesStarted);
                }
                self.rec.log.event(ev);
            }
            Action::AnnounceStop => {
                if let Some(c) = &self.rec.control {
                    c.mark_stopping();
                }
            }
            Action::StopSources => self.stop_sources(),
            Action::NoteSlowStart => {
                let slow = self.rec.producers.as_ref().map_or_else(Vec::new, |p| {
                    p.not_started(crate::trace::service::MAX_LISTED_DATA_SOURCES)
                });
                if !slow.is_empty() {
                    log::warn!("data sources slow to start: {slow:?}");
                    self.rec.log.slow_starting(slow);
                }
            }
            Action::Exit(reason) => {
                log::info!("session over: {reason}");
                self.exit = Some(reason);
            }
        }
    }

    fn start_sources(&mut self) {
        log::info!("{}: tracing started", self.rec.output_label);
        self.rec.log.started();
        for s in &mut self.rec.sources {
            if let Err(e) = s.start() {
                self.queue.push_back(Event::SourceFailed(SourceFailure {
                    source: s.name().to_string(),
                    phase: SourcePhase::Starting,
                    cause: std::sync::Arc::new(e),
                }));
                return;
            }
        }
        if let Some(p) = &mut self.rec.producers
            && p.start()
        {
            self.producer_start = true;
            return;
        }
        self.queue.push_back(Event::SourcesStarted);
    }

    fn accept_trigger(&mut self, t: AcceptedTrigger) {
        let rec = TriggerRecord {
            name: t.name.clone(),
            producer: t.producer,
            uid: t.uid,
            stop_delay_ms: t.stop_delay.as_millis() as u64,
            // A rule's firing carries the time of the event it matched.
            boot_ns: t.at_ns.unwrap_or_else(crate::clock::boottime_ns),
        };
        log::info!(
            "trigger {:?} accepted (stop delay {} ms)",
            t.name,
            rec.stop_delay_ms
        );
        if let Some(n) = t.snapshot {
            self.snapshot_triggers.insert(n, rec.clone());
        }
        self.rec.log.trigger(rec);
        if let Some(h) = &self.rec.history
            && let Err(e) = h.record(&t.name, history::now_secs())
        {
            self.warn(format!("trigger history: {e}"));
        }
    }

    fn reply(&mut self, id: RequestId, answer: Answer) {
        let inc = match self.pending.remove(&id) {
            Some(Waiting::Control(inc)) => inc,
            Some(Waiting::Host { ticket, .. }) => {
                self.published.push(SessionEvent::Answered {
                    ticket,
                    response: Response::Session(answer),
                });
                return;
            }
            Some(Waiting::Rule(i)) => {
                let refusal = match &answer {
                    Answer::Triggers(o) => o.first().and_then(|(_, r)| r.err()).map(|r| r.as_str()),
                    Answer::Rotated(r) => r.err().map(|r| r.as_str()),
                    _ => None,
                };
                if let Some(why) = refusal {
                    log::info!("rule firing not taken: {why}");
                }
                if let Some(b) = self.rec.rules.as_mut() {
                    b.answered(i, refusal);
                }
                return;
            }
            None => return,
        };
        let reply = match answer {
            Answer::Triggers(outcomes) => Reply::Triggers(
                outcomes
                    .into_iter()
                    .map(|(name, res)| TriggerOutcome {
                        name,
                        accepted: res.is_ok(),
                        reason: res.err().map(|r| r.as_str().to_string()),
                    })
                    .collect(),
            ),
            Answer::Stopping => Reply::Stopping,
            Answer::Started(Ok(())) => Reply::Started,
            Answer::Started(Err(r)) => Reply::Refused(format!("not started: {}", r.as_str())),
            // Flushes and drains are the host's requests, never the
            // control socket's: an answer here would be a bug, said as a
            // refusal rather than a panic.
            Answer::Flushed(_) | Answer::Drained => {
                Reply::Refused("not a request of the control socket".into())
            }
            Answer::NotCloned(r) => Reply::Refused(r.as_str().into()),
            Answer::Rotated(Ok(())) => Reply::Rotated,
            Answer::Rotated(Err(r)) => Reply::Refused(format!("not rotated: {}", r.as_str())),
        };
        inc.answer(reply);
    }

    /// Flushes the built-in sources in turn within `timeout` in all (each
    /// pushes out what it holds, on this thread); producers answer later,
    /// on their sockets.
    fn flush_sources(&mut self, id: FlushId, timeout: Duration, for_stop: bool) {
        let deadline = Instant::now() + timeout;
        let mut complete = true;
        for i in 0..self.rec.sources.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(e) = self.rec.sources[i].flush(left) {
                self.warn(e.to_string());
                complete = false;
            }
        }
        // Producers answer later, on their sockets.
        if let Some(p) = &mut self.rec.producers
            && p.flush(id.0, for_stop)
        {
            // Flushes the session already gave up on (its deadline passed)
            // need no entry: keep only the recent ones.
            if self.producer_flushes.len() >= 1000
                && let Some(oldest) = self.producer_flushes.keys().min().copied()
            {
                self.producer_flushes.remove(&oldest);
            }
            self.producer_flushes.insert(id, complete);
            return;
        }
        self.queue.push_back(Event::SourcesFlushed { id, complete });
    }

    fn stop_sources(&mut self) {
        for s in &mut self.rec.sources {
            if let Err(e) = s.stop() {
                self.warnings.push(e.to_string());
            }
            self.warnings.extend(s.loss_warnings());
        }
        if let Some(p) = &mut self.rec.producers
            && p.stop()
        {
            self.producer_stop = true;
            return;
        }
        self.queue.push_back(Event::SourcesStopped);
    }

    fn write_pass(&mut self, pass: Pass, sync: bool) {
        let last = pass == Pass::Final;
        if last {
            self.rec.log.want_stats();
        }
        let head = self.rec.log.head();
        let plan: Vec<(Arc<Buffer>, Take)> = self
            .rec
            .buffers
            .iter()
            .map(|b| (b.buffer.clone(), Take::Consume))
            .collect();
        let buffers = &self.rec.buffers;
        let flushes = self.rec.session.flush_counts();
        let producers = self.rec.producers.as_ref();
        let control = self.rec.control.as_ref();
        let view = self.rec.quota_view;
        let rules = self.rec.rules.as_ref();
        let log = &mut self.rec.log;
        let tail = |carried| {
            log.tail(carried, || {
                trace_stats(buffers, flushes, producers, control, view, rules)
            })
        };
        // While the pass waits on the disk the sources' due work goes on:
        // a slow disk must not leave the kernel's buffers unread.
        let (sources, queue) = (&mut self.rec.sources, &mut self.queue);
        let mut idle = || run_due(sources, queue, &[], 0);
        let stage = PassStage {
            compress: self.rec.compress.as_mut(),
            count_packets: matches!(self.rec.sink, Output::Segments(_)),
            last,
            max_bounce: None,
            idle: Some(&mut idle),
        };
        let r = write_pass_staged(
            self.rec.sink.as_sink(),
            &head,
            &plan,
            tail,
            self.rec.max_file_size,
            sync,
            stage,
        );
        self.passes += 1;
        let ev = match r {
            Ok(rep) => {
                log::debug!(
                    "pass {}: {} bytes in {:?}",
                    self.passes,
                    rep.bytes,
                    rep.duration
                );
                if rep.cap_reached && !last {
                    log::info!("max_file_size_bytes reached: stopping");
                }
                self.note_pass(&rep);
                Event::PassWritten {
                    cap_reached: rep.cap_reached,
                    segment: self.segment_fill(),
                }
            }
            Err(e) => {
                log::error!("write failed: {e}");
                if last {
                    self.warnings.push(format!("final write failed: {e}"));
                }
                Event::OutputFailed(e.into())
            }
        };
        self.queue.push_back(ev);
    }

    /// Figures of a pass for the summary and the segment's sidecar.
    fn note_pass(&mut self, rep: &PassReport) {
        self.compressed.0 += rep.input_bytes;
        self.compressed.1 += rep.bytes;
        self.cut_bytes += rep.cut_bytes;
        if let Output::Segments(w) = &mut self.rec.sink {
            w.record_pass(rep);
        }
    }

    fn segment_fill(&self) -> Option<SegmentFill> {
        match &self.rec.sink {
            Output::Segments(w) => w.fill().map(|(bytes, age)| SegmentFill { bytes, age }),
            Output::File(_) => None,
        }
    }

    /// Tells the segment writer what each source has lost upstream of its
    /// buffer so far, for the sidecar of the segment about to close.
    fn note_upstream_loss(&mut self) {
        let Output::Segments(w) = &mut self.rec.sink else {
            return;
        };
        for s in &self.rec.sources {
            if let Some(u) = s.upstream_loss() {
                w.note_upstream_loss(s.name(), u.events, u.advice);
            }
        }
    }

    /// Closes the segment being written (with its closing `trace_stats`)
    /// and opens the next, headed afresh by the service log.
    fn rotate(&mut self, reason: RotateReason) {
        self.note_upstream_loss();
        let Output::Segments(w) = &mut self.rec.sink else {
            return;
        };
        let started = Instant::now();
        let tail = self.rec.log.segment_tail(&trace_stats(
            &self.rec.buffers,
            self.rec.session.flush_counts(),
            self.rec.producers.as_ref(),
            self.rec.control.as_ref(),
            self.rec.quota_view,
            self.rec.rules.as_ref(),
        ));
        match w.rotate(&tail, reason) {
            Ok(()) => {
                let (index, uuid) = (w.index(), w.trace_uuid());
                log::debug!(
                    "rotation to segment {index} ({reason:?}): {:?}",
                    started.elapsed()
                );
                self.rec.log.begin_segment(index, uuid);
            }
            Err(e) => {
                log::error!("rotating the output failed: {e}");
                self.queue
                    .push_back(Event::OutputFailed(OutputError::from(e)));
            }
        }
    }

    /// The end of the output: the last segment is closed (renamed, its
    /// sidecar written) and queued hooks get their grace period.
    fn close_output(&mut self, failed: bool) {
        self.note_upstream_loss();
        let Output::Segments(w) = &mut self.rec.sink else {
            return;
        };
        let r = if failed {
            w.finish_after_failure()
        } else {
            w.finish(&[])
        };
        if let Err(e) = r {
            self.warnings.push(format!("closing the last segment: {e}"));
        }
        if let Some(st) = self.rec.sink.segments() {
            self.warnings.extend(st.warnings);
        }
    }

    fn snapshot(&mut self, n: u32, takes: &[Take]) {
        if self.rec.snapshots_to_host {
            let trigger = self.snapshot_triggers.get(&n).map(|t| t.name.clone());
            log::info!("snapshot {n}: told to the consumer, which clones the session");
            self.published.push(SessionEvent::CloneTriggerHit {
                trigger: trigger.unwrap_or_default(),
            });
            return;
        }
        let Some(base) = self.rec.snapshot_base.clone() else {
            self.warn("a snapshot was triggered but the output is not a file: skipped".into());
            return;
        };
        let mut path = PathBuf::from(format!("{}.{n}", base.display()));
        let opened = match &self.rec.snapshot_dir {
            // The next name that can take a file: a directory planted at
            // OUT.N does not lose the snapshot.
            Some((dir, name)) => {
                let from = n.max(self.next_snapshot_name);
                crate::storage::open_numbered(dir, name, from, self.rec.snapshot_open).map(
                    |(k, sink)| {
                        self.next_snapshot_name = k + 1;
                        path = PathBuf::from(format!("{}.{k}", base.display()));
                        sink
                    },
                )
            }
            None => {
                crate::storage::open_output(OutputPath::File(path.clone()), self.rec.snapshot_open)
            }
        };
        let mut sink = match opened {
            Ok(s) => s,
            Err(e) => {
                self.warn(format!("snapshot {}: {e}", path.display()));
                return;
            }
        };
        let trigger = self.snapshot_triggers.get(&n).cloned();
        match self.write_copy(sink.as_mut(), trigger.as_ref(), takes) {
            Ok(rep) => {
                log::info!("snapshot {} written: {} bytes", path.display(), rep.bytes);
                self.snapshots.push(path);
            }
            Err(e) => self.warn(format!("snapshot {}: {e}", path.display())),
        }
    }

    /// A consumer's clone: a copy of the buffers into the descriptor that
    /// came with the request; the buffers stay as they are.
    fn clone_into(&mut self, req: RequestId, takes: &[Take]) {
        let (ticket, fd) = match self.pending.remove(&req) {
            Some(Waiting::Host { ticket, attachment }) => (ticket, attachment),
            Some(Waiting::Control(inc)) => {
                // The control socket carries no descriptors.
                inc.answer(Reply::Refused("no output for the clone".into()));
                return;
            }
            Some(Waiting::Rule(_)) | None => return,
        };
        let result = match fd {
            None => Err(CloneError::NoOutput),
            Some(fd) => self.clone_to(fd, takes),
        };
        if let Err(e) = &result {
            log::info!("clone not written: {e}");
        }
        self.published.push(SessionEvent::Answered {
            ticket,
            response: Response::Cloned(result),
        });
    }

    /// A copy of the buffers into `fd`: its bytes.
    fn clone_to(&mut self, fd: OwnedFd, takes: &[Take]) -> Result<u64, CloneError> {
        let mut sink = crate::storage::sink_for_fd(fd, crate::storage::IoChoice::Auto, false)
            .map_err(CloneError::Output)?;
        // The latest snapshot trigger is the one the consumer clones for.
        let trigger = self.snapshot_triggers.values().next_back().cloned();
        let rep = self
            .write_copy(sink.as_mut(), trigger.as_ref(), takes)
            .map_err(CloneError::Write)?;
        log::info!("clone written: {} bytes", rep.bytes);
        Ok(rep.bytes)
    }

    /// Writes a copy of every buffer, each taken as `takes` says, as a whole
    /// trace: the snapshot head, the buffers, the clone's events and
    /// trace_stats.
    fn write_copy(
        &mut self,
        sink: &mut dyn crate::storage::FileSink,
        trigger: Option<&TriggerRecord>,
        takes: &[Take],
    ) -> Result<PassReport, crate::storage::write_pass::PassError> {
        let head = self.rec.log.snapshot_head(trigger);
        let plan: Vec<(Arc<Buffer>, Take)> = (self.rec.buffers.iter())
            .zip(takes)
            .map(|(b, &take)| (b.buffer.clone(), take))
            .collect();
        let buffers = &self.rec.buffers;
        let flushes = self.rec.session.flush_counts();
        let producers = self.rec.producers.as_ref();
        let control = self.rec.control.as_ref();
        let view = self.rec.quota_view;
        let rules = self.rec.rules.as_ref();
        let uid = self.rec.log.uid();
        let tail = |_| {
            use crate::trace::service;
            let now = crate::clock::boottime_ns();
            let mut t: Vec<Vec<u8>> = (0..buffers.len() as u32)
                .map(|i| service::buffer_cloned(uid, now, i))
                .collect();
            t.push(service::service_event(
                uid,
                now,
                ServiceEvent::TracingDisabled,
            ));
            t.push(service::service_event(
                uid,
                now,
                ServiceEvent::ReadTracingBuffersCompleted,
            ));
            t.extend(service::stats_packets(
                uid,
                now,
                &trace_stats(buffers, flushes, producers, control, view, rules),
            ));
            t
        };
        let (sources, queue) = (&mut self.rec.sources, &mut self.queue);
        let mut idle = || run_due(sources, queue, &[], 0);
        let stage = PassStage {
            compress: self.rec.compress.as_mut(),
            count_packets: false,
            last: true,
            max_bounce: None,
            idle: Some(&mut idle),
        };
        write_pass_staged(sink, &head, &plan, tail, None, true, stage)
    }

    /// The session's state for people.
    pub(crate) fn state_text(&self) -> &'static str {
        match self.rec.session.state() {
            State::Deferred => "deferred (waiting for `recorder start`)",
            State::WaitingForTrigger => "waiting for trigger",
            State::Recording if self.rec.session.waiting_for_trigger() => {
                "recording (waiting for trigger)"
            }
            State::Recording => "recording",
            State::Stopping => "stopping",
            State::Finished => "finished",
        }
    }

    /// The session's live status, with the quota lines `viewer` may see.
    pub(crate) fn status(&self, viewer: QuotaView) -> SessionStatus {
        SessionStatus {
            pid: std::process::id(),
            uid: self.rec.log.uid(),
            config: self.rec.config_label.clone(),
            output: self.rec.output_label.clone(),
            state: self.state_text().to_string(),
            elapsed_ms: self.timers.now().as_millis() as u64,
            bytes_written: self.rec.sink.bytes_written(),
            segments: self.rec.sink.segments().map(Box::new),
            buffers: self
                .rec
                .buffers
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let s = b.buffer.stats();
                    BufferStatus {
                        index: i as u32,
                        policy: b.policy.to_string(),
                        size_bytes: s.buffer_size,
                        buffered_bytes: s.bytes_buffered,
                        bytes_written: s.bytes_written,
                        bytes_overwritten: s.bytes_overwritten,
                        bytes_discarded: s.bytes_discarded,
                        packets_lost: s.packets_overwritten
                            + s.packets_discarded
                            + s.packets_refused,
                    }
                })
                .collect(),
            control_requests_refused: self.rec.control.as_ref().map_or(0, |c| c.refused()),
            producer_socket: self
                .rec
                .producers
                .as_ref()
                .map(|p| p.path().display().to_string()),
            producers: self.rec.producers.as_ref().map_or_else(Vec::new, |p| {
                p.reports()
                    .into_iter()
                    .rev()
                    .take(MAX_PRODUCERS_SHOWN)
                    .map(|r| ProducerStatus {
                        refused: r.stats.lost(),
                        losses: r
                            .stats
                            .losses()
                            .into_iter()
                            .map(|(w, n)| (w.to_string(), n))
                            .collect(),
                        chunks_scraped: r.stats.chunks_scraped,
                        name: r.name,
                        pid: r.pid,
                        uid: r.uid,
                        data_sources: r.data_sources,
                        packets: r.stats.packets,
                        bytes: r.stats.bytes,
                        connected: r.connected,
                    })
                    .collect()
            }),
            rules: self.rec.rules.as_ref().map_or_else(Vec::new, |b| {
                b.reports()
                    .into_iter()
                    .take(crate::control::wire::MAX_RULES_SHOWN)
                    .map(|r| crate::control::wire::RuleStatus {
                        text: r
                            .text
                            .chars()
                            .take(crate::control::wire::MAX_RULE_TEXT_SHOWN)
                            .collect(),
                        name: r.name,
                        matched: r.matched,
                        suppressed: r.suppressed,
                        fired: r.fired,
                        accepted: r.accepted,
                    })
                    .collect()
            }),
            quotas: crate::control::wire::UidQuotaStatus::of(&viewer.filter(quota_reports(
                self.rec.producers.as_ref(),
                self.rec.control.as_ref(),
                self.rec.quota_view,
            ))),
        }
    }

    /// Each buffer's figures now.
    pub(crate) fn buffer_stats(&self) -> Vec<crate::ringbuf::BufferStats> {
        self.rec.buffers.iter().map(|b| b.buffer.stats()).collect()
    }

    /// The figures of the live status line.
    pub(crate) fn status_figures(&self) -> StatusFigures<'static> {
        StatusFigures {
            elapsed: self.timers.now(),
            state: self.state_text(),
            bytes_written: self.rec.sink.bytes_written(),
            buffers: self.rec.buffers.iter().map(|b| b.buffer.stats()).collect(),
        }
    }

    fn warn(&mut self, w: String) {
        log::warn!("{w}");
        self.warnings.push(w);
    }

    /// How the session ended; requests it never answered are told it
    /// ended.
    pub(crate) fn outcome(mut self) -> Outcome {
        for (_, w) in self.pending.drain() {
            if let Waiting::Control(inc) = w {
                inc.answer(Reply::Refused("the session has ended".into()));
            }
        }
        Outcome {
            reason: self.exit.clone().unwrap_or(StopReason::StopRequested),
            output_label: self.rec.output_label.clone(),
            bytes_written: self.rec.sink.bytes_written(),
            elapsed: self.timers.now(),
            buffers: self
                .rec
                .buffers
                .iter()
                .map(|b| BufferSummary {
                    policy: b.policy,
                    stats: b.buffer.stats(),
                })
                .collect(),
            snapshots: self.snapshots.clone(),
            snapshots_refused: self.rec.session.snapshots_refused(),
            passes: self.passes,
            triggered: self.rec.session.triggered(),
            sink_kind: self.rec.sink.kind().to_string(),
            warnings: self.warnings.clone(),
            segments: self.rec.sink.segments(),
            compression: self.rec.compress.as_ref().map(|_| self.compressed),
            cut_bytes: self.cut_bytes,
            producers: self
                .rec
                .producers
                .as_ref()
                .map_or_else(Vec::new, |p| p.reports()),
            quotas: quota_reports(
                self.rec.producers.as_ref(),
                self.rec.control.as_ref(),
                self.rec.quota_view,
            ),
            rules: self
                .rec
                .rules
                .as_ref()
                .map_or_else(Vec::new, RuleBook::reports),
        }
    }
}
