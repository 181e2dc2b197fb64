//! The validated, typed form of a TraceConfig that the rest of recorder works
//! on. Defaults are applied; no generated proto type appears here.

use std::fmt;
use std::time::Duration;

use super::raw::{self, ServiceFields, WireError};

/// Index of a buffer in the config's `buffers` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BufferId(pub u32);

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `kb` KiB.
    pub const fn from_kb(kb: u64) -> Self {
        ByteSize(kb * 1024)
    }
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
    /// The size in whole KiB (rounded down).
    pub const fn kb(self) -> u64 {
        self.0 / 1024
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KIB: u64 = 1024;
        let b = self.0;
        if b >= KIB * KIB * KIB && b.is_multiple_of(KIB * KIB * KIB) {
            write!(f, "{} GiB", b / (KIB * KIB * KIB))
        } else if b >= KIB * KIB && b.is_multiple_of(KIB * KIB) {
            write!(f, "{} MiB", b / (KIB * KIB))
        } else if b >= KIB && b.is_multiple_of(KIB) {
            write!(f, "{} KiB", b / KIB)
        } else {
            write!(f, "{b} B")
        }
    }
}

/// What a buffer does when it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillPolicy {
    /// Overwrite the oldest unflushed data (RING_BUFFER, and UNSPECIFIED).
    RingBuffer,
    /// Drop new data until a flush frees space.
    Discard,
}

/// One buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferSpec {
    /// Its index.
    pub id: BufferId,
    /// Its name, if the config gave one.
    pub name: Option<String>,
    /// Its size.
    pub size: ByteSize,
    /// Its fill policy.
    pub fill_policy: FillPolicy,
    /// Clone semantics (accepted; relevant once clone snapshots exist).
    pub(crate) transfer_on_clone: bool,
    /// Clone semantics.
    pub(crate) clear_before_clone: bool,
}

/// A scalar counter of a `/proc` file, by its enum number and name (e.g.
/// `MEMINFO_MEM_TOTAL`, `VMSTAT_NR_FREE_PAGES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// The enum number (what the trace records as the key).
    pub id: i32,
    /// The enum name.
    pub name: String,
}

impl Counter {
    /// The `/proc/vmstat` key of a vmstat counter: its name without `VMSTAT_`,
    /// in lower case.
    #[cfg(test)]
    pub(crate) fn vmstat_key(&self) -> String {
        self.name.trim_start_matches("VMSTAT_").to_ascii_lowercase()
    }
}

/// Which `/proc/stat` parts to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatCounter {
    /// Per-CPU times.
    CpuTimes,
    /// Interrupt counts.
    IrqCounts,
    /// Softirq counts.
    SoftirqCounts,
    /// Forks since boot.
    ForkCount,
}

/// `linux.ftrace`. `Default` is what an empty `ftrace_config` validates to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FtraceSpec {
    /// `group/name`, bare `name` or `group/*`.
    pub events: Vec<String>,
    /// Atrace categories: on Linux, the kernel events of
    /// [`category_events`](Self::category_events) and `ftrace/print`.
    pub atrace_categories: Vec<String>,
    /// Android atrace apps (on Linux, only `ftrace/print`).
    pub atrace_apps: Vec<String>,
    /// `group/name` of the kernel events the atrace categories add
    /// ([`crate::config::categories`]), not already in `events`: each is
    /// enabled where the kernel has it, and one it lacks is not unknown.
    pub category_events: Vec<String>,
    /// Per-CPU kernel buffer; `None`: 4 MiB, or 8 MiB with 7 GiB of RAM or more.
    pub buffer_size: Option<ByteSize>,
    /// `buffer_size` is a lower bound: the default size is used when larger.
    pub buffer_size_lower_bound: bool,
    /// How often the per-CPU buffers are read (default 100 ms).
    pub drain_period: Duration,
    /// Also drain as soon as a CPU buffer is this full (percent, 1..=100;
    /// unset or 0 in the config: 50). 0 here drains on the period only.
    pub drain_buffer_percent: u32,
    /// Columnar sched_switch/sched_waking encoding (default on).
    pub compact_sched: bool,
    /// Record `kmem/rss_stat_throttled` instead of `kmem/rss_stat` where the
    /// kernel has it.
    pub throttle_rss_stat: bool,
    /// Enable only events that have a typed message (no generic events).
    pub disable_generic_events: bool,
    /// Syscalls to record, through `raw_syscalls` filtered in the kernel.
    pub syscall_events: Vec<Syscall>,
    /// The function_graph tracer.
    pub enable_function_graph: bool,
    /// `set_ftrace_filter` globs for function_graph.
    pub function_filters: Vec<String>,
    /// `set_graph_function` globs for function_graph.
    pub function_graph_roots: Vec<String>,
    /// `max_graph_depth` for function_graph (`None`: the kernel's).
    pub function_graph_max_depth: Option<u32>,
    /// Keep what the kernel buffer already holds (not cleared at start).
    pub preserve_ftrace_buffer: bool,
    /// Timestamp with `mono_raw` instead of `boot`.
    pub use_monotonic_raw_clock: bool,
    /// A tracefs instance instead of our own.
    pub instance_name: Option<String>,
    /// Hex cpumask (`tracing_cpumask`).
    pub tracing_cpumask: Option<String>,
    /// Only these threads (`set_event_pid`; in user space where refused).
    pub tids_to_trace: Vec<u32>,
    /// kprobes and kretprobes to create and record.
    pub kprobe_events: Vec<KprobeSpec>,
    /// tracefs `options/NAME` to set for the recording: (name, enabled).
    pub tracefs_options: Vec<(String, bool)>,
    /// `print_filter` rules.
    pub print_filter: PrintFilter,
}

