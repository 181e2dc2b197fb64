//! Executes the session's decisions. One blocking wait (`poll` on the
//! signal pipe and the control server's wake-up pipe, with the nearest
//! deadline as timeout), then a `match` on what happened; the decisions
//! themselves are [`Session::on_event`]'s.
//!
//! Write passes run on this thread: the data sources write on their own
//! threads and never wait for it (R4); a pass only blocks control requests,
//! which the control thread queues meanwhile.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::time::Timespec;

use crate::control::history::{self, TriggerHistory};
use crate::control::message::{BufferStatus, Reply, Request, SessionStatus, TriggerOutcome};
use crate::control::server::{ControlServer, Incoming};
use crate::ringbuf::{Buffer, BufferStats};
use crate::session::{Action, Event, Session, State, StopReason, Timer, TriggerRefusal};
use crate::sources::DataSource;
use crate::storage::compress::ZstdStage;
use crate::storage::segment::{Output, SegmentsStatus};
use crate::storage::write_pass::{PassReport, PassStage, Take, write_pass_staged};
use crate::storage::{OpenOptions as SinkOpenOptions, OutputPath};
use crate::trace::service::{BufferStatsRecord, ServiceEvent, TraceStatsRecord, TriggerRecord};
use crate::trace::service_log::ServiceLog;

/// One buffer of the session, as the loop needs it.
pub struct SessionBuffer {
    pub buffer: Arc<Buffer>,
    /// `RING_BUFFER` or `DISCARD`, for people.
    pub policy: &'static str,
    pub transfer_on_clone: bool,
    pub clear_before_clone: bool,
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
    pub fsync_each_pass: bool,
    pub flush_timeout: Duration,
    pub control: Option<ControlServer>,
    pub history: Option<TriggerHistory>,
    pub config_label: String,
    /// Show a live status line on stderr (when it is a terminal).
    pub status_line: bool,
}

/// One buffer's figures at the end.
#[derive(Clone, Debug)]
pub struct BufferSummary {
    pub policy: &'static str,
    pub stats: BufferStats,
}

/// How the session ended and what it wrote.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub reason: StopReason,
    pub output_label: String,
    pub bytes_written: u64,
    pub elapsed: Duration,
    pub buffers: Vec<BufferSummary>,
    pub snapshots: Vec<PathBuf>,
    pub passes: u64,
    pub triggered: bool,
    /// Which sink carried the data (io_uring, pwritev, stream).
    pub sink_kind: String,
    /// Errors met on the way that did not stop the session.
    pub warnings: Vec<String>,
    /// Segmented output: every segment, its size and fate.
    pub segments: Option<SegmentsStatus>,
    /// With compression: (bytes before, bytes after) over every pass.
    pub compression: Option<(u64, u64)>,
}

