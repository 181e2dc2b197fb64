//! Executes sessions' decisions. A [`Runner`] is one session's executor: it
//! hands each queued [`Event`](crate::session::Event) to
//! [`Session::on_event`] and carries out the returned
//! [`Action`](crate::session::Action)s. An action's result (a pass written, sources
//! flushed) goes back on the queue as an event: nothing here decides (an
//! action carries every choice it needs), and nothing dispatches from inside
//! an action. `tests.rs` runs the executor against fake data sources and a
//! fake sink.
//!
//! A runner never waits. Its host waits once for all it hosts (the
//! descriptors of [`Runner::interest`], the earliest [`Runner::next_due`]),
//! then calls [`Runner::on_wake`] and [`Runner::settle`]: [`run`] below is
//! the main job's host, one session with its signals, control socket and
//! status line; `recorder serve` hosts every session on one loop
//! (`crate::consumer::service`). The data sources have no threads: their
//! work (samples, test packets, ftrace drains) is the host's wake-ups too.
//!
//! A host talks to its sessions in types: [`Command`]s in, each with a
//! [`Ticket`], and [`SessionEvent`]s out ([`Runner::take_published`]): the
//! answers, the start of every data source, a snapshot trigger's hit.
//!
//! Adding an input (a socket, say) means: a descriptor in
//! [`Runner::interest`], a translation of what it brings into session
//! events, and the session's rules for those events.

use std::os::fd::BorrowedFd;

use rustix::event::PollFlags;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

mod host;
mod outcome;
mod reactor;
pub(crate) mod rules;
mod runner;
mod status_line;

pub(crate) use host::{Command, Response, SessionEvent, Ticket};
pub(crate) use outcome::{BufferSummary, Outcome};
pub(crate) use reactor::wait_for;
pub(crate) use runner::Runner;

use crate::control::history::TriggerHistory;
use crate::control::server::ControlServer;
use crate::producer::host::{ProducerHost, QuotaView};
use crate::producer::quota::{Limit, UidReport};
use crate::ringbuf::Buffer;
use crate::session::{FlushCounts, Session};
use crate::sources::DataSource;
use crate::storage::OpenOptions as SinkOpenOptions;
use crate::storage::compress::ZstdStage;
use crate::storage::create::OutputDir;
use crate::storage::segment::Output;
use crate::sys::signals::Signals;
use crate::trace::service::TraceStatsRecord;
use crate::trace::service_log::ServiceLog;
use status_line::StatusLine;

/// One buffer of the session, as the loop needs it.
pub(crate) struct SessionBuffer {
    pub buffer: Arc<Buffer>,
    /// `RING_BUFFER` or `DISCARD`, for people.
    pub policy: &'static str,
}

/// Everything a running session is made of; built by `app`.
pub(crate) struct Recording {
    pub session: Session,
    pub buffers: Vec<SessionBuffer>,
    pub sources: Vec<Box<dyn DataSource>>,
    /// One file, or numbered segments.
    pub sink: Output,
    /// zstd between the ring and the file (`compression { zstd {} }`, `--compress`).
    pub compress: Option<ZstdStage>,
    /// The output as people should read it (a path or `stdout`).
    pub(crate) output_label: String,
    /// Where snapshots go: `OUT.0`, `OUT.1`, … (CLONE_SNAPSHOT).
    pub(crate) snapshot_base: Option<PathBuf>,
    pub(crate) snapshot_open: SinkOpenOptions,
    pub log: ServiceLog,
    pub(crate) max_file_size: Option<u64>,
    pub control: Option<ControlServer>,
    pub history: Option<TriggerHistory>,
    /// The producer socket and its connections (Perfetto SDK apps).
    pub producers: Option<ProducerHost>,
    pub(crate) config_label: String,
    /// Show a live status line on stderr (when it is a terminal).
    pub(crate) status_line: bool,
    /// Where snapshots are made: the output's checked directory and the
    /// output's file name (CLONE_SNAPSHOT sessions).
    pub(crate) snapshot_dir: Option<(OutputDir, String)>,
    /// Whose quota figures the trace and the summary show.
    pub(crate) quota_view: QuotaView,
    /// Snapshots are not written to files but published to the host
    /// ([`SessionEvent::CloneTriggerHit`]): the consumer clones the session
    /// (a CLONE_SNAPSHOT session of `recorder serve`).
    pub(crate) snapshots_to_host: bool,
    /// The trigger rules the recorder fires itself (`recorder --config`).
    pub rules: Option<rules::RuleBook>,
}

/// Runs the main job's one session to its end. `signals` were installed
/// before the session was set up (a signal that came meanwhile stops it at
/// once); without them the loop installs its own.
pub(crate) fn run(rec: Recording, signals: Option<Signals>) -> Outcome {
    let signals = signals.or_else(|| match Signals::install() {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn!("cannot install signal handlers: {e}");
            None
        }
    });
    let mut status = if rec.status_line {
        StatusLine::on_terminal()
    } else {
        None
    };
    let mut runner = Runner::new(rec);
    // A signal during set-up: the session stops as soon as it began.
    take_signals(&signals, &mut runner);
    loop {
        runner.settle();
        if runner.is_over() {
            break;
        }
        let mut deadline = runner.next_due();
        if let Some(s) = &status {
            let at = Instant::now() + s.until_due();
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
        let ready: Vec<bool> = {
            let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = Vec::new();
            if let Some(s) = &signals {
                fds.push((s.fd(), PollFlags::IN));
            }
            fds.extend(runner.interest());
            let skip = usize::from(signals.is_some());
            wait_for(&fds, deadline)
                .into_iter()
                .skip(skip)
                .map(|r| !r.is_empty())
                .collect()
        };
        take_signals(&signals, &mut runner);
        runner.on_wake(&ready);
        if let Some(s) = &mut status {
            s.draw_if_due(|| runner.status_figures());
        }
    }
    if let Some(s) = status.take() {
        s.finish();
    }
    runner.outcome()
}

fn take_signals(signals: &Option<Signals>, runner: &mut Runner) {
    for _ in 0..signals.as_ref().map_or(0, |s| s.take()) {
        runner.signal();
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
pub(crate) const QUOTA_KEY_PREFIX: &str = "recorder.quota.uid.";

/// trace_stats from the buffers' live counters, the flushes so far and what
/// producers did.
pub(crate) fn trace_stats(
    buffers: &[SessionBuffer],
    flushes: FlushCounts,
    producers: Option<&ProducerHost>,
    control: Option<&ControlServer>,
    view: QuotaView,
    rules: Option<&rules::RuleBook>,
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
    rec.rule_counts = rules.map_or_else(Vec::new, rules::RuleBook::attributes);
    rec
}

/// Every uid that hit a producer quota, had its closed producers folded or
/// had control or trigger requests refused, by uid: those `view` shows.
pub(crate) fn quota_reports(
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