impl Default for FtraceSpec {
    fn default() -> Self {
        Self {
            events: Vec::new(),
            atrace_categories: Vec::new(),
            atrace_apps: Vec::new(),
            category_events: Vec::new(),
            buffer_size: None,
            buffer_size_lower_bound: false,
            drain_period: Duration::from_millis(u64::from(
                super::validate::DEFAULT_DRAIN_PERIOD_MS,
            )),
            drain_buffer_percent: super::validate::DEFAULT_DRAIN_BUFFER_PERCENT,
            compact_sched: true,
            throttle_rss_stat: false,
            disable_generic_events: false,
            syscall_events: Vec::new(),
            enable_function_graph: false,
            function_filters: Vec::new(),
            function_graph_roots: Vec::new(),
            function_graph_max_depth: None,
            preserve_ftrace_buffer: false,
            use_monotonic_raw_clock: false,
            instance_name: None,
            tracing_cpumask: None,
            tids_to_trace: Vec::new(),
            kprobe_events: Vec::new(),
            tracefs_options: Vec::new(),
            print_filter: PrintFilter::default(),
        }
    }
}

/// A syscall by name, with its number on the architecture recorder runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Syscall {
    /// As the config names it (`sys_read`).
    pub name: String,
    /// `raw_syscalls` `id`.
    pub number: u32,
}

/// Which probes a kprobe event makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KprobeKind {
    /// On entry.
    Kprobe,
    /// On return.
    Kretprobe,
    /// Both.
    Both,
}

/// One `FtraceConfig.kprobe_events` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KprobeSpec {
    /// The kernel function.
    pub function: String,
    /// Entry, return or both.
    pub kind: KprobeKind,
}

/// `FtraceConfig.print_filter`: the first matching rule decides whether an
/// `ftrace/print` event is kept; none matching keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrintFilter {
    /// The rules, in order.
    pub rules: Vec<PrintRule>,
}

/// One rule of the print filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrintRule {
    /// What it matches.
    pub matches: PrintMatch,
    /// Keep (true) or drop a matching print.
    pub allow: bool,
}

/// What a print rule matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrintMatch {
    /// The message starts with this prefix.
    Prefix(String),
    /// An atrace message `T|pid|name...` of type `T` whose name starts with prefix.
    Atrace {
        /// The atrace type (`B`, `E`, `C`, ...).
        kind: String,
        /// Start of the name.
        prefix: String,
    },
}

impl PrintFilter {
    /// Whether a print with text `buf` is kept (no matching rule: kept).
    pub fn allows(&self, buf: &[u8]) -> bool {
        for r in &self.rules {
            let hit = match &r.matches {
                PrintMatch::Prefix(p) => buf.starts_with(p.as_bytes()),
                PrintMatch::Atrace { kind, prefix } => {
                    let mut parts = buf.splitn(3, |&c| c == b'|');
                    let t = parts.next().unwrap_or_default();
                    let _pid = parts.next();
                    let name = parts.next().unwrap_or_default();
                    t == kind.as_bytes() && name.starts_with(prefix.as_bytes())
                }
            };
            if hit {
                return r.allow;
            }
        }
        true
    }
}

/// `linux.process_stats`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessStatsSpec {
    /// Dump every process at start.
    pub scan_all_processes_on_start: bool,
    /// Record thread names.
    pub record_thread_names: bool,
    /// Poll period for `process_stats` packets (at least 100 ms); `None`: no polling.
    pub poll_period: Option<Duration>,
    /// Cache TTL for unchanged stats.
    pub cache_ttl: Option<Duration>,
    /// Do not scrape PIDs seen by ftrace (quirk DISABLE_ON_DEMAND).
    pub disable_on_demand: bool,
    /// Read smaps_rollup.
    pub scan_smaps_rollup: bool,
    /// Record process start time.
    pub record_process_age: bool,
    /// Record process CPU runtime.
    pub record_process_runtime: bool,
    /// Record dmabuf RSS.
    pub record_process_dmabuf_rss: bool,
    /// Record open file descriptors.
    pub resolve_process_fds: bool,
    /// Do not emit a thread entry for the main thread.
    pub skip_main_thread_message: bool,
}