/// Signals as the loop sees them: a pipe that wakes `poll`, and the flag
/// that lets a third signal kill the process.
struct Signals {
    rx: UnixStream,
    hurried: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        let (rx, tx) = UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        let hurried = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // Once hurried, a further signal takes the default action.
            ids.push(signal_hook::flag::register_conditional_default(
                sig,
                hurried.clone(),
            )?);
            ids.push(signal_hook::low_level::pipe::register(
                sig,
                tx.try_clone()?,
            )?);
        }
        Ok(Self { rx, hurried, ids })
    }

    /// How many signals arrived since the last call.
    fn take(&self) -> usize {
        let mut buf = [0u8; 16];
        let mut n = 0;
        let mut r = &self.rx;
        while let Ok(k) = std::io::Read::read(&mut r, &mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Runs the session to its end.
pub fn run(rec: Recording) -> Outcome {
    let mut l = Loop::new(rec);
    l.run();
    l.outcome()
}

struct Loop {
    rec: Recording,
    signals: Option<Signals>,
    started: Instant,
    timers: BTreeMap<Timer, Instant>,
    next_pass: Option<Instant>,
    next_tick: Instant,
    next_status: Instant,
    exit: Option<StopReason>,
    passes: u64,
    snapshots: Vec<PathBuf>,
    trigger_records: BTreeMap<u32, TriggerRecord>,
    warnings: Vec<String>,
    hurry: bool,
    pending_failure: Option<String>,
    bar: Option<indicatif::ProgressBar>,
    last_bytes: (Instant, u64),
    /// Bytes before and after compression, over every pass.
    compressed: (u64, u64),
}

/// The streaming stats/sync-marker/clock-snapshot period (facts §5.5).
const TICK: Duration = Duration::from_secs(10);

impl Loop {
    fn new(rec: Recording) -> Self {
        let now = Instant::now();
        let signals = match Signals::install() {
            Ok(s) => Some(s),
            Err(e) => {
                log::warn!("cannot install signal handlers: {e}");
                None
            }
        };
        let bar = (rec.status_line && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
            b
        });
        Self {
            rec,
            signals,
            started: now,
            timers: BTreeMap::new(),
            next_pass: None,
            next_tick: now + TICK,
            next_status: now,
            exit: None,
            passes: 0,
            snapshots: Vec::new(),
            trigger_records: BTreeMap::new(),
            warnings: Vec::new(),
            hurry: false,
            pending_failure: None,
            bar,
            last_bytes: (now, 0),
            compressed: (0, 0),
        }
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn run(&mut self) {
        self.dispatch(Event::Begin);
        while self.exit.is_none() {
            let now = Instant::now();
            let deadline = self.next_deadline();
            let wait = deadline.saturating_duration_since(now);
            self.wait(wait);
            if let Some(n) = self.signals.as_ref().map(|s| s.take()) {
                for _ in 0..n {
                    self.dispatch(Event::Signal);
                }
            }
            self.serve_control();
            self.fire_due_timers();
            self.check_sources();
            if self.exit.is_none() {
                self.periodic();
            }
        }
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }

    fn next_deadline(&self) -> Instant {
        let mut d = self.next_tick;
        if let Some(t) = self.timers.values().min() {
            d = d.min(*t);
        }
        if let Some(p) = self.next_pass {
            d = d.min(p);
        }
        if self.bar.is_some() {
            d = d.min(self.next_status);
        }
        // Sources report failures asynchronously; look at least once a second.
        d.min(Instant::now() + Duration::from_secs(1))
    }

    fn wait(&self, timeout: Duration) {
        let ts = Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        let mut fds = Vec::with_capacity(2);
        if let Some(s) = &self.signals {
            fds.push(PollFd::new(&s.rx, PollFlags::IN));
        }
        if let Some(c) = &self.rec.control {
            fds.push(PollFd::from_borrowed_fd(c.wake_fd(), PollFlags::IN));
        }
        if fds.is_empty() {
            std::thread::sleep(timeout);
        } else {
            let _ = poll(&mut fds, Some(&ts));
        }
    }

    fn dispatch(&mut self, ev: Event) {
        let actions = self.rec.session.on_event(ev);
        self.execute(actions);
    }

    fn execute(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::StartSources => self.start_sources(),
                Action::SetTimer(t, d) => {
                    self.timers.insert(t, Instant::now() + d);
                }
                Action::CancelTimer(t) => {
                    self.timers.remove(&t);
                }
                Action::AcceptTrigger {
                    name,
                    producer,
                    uid,
                    stop_delay,
                } => {
                    let rec = TriggerRecord {
                        name: name.clone(),
                        producer,
                        uid,
                        stop_delay_ms: stop_delay.as_millis() as u64,
                        boot_ns: crate::clock::boottime_ns(),
                    };
                    log::info!(
                        "trigger {name:?} accepted (stop delay {} ms)",
                        rec.stop_delay_ms
                    );
                    self.trigger_records
                        .insert(self.rec.session.snapshots().saturating_sub(1), rec.clone());
                    self.rec.log.trigger(rec);
                    if let Some(h) = &self.rec.history
                        && let Err(e) = h.record(&name, history::now_secs())
                    {
                        self.warn(format!("trigger history: {e}"));
                    }
                }
                Action::Snapshot(n) => self.snapshot(n),
                Action::Finalize { reason, skip_flush } => self.finalize(reason, skip_flush),
                Action::Hurry => {
                    self.hurry = true;
                    if let Some(s) = &self.signals {
                        s.hurried.store(true, Ordering::Relaxed);
                    }
                }
                Action::Exit(reason) => self.exit = Some(reason),
            }
        }
    }

    fn start_sources(&mut self) {
        log::info!("tracing started");
        self.rec.log.started();
        let mut failed = None;
        for s in &mut self.rec.sources {
            if let Err(e) = s.start() {
                failed = Some(e.to_string());
                break;
            }
        }
        if let Some(period) = self.rec.session.timeline().write_period {
            let ms = crate::clock::ms_to_next_multiple(period.as_millis() as u64);
            self.next_pass = Some(Instant::now() + Duration::from_millis(ms));
        }
        if let Some(e) = failed {
            self.dispatch(Event::SourceFailed(e));
        }
    }

    fn fire_due_timers(&mut self) {
        let now = Instant::now();
        let due: Vec<Timer> = self
            .timers
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in due {
            self.timers.remove(&t);
            self.dispatch(Event::TimerFired(t));
        }
    }

    fn check_sources(&mut self) {
        let failure = self
            .rec
            .sources
            .iter_mut()
            .find_map(|s| s.take_failure().map(|f| format!("{}: {f}", s.name())));
        if let Some(f) = failure {
            self.dispatch(Event::SourceFailed(f));
        }
    }

    fn periodic(&mut self) {
        let now = Instant::now();
        if now >= self.next_tick {
            self.rec.log.tick();
            self.next_tick = now + TICK;
        }
        if let (Some(at), Some(period)) = (self.next_pass, self.rec.session.timeline().write_period)
            && now >= at
        {
            let ms = crate::clock::ms_to_next_multiple(period.as_millis() as u64);
            self.next_pass = Some(now + Duration::from_millis(ms));
            if self.rec.session.state() == State::Recording
                && !self.rec.session.waiting_for_trigger()
                && self.pass(Take::Consume, false).is_some()
            {
                self.rotate_if_due();
            }
        }
        if self.bar.is_some() && now >= self.next_status {
            self.next_status = now + Duration::from_millis(500);
            self.draw_status();
        }
    }

    /// Runs a write pass; a failure or the cap becomes a session event.
    fn pass(&mut self, take: Take, is_final: bool) -> Option<PassReport> {
        let head = self.rec.log.head();
        let plan: Vec<(Arc<Buffer>, Take)> = self
            .rec
            .buffers
            .iter()
            .map(|b| (b.buffer.clone(), take))
            .collect();
        let buffers = &self.rec.buffers;
        let log = &mut self.rec.log;
        let tail = || log.tail(|| trace_stats(buffers));
        let sync = self.rec.fsync_each_pass || is_final;
        let stage = PassStage {
            compress: self.rec.compress.as_mut(),
            count_packets: matches!(self.rec.sink, Output::Segments(_)),
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
        match r {
            Ok(rep) => {
                self.note_pass(&rep);
                log::debug!(
                    "pass {}: {} bytes in {:?}",
                    self.passes,
                    rep.bytes,
                    rep.duration
                );
                if rep.cap_reached && !is_final {
                    log::info!("max_file_size_bytes reached: stopping");
                    self.dispatch(Event::SizeCapReached);
                }
                Some(rep)
            }
            Err(e) => {
                log::error!("write failed: {e}");
                if !is_final {
                    self.dispatch(Event::OutputFailed(e.to_string()));
                } else {
                    self.exit_error(e.to_string());
                }
                None
            }
        }
    }

    fn exit_error(&mut self, e: String) {
        self.warnings.push(format!("final write failed: {e}"));
        if let Some(reason) = self.exit.as_mut() {
            *reason = StopReason::OutputFailed(e);
        } else {
            self.pending_failure = Some(e);
        }
    }

    fn snapshot(&mut self, n: u32) {
        let Some(base) = self.rec.snapshot_base.clone() else {
            self.warn("a snapshot was triggered but the output is not a file: skipped".into());
            return;
        };
        let path = PathBuf::from(format!("{}.{n}", base.display()));
        self.rec.log.event(ServiceEvent::CloneStarted);
        for b in &self.rec.buffers {
            if b.clear_before_clone {
                b.buffer.clear();
            }
        }
        for s in &mut self.rec.sources {
            if let Err(e) = s.flush(self.rec.flush_timeout) {
                self.warnings.push(format!("flush before snapshot: {e}"));
            }
        }
        let opened =
            crate::storage::open_output(OutputPath::File(path.clone()), self.rec.snapshot_open);
        let mut sink = match opened {
            Ok(s) => s,
            Err(e) => {
                self.warn(format!("snapshot {}: {e}", path.display()));
                return;
            }
        };
        let trigger = self.trigger_records.get(&n).cloned();
        let head = self.rec.log.snapshot_head(trigger.as_ref());
        let plan: Vec<(Arc<Buffer>, Take)> = self
            .rec
            .buffers
            .iter()
            .map(|b| {
                (
                    b.buffer.clone(),
                    if b.transfer_on_clone {
                        Take::Consume
                    } else {
                        Take::Snapshot
                    },
                )
            })
            .collect();
        let buffers = &self.rec.buffers;
        let uid = self.rec.log.uid();
        let tail = || {
            let now = crate::clock::boottime_ns();
            let mut t: Vec<Vec<u8>> = (0..buffers.len() as u32)
                .map(|i| crate::trace::service::buffer_cloned(uid, now, i))
                .collect();
            t.push(crate::trace::service::service_event(
                uid,
                now,
                ServiceEvent::TracingDisabled,
            ));
            t.push(crate::trace::service::service_event(
                uid,
                now,
                ServiceEvent::ReadTracingBuffersCompleted,
            ));
            t.push(crate::trace::service::trace_stats(
                uid,
                now,
                &trace_stats(buffers),
            ));
            t
        };
        let stage = PassStage {
            compress: self.rec.compress.as_mut(),
            count_packets: false,
        };
        match write_pass_staged(sink.as_mut(), &head, &plan, tail, None, true, stage) {
            Ok(rep) => {
                log::info!("snapshot {} written: {} bytes", path.display(), rep.bytes);
                self.snapshots.push(path);
            }
            Err(e) => self.warn(format!("snapshot {}: {e}", path.display())),
        }
    }

    fn finalize(&mut self, reason: StopReason, skip_flush: bool) {
        log::info!("stopping: {}", describe(&reason));
        let flush_ok = if skip_flush {
            false
        } else {
            self.flush_sources()
        };
        for s in &mut self.rec.sources {
            if let Err(e) = s.stop() {
                self.warnings.push(e.to_string());
            }
            self.warnings.extend(s.loss_warnings());
        }
        if flush_ok {
            self.rec.log.event(ServiceEvent::AllDataSourcesFlushed);
        }
        self.rec.log.event(ServiceEvent::TracingDisabled);
        self.rec.log.want_stats();
        let write = reason.writes_buffers() && !self.rec.session.waiting_for_trigger();
        let mut final_ok = true;
        if write {
            final_ok = self.pass(Take::Consume, true).is_some();
        } else if !matches!(reason, StopReason::OutputFailed(_))
            && let Err(e) = self.rec.sink.sync_data()
        {
            self.warnings.push(format!("fdatasync: {e}"));
        }
        let failed = !final_ok || matches!(reason, StopReason::OutputFailed(_));
        self.finish_segments(failed);
        self.dispatch(Event::Finalized);
        if let (Some(e), Some(r)) = (self.pending_failure.take(), self.exit.as_mut()) {
            *r = StopReason::OutputFailed(e);
        }
    }

    /// Flushes every source unless a second signal hurries the stop.
    fn flush_sources(&mut self) -> bool {
        let mut ok = true;
        for i in 0..self.rec.sources.len() {
            if let Some(n) = self.signals.as_ref().map(|s| s.take()) {
                for _ in 0..n {
                    self.dispatch(Event::Signal);
                }
            }
            if self.hurry {
                log::info!("second signal: finishing with what is buffered");
                return false;
            }
            if let Err(e) = self.rec.sources[i].flush(self.rec.flush_timeout) {
                self.warnings.push(e.to_string());
                ok = false;
            }
        }
        ok
    }

    fn serve_control(&mut self) {
        let pending = match &self.rec.control {
            Some(c) => c.pending(),
            None => return,
        };
        for inc in pending {
            self.answer(inc);
        }
    }

    fn answer(&mut self, inc: Incoming) {
        match inc.request.clone() {
            Request::Trigger { names, producer } => {
                let mut outcomes = Vec::new();
                for name in names {
                    let count = self
                        .rec
                        .history
                        .as_ref()
                        .and_then(|h| h.count(&name, history::now_secs()).ok())
                        .unwrap_or(0);
                    self.dispatch(Event::Trigger {
                        name: name.clone(),
                        producer: producer.clone(),
                        uid: inc.peer_uid,
                        draw: rand::random::<f64>(),
                        matches_last_24h: count,
                    });
                    let res = self
                        .rec
                        .session
                        .last_trigger()
                        .cloned()
                        .unwrap_or(Err(TriggerRefusal::NotListed));
                    outcomes.push(TriggerOutcome {
                        name,
                        accepted: res.is_ok(),
                        reason: res.err().map(|r| refusal_text(&r).to_string()),
                    });
                }
                inc.answer(Reply::Triggers(outcomes));
            }
            Request::Query {} => {
                let st = self.status();
                inc.answer(Reply::Status(st));
            }
            Request::Stop {} => {
                inc.answer(Reply::Stopping);
                self.dispatch(Event::StopRequest);
            }
        }
    }

    fn status(&self) -> SessionStatus {
        let state = match self.rec.session.state() {
            State::WaitingForTrigger => "waiting for trigger",
            State::Recording if self.rec.session.waiting_for_trigger() => {
                "recording (waiting for trigger)"
            }
            State::Recording => "recording",
            State::Stopping => "stopping",
            State::Finished => "finished",
        };
        SessionStatus {
            pid: std::process::id(),
            uid: self.rec.log.uid(),
            config: self.rec.config_label.clone(),
            output: self.rec.output_label.clone(),
            state: state.to_string(),
            elapsed_ms: self.elapsed().as_millis() as u64,
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
        }
    }

    fn draw_status(&mut self) {
        let Some(bar) = &self.bar else { return };
        let now = Instant::now();
        let bytes = self.rec.sink.bytes_written();
        let dt = now.duration_since(self.last_bytes.0).as_secs_f64();
        let rate = if dt > 0.0 {
            (bytes - self.last_bytes.1.min(bytes)) as f64 / dt / 1e6
        } else {
            0.0
        };
        if dt >= 1.0 {
            self.last_bytes = (now, bytes);
        }
        let mut msg = format!(
            "{:>6.1}s  {}  written {}  {:.1} MB/s",
            self.elapsed().as_secs_f64(),
            self.status().state,
            human_bytes(bytes),
            rate
        );
        for (i, b) in self.rec.buffers.iter().enumerate() {
            let s = b.buffer.stats();
            let fill = if s.buffer_size > 0 {
                100.0 * s.bytes_buffered as f64 / s.buffer_size as f64
            } else {
                0.0
            };
            let lost = s.bytes_overwritten + s.bytes_discarded;
            msg.push_str(&format!("  buf{i} {fill:.0}%"));
            if lost > 0 {
                msg.push_str(&format!(" lost {}", human_bytes(lost)));
            }
        }
        bar.set_message(msg);
        bar.tick();
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
            elapsed: self.elapsed(),
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
            passes: self.passes,
            triggered: self.rec.session.triggered(),
            sink_kind: self.rec.sink.kind().to_string(),
            warnings: self.warnings.clone(),
            segments: self.rec.sink.segments(),
            compression: self.rec.compress.as_ref().map(|_| self.compressed),
        }
    }
}

