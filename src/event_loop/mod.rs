//! Executes the session's decisions. The loop waits once (`reactor`),
//! turns what happened into [`Event`]s on a queue, hands each to
//! [`Session::on_event`] and carries out the returned [`Action`]s. An action's
//! result (a pass written, sources flushed) goes back on the queue as an
//! event: nothing here decides (an action carries every choice it needs),
//! and nothing dispatches from inside an action. `tests.rs` runs the
//! executor against fake data sources and a fake sink.
//!
//! Write passes run on this thread: the data sources write on their own
//! threads and never wait for it (R4); a pass only delays control requests,
//! which the control thread queues meanwhile.
//!
//! Adding an input (a socket, say) means: a descriptor in `Loop::wait`, a
//! translation of what it brings into session events, and the session's
//! rules for those events.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod outcome;
mod reactor;
mod status_line;
#[cfg(test)]
mod tests;

pub use outcome::{BufferSummary, Outcome};
pub use reactor::Reactor;

use crate::control::history::{self, TriggerHistory};
use crate::control::message::{
    BufferStatus, MAX_PRODUCERS_SHOWN, ProducerStatus, Reply, Request, SessionStatus,
    TriggerOutcome,
};
use crate::control::server::{ControlServer, Incoming};
use crate::ipc::host::{HostEvent, ProducerHost, QuotaView};
use crate::ipc::quota::{Limit, UidReport};
use crate::ringbuf::Buffer;
use crate::session::{
    AcceptedTrigger, Action, Answer, Event, FlushCounts, FlushId, Pass, RequestId, SegmentFill,
    Session, SourceFailure, SourcePhase, State, StopReason, TriggerArrival, TriggerName,
};
use crate::sources::DataSource;
use crate::storage::compress::ZstdStage;
use crate::storage::create::OutputDir;
use crate::storage::segment::Output;
use crate::storage::segment::policy::RotateReason;
use crate::storage::write_pass::{PassReport, PassStage, Take, write_pass_staged};
use crate::storage::{OpenOptions as SinkOpenOptions, OutputError, OutputPath};
use crate::sys::signals::Signals;
use crate::trace::service::{ServiceEvent, TraceStatsRecord, TriggerRecord};
use crate::trace::service_log::ServiceLog;
use status_line::{StatusFigures, StatusLine};

/// One buffer of the session, as the loop needs it.
pub struct SessionBuffer {
    pub buffer: Arc<Buffer>,
    /// `RING_BUFFER` or `DISCARD`, for people.
    pub policy: &'static str,
}

/// Everything a running session is made of; built by `app`.
pub struct Recording {
    pub session: Session,
    pub buffers: Vec<SessionBuffer>,
    pub sources: Vec<Box<dyn DataSource>>,
    /// One file, or numbered segments.
    pub sink: Output,
    /// zstd between the ring and the file (`compression { zstd {} }`, `--compress`).
    pub compress: Option<ZstdStage>,
    /// The output as people should read it (a path or `stdout`).
    pub output_label: String,
    /// Where snapshots go: `OUT.0`, `OUT.1`, … (CLONE_SNAPSHOT).
    pub snapshot_base: Option<PathBuf>,
    pub snapshot_open: SinkOpenOptions,
    pub log: ServiceLog,
    pub max_file_size: Option<u64>,
    pub control: Option<ControlServer>,
    pub history: Option<TriggerHistory>,
    /// The producer socket and its connections (Perfetto SDK apps).
    pub producers: Option<ProducerHost>,
    pub config_label: String,
    /// Show a live status line on stderr (when it is a terminal).
    pub status_line: bool,
    /// Where snapshots are made: the output's checked directory and the
    /// output's file name (CLONE_SNAPSHOT sessions).
    pub snapshot_dir: Option<(OutputDir, String)>,
    /// Whose quota figures the trace and the summary show.
    pub quota_view: QuotaView,
    /// Where a snapshot goes instead of a file: told to the session's
    /// consumer, which clones it (a CLONE_SNAPSHOT session of `recorder
    /// serve`).
    pub on_snapshot: Option<SnapshotHook>,
}

/// Told the snapshot's number and the trigger that asked for it.
pub type SnapshotHook = Box<dyn FnMut(u32, Option<&TriggerRecord>) + Send>;

/// Runs the session to its end. `signals` were installed before the
/// session was set up (a signal that came meanwhile stops it at once);
/// without them the loop installs its own.
pub fn run(rec: Recording, signals: Option<Signals>) -> Outcome {
    let signals = signals.or_else(|| match Signals::install() {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn!("cannot install signal handlers: {e}");
            None
        }
    });
    let mut l = Loop::new(rec, signals);
    l.run();
    l.outcome()
}

