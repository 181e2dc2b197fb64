//! The `linux.ftrace` data source: kernel events from tracefs raw pages,
//! encoded as Perfetto `FtraceEventBundle`s (typed events, compact_sched,
//! generic events for the rest).
//!
//! ```text
//!  tracefs (our instance)                reader thread, every drain period
//!  per_cpu/cpuN/trace_pipe_raw ──read──► page ──walk──► event ──encode──► PacketOutput
//!    layouts from events/header_page,     (page.rs)      (event_table.rs,    (bundle per
//!    header_event, G/N/format (format.rs)                 encode.rs)          run of pages)
//! ```
//!
//! [`FtraceSource::start`] configures tracefs ([`tracefs::TracefsSession`]
//! remembers and restores every change), writes the start FtraceStats and
//! spawns the reader; [`FtraceSource::flush`] drains synchronously;
//! [`FtraceSource::stop`] drains a last time, writes the end FtraceStats and
//! puts tracefs back as it was.

pub mod encode;
pub mod event_table;
pub mod format;
pub mod output;
pub mod page;
pub mod reader;
pub mod stats;
pub mod tracefs;

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

pub use encode::{PrintFilter, PrintMatch, PrintRule};
pub use output::{PacketOutput, VecOutput};
pub use reader::{PidSink, ReadMode};

use encode::{BundleEncoder, CpuCursor, EncodeStats};
use event_table::EventTable;
use format::PageLayout;
use reader::{Command, CpuPipe, ReaderState};
use stats::{CpuStats, Phase, StatsReport};
use tracefs::{Tracefs, TracefsError, TracefsSession};

use crate::config::spec::FtraceSpec;

/// Largest bundle packet.
pub const DEFAULT_MAX_PACKET_BYTES: usize = 32 * 1024;

/// What the ftrace source records (the validated config) and where.
#[derive(Clone, Debug)]
pub struct FtraceOptions {
    /// The validated `FtraceConfig`.
    pub spec: FtraceSpec,
    /// tracefs root; `None` discovers it.
    pub tracefs_root: Option<PathBuf>,
    /// procfs root (stale-instance detection, RAM size).
    pub proc_root: PathBuf,
    /// trusted_packet_sequence_id of every packet written.
    pub sequence_id: u32,
    pub max_packet_bytes: usize,
    pub read_mode: ReadMode,
}

impl Default for FtraceOptions {
    fn default() -> Self {
        Self {
            spec: FtraceSpec::default(),
            tracefs_root: None,
            proc_root: PathBuf::from("/proc"),
            sequence_id: 2,
            max_packet_bytes: DEFAULT_MAX_PACKET_BYTES,
            read_mode: ReadMode::Read,
        }
    }
}

/// The per-CPU buffer when none is configured: enough for two 100 ms drains
/// at the highest rates measured here (67 MB/s over 2 CPUs), more on big
/// machines as Perfetto does.
pub fn default_buffer_size_kb(mem_total_kb: u64) -> u32 {
    if mem_total_kb >= 7 * 1024 * 1024 {
        8192
    } else {
        4096
    }
}