/// `linux.sys_stats`. A period of `None` means that part is not read; an empty
/// counter list means every known counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SysStatsSpec {
    /// /proc/meminfo period.
    pub meminfo_period: Option<Duration>,
    /// Which meminfo counters.
    pub meminfo_counters: Vec<Counter>,
    /// /proc/vmstat period.
    pub vmstat_period: Option<Duration>,
    /// Which vmstat counters.
    pub vmstat_counters: Vec<Counter>,
    /// /proc/stat period.
    pub stat_period: Option<Duration>,
    /// Which /proc/stat parts.
    pub stat_counters: Vec<StatCounter>,
    /// devfreq period.
    pub devfreq_period: Option<Duration>,
    /// cpufreq period.
    pub cpufreq_period: Option<Duration>,
    /// buddyinfo period.
    pub buddyinfo_period: Option<Duration>,
    /// diskstats period.
    pub diskstat_period: Option<Duration>,
    /// PSI period.
    pub psi_period: Option<Duration>,
    /// thermal zones period.
    pub thermal_period: Option<Duration>,
    /// cpuidle period.
    pub cpuidle_period: Option<Duration>,
    /// GPU frequency period.
    pub gpufreq_period: Option<Duration>,
    /// slabinfo period.
    pub slab_period: Option<Duration>,
}

/// The synthetic `for_testing` source (TestConfig).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TestSourceSpec {
    /// Packets to emit (0: none).
    pub message_count: u32,
    /// Rate limit (0: as fast as possible).
    pub max_messages_per_second: u32,
    /// Seed of the payload generator.
    pub seed: u32,
    /// Payload size in bytes.
    pub message_size: u32,
    /// Emit the whole batch at registration.
    pub(crate) send_batch_on_register: bool,
}

/// What a data source is, with its decoded sub-config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    /// `linux.ftrace`.
    Ftrace(FtraceSpec),
    /// `linux.process_stats`.
    ProcessStats(ProcessStatsSpec),
    /// `linux.sys_stats`.
    SysStats(SysStatsSpec),
    /// `for_testing` or `android.perfetto.FakeProducer`.
    ForTesting(TestSourceSpec),
    /// `track_event`: accepted; written only by SDK producers that connect.
    TrackEvent,
    /// `linux.system_info`: accepted; the recorder writes system info itself.
    SystemInfo,
    /// No built-in source provides it (the session simply has no such producer).
    Other,
}

/// One data source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSourceSpec {
    /// `config.name`.
    pub name: String,
    /// The buffer it writes into.
    pub target_buffer: BufferId,
    /// `config` exactly as written (unknown fields included).
    pub raw_config: Vec<u8>,
    /// Exact producer names it may match.
    pub producer_name_filter: Vec<String>,
    /// Producer name patterns (full match).
    pub producer_name_regex_filter: Vec<String>,
    /// Kind and sub-config.
    pub kind: SourceKind,
}

impl DataSourceSpec {
    /// The config bytes to hand to the source: the user's bytes with only the
    /// service-owned fields replaced.
    pub fn config_for_source(&self, svc: &ServiceFields) -> Result<Vec<u8>, WireError> {
        raw::rewrite_service_fields(&self.raw_config, svc)
    }
}

/// When triggers act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerMode {
    /// Idle until a trigger, then record for its stop delay.
    StartTracing,
    /// Record at once; a trigger stops after its stop delay.
    StopTracing,
    /// Record in a ring; a trigger snapshots it (also STOP_TRACING with
    /// `use_clone_snapshot_if_available`).
    CloneSnapshot,
}

/// One named trigger.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerSpec {
    /// The name `recorder trigger NAME` sends.
    pub name: String,
    /// Only producers whose name fully matches (validated pattern).
    pub producer_name_regex: Option<String>,
    /// Delay between the trigger and the stop (or the start's duration).
    pub(crate) stop_delay: Duration,
    /// Rate limit per 24 h (`None`: unlimited).
    pub max_per_24_h: Option<u32>,
    /// Probability in [0, 1] to ignore a hit.
    pub skip_probability: f64,
}

/// The trigger part of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerPlan {
    /// Effective mode.
    pub mode: TriggerMode,
    /// How long to wait for a trigger.
    pub timeout: Duration,
    /// The triggers.
    pub triggers: Vec<TriggerSpec>,
}