/// How long the loop sleeps at most once the sources started: they report
/// failures from their own threads, which the loop looks at once per
/// wake-up.
const SOURCE_CHECK: Duration = Duration::from_secs(1);

/// How long it sleeps at most before that (a session waiting for its start
/// trigger): only its fds and the session's timers wake it.
const BEFORE_START: Duration = Duration::from_secs(3600);

struct Loop {
    rec: Recording,
    reactor: Reactor,
    signals: Option<Signals>,
    queue: VecDeque<Event>,
    /// Control requests waiting for the session's answer.
    pending: HashMap<RequestId, Incoming>,
    next_request: u64,
    exit: Option<StopReason>,
    passes: u64,
    snapshots: Vec<PathBuf>,
    /// The trigger that took each snapshot, by snapshot number.
    snapshot_triggers: BTreeMap<u32, TriggerRecord>,
    warnings: Vec<String>,
    status: Option<StatusLine>,
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
    /// StartSources was carried out: failures may come from their threads.
    sources_started: bool,
}

impl Loop {
    fn new(rec: Recording, signals: Option<Signals>) -> Self {
        let status = if rec.status_line {
            StatusLine::on_terminal()
        } else {
            None
        };
        Self {
            rec,
            reactor: Reactor::new(),
            signals,
            queue: VecDeque::new(),
            pending: HashMap::new(),
            next_request: 0,
            exit: None,
            passes: 0,
            snapshots: Vec::new(),
            snapshot_triggers: BTreeMap::new(),
            warnings: Vec::new(),
            status,
            compressed: (0, 0),
            cut_bytes: 0,
            producer_flushes: HashMap::new(),
            producer_stop: false,
            producer_start: false,
            sources_started: false,
        }
    }

    fn run(&mut self) {
        self.queue.push_back(Event::Begin {
            wall_ms: crate::clock::realtime_ms(),
        });
        // A signal during set-up: the session stops as soon as it began.
        self.take_signals();
        loop {
            self.settle();
            if self.exit.is_some() {
                break;
            }
            self.wait();
        }
        // Requests the session never answered (it ended first).
        for (_, inc) in self.pending.drain() {
            inc.answer(Reply::Refused("the session has ended".into()));
        }
        if let Some(s) = self.status.take() {
            s.finish();
        }
    }

    /// Hands every queued event to the session and carries out its
    /// decisions, until the queue is empty.
    fn settle(&mut self) {
        while let Some(ev) = self.queue.pop_front() {
            let now = self.reactor.now();
            for action in self.rec.session.on_event(ev, now) {
                self.execute(action);
            }
        }
    }

    /// The longest the next wait may sleep, timers aside.
    fn longest_sleep(&self) -> Duration {
        if self.sources_started {
            SOURCE_CHECK
        } else {
            BEFORE_START
        }
    }

    /// The one blocking wait; queues what happened as events.
    fn wait(&mut self) {
        let mut at_most = self.longest_sleep();
        if let Some(s) = &self.status {
            at_most = at_most.min(s.until_due());
        }
        let mut fds: Vec<BorrowedFd<'_>> = Vec::with_capacity(2);
        if let Some(s) = &self.signals {
            fds.push(s.fd());
        }
        if let Some(c) = &self.rec.control {
            fds.push(c.wake_fd());
        }
        if let Some(p) = &self.rec.producers {
            fds.extend(p.fds());
        }
        // Readiness only says where to look; every input is drained anyway.
        let _ = self.reactor.wait(&fds, at_most);
        self.take_signals();
        self.take_control_requests();
        self.take_producer_events();
        for t in self.reactor.due() {
            self.queue.push_back(Event::TimerFired(t));
        }
        self.take_source_failures();
        self.draw_status();
    }