/// Segmented output and compression figures: the steps a streaming session
/// takes around its write passes. Kept apart so they can move as they are
/// into whatever decides and executes passes:
/// - after every pass: [`Loop::note_pass`] (figures for the sidecar and the
///   summary);
/// - after every periodic pass that succeeded: [`Loop::rotate_if_due`]: the
///   pure decision (`storage::segment::policy::rotation_due`, through
///   `SegmentWriter::rotation_due`), then the old segment gets its closing
///   `trace_stats` and is closed, the service log heads the new one, and
///   every data source clears its incremental state;
/// - once, after the final pass: [`Loop::finish_segments`].
impl Loop {
    fn note_pass(&mut self, rep: &PassReport) {
        self.compressed.0 += rep.input_bytes;
        self.compressed.1 += rep.bytes;
        if let Output::Segments(w) = &mut self.rec.sink {
            w.record_pass(rep);
        }
    }

    fn rotate_if_due(&mut self) {
        let Output::Segments(w) = &mut self.rec.sink else {
            return;
        };
        let Some(reason) = w.rotation_due() else {
            return;
        };
        let started = Instant::now();
        let tail = self.rec.log.segment_tail(&trace_stats(&self.rec.buffers));
        let rotated = w.rotate(&tail, reason);
        match rotated {
            Ok(()) => {
                let (index, uuid) = (w.index(), w.trace_uuid());
                log::debug!(
                    "rotation to segment {index}: {:?} (close, sidecar, open)",
                    started.elapsed()
                );
                self.rec.log.begin_segment(index, uuid);
                for s in &mut self.rec.sources {
                    s.clear_incremental_state();
                }
            }
            Err(e) => {
                log::error!("rotating the output failed: {e}");
                self.dispatch(Event::OutputFailed(e.to_string()));
            }
        }
    }