/// `write_into_file` streaming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// Period of write passes (0 → 5000 ms, at least 100 ms).
    pub write_period: Duration,
    /// The file never exceeds this.
    pub(crate) max_size: Option<ByteSize>,
    /// fdatasync after each pass.
    pub(crate) fdatasync_each_pass: bool,
    /// `output_path` from the config, if any.
    pub output_path: Option<String>,
}

/// When data sources are asked to flush while the session runs (ARCHITECTURE.md §8.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPlan {
    /// Only at stop.
    AtStop,
    /// Every period.
    Periodic(Duration),
    /// Before every write pass (`write_into_file`).
    BeforeEachWritePass,
}

/// The recorder's own packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltinSourcesSpec {
    /// No clock snapshots.
    pub(crate) disable_clock_snapshotting: bool,
    /// No `trace_config` packet.
    pub(crate) disable_trace_config: bool,
    /// No `system_info` packet.
    pub(crate) disable_system_info: bool,
    /// No service events.
    pub(crate) disable_service_events: bool,
    /// BuiltinClock number of the primary trace clock (6 = BOOTTIME).
    pub(crate) primary_trace_clock: u32,
    /// Period of clock snapshots and stats (default 10 s).
    pub(crate) snapshot_interval: Duration,
    /// Snapshot timer on the suspend-aware clock.
    pub(crate) prefer_suspend_clock_for_snapshot: bool,
    /// No chunk-usage histograms in trace stats.
    pub(crate) disable_chunk_usage_histograms: bool,
}

/// Output compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain packets (the default; every Perfetto version reads them).
    None,
    /// zstd-compressed packet batches at this level.
    Zstd {
        /// zstd level (0: the library default).
        level: i32,
    },
}

/// Something allowed but worth telling the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Field path (`data_sources[2].config.name`), or empty for the whole config.
    pub path: String,
    /// What happens.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// A validated session.
#[derive(Debug, Clone, PartialEq)]
pub struct RecorderSpec {
    /// Buffers, by index.
    pub buffers: Vec<BufferSpec>,
    /// Data sources, in config order.
    pub data_sources: Vec<DataSourceSpec>,
    /// Stop after this long (`None`: until stopped or triggered).
    pub duration: Option<Duration>,
    /// Trigger mode, if any.
    pub trigger: Option<TriggerPlan>,
    /// Streaming to the file, if `write_into_file`.
    pub file: Option<FileSpec>,
    /// When data sources are asked to flush during the session.
    pub flush: FlushPlan,
    /// Bound on a flush (default 5 s).
    pub(crate) flush_timeout: Duration,
    /// Bound on a data source's stop (default 5 s).
    pub(crate) data_source_stop_timeout: Duration,
    /// Period of incremental-state clears (`None`: never).
    pub(crate) incremental_state_clear_period: Option<Duration>,
    /// Triggers to send instead of recording (the config is then a trigger
    /// request, as with Perfetto's cmdline).
    pub activate_triggers: Vec<String>,
    /// At most one live session of this name.
    pub unique_session_name: Option<String>,
    /// Wait for an explicit start.
    pub deferred_start: bool,
    /// Config-provided trace UUID (msb, lsb).
    pub trace_uuid: Option<(i64, i64)>,
    /// The recorder's own packets.
    pub builtin: BuiltinSourcesSpec,
    /// Output compression.
    pub compression: Compression,
    /// The config as run, serialized, for the `trace_config` packet: as
    /// loaded, plus the flush period a streaming session flushes at
    /// (`flush_period_ms`, see `FlushPlan`).
    pub config_bytes: Vec<u8>,
    /// Field paths the schema does not know.
    pub unknown_fields: Vec<String>,
    /// Fields from the user's own `.proto` files (extensions of
    /// DataSourceConfig), each with the data source it is passed to.
    pub custom_fields: Vec<CustomField>,
    /// Every field the config sets, with what becomes of it (`config check
    /// --explain`).
    pub fields: Vec<super::fields::FieldReport>,
    /// Things worth telling the user; the library never prints them.
    pub warnings: Vec<Warning>,
    /// Accepted as written, with a remark (e.g. `track_event` needs an SDK
    /// producer to write anything).
    pub notes: Vec<Warning>,
}

/// A custom field a config sets: an extension of `DataSourceConfig` from the
/// user's schema, passed to its data source as encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomField {
    /// `data_sources[0].config.[my.pkg.my_config]`.
    pub path: String,
    /// The data source's name (who receives it).
    pub data_source: String,
    /// The .proto file that declares it.
    pub(crate) declared_in: String,
    /// The value as text, on one line and cut short.
    pub value: String,
}

impl RecorderSpec {
    /// The data sources that write into `buffer`.
    pub(crate) fn sources_of(&self, buffer: BufferId) -> impl Iterator<Item = &DataSourceSpec> {
        self.data_sources
            .iter()
            .filter(move |d| d.target_buffer == buffer)
    }
}