    fn take_signals(&mut self) {
        let n = self.signals.as_ref().map_or(0, |s| s.take());
        for _ in 0..n {
            self.queue.push_back(Event::Signal);
        }
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
                    inc.answer(Reply::Status(st));
                    continue;
                }
                Request::Stop {} => Event::StopRequest(id),
                Request::Start {} => Event::StartRequest(id),
                Request::Flush {} => Event::FlushRequest(id),
                Request::Drain {} => Event::DrainRequest(id),
                Request::Clone {} => Event::CloneRequest(id),
                Request::Trigger { names, producer } => Event::Triggers(TriggerArrival {
                    request: Some(id),
                    producer: producer.clone(),
                    uid: inc.peer_uid,
                    names: names.iter().map(|n| self.trigger_name(n)).collect(),
                }),
            };
            self.pending.insert(id, inc);
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

    fn take_source_failures(&mut self) {
        for s in &mut self.rec.sources {
            if let Some(f) = s.take_failure() {
                let ev = Event::SourceFailed(SourceFailure {
                    source: s.name().to_string(),
                    phase: SourcePhase::Running,
                    cause: f,
                });
                self.queue.push_back(ev);
            }
        }
    }

    fn execute(&mut self, action: Action) {
        match action {
            Action::StartSources => {
                self.start_sources();
            }
            Action::SetTimer(t, at) => self.reactor.set(t, at),
            Action::CancelTimer(t) => self.reactor.cancel(t),
            Action::AcceptTrigger(t) => self.accept_trigger(t),
            Action::Reply(id, answer) => self.reply(id, answer),
            Action::FlushSources {
                id,
                timeout,
                for_stop,
            } => self.flush_sources(id, timeout, for_stop),
            Action::WritePass { pass, sync } => self.write_pass(pass, sync),
            Action::SyncOutput => {
                if let Err(e) = self.rec.sink.sync_data() {
                    self.warn(format!("fdatasync: {e}"));
                }
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
            Action::Service(ev) => self.rec.log.event(ev),
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
        log::info!("tracing started");
        self.sources_started = true;
        self.rec.log.started();
        for s in &mut self.rec.sources {
            if let Err(e) = s.start() {
                self.queue.push_back(Event::SourceFailed(SourceFailure {
                    source: s.name().to_string(),
                    phase: SourcePhase::Starting,
                    cause: e.cause_text(),
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
            boot_ns: crate::clock::boottime_ns(),
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
        let Some(inc) = self.pending.remove(&id) else {
            return;
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
            Answer::Flushed(complete) => Reply::Flushed { complete },
            Answer::Drained => Reply::Drained,
            Answer::NotCloned(r) => Reply::Refused(r.as_str().into()),
        };
        inc.answer(reply);
    }

    /// Flushes the sources in turn within `timeout` in all. A signal that
    /// arrives meanwhile ends the flush early: the session decides what it
    /// means (a second signal skips the rest of the stop's flush).
    fn flush_sources(&mut self, id: FlushId, timeout: Duration, for_stop: bool) {
        let deadline = Instant::now() + timeout;
        let mut complete = true;
        for i in 0..self.rec.sources.len() {
            let signals = self.signals.as_ref().map_or(0, |s| s.take());
            if signals > 0 {
                for _ in 0..signals {
                    self.queue.push_back(Event::Signal);
                }
                complete = false;
                break;
            }
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
        let log = &mut self.rec.log;
        let tail = |carried| {
            log.tail(carried, || {
                trace_stats(buffers, flushes, producers, control, view)
            })
        };
        let stage = PassStage {
            compress: self.rec.compress.as_mut(),
            count_packets: matches!(self.rec.sink, Output::Segments(_)),
            last,
            max_bounce: None,
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
        if let Some(hook) = &mut self.rec.on_snapshot {
            let trigger = self.snapshot_triggers.get(&n).cloned();
            log::info!("snapshot {n}: told to the consumer, which clones the session");
            hook(n, trigger.as_ref());
            return;
        }
        let Some(base) = self.rec.snapshot_base.clone() else {
            self.warn("a snapshot was triggered but the output is not a file: skipped".into());
            return;
        };
        let path = PathBuf::from(format!("{}.{n}", base.display()));
        let opened = match &self.rec.snapshot_dir {
            Some((dir, name)) => {
                crate::storage::open_in(dir, &format!("{name}.{n}"), self.rec.snapshot_open)
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
        let Some(mut inc) = self.pending.remove(&req) else {
            return;
        };
        let Some(fd) = inc.attachment.take() else {
            inc.answer(Reply::Refused("no output for the clone".into()));
            return;
        };
        let mut sink = match crate::storage::sink_for_fd(fd, crate::storage::IoChoice::Auto, false)
        {
            Ok(s) => s,
            Err(e) => {
                inc.answer(Reply::Refused(format!("clone: {e}")));
                return;
            }
        };
        // The latest snapshot trigger is the one the consumer clones for.
        let trigger = self.snapshot_triggers.values().next_back().cloned();
        match self.write_copy(sink.as_mut(), trigger.as_ref(), takes) {
            Ok(rep) => {
                log::info!("clone written: {} bytes", rep.bytes);
                inc.answer(Reply::Cloned { bytes: rep.bytes });
            }
            Err(e) => inc.answer(Reply::Refused(format!("clone: {e}"))),
        }
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
                &trace_stats(buffers, flushes, producers, control, view),
            ));
            t
        };
        let stage = PassStage {
            compress: self.rec.compress.as_mut(),
            count_packets: false,
            last: true,
            max_bounce: None,
        };
        write_pass_staged(sink, &head, &plan, tail, None, true, stage)
    }

    /// The session's state for people.
    fn state_text(&self) -> &'static str {
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
    fn status(&self, viewer: QuotaView) -> SessionStatus {
        SessionStatus {
            pid: std::process::id(),
            uid: self.rec.log.uid(),
            config: self.rec.config_label.clone(),
            output: self.rec.output_label.clone(),
            state: self.state_text().to_string(),
            elapsed_ms: self.reactor.now().as_millis() as u64,
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
            quotas: crate::control::message::UidQuotaStatus::of(&viewer.filter(quota_reports(
                self.rec.producers.as_ref(),
                self.rec.control.as_ref(),
                self.rec.quota_view,
            ))),
        }
    }

    fn draw_status(&mut self) {
        let Some(mut line) = self.status.take() else {
            return;
        };
        line.draw_if_due(|| StatusFigures {
            elapsed: self.reactor.now(),
            state: self.state_text(),
            bytes_written: self.rec.sink.bytes_written(),
            buffers: self.rec.buffers.iter().map(|b| b.buffer.stats()).collect(),
        });
        self.status = Some(line);
    }

    fn warn(&mut self, w: String) {
        log::warn!("{w}");
        self.warnings.push(w);
    }

    fn outcome(self) -> Outcome {
        Outcome {
            reason: self.exit.clone().unwrap_or(StopReason::StopRequested),
            output_label: self.rec.output_label.clone(),
            bytes_written: self.rec.sink.bytes_written(),
            elapsed: self.reactor.now(),
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
        }
    }
}

/// The `trace_attributes` entries of per-uid quota hits and folded closed
/// producers: `recorder.quota.uid.<uid>.<limit>` and
/// `recorder.quota.uid.<uid>.closed_producers`.
fn quota_attributes(reports: &[UidReport]) -> Vec<(String, i64)> {
    let mut v = Vec::new();
    for r in reports {
        for (limit, n) in r.hits.each() {
            v.push((
                format!("{}{}.{}", QUOTA_KEY_PREFIX, r.uid, limit.key()),
                i64::try_from(n).unwrap_or(i64::MAX),
            ));
        }
        if r.closed_producers > 0 {
            v.push((
                format!("{}{}.closed_producers", QUOTA_KEY_PREFIX, r.uid),
                i64::try_from(r.closed_producers).unwrap_or(i64::MAX),
            ));
        }
    }
    v
}

/// Where per-uid quota figures live in `trace_attributes`.
pub const QUOTA_KEY_PREFIX: &str = "recorder.quota.uid.";

/// trace_stats from the buffers' live counters, the flushes so far and what
/// producers did.
fn trace_stats(
    buffers: &[SessionBuffer],
    flushes: FlushCounts,
    producers: Option<&ProducerHost>,
    control: Option<&ControlServer>,
    view: QuotaView,
) -> TraceStatsRecord {
    let mut rec = TraceStatsRecord {
        flushes_requested: flushes.requested,
        flushes_succeeded: flushes.succeeded,
        flushes_failed: flushes.failed,
        ..TraceStatsRecord::of_buffers(buffers.iter().map(|b| &*b.buffer))
    };
    if let Some(p) = producers {
        let t = p.totals();
        // The built-in sources count as one producer, as traced_probes does.
        rec.producers_connected += t.connected;
        rec.producers_seen += t.seen;
        rec.data_sources_registered += t.data_sources_registered;
        rec.chunks_discarded = t.all.chunks_discarded;
        rec.patches_discarded = t.all.patches_failed;
        rec.invalid_packets = t.all.invalid_packets;
        for (b, s) in rec.buffers.iter_mut().zip(&t.per_buffer) {
            b.patches_succeeded = s.patches_succeeded;
            b.patches_failed = s.patches_failed;
            b.abi_violations = s.abi_violations;
            b.chunks_committed_out_of_order = s.chunks_committed_out_of_order;
            b.trace_writer_packet_loss += s.trace_writer_packet_loss;
        }
    }
    rec.quota_hits = quota_attributes(&quota_reports(producers, control, view));
    rec
}

/// Every uid that hit a producer quota, had its closed producers folded or
/// had control or trigger requests refused, by uid: those `view` shows.
fn quota_reports(
    producers: Option<&ProducerHost>,
    control: Option<&ControlServer>,
    view: QuotaView,
) -> Vec<UidReport> {
    let mut v = producers.map_or_else(Vec::new, |p| p.quota_reports());
    for (uid, n) in control.map_or_else(Vec::new, |c| c.refused_by_uid()) {
        match v.iter_mut().find(|r| r.uid == uid) {
            Some(r) => r.hits.add(Limit::ControlRequests, n),
            None => {
                let mut r = UidReport {
                    uid,
                    ..UidReport::default()
                };
                r.hits.add(Limit::ControlRequests, n);
                v.push(r);
            }
        }
    }
    v.sort_by_key(|r| r.uid);
    view.filter(v)
}
