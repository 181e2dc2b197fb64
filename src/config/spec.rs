//! The validated, typed form of a TraceConfig that the rest of recorder works
//! on. Defaults are applied; no generated proto type appears here.

use std::fmt;
use std::time::Duration;

use super::wire::{self, ServiceFields, WireError};

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
    pub transfer_on_clone: bool,
    /// Clone semantics.
    pub clear_before_clone: bool,
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
    pub fn vmstat_key(&self) -> String {
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

/// `linux.ftrace`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FtraceSpec {
    /// `group/name`, bare `name` or `group/*`.
    pub events: Vec<String>,
    /// Android atrace categories (no effect elsewhere).
    pub atrace_categories: Vec<String>,
    /// Android atrace apps.
    pub atrace_apps: Vec<String>,
    /// Per-CPU kernel buffer; `None` means the default.
    pub buffer_size: Option<ByteSize>,
    /// Treat `buffer_size` as a lower bound.
    pub buffer_size_lower_bound: bool,
    /// How often the per-CPU buffers are read (default 100 ms).
    pub drain_period: Duration,
    /// Drain when a CPU buffer is this full (percent); `None` if unset.
    pub drain_buffer_percent: Option<u32>,
    /// Columnar sched_switch/sched_waking encoding (default on).
    pub compact_sched: bool,
    /// Resolve kernel symbols.
    pub symbolize_ksyms: bool,
    /// Throttle rss_stat events.
    pub throttle_rss_stat: bool,
    /// Do not emit events the schema has no typed message for.
    pub disable_generic_events: bool,
    /// Encode unknown events with dynamic field ids (default on).
    pub denser_generic_event_encoding: bool,
    /// Syscalls to trace (raw_syscalls filtering).
    pub syscall_events: Vec<String>,
    /// function_graph tracer.
    pub enable_function_graph: bool,
    /// Function filters for function_graph.
    pub function_filters: Vec<String>,
    /// Graph roots for function_graph.
    pub function_graph_roots: Vec<String>,
    /// Keep the kernel buffer's previous contents.
    pub preserve_ftrace_buffer: bool,
    /// Use the mono_raw trace clock.
    pub use_monotonic_raw_clock: bool,
    /// A tracefs instance instead of the top-level one.
    pub instance_name: Option<String>,
    /// Hex cpumask (`tracing_cpumask`).
    pub tracing_cpumask: Option<String>,
    /// Only these tids (exclusive feature).
    pub tids_to_trace: Vec<u32>,
    /// `print_filter` rules, in order: the first matching one decides
    /// whether an `ftrace/print` event is kept; none matching keeps it.
    pub print_filter: Vec<PrintRuleSpec>,
}

/// One rule of `FtraceConfig.print_filter`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrintRuleSpec {
    pub matches: PrintMatchSpec,
    pub allow: bool,
}

/// What a print rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrintMatchSpec {
    /// The message starts with this.
    Prefix(String),
    /// An atrace message `TYPE|pid|name…` of this type whose name starts with `prefix`.
    Atrace { kind: String, prefix: String },
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
    pub send_batch_on_register: bool,
    /// Whether `dummy_fields` was set (emit one field of every scalar type).
    pub dummy_fields: bool,
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
        wire::rewrite_service_fields(&self.raw_config, svc)
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
    pub stop_delay: Duration,
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
    pub max_size: Option<ByteSize>,
    /// fdatasync after each pass.
    pub fdatasync_each_pass: bool,
    /// `output_path` from the config, if any.
    pub output_path: Option<String>,
}

/// When data sources are asked to flush while the session runs (facts §5.7).
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
    pub disable_clock_snapshotting: bool,
    /// No `trace_config` packet.
    pub disable_trace_config: bool,
    /// No `system_info` packet.
    pub disable_system_info: bool,
    /// No service events.
    pub disable_service_events: bool,
    /// BuiltinClock number of the primary trace clock (6 = BOOTTIME).
    pub primary_trace_clock: u32,
    /// Period of clock snapshots and stats (default 10 s).
    pub snapshot_interval: Duration,
    /// Snapshot timer on the suspend-aware clock.
    pub prefer_suspend_clock_for_snapshot: bool,
    /// No chunk-usage histograms in trace stats.
    pub disable_chunk_usage_histograms: bool,
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
    pub flush_timeout: Duration,
    /// Bound on a data source's stop (default 5 s).
    pub data_source_stop_timeout: Duration,
    /// Period of incremental-state clears (`None`: never).
    pub incremental_state_clear_period: Option<Duration>,
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
    /// Field paths our schema does not know (binary input only).
    pub unknown_fields: Vec<String>,
    /// Things worth telling the user; the library never prints them.
    pub warnings: Vec<Warning>,
    /// Accepted as written, with a remark (e.g. `track_event` needs an SDK
    /// producer to write anything).
    pub notes: Vec<Warning>,
}

impl RecorderSpec {
    /// The data sources that write into `buffer`.
    pub fn sources_of(&self, buffer: BufferId) -> impl Iterator<Item = &DataSourceSpec> {
        self.data_sources
            .iter()
            .filter(move |d| d.target_buffer == buffer)
    }
}