fn mem_total_kb(proc: &std::path::Path) -> u64 {
    std::fs::read_to_string(proc.join("meminfo"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
pub enum FtraceError {
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error("{file}: {source}")]
    Format {
        file: String,
        source: format::FormatError,
    },
    #[error("none of the requested ftrace events exist: {0:?} (see events/ in tracefs)")]
    NoEvents(Vec<String>),
    #[error("the source is not in the state this needs ({0})")]
    State(&'static str),
    #[error("the output has no room for the {0} packet")]
    NoRoom(&'static str),
    #[error("reader thread: {0}")]
    Thread(String),
}

/// Counters of a finished (or running) recording.
#[derive(Clone, Debug, Default)]
pub struct FtraceSummary {
    pub encode: EncodeStats,
    pub bytes_read: u64,
    pub unknown_events: Vec<String>,
    pub failed_events: Vec<String>,
    pub non_monotonic: u64,
    /// Drains started early because a CPU buffer passed the watermark.
    pub watermark_drains: u64,
    /// The kernel's per-CPU counters at the last FtraceStats written.
    pub cpu_stats: Vec<CpuStats>,
}

/// The events `spec` names in `dir`, or none.
pub fn resolve_event(dir: &Tracefs, spec: &str) -> Vec<(String, String)> {
    match spec.split_once('/') {
        Some((g, "*")) => dir
            .events_of(g)
            .into_iter()
            .map(|n| (g.to_string(), n))
            .collect(),
        Some((g, n)) => {
            if dir.path(&format!("events/{g}/{n}/format")).is_file() {
                vec![(g.to_string(), n.to_string())]
            } else {
                Vec::new()
            }
        }
        None => dir
            .groups()
            .into_iter()
            .filter(|g| dir.path(&format!("events/{g}/{spec}/format")).is_file())
            .map(|g| (g, spec.to_string()))
            .collect(),
    }
}

/// Loads the page layout and the formats of `events` from `dir` into a
/// table. Events whose format does not parse are returned as failed.
pub fn load_layouts(
    dir: &Tracefs,
    events: &[(String, String)],
    compact_sched: bool,
) -> Result<(PageLayout, EventTable, Vec<String>), FtraceError> {
    let read = |rel: &str| dir.read(rel);
    let hp = read("events/header_page")?;
    let layout = format::parse_header_page(&hp).map_err(|source| FtraceError::Format {
        file: "events/header_page".into(),
        source,
    })?;
    let he = read("events/header_event")?;
    format::check_header_event(&he).map_err(|source| FtraceError::Format {
        file: "events/header_event".into(),
        source,
    })?;
    let mut table = EventTable::new();
    let mut failed = Vec::new();
    for (g, n) in events {
        let rel = format!("events/{g}/{n}/format");
        match read(&rel).map_err(FtraceError::from).and_then(|t| {
            format::parse_event_format(g, &t).map_err(|source| FtraceError::Format {
                file: rel.clone(),
                source,
            })
        }) {
            Ok(f) => table.insert(f, compact_sched),
            Err(e) => {
                log::warn!("ftrace event {g}/{n} unusable: {e}");
                failed.push(format!("{g}/{n}"));
            }
        }
    }
    Ok((layout, table, failed))
}

struct Running<O: PacketOutput> {
    tx: Sender<Command>,
    /// eventfd the reader polls: written after each command.
    wake: OwnedFd,
    handle: JoinHandle<ReaderState<O>>,
}

impl<O: PacketOutput> Running<O> {
    fn send(&self, c: Command) -> Result<(), FtraceError> {
        self.tx
            .send(c)
            .map_err(|e| FtraceError::Thread(e.to_string()))?;
        rustix::io::write(&self.wake, &1u64.to_ne_bytes())
            .map_err(|e| FtraceError::Thread(format!("eventfd: {e}")))?;
        Ok(())
    }
}

/// The linux.ftrace data source.
pub struct FtraceSource<O: PacketOutput + 'static> {
    opts: FtraceOptions,
    top: Tracefs,
    session: Option<TracefsSession>,
    layout: Option<PageLayout>,
    output: Option<O>,
    pid_sink: Option<PidSink>,
    running: Option<Running<O>>,
    summary: FtraceSummary,
    cpus: Vec<u32>,
    buffer_size_kb: u32,
}

impl<O: PacketOutput + 'static> FtraceSource<O> {
    /// Finds tracefs (or uses `opts.tracefs_root`); nothing is changed yet.
    pub fn new(opts: FtraceOptions, output: O) -> Result<Self, FtraceError> {
        let top = match &opts.tracefs_root {
            Some(r) => Tracefs::at(r)?,
            None => Tracefs::discover()?,
        };
        Ok(Self {
            opts,
            top,
            session: None,
            layout: None,
            output: Some(output),
            pid_sink: None,
            running: None,
            summary: FtraceSummary::default(),
            cpus: Vec::new(),
            buffer_size_kb: 0,
        })
    }

    /// Sets the callback told the thread ids seen (for process_stats).
    pub fn on_pids(&mut self, sink: PidSink) {
        self.pid_sink = Some(sink);
    }

    /// The tracefs directory being recorded in, once started.
    pub fn tracefs_dir(&self) -> Option<&Tracefs> {
        self.session.as_ref().map(TracefsSession::dir)
    }

    fn cpu_stats(&self) -> Vec<CpuStats> {
        let Some(s) = &self.session else {
            return Vec::new();
        };
        self.cpus
            .iter()
            .map(|&c| {
                CpuStats::parse(
                    c as u64,
                    &s.dir()
                        .read(&format!("per_cpu/cpu{c}/stats"))
                        .unwrap_or_default(),
                )
            })
            .collect()
    }

    fn write_stats(&mut self, phase: Phase, output: &mut O) -> Result<(), FtraceError> {
        let cpus = self.cpu_stats();
        let parse_errors: Vec<u32> = self
            .summary
            .encode
            .parse_errors
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, _)| i as u32)
            .collect();
        let page = self.layout.map(|l| l.page_size()).unwrap_or(4096).max(1) as u64;
        self.summary.cpu_stats = cpus.clone();
        let report = StatsReport {
            cpus: &cpus,
            unknown_events: &self.summary.unknown_events,
            failed_events: &self.summary.failed_events,
            parse_errors: &parse_errors,
            cpu_buffer_size_pages: self.buffer_size_kb as u64 * 1024 / page,
        };
        let max = 256
            + 128 * cpus.len()
            + report
                .unknown_events
                .iter()
                .chain(report.failed_events)
                .map(|s| s.len() + 4)
                .sum::<usize>();
        let buf = output
            .begin(max, max)
            .ok_or(FtraceError::NoRoom("FtraceStats"))?;
        let n = stats::encode_stats_packet(
            buf,
            self.opts.sequence_id,
            crate::clock::boottime_ns(),
            phase,
            &report,
        )
        .ok_or(FtraceError::NoRoom("FtraceStats"))?;
        output.commit(n);
        Ok(())
    }

    /// Configures tracefs, writes the start FtraceStats and starts the reader.
    /// On error everything changed is put back.
    pub fn start(&mut self) -> Result<(), FtraceError> {
        if self.running.is_some() || self.output.is_none() {
            return Err(FtraceError::State("start twice"));
        }
        let spec = &self.opts.spec;
        let mut events = spec.events.clone();
        if !spec.atrace_categories.is_empty() || !spec.atrace_apps.is_empty() {
            // Userspace atrace writes through trace_marker: keep its prints.
            log::warn!(
                "atrace_categories/atrace_apps are Android-only; recording ftrace/print for \
                 userspace atrace markers"
            );
            if !events.iter().any(|e| e == "ftrace/print" || e == "print") {
                events.push("ftrace/print".into());
            }
        }
        let mut session = TracefsSession::open(
            &self.top,
            spec.instance_name.as_deref(),
            &self.opts.proc_root,
        )?;
        let mut selected = Vec::new();
        for spec in &events {
            let found = resolve_event(session.dir(), spec);
            if found.is_empty() {
                self.summary.unknown_events.push(spec.clone());
            }
            for e in found {
                if !selected.contains(&e) {
                    selected.push(e);
                }
            }
        }
        if !self.summary.unknown_events.is_empty() {
            log::warn!(
                "unknown ftrace events ignored: {}",
                self.summary.unknown_events.join(", ")
            );
        }
        if selected.is_empty() {
            return Err(FtraceError::NoEvents(events));
        }
        let (layout, table, failed) = load_layouts(session.dir(), &selected, spec.compact_sched)?;
        self.summary.failed_events = failed;
        self.layout = Some(layout);

        session.set("tracing_on", "0")?;
        session.set("trace_clock", "boot")?;
        self.buffer_size_kb = match spec.buffer_size {
            Some(b) => b.kb().min(u64::from(u32::MAX)) as u32,
            None => default_buffer_size_kb(mem_total_kb(&self.opts.proc_root)),
        };
        session.set("buffer_size_kb", &self.buffer_size_kb.to_string())?;
        if let Some(mask) = &spec.tracing_cpumask {
            session.set("tracing_cpumask", mask)?;
        }
        let pct = spec.drain_buffer_percent;
        let watermark = pct > 0 && session.dir().path("buffer_percent").exists();
        if watermark {
            session.set("buffer_percent", &pct.to_string())?;
        } else if pct > 0 {
            log::info!("ftrace: no buffer_percent in tracefs; draining every period only");
        }
        for (g, n) in &selected {
            let rel = format!("events/{g}/{n}/enable");
            if !session.dir().path(&rel).exists() {
                // ftrace/print has no switch: it is on while tracing is.
                continue;
            }
            if let Err(e) = session.set(&rel, "1") {
                log::warn!("enabling ftrace event {g}/{n}: {e}");
                self.summary.failed_events.push(format!("{g}/{n}"));
            }
        }
        self.cpus = session.dir().cpus();
        let mut pipes = Vec::new();
        for &cpu in &self.cpus {
            let p = session
                .dir()
                .path(&format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&p)
                .map_err(|source| TracefsError::Io {
                    path: p.clone(),
                    source,
                })?;
            pipes.push(CpuPipe {
                cpu,
                file,
                bytes_read: 0,
                read_errors: 0,
                cursor: CpuCursor {
                    cpu,
                    ..Default::default()
                },
                splice_pipe: None,
            });
            if self.opts.read_mode == ReadMode::Splice {
                let (r, w) = rustix::pipe::pipe_with(
                    rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
                )
                .map_err(|e| FtraceError::Thread(format!("pipe: {e}")))?;
                let want = reader::SPLICE_PIPE_PAGES * layout.page_size();
                let _ = rustix::pipe::fcntl_setpipe_size(&w, want);
                if let Some(last) = pipes.last_mut() {
                    last.splice_pipe = Some((r, w));
                }
            }
        }
        self.session = Some(session);
        let mut output = self.output.take().ok_or(FtraceError::State("no output"))?;
        if let Err(e) = self.write_stats(Phase::StartOfTrace, &mut output) {
            self.output = Some(output);
            return Err(e);
        }
        if let Some(s) = &mut self.session {
            s.set("tracing_on", "1")?;
        }
        let state = ReaderState::new(
            output,
            BundleEncoder::new(self.opts.sequence_id, self.opts.max_packet_bytes),
            pipes,
            Arc::new(table),
            self.opts.spec.print_filter.clone(),
            layout,
            self.pid_sink.take(),
        );
        let mut state = state;
        state.mode = self.opts.read_mode;
        state.watermark = watermark;
        let (tx, rx) = mpsc::channel();
        let period = self.opts.spec.drain_period;
        let wake = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| FtraceError::Thread(format!("eventfd: {e}")))?;
        let thread_wake = wake
            .try_clone()
            .map_err(|e| FtraceError::Thread(format!("eventfd: {e}")))?;
        let handle = std::thread::Builder::new()
            .name("ftrace-reader".into())
            .spawn(move || state.run(period, rx, thread_wake))
            .map_err(|e| FtraceError::Thread(e.to_string()))?;
        self.running = Some(Running { tx, wake, handle });
        log::info!(
            "ftrace: recording {} events on {} CPUs, {} KiB per CPU",
            selected.len(),
            self.cpus.len(),
            self.buffer_size_kb
        );
        Ok(())
    }

    /// Drains every CPU now and returns once the data is in the output.
    pub fn flush(&mut self) -> Result<(), FtraceError> {
        let r = self
            .running
            .as_ref()
            .ok_or(FtraceError::State("flush before start"))?;
        let (ack_tx, ack_rx) = mpsc::channel();
        r.send(Command::Flush(ack_tx))?;
        ack_rx
            .recv()
            .map_err(|e| FtraceError::Thread(e.to_string()))
    }

    /// Stops tracing, drains a last time, writes the end FtraceStats and
    /// restores tracefs. The output can then be taken back.
    pub fn stop(&mut self) -> Result<FtraceSummary, FtraceError> {
        let r = self
            .running
            .take()
            .ok_or(FtraceError::State("stop before start"))?;
        if let Some(s) = &self.session {
            // Nothing new after this; the last drain then empties the buffers.
            let _ = s.dir().write("tracing_on", "0");
        }
        let _ = r.send(Command::Stop);
        let state = r
            .handle
            .join()
            .map_err(|_| FtraceError::Thread("reader panicked".into()))?;
        let ReaderState {
            mut output,
            encoder,
            pipes,
            non_monotonic,
            watermark_drains,
            ..
        } = state;
        self.summary.watermark_drains = watermark_drains;
        self.summary.bytes_read = pipes.iter().map(|p| p.bytes_read).sum();
        self.summary.encode = encoder.stats;
        self.summary.non_monotonic = non_monotonic;
        drop(pipes);
        let res = self.write_stats(Phase::EndOfTrace, &mut output);
        self.output = Some(output);
        if let Some(mut s) = self.session.take() {
            s.restore();
        }
        res.map(|()| self.summary.clone())
    }

    /// The output, after [`FtraceSource::stop`] (or before start).
    pub fn take_output(&mut self) -> Option<O> {
        self.output.take()
    }
}

impl<O: PacketOutput + 'static> Drop for FtraceSource<O> {
    fn drop(&mut self) {
        if self.running.is_some() {
            let _ = self.stop();
        }
    }
}
