//! The `linux.ftrace` data source: kernel events from tracefs raw pages,
//! encoded as Perfetto `FtraceEventBundle`s (typed events, compact_sched,
//! generic events for the rest).
//!
//! ```text
//!  tracefs (our instance)                reader, every drain period
//!  per_cpu/cpuN/trace_pipe_raw ──read──► page ──walk──► event ──encode──► PacketOutput
//!    layouts from events/header_page,     (page.rs)      (event_table.rs,    (bundle per
//!    header_event, G/N/format (format.rs)                 encode.rs)          run of pages)
//! ```
//!
//! [`FtraceSource::start`] configures tracefs ([`tracefs::TracefsSession`]
//! remembers and restores every change), writes the start FtraceStats and
//! arms the reader, which its host drives ([`FtraceSource::next_due`],
//! [`FtraceSource::watched`], [`FtraceSource::on_due`]: no thread of its
//! own); [`FtraceSource::flush`] drains synchronously;
//! [`FtraceSource::stop`] drains a last time, writes the end FtraceStats and
//! puts tracefs back as it was.
//!
//! **F1** (ARCHITECTURE §5.7): the page layout is read from the recording
//! directory's `events/header_page` only after its sub-buffer size is set
//! ([`subbuf`]), so every reader walks pages of the size the kernel hands
//! out.

pub mod encode;
pub mod event_table;
pub mod format;
pub mod page;
pub mod reader;
pub(crate) mod refusal;
pub(crate) mod remote;
pub mod stats;
pub mod subbuf;
pub mod tracefs;
pub mod watch;

use std::fs::OpenOptions;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

pub use crate::sources::output::{PacketOutput, VecOutput};
pub use encode::{PrintFilter, PrintMatch, PrintRule};
pub use reader::{PidSink, ReadMode};
pub use subbuf::SubbufSize;

use encode::{BundleEncoder, CpuCursor, EncodeStats};
use event_table::EventTable;
use format::PageLayout;
use reader::{CpuPipe, ReaderState};
use stats::{CpuStats, Phase, StatsReport};
use tracefs::{Tracefs, TracefsError, TracefsSession};

use crate::config::spec::FtraceSpec;

/// Largest bundle packet.
pub const DEFAULT_MAX_PACKET_BYTES: usize = 32 * 1024;
/// `FtraceClock` MONO_RAW (FtraceEventBundle.ftrace_clock).
pub(crate) const FTRACE_CLOCK_MONO_RAW: u32 = 4;

/// The clock `trace_clock` shows selected (`[boot] local` → `boot`).
fn restorable_clock(text: &str) -> String {
    tracefs::restorable_value("trace_clock", text)
}

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
    /// Largest bundle packet written; an event bigger than this is dropped.
    pub max_packet_bytes: usize,
    /// How pages leave the kernel's per-CPU ring buffers (read(2), splice or
    /// the mapping).
    pub read_mode: ReadMode,
    /// The kernel's sub-buffer size for the recording's buffers.
    pub subbuf: SubbufSize,
    /// The session's trigger rules: those on ftrace events are evaluated
    /// as the events are decoded ([`watch`]); `freeze` ones are armed in
    /// the kernel.
    pub rules: Option<crate::sources::rules::RulePlan>,
}

impl Default for FtraceOptions {
    fn default() -> Self {
        Self {
            spec: FtraceSpec::default(),
            tracefs_root: None,
            proc_root: PathBuf::from("/proc"),
            sequence_id: 2,
            max_packet_bytes: DEFAULT_MAX_PACKET_BYTES,
            read_mode: ReadMode::default(),
            subbuf: SubbufSize::default(),
            rules: None,
        }
    }
}

/// The per-CPU buffer when none is configured: enough for two 100 ms drains
/// at the highest rates measured here (67 MB/s over 2 CPUs), more on big
/// machines as Perfetto does.
pub(crate) fn default_buffer_size_kb(mem_total_kb: u64) -> u32 {
    if mem_total_kb >= 7 * 1024 * 1024 {
        8192
    } else {
        4096
    }
}