    fn finish_segments(&mut self, failed: bool) {
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
}

/// trace_stats from the buffers' live counters.
fn trace_stats(buffers: &[SessionBuffer]) -> TraceStatsRecord {
    TraceStatsRecord {
        buffers: buffers
            .iter()
            .map(|b| {
                let s = b.buffer.stats();
                BufferStatsRecord {
                    buffer_size: s.buffer_size,
                    bytes_written: s.bytes_written,
                    chunks_written: s.chunks_written,
                    chunks_overwritten: s.chunks_overwritten,
                    write_wrap_count: s.write_wrap_count,
                    bytes_overwritten: s.bytes_overwritten,
                    bytes_read: s.bytes_read,
                    padding_bytes_written: s.padding_bytes_written,
                    chunks_read: s.chunks_read,
                    chunks_discarded: s.chunks_discarded,
                    trace_writer_packet_loss: s.packets_refused,
                }
            })
            .collect(),
        producers_connected: 1,
        producers_seen: 1,
        tracing_sessions: 1,
        total_buffers: buffers.len() as u32,
        ..Default::default()
    }
}

fn refusal_text(r: &TriggerRefusal) -> &'static str {
    match r {
        TriggerRefusal::NotListed => "not_listed",
        TriggerRefusal::ProducerMismatch => "producer_mismatch",
        TriggerRefusal::Skipped => "skipped",
        TriggerRefusal::RateLimited => "rate_limited",
        TriggerRefusal::AlreadyTriggered => "already_triggered",
        TriggerRefusal::NotRecording => "not_recording",
    }
}

/// A short sentence for a stop reason.
pub fn describe(r: &StopReason) -> String {
    match r {
        StopReason::DurationElapsed => "duration_ms elapsed".into(),
        StopReason::Signal => "stopped by a signal".into(),
        StopReason::StopRequested => "stopped by `recorder stop`".into(),
        StopReason::Trigger(n) => format!("stop trigger {n:?}"),
        StopReason::TriggerTimeout => "trigger_timeout_ms passed with no trigger".into(),
        StopReason::CloneTimeout => {
            "trigger_timeout_ms passed (clone-snapshot session ends)".into()
        }
        StopReason::SizeCap => "max_file_size_bytes reached".into(),
        StopReason::OutputFailed(e) => format!("writing the output failed: {e}"),
        StopReason::SourceFailed(e) => format!("a data source failed: {e}"),
    }
}

/// Bytes for people (KiB, MiB, GiB).
pub fn human_bytes(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f >= K * K * K {
        format!("{:.2} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else if f >= K {
        format!("{:.1} KiB", f / K)
    } else {
        format!("{b} B")
    }
}