/// The machine's memory (KiB) as `proc`/meminfo says; 0 when unreadable.
pub(crate) fn mem_total_kb(proc: &std::path::Path) -> u64 {
    std::fs::read_to_string(proc.join("meminfo"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Errors of the ftrace source: tracefs, the kernel's format files, the
/// config against this kernel, or a call out of order.
#[derive(Debug, thiserror::Error)]
pub enum FtraceError {
    /// Reading or writing tracefs failed, or it was not found.
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    /// A layout file (`events/header_page`, `events/header_event` or an
    /// event's `format`) could not be parsed.
    #[error("{file}: {source}")]
    Format {
        /// The layout file, relative to the recording directory.
        file: String,
        /// Why it could not be used.
        source: format::FormatError,
    },
    /// None of the requested events (nor kprobes) exists on this kernel; the
    /// names asked for.
    #[error("none of the requested ftrace events exist: {0:?} (see events/ in tracefs)")]
    NoEvents(Vec<String>),
    /// A call the source's state does not allow yet or any more (what was
    /// attempted).
    #[error("the source is not in the state this needs ({0})")]
    State(&'static str),
    /// The output had no room for a packet the source must write (the
    /// FtraceStats packet named).
    #[error("the output has no room for the {0} packet")]
    NoRoom(&'static str),
    /// The pipe splice reads pages through could not be made.
    #[error("splice pipe")]
    SplicePipe(#[source] std::io::Error),
    /// The kernel, the system or the privileged side refused a configured
    /// feature.
    #[error("{0}")]
    Refused(#[source] refusal::Refusal),
    /// A trigger rule does not fit the events recorded.
    #[error("trigger rule")]
    Rule(#[source] crate::config::rule::RuleError),
}

/// Counters of a finished (or running) recording.
#[derive(Clone, Debug, Default)]
pub struct FtraceSummary {
    /// What the encoder counted (pages, events, bundles, losses).
    pub encode: EncodeStats,
    /// Bytes read from the CPUs' `trace_pipe_raw` (or their mappings).
    pub bytes_read: u64,
    /// Requested events this kernel does not have (no `events/GROUP/NAME`).
    pub unknown_events: Vec<String>,
    /// Events that exist but could not be enabled, or kprobes that could not
    /// be made (`group/name`).
    pub failed_events: Vec<String>,
    /// Drains after which a CPU's last timestamp was earlier than before it:
    /// the kernel's clock or buffer went backwards.
    pub non_monotonic: u64,
    /// Drains started early because a CPU buffer passed the watermark.
    pub watermark_drains: u64,
    /// The kernel's per-CPU counters at the last FtraceStats written.
    pub cpu_stats: Vec<CpuStats>,
    /// CPUs read through the mapped ring buffer (the rest with read(2)).
    pub mapped_cpus: usize,
    /// The sub-buffer size the recorder chose and the kernel refused (it
    /// recorded with the kernel's own): what was asked, and why not.
    pub subbuf_refused: Option<(u32, String)>,
}

/// The events the kernel's counters say were lost, all CPUs together.
pub(crate) fn events_lost(cpus: &[CpuStats]) -> u64 {
    cpus.iter().map(|c| c.overrun + c.dropped_events).sum()
}

/// The events `spec` names in `dir`, or none.
pub fn resolve_event(dir: &Tracefs, spec: &str) -> Vec<(String, String)> {
    if let Some(why) = tracefs::event_spec_problem(spec) {
        log::warn!("ftrace: {why}");
        return Vec::new();
    }
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
    layouts_from(|rel| dir.read(rel), events, compact_sched)
}

/// [`load_layouts`] from whatever `read` gives for a tracefs path.
fn layouts_from(
    read: impl Fn(&str) -> Result<String, TracefsError>,
    events: &[(String, String)],
    compact_sched: bool,
) -> Result<(PageLayout, EventTable, Vec<String>), FtraceError> {
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

/// What [`FtraceSource::prepare`] made ready for [`FtraceSource::arm`].
struct Prepared {
    /// The events enabled.
    selected: Vec<(String, String)>,
    pipes: Vec<CpuPipe>,
    table: EventTable,
    layout: PageLayout,
    watermark: bool,
}

/// The linux.ftrace data source.
pub struct FtraceSource<O: PacketOutput + 'static> {
    opts: FtraceOptions,
    /// None when prepared elsewhere ([`FtraceSource::detached`]).
    top: Option<Tracefs>,
    session: Option<TracefsSession>,
    layout: Option<PageLayout>,
    output: Option<O>,
    pid_sink: Option<PidSink>,
    /// Armed: the reader and its schedule.
    running: Option<ReaderState<O>>,
    summary: FtraceSummary,
    cpus: Vec<u32>,
    buffer_size_kb: u32,
    /// The sub-buffer size written, when the recorder chose one.
    subbuf_kb: Option<u32>,
    /// Events the kernel had lost (overrun + dropped) when tracing started;
    /// nonzero only when the buffer was preserved.
    lost_at_start: u64,
    /// `set_event_pid` took `tids_to_trace` (else the encoder filters).
    tid_filter_in_kernel: bool,
    /// Each CPU's `per_cpu/cpuN/stats`, opened at the start.
    stats_files: Vec<std::fs::File>,
    /// Prepared and not yet armed.
    prepared: Option<Prepared>,
    /// The recording directory's `tracing_on`, opened for writing while
    /// privileged: arming and stopping write through it.
    tracing_on: Option<std::fs::File>,
    /// The events a `freeze` rule armed the kernel's traceoff on.
    frozen_at: Vec<(String, String)>,
}

impl<O: PacketOutput + 'static> FtraceSource<O> {
    /// Finds tracefs (or uses `opts.tracefs_root`); nothing is changed yet.
    pub fn new(opts: FtraceOptions, output: O) -> Result<Self, FtraceError> {
        let top = match &opts.tracefs_root {
            Some(r) => Tracefs::at(r)?,
            None => Tracefs::discover()?,
        };
        Ok(Self::with_top(opts, Some(top), output))
    }

    fn with_top(opts: FtraceOptions, top: Option<Tracefs>, output: O) -> Self {
        Self {
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
            subbuf_kb: None,
            lost_at_start: 0,
            tid_filter_in_kernel: false,
            stats_files: Vec::new(),
            prepared: None,
            tracing_on: None,
            frozen_at: Vec::new(),
        }
    }

    /// What it records.
    pub fn options(&self) -> &FtraceOptions {
        &self.opts
    }

    /// Sets the callback told the thread ids seen (for process_stats).
    pub fn on_pids(&mut self, sink: PidSink) {
        self.pid_sink = Some(sink);
    }

    /// See [`TracefsSession::hand_over`].
    pub(crate) fn hand_over_teardown(&mut self) -> Option<tracefs::TracefsTeardown> {
        self.session.as_mut()?.hand_over()
    }

    /// What reading the kernel's leftover of this recording needs, once
    /// prepared: for the broker, which reads it if the recorder dies
    /// ([`drain_leftover`]).
    pub(crate) fn leftover(&self) -> Option<Leftover> {
        Some(Leftover {
            dir: self.session.as_ref()?.dir().root().to_path_buf(),
            sequence_id: self.opts.sequence_id,
            compact_sched: self.opts.spec.compact_sched,
            mono_raw: self.opts.spec.use_monotonic_raw_clock,
        })
    }

    /// The tracefs directory being recorded in, once started.
    pub fn tracefs_dir(&self) -> Option<&Tracefs> {
        self.session.as_ref().map(TracefsSession::dir)
    }

    fn cpu_stats(&self) -> Vec<CpuStats> {
        if !self.cpus.is_empty() && self.stats_files.len() == self.cpus.len() {
            return self
                .cpus
                .iter()
                .zip(&self.stats_files)
                .map(|(&c, f)| CpuStats::parse(c as u64, &read_whole(f)))
                .collect();
        }
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
        // Pages of memory, whatever the sub-buffer size.
        let page = rustix::param::page_size().max(1) as u64;
        self.summary.cpu_stats = cpus.clone();
        let report = StatsReport {
            cpus: &cpus,
            unknown_events: &self.summary.unknown_events,
            failed_events: &self.summary.failed_events,
            parse_errors: &parse_errors,
            cpu_buffer_size_pages: self.buffer_size_kb as u64 * 1024 / page,
            preserve_ftrace_buffer: self.opts.spec.preserve_ftrace_buffer,
        };
        let max = 256
            + 128 * cpus.len()
            + report
                .unknown_events
                .iter()
                .chain(report.failed_events)
                .map(|s| s.len() + 4)
                .sum::<usize>();
        let mut slot = output
            .begin(max, max)
            .ok_or(FtraceError::NoRoom("FtraceStats"))?;
        let n = stats::encode_stats_packet(
            slot.buf(),
            self.opts.sequence_id,
            crate::clock::boottime_ns(),
            phase,
            &report,
        )
        .ok_or(FtraceError::NoRoom("FtraceStats"))?;
        slot.commit(n);
        output.flush();
        Ok(())
    }

    /// The events to record in `dir`: the configured ones, the atrace
    /// categories' kernel events this kernel has and ftrace/print for
    /// atrace, raw_syscalls for `syscall_events`, the kprobes made, with
    /// rss_stat throttled and generic events left out as configured.
    fn select_events(
        &mut self,
        dir: &Tracefs,
        kprobes: &[(String, String)],
    ) -> Vec<(String, String)> {
        let spec = &self.opts.spec;
        let mut events = spec.events.clone();
        // As Perfetto's probes: a category's event the kernel lacks is
        // skipped, not unknown.
        events.extend(
            spec.category_events
                .iter()
                .filter(|e| !resolve_event(dir, e).is_empty())
                .cloned(),
        );
        if !spec.atrace_categories.is_empty() || !spec.atrace_apps.is_empty() {
            // Userspace atrace writes through trace_marker: keep its prints.
            if !events.iter().any(|e| e == "ftrace/print" || e == "print") {
                events.push("ftrace/print".into());
            }
        }
        if !spec.syscall_events.is_empty() {
            for e in ["raw_syscalls/sys_enter", "raw_syscalls/sys_exit"] {
                if !events.iter().any(|x| x == e) {
                    events.push(e.into());
                }
            }
        }
        let mut selected = Vec::new();
        for name in &events {
            let mut found = resolve_event(dir, name);
            if spec.throttle_rss_stat && found.iter().any(|(g, n)| g == "kmem" && n == "rss_stat") {
                if dir.path("events/kmem/rss_stat_throttled/format").is_file() {
                    found.retain(|(g, n)| !(g == "kmem" && n == "rss_stat"));
                    found.push(("kmem".into(), "rss_stat_throttled".into()));
                } else {
                    log::info!(
                        "throttle_rss_stat: this kernel has no kmem/rss_stat_throttled; recording kmem/rss_stat"
                    );
                }
            }
            if found.is_empty() {
                self.summary.unknown_events.push(name.clone());
            }
            for e in found {
                if !selected.contains(&e) {
                    selected.push(e);
                }
            }
        }
        for e in kprobes {
            if !selected.contains(e) {
                selected.push(e.clone());
            }
        }
        if spec.enable_function_graph {
            // Written by the tracer, not enabled as events.
            for n in ["funcgraph_entry", "funcgraph_exit"] {
                selected.push(("ftrace".into(), n.into()));
            }
        }
        if spec.disable_generic_events {
            let (typed, generic): (Vec<_>, Vec<_>) = selected
                .into_iter()
                .partition(|(g, n)| event_table::is_typed(g, n) || g == "ftrace");
            if !generic.is_empty() {
                log::info!(
                    "disable_generic_events: not enabling {} event(s) without a typed message: {}",
                    generic.len(),
                    generic
                        .iter()
                        .map(|(g, n)| format!("{g}/{n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            selected = typed;
        }
        if !self.summary.unknown_events.is_empty() {
            log::warn!(
                "unknown ftrace events ignored: {}",
                self.summary.unknown_events.join(", ")
            );
        }
        selected
    }

    /// Creates the configured kprobes (top-level `kprobe_events`, removed
    /// again at restore); returns their events. A kernel without kprobe
    /// events, or one refusing a probe, fails it by name, as an event that
    /// cannot be enabled.
    fn make_kprobes(&mut self, session: &mut TracefsSession) -> Vec<(String, String)> {
        use crate::config::spec::KprobeKind;
        let mut made = Vec::new();
        if self.opts.spec.kprobe_events.is_empty() {
            return made;
        }
        let group = format!("recorder_{}", std::process::id());
        let has_file = session.top().path("kprobe_events").is_file();
        for k in self.opts.spec.kprobe_events.clone() {
            let base: String = k
                .function
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let probes: &[(&str, String)] = match k.kind {
                KprobeKind::Kprobe => &[("p", base.clone())],
                KprobeKind::Kretprobe => &[("r", format!("{base}_ret"))],
                KprobeKind::Both => &[("p", base.clone()), ("r", format!("{base}_ret"))],
            };
            for (kind, name) in probes {
                if !has_file {
                    log::warn!(
                        "kprobe_events: this kernel has no kprobe_events in tracefs (CONFIG_KPROBE_EVENTS); {} not probed",
                        k.function
                    );
                    self.summary.failed_events.push(format!("{group}/{name}"));
                    continue;
                }
                let line = format!("{kind}:{group}/{name} {}", k.function);
                match session.append_top("kprobe_events", &line, &format!("-:{group}/{name}")) {
                    Ok(()) => made.push((group.clone(), name.clone())),
                    Err(e) => {
                        log::warn!("kprobe_events: {line:?}: {e}");
                        self.summary.failed_events.push(format!("{group}/{name}"));
                    }
                }
            }
        }
        made
    }

    /// Sets up the function_graph tracer; every refusal is an error that
    /// says which file refused and why.
    fn function_graph(&self, session: &mut TracefsSession) -> Result<(), FtraceError> {
        let spec = &self.opts.spec;
        let tracers = session.dir().read("available_tracers").unwrap_or_default();
        if !tracers.split_whitespace().any(|t| t == "function_graph") {
            return Err(FtraceError::Refused(refusal::Refusal::NoFunctionGraph {
                available: tracers.trim().to_string(),
            }));
        }
        let refused = |field: &'static str, source: TracefsError| {
            FtraceError::Refused(refusal::Refusal::Setting { field, source })
        };
        if !spec.function_filters.is_empty() {
            session
                .set("set_ftrace_filter", &spec.function_filters.join(" "))
                .map_err(|e| refused("function_filters", e))?;
        }
        if !spec.function_graph_roots.is_empty() {
            session
                .set("set_graph_function", &spec.function_graph_roots.join(" "))
                .map_err(|e| refused("function_graph_roots", e))?;
        }
        if let Some(depth) = spec.function_graph_max_depth {
            session
                .set_top("max_graph_depth", &depth.to_string())
                .map_err(|e| refused("function_graph_max_depth", e))?;
        }
        session
            .set("current_tracer", "function_graph")
            .map_err(|e| refused("enable_function_graph", e))
    }

    /// After [`prepare`](Self::prepare), on the privileged side: hands the
    /// prepared instance over — what decoding needs, its descriptors (see
    /// [`remote::PreparedInfo`]) and its teardown — and keeps nothing of it.
    pub(crate) fn export(
        &mut self,
    ) -> Result<(remote::PreparedInfo, Vec<OwnedFd>, tracefs::TracefsTeardown), FtraceError> {
        let prepared = self
            .prepared
            .take()
            .ok_or(FtraceError::State("export before prepare"))?;
        let session = self
            .session
            .as_mut()
            .ok_or(FtraceError::State("export before prepare"))?;
        let dir = session.dir().clone();
        let mut formats = Vec::with_capacity(prepared.selected.len());
        for (g, n) in &prepared.selected {
            // ftrace/funcgraph_* and events whose format failed have none.
            if let Ok(text) = dir.read(&format!("events/{g}/{n}/format")) {
                formats.push((g.clone(), n.clone(), text));
            }
        }
        let info = remote::PreparedInfo {
            cpus: self.cpus.clone(),
            header_page: dir.read("events/header_page")?,
            header_event: dir.read("events/header_event")?,
            formats,
            unknown_events: self.summary.unknown_events.clone(),
            failed_events: self.summary.failed_events.clone(),
            buffer_size_kb: self.buffer_size_kb,
            watermark: prepared.watermark,
        };
        let tracing_on = self
            .tracing_on
            .take()
            .ok_or(FtraceError::State("tracing_on is not open"))?;
        let mut fds: Vec<OwnedFd> = vec![tracing_on.into()];
        fds.extend(prepared.pipes.into_iter().map(|p| OwnedFd::from(p.file)));
        fds.extend(self.stats_files.drain(..).map(OwnedFd::from));
        if fds.len() != info.fd_count() {
            return Err(FtraceError::Refused(refusal::Refusal::StatsFiles {
                opened: fds.len().saturating_sub(1 + info.cpus.len()),
                cpus: info.cpus.len(),
            }));
        }
        // Kept until here: on an error above, dropping the session restores.
        let teardown = session
            .hand_over()
            .ok_or(FtraceError::State("teardown handed over already"))?;
        self.session = None;
        Ok((info, fds, teardown))
    }

    /// A source for an instance to be prepared elsewhere: it never touches
    /// tracefs by path; [`adopt`](Self::adopt) gives it the instance.
    pub fn detached(opts: FtraceOptions, output: O) -> Self {
        Self::with_top(opts, None, output)
    }

    /// Takes an instance prepared elsewhere ([`export`](Self::export)), ready
    /// to [`arm`](Self::arm); the teardown stays with whoever prepared it.
    pub(crate) fn adopt(
        &mut self,
        info: remote::PreparedInfo,
        fds: Vec<OwnedFd>,
    ) -> Result<(), FtraceError> {
        if fds.len() != info.fd_count() {
            return Err(FtraceError::State("descriptors missing"));
        }
        if self.prepared.is_some() || self.running.is_some() {
            return Err(FtraceError::State("prepare twice"));
        }
        let me = self;
        let texts: std::collections::HashMap<String, &str> = info
            .formats
            .iter()
            .map(|(g, n, t)| (format!("events/{g}/{n}/format"), t.as_str()))
            .chain([
                ("events/header_page".to_string(), info.header_page.as_str()),
                (
                    "events/header_event".to_string(),
                    info.header_event.as_str(),
                ),
            ])
            .collect();
        let selected: Vec<(String, String)> = info
            .formats
            .iter()
            .map(|(g, n, _)| (g.clone(), n.clone()))
            .collect();
        let read = |rel: &str| {
            texts
                .get(rel)
                .map(|t| t.to_string())
                .ok_or_else(|| TracefsError::Io {
                    path: PathBuf::from(rel),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                })
        };
        let (layout, table, failed) = layouts_from(read, &selected, me.opts.spec.compact_sched)?;
        me.summary.unknown_events = info.unknown_events;
        me.summary.failed_events = info.failed_events;
        me.summary.failed_events.extend(failed);
        me.layout = Some(layout);
        me.buffer_size_kb = info.buffer_size_kb;
        me.cpus = info.cpus;
        let mut fds = fds.into_iter();
        me.tracing_on = fds.next().map(std::fs::File::from);
        let n = me.cpus.len();
        let pipe_fds: Vec<OwnedFd> = fds.by_ref().take(n).collect();
        me.stats_files = fds.map(std::fs::File::from).collect();
        let mut pipes = Vec::with_capacity(n);
        for (file, cpu) in pipe_fds.into_iter().zip(me.cpus.clone()) {
            pipes.push(me.cpu_pipe(std::fs::File::from(file), cpu, &layout)?);
        }
        me.prepared = Some(Prepared {
            selected,
            pipes,
            table,
            layout,
            watermark: info.watermark,
        });
        Ok(())
    }

    /// Configures tracefs, writes the start FtraceStats and starts the reader:
    /// [`prepare`](Self::prepare) then [`arm`](Self::arm).
    /// On error everything changed is put back.
    pub fn start(&mut self) -> Result<(), FtraceError> {
        if self.prepared.is_none() {
            self.prepare()?;
        }
        self.arm()
    }

    /// Everything of the start that needs privileges, with tracing still
    /// off: the instance, its settings and events, and every descriptor the
    /// recording needs later (per-CPU `trace_pipe_raw` and `stats`, and
    /// `tracing_on` for writing), so that [`arm`](Self::arm) and
    /// [`stop`](Self::stop) need no rights the process may have given up
    /// meanwhile: the kernel checks a tracefs file's permission when it is
    /// opened, not when it is written. On error everything changed is put
    /// back.
    pub(crate) fn prepare(&mut self) -> Result<(), FtraceError> {
        if self.prepared.is_some() || self.running.is_some() || self.output.is_none() {
            return Err(FtraceError::State("prepare twice"));
        }
        let spec = self.opts.spec.clone();
        let top = self.top.as_ref().ok_or(FtraceError::State("no tracefs"))?;
        let mut session =
            TracefsSession::open(top, spec.instance_name.as_deref(), &self.opts.proc_root)?;
        let kprobes = self.make_kprobes(&mut session);
        let selected = self.select_events(session.dir(), &kprobes);
        if selected.is_empty() {
            let mut asked = spec.events.clone();
            asked.extend(spec.kprobe_events.iter().map(|k| k.function.clone()));
            return Err(FtraceError::NoEvents(asked));
        }
        self.buffer_size_kb = self.per_cpu_kb(&session)?;
        // The sub-buffer size changes the page layout: set before it is read.
        self.set_subbuf(&mut session)?;
        let (layout, table, failed) = load_layouts(session.dir(), &selected, spec.compact_sched)?;
        self.summary.failed_events.extend(failed);
        self.layout = Some(layout);

        session.set("tracing_on", "0")?;
        let tracing_on = open_for_writing(&session.dir().path("tracing_on"))?;
        self.configure(&mut session)?;
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
        self.arm_freezes(&mut session);
        self.cpus = session.dir().cpus();
        let pipes = self.open_pipes(session.dir(), &layout)?;
        // Held open: the stats stay readable after the process gives up root.
        self.stats_files = self
            .cpus
            .iter()
            .filter_map(|&c| {
                std::fs::File::open(session.dir().path(&format!("per_cpu/cpu{c}/stats"))).ok()
            })
            .collect();
        self.session = Some(session);
        self.prepared = Some(Prepared {
            selected,
            pipes,
            table,
            layout,
            watermark,
        });
        self.tracing_on = Some(tracing_on);
        Ok(())
    }

    /// Arms the kernel's own `traceoff` trigger, with the rule's filter, on
    /// the event of each `freeze` rule: the recording directory's buffers
    /// stop at the event, with no round trip to user space. Where the
    /// kernel refuses, one line says so and the rule acts from user space.
    fn arm_freezes(&mut self, session: &mut TracefsSession) {
        let Some(plan) = &self.opts.rules else {
            return;
        };
        for (g, n, filter) in watch::Watch::freezes(plan) {
            let line = match &filter {
                Some(f) => format!("traceoff:1 if {f}"),
                None => "traceoff:1".to_string(),
            };
            let rel = format!("events/{g}/{n}/trigger");
            if !session.dir().path(&rel).is_file() {
                log::warn!(
                    "freeze: this kernel has no {rel} (event triggers): the rule stops the session from user space only"
                );
                continue;
            }
            match session.append(&rel, &line, &format!("!{line}")) {
                Ok(()) => {
                    log::info!("freeze: armed `{line}` on {g}/{n}");
                    self.frozen_at.push((g, n));
                }
                Err(e) => log::warn!(
                    "freeze: the kernel refused `{line}` on {g}/{n} ({e}): the rule stops the session from user space only"
                ),
            }
        }
    }

    /// The buffer size per CPU, in KiB: as configured (at least the default
    /// where it is a lower bound), the default, or with
    /// `preserve_ftrace_buffer` the size the buffer already has (a resize
    /// would drop what it holds).
    fn per_cpu_kb(&self, session: &TracefsSession) -> Result<u32, FtraceError> {
        let spec = &self.opts.spec;
        let default_kb = || default_buffer_size_kb(mem_total_kb(&self.opts.proc_root));
        let kb = match spec.buffer_size {
            Some(b) if spec.buffer_size_lower_bound => {
                (b.kb().min(u64::from(u32::MAX)) as u32).max(default_kb())
            }
            Some(b) => b.kb().min(u64::from(u32::MAX)) as u32,
            None => default_kb(),
        };
        if !spec.preserve_ftrace_buffer {
            return Ok(kb);
        }
        let now = session.dir().read("buffer_size_kb")?;
        Ok(tracefs::restorable_value("buffer_size_kb", &now)
            .parse()
            .unwrap_or(kb))
    }

    /// Writes the sub-buffer size [`subbuf`] chooses, where the kernel has
    /// the setting and the buffer is not preserved (a change empties it).
    /// A size the kernel refuses is an error only when it was asked for;
    /// the recorder's own choice falls back to the kernel's size.
    fn set_subbuf(&mut self, session: &mut TracefsSession) -> Result<(), FtraceError> {
        const FILE: &str = "buffer_subbuf_size_kb";
        if self.opts.spec.preserve_ftrace_buffer || !session.dir().path(FILE).is_file() {
            return Ok(());
        }
        let page_kb = (rustix::param::page_size() / 1024).max(1) as u32;
        let Some(kb) = self.opts.subbuf.choose(self.buffer_size_kb, page_kb) else {
            return Ok(());
        };
        let now = session.dir().read(FILE)?;
        if now.trim() != kb.to_string()
            && let Err(e) = session.set(FILE, &kb.to_string())
        {
            if self.opts.subbuf != SubbufSize::Auto {
                return Err(e.into());
            }
            log::info!("ftrace: keeping the kernel's sub-buffer size: {e}");
            self.summary.subbuf_refused = Some((kb, e.to_string()));
            return Ok(());
        }
        self.subbuf_kb = Some(kb);
        Ok(())
    }

    /// The settings of the recording directory: clock, buffer size (the
    /// buffer emptied unless preserved), CPU mask, trace options, the pid
    /// filter, syscall filters and the function_graph tracer.
    fn configure(&mut self, session: &mut TracefsSession) -> Result<(), FtraceError> {
        let spec = self.opts.spec.clone();
        // Changing the clock empties the buffer: only when it differs.
        let clock = if spec.use_monotonic_raw_clock {
            "mono_raw"
        } else {
            "boot"
        };
        if restorable_clock(&session.dir().read("trace_clock")?) != clock {
            session.set("trace_clock", clock)?;
        }
        if spec.preserve_ftrace_buffer {
            log::info!(
                "preserve_ftrace_buffer: keeping the buffer and its size ({} KiB per CPU)",
                self.buffer_size_kb
            );
        } else {
            session.set("buffer_size_kb", &self.buffer_size_kb.to_string())?;
            // Nothing recorded before this session's start.
            session.dir().write("trace", "")?;
        }
        if let Some(mask) = &spec.tracing_cpumask {
            session.set("tracing_cpumask", mask)?;
        }
        for (name, on) in &spec.tracefs_options {
            let rel = format!("options/{name}");
            if !session.dir().path(&rel).is_file() {
                return Err(FtraceError::Refused(refusal::Refusal::NoOption(
                    name.clone(),
                )));
            }
            session.set(&rel, if *on { "1" } else { "0" })?;
        }
        if !spec.tids_to_trace.is_empty() {
            let list: Vec<String> = spec.tids_to_trace.iter().map(u32::to_string).collect();
            match session.set("set_event_pid", &list.join(" ")) {
                Ok(()) => self.tid_filter_in_kernel = true,
                Err(e) => {
                    log::info!(
                        "tids_to_trace: the kernel filter is refused ({e}); filtering in user space"
                    );
                    self.tid_filter_in_kernel = false;
                }
            }
        }
        if !spec.syscall_events.is_empty() {
            // Filtered in the kernel: only the listed syscall numbers.
            let filter = spec
                .syscall_events
                .iter()
                .map(|s| format!("id == {}", s.number))
                .collect::<Vec<_>>()
                .join(" || ");
            for e in ["sys_enter", "sys_exit"] {
                session.set(&format!("events/raw_syscalls/{e}/filter"), &filter)?;
            }
        }
        if spec.enable_function_graph {
            self.function_graph(session)?;
        }
        Ok(())
    }

    /// Opens each CPU's `trace_pipe_raw`.
    fn open_pipes(
        &mut self,
        dir: &Tracefs,
        layout: &PageLayout,
    ) -> Result<Vec<CpuPipe>, FtraceError> {
        let mut pipes = Vec::new();
        for cpu in self.cpus.clone() {
            let p = dir.path(&format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&p)
                .map_err(|source| TracefsError::Io {
                    path: p.clone(),
                    source,
                })?;
            pipes.push(self.cpu_pipe(file, cpu, layout)?);
        }
        Ok(pipes)
    }

    /// One CPU's reader state on its open `trace_pipe_raw` (mapped, or with
    /// a splice pipe, as the read mode asks).
    fn cpu_pipe(
        &mut self,
        file: std::fs::File,
        cpu: u32,
        layout: &PageLayout,
    ) -> Result<CpuPipe, FtraceError> {
        let map = reader::open_map(&file, cpu, layout, self.opts.read_mode)
            .map_err(|source| FtraceError::Refused(refusal::Refusal::Mmap { cpu, source }))?;
        self.summary.mapped_cpus += usize::from(map.is_some());
        let splice_pipe = if self.opts.read_mode == ReadMode::Splice {
            let (r, w) = rustix::pipe::pipe_with(
                rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
            )
            .map_err(|e| FtraceError::SplicePipe(e.into()))?;
            let want = reader::SPLICE_PIPE_PAGES * layout.page_size();
            let _ = rustix::pipe::fcntl_setpipe_size(&w, want);
            Some((r, w))
        } else {
            None
        };
        Ok(CpuPipe {
            map,
            cpu,
            file,
            bytes_read: 0,
            read_errors: 0,
            cursor: CpuCursor {
                cpu,
                ..Default::default()
            },
            splice_pipe,
        })
    }

    /// Writes the start FtraceStats, turns tracing on through the
    /// descriptor [`prepare`](Self::prepare) opened, and starts the reader.
    /// Needs no privileges.
    pub(crate) fn arm(&mut self) -> Result<(), FtraceError> {
        if self.running.is_some() {
            return Err(FtraceError::State("start twice"));
        }
        let Some(prepared) = self.prepared.take() else {
            return Err(FtraceError::State("arm before prepare"));
        };
        let Prepared {
            selected,
            pipes,
            mut table,
            layout,
            watermark,
        } = prepared;
        let watch = match &self.opts.rules {
            Some(plan) => {
                // Rules fire on BOOTTIME; events carry the trace clock.
                let to_boot = if self.opts.spec.use_monotonic_raw_clock {
                    crate::clock::boottime_ns() as i64
                        - crate::clock::BuiltinClock::MonotonicRaw.now_ns() as i64
                } else {
                    0
                };
                watch::Watch::new(plan, &mut table, to_boot).map_err(FtraceError::Rule)?
            }
            None => None,
        };
        let mut output = self.output.take().ok_or(FtraceError::State("no output"))?;
        if let Err(e) = self.write_stats(Phase::StartOfTrace, &mut output) {
            self.output = Some(output);
            return Err(e);
        }
        self.lost_at_start = events_lost(&self.summary.cpu_stats);
        if let Err(e) = self.write_tracing_on(true) {
            self.output = Some(output);
            return Err(e);
        }
        let mut encoder = BundleEncoder::new(self.opts.sequence_id, self.opts.max_packet_bytes);
        if self.opts.spec.use_monotonic_raw_clock {
            encoder.set_ftrace_clock(FTRACE_CLOCK_MONO_RAW);
        }
        if !self.opts.spec.tids_to_trace.is_empty() && !self.tid_filter_in_kernel {
            encoder.set_tid_filter(&self.opts.spec.tids_to_trace);
        }
        if let Some(w) = watch {
            encoder.set_watch(w);
        }
        let mut state = ReaderState::new(
            output,
            encoder,
            pipes,
            Arc::new(table),
            self.opts.spec.print_filter.clone(),
            layout,
            self.pid_sink.take(),
        );
        state.mode = self.opts.read_mode;
        state.watermark = watermark;
        state.schedule(self.opts.spec.drain_period);
        self.running = Some(state);
        log::info!(
            "ftrace: recording {} events on {} CPUs, {} KiB per CPU{}",
            selected.len(),
            self.cpus.len(),
            self.buffer_size_kb,
            self.subbuf_kb
                .map(|k| format!(" in {k} KiB sub-buffers"))
                .unwrap_or_default()
        );
        Ok(())
    }

    /// Turns tracing on or off through the descriptor held since
    /// [`prepare`](Self::prepare).
    fn write_tracing_on(&self, on: bool) -> Result<(), FtraceError> {
        let Some(f) = &self.tracing_on else {
            return Err(FtraceError::State("tracing_on is not open"));
        };
        let path = || {
            self.session
                .as_ref()
                .map_or_else(PathBuf::new, |s| s.dir().path("tracing_on"))
        };
        // The kernel reads the value whatever the offset.
        std::io::Write::write_all(&mut &*f, if on { b"1" } else { b"0" }).map_err(|source| {
            FtraceError::Tracefs(TracefsError::Io {
                path: path(),
                source,
            })
        })
    }

    /// Events the kernel lost before they were read (overruns and dropped
    /// events, all CPUs) since tracing started: its counters now while
    /// running, those at the end after the stop.
    pub(crate) fn kernel_lost(&self) -> u64 {
        let now = if self.running.is_some() {
            events_lost(&self.cpu_stats())
        } else {
            events_lost(&self.summary.cpu_stats)
        };
        now.saturating_sub(self.lost_at_start)
    }

    /// Drains every CPU now and returns once the data is in the output.
    pub fn flush(&mut self) -> Result<(), FtraceError> {
        let r = self
            .running
            .as_mut()
            .ok_or(FtraceError::State("flush before start"))?;
        // A flush must deliver everything written so far.
        r.drain(true);
        Ok(())
    }

    /// When the reader next wants [`on_due`](Self::on_due) (none before
    /// the start or after the stop).
    pub fn next_due(&self) -> Option<Instant> {
        self.running.as_ref().map(ReaderState::next_due)
    }

    /// The CPUs' pipes to wait on: readable once a CPU's buffer passed the
    /// watermark.
    pub fn watched(&self) -> Vec<BorrowedFd<'_>> {
        self.running
            .as_ref()
            .map_or_else(Vec::new, ReaderState::watched)
    }

    /// Drains when the period came, or early when a watched pipe was
    /// readable (`woken`).
    pub(crate) fn on_due(&mut self, now: Instant, woken: bool) {
        if let Some(r) = &mut self.running {
            r.on_due(now, woken);
        }
    }

    /// Hosts the reader on this thread until `stop` is set (looked at every
    /// `check`): what a program that records ftrace alone (a test, a bench)
    /// does in place of an event loop.
    pub fn drive_until(
        &mut self,
        stop: &std::sync::atomic::AtomicBool,
        check: std::time::Duration,
    ) {
        use rustix::event::{PollFd, PollFlags, poll};
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            let Some(due) = self.next_due() else {
                return;
            };
            let until = due.min(Instant::now() + check);
            let left = until.saturating_duration_since(Instant::now());
            let ts = rustix::time::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let woken = {
                let watched = self.watched();
                let mut fds: Vec<PollFd<'_>> = watched
                    .iter()
                    .map(|f| PollFd::from_borrowed_fd(*f, PollFlags::IN))
                    .collect();
                if fds.is_empty() {
                    std::thread::sleep(left);
                    false
                } else {
                    let _ = poll(&mut fds, Some(&ts));
                    fds.iter().any(|f| !f.revents().is_empty())
                }
            };
            self.on_due(Instant::now(), woken);
        }
    }

    /// The next bundle written says the sequence's incremental state was
    /// cleared (bundles carry none across each other).
    pub fn clear_incremental_state(&mut self) -> Result<(), FtraceError> {
        self.running
            .as_mut()
            .ok_or(FtraceError::State("clear before start"))?
            .encoder
            .clear_incremental_state();
        Ok(())
    }

    /// Stops tracing, drains a last time, writes the end FtraceStats and
    /// restores tracefs. The output can then be taken back.
    pub fn stop(&mut self) -> Result<FtraceSummary, FtraceError> {
        let mut state = self
            .running
            .take()
            .ok_or(FtraceError::State("stop before start"))?;
        // Nothing new after this; the last drain then empties the buffers.
        if let Err(e) = self.write_tracing_on(false) {
            log::warn!("ftrace: turning tracing off: {e}");
        }
        state.drain(true);
        if let Some(w) = state.encoder.watch() {
            w.note_freeze(
                state
                    .pipes
                    .iter()
                    .map(|p| p.cursor.last_ts)
                    .max()
                    .unwrap_or(0),
                &self.frozen_at,
            );
        }
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
        // An instance with a file open cannot be removed.
        self.close_files();
        self.output = Some(output);
        if let Some(mut s) = self.session.take() {
            s.restore();
        }
        res.map(|()| self.summary.clone())
    }

    /// Closes every tracefs file held (an instance with a file open cannot
    /// be removed).
    pub(crate) fn close_files(&mut self) {
        self.prepared = None;
        self.stats_files.clear();
        self.tracing_on = None;
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
        // Prepared and never armed: the files close before the restore.
        self.close_files();
        if let Some(mut s) = self.session.take() {
            s.restore();
        }
    }
}

/// A recording directory whose recorder may die with events still in the
/// kernel's buffers: where it is and how its events were encoded.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Leftover {
    /// The recording directory (a tracefs instance).
    pub dir: PathBuf,
    /// The sequence the recording wrote its bundles on.
    pub sequence_id: u32,
    /// Whether sched_switch and sched_waking were written as compact_sched.
    pub compact_sched: bool,
    /// Whether the recording used the MONO_RAW trace clock, so the bundles
    /// say so.
    pub mono_raw: bool,
}

/// Reads what the kernel still holds in a recording directory whose
/// recorder died, before the directory is removed: tracing off first, then
/// every CPU's `trace_pipe_raw` to its end, decoded with the formats of the
/// events enabled there (`set_event`, and `ftrace/print`), encoded as the
/// recording did on its sequence. Returns the framed packets. Needs the
/// rights to open the directory's files (the broker's).
pub(crate) fn drain_leftover(l: &Leftover) -> Result<Vec<u8>, FtraceError> {
    let dir = Tracefs::at(&l.dir)?;
    if let Err(e) = dir.write("tracing_on", "0") {
        log::warn!(
            "ftrace leftover in {}: turning tracing off: {e}",
            l.dir.display()
        );
    }
    let mut selected: Vec<(String, String)> = dir
        .read("set_event")?
        .lines()
        .filter_map(|line| line.trim().split_once(':'))
        .map(|(g, n)| (g.to_string(), n.to_string()))
        .collect();
    selected.extend(resolve_event(&dir, "ftrace/print"));
    let (layout, table, _failed) = load_layouts(&dir, &selected, l.compact_sched)?;
    let opts = FtraceOptions {
        spec: FtraceSpec {
            compact_sched: l.compact_sched,
            use_monotonic_raw_clock: l.mono_raw,
            ..FtraceSpec::default()
        },
        sequence_id: l.sequence_id,
        read_mode: ReadMode::Read,
        ..FtraceOptions::default()
    };
    let mut src = FtraceSource::detached(opts, VecOutput::new());
    src.cpus = dir.cpus();
    let pipes = src.open_pipes(&dir, &layout)?;
    let mut encoder = BundleEncoder::new(l.sequence_id, src.opts.max_packet_bytes);
    if l.mono_raw {
        encoder.set_ftrace_clock(FTRACE_CLOCK_MONO_RAW);
    }
    let mut state = ReaderState::new(
        VecOutput::new(),
        encoder,
        pipes,
        Arc::new(table),
        PrintFilter::default(),
        layout,
        None,
    );
    state.mode = ReadMode::Read;
    state.drain(true);
    state.output.flush();
    Ok(std::mem::take(&mut state.output.bytes))
}

/// `path` opened for writing (a tracefs switch).
fn open_for_writing(path: &std::path::Path) -> Result<std::fs::File, FtraceError> {
    OpenOptions::new().write(true).open(path).map_err(|source| {
        FtraceError::Tracefs(TracefsError::Io {
            path: path.to_path_buf(),
            source,
        })
    })
}

/// A tracefs file read again from its start through a held descriptor
/// (empty on error).
fn read_whole(f: &std::fs::File) -> String {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let mut at = 0u64;
    while let Ok(n) = f.read_at(&mut buf, at) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    String::from_utf8_lossy(&out).into_owned()
}
