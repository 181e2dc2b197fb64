//! What becomes of every config field: one table ([`FIELDS`]) says, for each
//! field of the messages recorder reads, whether it is applied, ignored (a
//! warning names it and says why), refused, set by the recorder itself, or a
//! message whose own fields are judged one by one. Validation walks the
//! config against it ([`judge`]): a field the table ignores gets its
//! warning there, a refused one its error, and every field the config sets
//! gets one [`FieldReport`] — what `recorder config check --explain` prints.
//! Where the outcome depends on the value (a period raised to its minimum, a
//! field that needs another), validation records it and that wins.
//!
//! A test walks every field of these messages through the descriptor pool
//! and fails when one has no entry, so no field is ever silently ignored.

use std::fmt;

use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, ReflectMessage, Value};

use super::validate::{FAKE_PRODUCER, FOR_TESTING, FTRACE, PROCESS_STATS, SYS_STATS};

/// The fate of one field the config sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldStatus {
    /// Used as written; the text says how where that is not obvious.
    Applied(String),
    /// Used, with a different value or meaning: how.
    Changed(String),
    /// No effect: why.
    Ignored(String),
}

impl fmt::Display for FieldStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldStatus::Applied(how) if how.is_empty() => write!(f, "applied"),
            FieldStatus::Applied(how) => write!(f, "applied ({how})"),
            FieldStatus::Changed(how) => write!(f, "applied with changes ({how})"),
            FieldStatus::Ignored(why) => write!(f, "ignored ({why})"),
        }
    }
}

/// One field the config sets, with its value and fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldReport {
    /// `data_sources[0].config.ftrace_config.drain_period_ms`.
    pub path: String,
    /// The value as written (`{…}` for a message).
    pub value: String,
    /// What recorder does with it.
    pub status: FieldStatus,
}

impl fmt::Display for FieldReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}: {}", self.path, self.value, self.status)
    }
}

/// What the table says about a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Honoured; the text says how (empty: as the field says).
    Applied(&'static str),
    /// Accepted with no effect: a warning names the field and says why.
    Ignored(&'static str),
    /// A config that sets it is refused: why.
    Refused(&'static str),
    /// A message whose own fields are judged one by one.
    Nested,
    /// Written by the recorder for the session, whatever the config says.
    ServiceOwned,
    /// A data source's sub-config: judged field by field for the built-in
    /// sources named here, passed as written to any other data source's
    /// producer, and ignored beside another built-in source.
    SubConfig(&'static [&'static str]),
}

/// One row of the table: a field of a message (names without the
/// `perfetto.protos.` package).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FieldRule {
    /// `TraceConfig.BufferConfig`.
    pub message: &'static str,
    /// `size_kb`.
    pub field: &'static str,
    /// What becomes of it.
    pub rule: Rule,
}

const fn r(message: &'static str, field: &'static str, rule: Rule) -> FieldRule {
    FieldRule {
        message,
        field,
        rule,
    }
}

use Rule::{Applied as A, Ignored as I, Nested as N, Refused, ServiceOwned as S, SubConfig};

const TC: &str = "TraceConfig";
const BUF: &str = "TraceConfig.BufferConfig";
const DS: &str = "TraceConfig.DataSource";
const BUILTIN: &str = "TraceConfig.BuiltinDataSource";
const TRIG: &str = "TraceConfig.TriggerConfig";
const TRIGGER: &str = "TraceConfig.TriggerConfig.Trigger";
const DSC: &str = "DataSourceConfig";
const FT: &str = "FtraceConfig";
const PS: &str = "ProcessStatsConfig";
const SS: &str = "SysStatsConfig";
const TEST: &str = "TestConfig";

const ANDROID: &str = "Android only";
const ONE_MACHINE: &str = "recorder traces the machine it runs on";
const FORWARDED: &[&str] = &[];

/// Every field of the messages recorder reads, and what becomes of it.
pub(crate) const FIELDS: &[FieldRule] = &[
    // TraceConfig.
    r(TC, "buffers", N),
    r(TC, "data_sources", N),
    r(TC, "duration_ms", A("")),
    r(
        TC,
        "enable_extra_guardrails",
        I("guardrails belong to Perfetto's Android uploads (perfetto_cmd overwrites this field)"),
    ),
    r(
        TC,
        "lockdown_mode",
        I("not enforced: producers of any user may connect"),
    ),
    r(
        TC,
        "producers",
        I("built-in sources use no shared memory; producer connections do not read it"),
    ),
    r(TC, "statsd_metadata", I(ANDROID)),
    r(TC, "write_into_file", A("")),
    r(TC, "file_write_period_ms", A("")),
    r(TC, "max_file_size_bytes", A("")),
    r(
        TC,
        "guardrail_overrides",
        I("guardrails belong to Perfetto's Android uploads"),
    ),
    r(
        TC,
        "deferred_start",
        A("the session waits for `recorder start`"),
    ),
    r(
        TC,
        "flush_period_ms",
        A("data sources are flushed every period"),
    ),
    r(TC, "flush_timeout_ms", A("")),
    r(TC, "notify_traceur", I(ANDROID)),
    r(TC, "trigger_config", N),
    r(
        TC,
        "activate_triggers",
        A("the config only fires these triggers"),
    ),
    r(TC, "allow_user_build_tracing", I(ANDROID)),
    r(TC, "builtin_data_sources", N),
    r(TC, "incremental_state_config", N),
    r(
        TC,
        "unique_session_name",
        A("a second live session of this name is refused"),
    ),
    r(
        TC,
        "data_source_stop_timeout_ms",
        A("bounds each data source's stop"),
    ),
    r(
        TC,
        "compression_type",
        Refused("deflate is not supported; use compression { zstd {} }"),
    ),
    r(TC, "incident_report_config", I(ANDROID)),
    r(TC, "trace_uuid_msb", A("")),
    r(TC, "trace_uuid_lsb", A("")),
    r(
        TC,
        "output_path",
        A("the trace file when no -o is given (a new file only)"),
    ),
    r(TC, "bugreport_score", I(ANDROID)),
    r(TC, "statsd_logging", I(ANDROID)),
    r(
        TC,
        "trace_filter",
        Refused(
            "trace filtering is not supported; Perfetto refuses to trace unfiltered when a filter cannot be applied, and so does recorder",
        ),
    ),
    r(TC, "android_report_config", I(ANDROID)),
    r(TC, "cmd_trace_start_delay", I("recorder starts at once")),
    r(
        TC,
        "prefer_suspend_clock_for_duration",
        I("the duration timer counts CLOCK_MONOTONIC time (time suspended is not counted)"),
    ),
    r(TC, "bugreport_filename", I(ANDROID)),
    r(
        TC,
        "session_semaphores",
        I("session semaphores are not enforced"),
    ),
    r(
        TC,
        "priority_boost",
        I("recorder does not change its scheduling priority"),
    ),
    r(
        TC,
        "exclusive_prio",
        I("exclusive sessions are an Android feature"),
    ),
    r(TC, "trace_all_machines", I(ONE_MACHINE)),
    r(TC, "write_flush_mode", A("")),
    r(TC, "fflush_post_write", A("")),
    r(TC, "compression", N),
    r(
        TC,
        "trace_attributes",
        I("no trace_attributes packet is written"),
    ),
    // BufferConfig.
    r(BUF, "size_kb", A("")),
    r(BUF, "fill_policy", A("")),
    r(BUF, "transfer_on_clone", A("")),
    r(BUF, "clear_before_clone", A("")),
    r(BUF, "name", A("")),
    r(
        BUF,
        "experimental_mode",
        I("recorder has one buffer engine"),
    ),
    // DataSource.
    r(DS, "config", N),
    r(
        DS,
        "producer_name_filter",
        A("matched against producer names"),
    ),
    r(
        DS,
        "producer_name_regex_filter",
        A("matched against producer names"),
    ),
    r(DS, "machine_name_filter", I(ONE_MACHINE)),
    // BuiltinDataSource.
    r(BUILTIN, "disable_clock_snapshotting", A("")),
    r(BUILTIN, "disable_trace_config", A("")),
    r(BUILTIN, "disable_system_info", A("")),
    r(BUILTIN, "disable_service_events", A("")),
    r(BUILTIN, "primary_trace_clock", A("")),
    r(
        BUILTIN,
        "snapshot_interval_ms",
        A("the period of clock snapshots, sync markers and trace_stats"),
    ),
    r(
        BUILTIN,
        "prefer_suspend_clock_for_snapshot",
        I("the snapshot timer counts CLOCK_MONOTONIC time"),
    ),
    r(
        BUILTIN,
        "disable_chunk_usage_histograms",
        A("recorder writes no chunk-usage histograms"),
    ),
    r(
        BUILTIN,
        "disable_extension_descriptors",
        A("recorder writes no extension descriptors"),
    ),
    r(
        BUILTIN,
        "enable_concurrent_session_events",
        I("concurrent-session events are not written"),
    ),
    // IncrementalStateConfig.
    r(
        "TraceConfig.IncrementalStateConfig",
        "clear_period_ms",
        A("data sources that keep incremental state clear it every period"),
    ),
    // TriggerConfig.
    r(TRIG, "trigger_mode", A("")),
    r(TRIG, "triggers", N),
    r(TRIG, "trigger_timeout_ms", A("")),
    r(TRIG, "use_clone_snapshot_if_available", A("")),
    r(TRIGGER, "name", A("")),
    r(TRIGGER, "producer_name_regex", A("")),
    r(TRIGGER, "stop_delay_ms", A("")),
    r(TRIGGER, "max_per_24_h", A("")),
    r(TRIGGER, "skip_probability", A("")),
    // CompressionConfig.
    r(
        "TraceConfig.CompressionConfig",
        "deflate",
        Refused("deflate is not supported; use compression { zstd {} }"),
    ),
    r("TraceConfig.CompressionConfig", "zstd", N),
    r("TraceConfig.CompressionConfig.Zstd", "level", A("")),
    // DataSourceConfig.
    r(DSC, "name", A("")),
    r(DSC, "target_buffer", A("")),
    r(DSC, "trace_duration_ms", S),
    r(DSC, "tracing_session_id", S),
    r(DSC, "enable_extra_guardrails", S),
    r(DSC, "stop_timeout_ms", S),
    r(DSC, "session_initiator", S),
    r(
        DSC,
        "buffer_exhausted_policy",
        I("applies to producers' shared memory; built-in sources write into the buffers directly"),
    ),
    r(
        DSC,
        "priority_boost",
        I("recorder does not change scheduling priorities"),
    ),
    r(DSC, "target_buffer_name", A("")),
    r(DSC, "protovm_config", I("ProtoVM programs are not run")),
    r(DSC, "prefer_suspend_clock_for_duration", S),
    r(DSC, "ftrace_config", SubConfig(&[FTRACE])),
    r(DSC, "process_stats_config", SubConfig(&[PROCESS_STATS])),
    r(DSC, "sys_stats_config", SubConfig(&[SYS_STATS])),
    r(DSC, "for_testing", SubConfig(&[FOR_TESTING, FAKE_PRODUCER])),
    r(DSC, "legacy_config", SubConfig(FORWARDED)),
    // The sub-configs of data sources other producers provide.
    r(DSC, "chrome_config", SubConfig(FORWARDED)),
    r(DSC, "inode_file_config", SubConfig(FORWARDED)),
    r(DSC, "heapprofd_config", SubConfig(FORWARDED)),
    r(DSC, "android_power_config", SubConfig(FORWARDED)),
    r(DSC, "android_log_config", SubConfig(FORWARDED)),
    r(DSC, "gpu_counter_config", SubConfig(FORWARDED)),
    r(DSC, "packages_list_config", SubConfig(FORWARDED)),
    r(DSC, "java_hprof_config", SubConfig(FORWARDED)),
    r(DSC, "perf_event_config", SubConfig(FORWARDED)),
    r(DSC, "vulkan_memory_config", SubConfig(FORWARDED)),
    r(DSC, "track_event_config", SubConfig(FORWARDED)),
    r(DSC, "android_polled_state_config", SubConfig(FORWARDED)),
    r(DSC, "interceptor_config", SubConfig(FORWARDED)),
    r(
        DSC,
        "android_game_intervention_list_config",
        SubConfig(FORWARDED),
    ),
    r(DSC, "statsd_tracing_config", SubConfig(FORWARDED)),
    r(DSC, "android_system_property_config", SubConfig(FORWARDED)),
    r(DSC, "system_info_config", SubConfig(FORWARDED)),
    r(DSC, "network_packet_trace_config", SubConfig(FORWARDED)),
    r(DSC, "surfaceflinger_layers_config", SubConfig(FORWARDED)),
    r(
        DSC,
        "surfaceflinger_transactions_config",
        SubConfig(FORWARDED),
    ),
    r(
        DSC,
        "android_sdk_sysprop_guard_config",
        SubConfig(FORWARDED),
    ),
    r(DSC, "etw_config", SubConfig(FORWARDED)),
    r(DSC, "protolog_config", SubConfig(FORWARDED)),
    r(DSC, "v8_config", SubConfig(FORWARDED)),
    r(DSC, "android_input_event_config", SubConfig(FORWARDED)),
    r(DSC, "pixel_modem_config", SubConfig(FORWARDED)),
    r(DSC, "windowmanager_config", SubConfig(FORWARDED)),
    r(DSC, "chromium_system_metrics", SubConfig(FORWARDED)),
    r(DSC, "kernel_wakelocks_config", SubConfig(FORWARDED)),
    r(DSC, "gpu_renderstages_config", SubConfig(FORWARDED)),
    r(DSC, "chromium_histogram_samples", SubConfig(FORWARDED)),
    r(DSC, "app_wakelocks_config", SubConfig(FORWARDED)),
    r(DSC, "frozen_ftrace_config", SubConfig(FORWARDED)),
    r(DSC, "cpu_per_uid_config", SubConfig(FORWARDED)),
    r(DSC, "user_list_config", SubConfig(FORWARDED)),
    r(DSC, "inputmethod_config", SubConfig(FORWARDED)),
    r(DSC, "android_aflags_config", SubConfig(FORWARDED)),
    r(DSC, "journald_config", SubConfig(FORWARDED)),
    r(DSC, "display_video_config", SubConfig(FORWARDED)),
    r(
        DSC,
        "chromium_stack_sampling_profiler",
        SubConfig(FORWARDED),
    ),
    r(DSC, "chromium_sampling_heap_profiler", SubConfig(FORWARDED)),
    r(DSC, "android_process_state_config", SubConfig(FORWARDED)),
    r(DSC, "process_smaps_config", SubConfig(FORWARDED)),
    r(DSC, "qnx_config", SubConfig(FORWARDED)),
    // FtraceConfig.
    r(FT, "ftrace_events", A("")),
    r(FT, "atrace_categories", A("")),
    r(FT, "atrace_apps", A("")),
    r(FT, "atrace_categories_prefer_sdk", I(ANDROID)),
    r(
        FT,
        "atrace_userspace_only",
        A("the categories add no kernel events, only ftrace/print"),
    ),
    r(FT, "buffer_size_kb", A("")),
    r(
        FT,
        "buffer_size_lower_bound",
        A("the default per-CPU size is used where larger"),
    ),
    r(FT, "drain_period_ms", A("")),
    r(FT, "drain_buffer_percent", A("")),
    r(FT, "compact_sched", N),
    r(FT, "print_filter", N),
    r(
        FT,
        "symbolize_ksyms",
        I(
            "kernel addresses (a workqueue's function, a blocked task's caller) are written as addresses, not resolved through /proc/kallsyms",
        ),
    ),
    r(
        FT,
        "ksyms_mem_policy",
        I("symbolize_ksyms is not supported"),
    ),
    r(
        FT,
        "initialize_ksyms_synchronously_for_testing",
        I("a no-op in Perfetto since v28"),
    ),
    r(
        FT,
        "throttle_rss_stat",
        A("kmem/rss_stat_throttled where the kernel has it, else kmem/rss_stat"),
    ),
    r(
        FT,
        "denser_generic_event_encoding",
        I(
            "events without a typed message are written as GenericFtraceEvent (field 327), which every trace processor reads",
        ),
    ),
    r(
        FT,
        "disable_generic_events",
        A("events without a typed message are not enabled"),
    ),
    r(
        FT,
        "syscall_events",
        A("raw_syscalls sys_enter/sys_exit, filtered in the kernel to these syscall numbers"),
    ),
    r(
        FT,
        "enable_function_graph",
        A("the function_graph tracer; the source fails, saying why, where the kernel refuses it"),
    ),
    r(
        FT,
        "function_filters",
        A("set_ftrace_filter; the source fails, saying why, where the kernel refuses it"),
    ),
    r(
        FT,
        "function_graph_roots",
        A("set_graph_function; the source fails, saying why, where the kernel refuses it"),
    ),
    r(FT, "function_graph_max_depth", A("max_graph_depth")),
    r(FT, "kprobe_events", N),
    r(
        FT,
        "preserve_ftrace_buffer",
        A("the kernel buffer is not cleared at start"),
    ),
    r(
        FT,
        "use_monotonic_raw_clock",
        A("trace_clock mono_raw; bundles say so (ftrace_clock)"),
    ),
    r(FT, "instance_name", A("")),
    r(
        FT,
        "debug_ftrace_abi",
        I("pages that do not parse are counted in FtraceStats, not copied into the trace"),
    ),
    r(
        FT,
        "tids_to_trace",
        A("set_event_pid, or filtered in user space where the kernel refuses it"),
    ),
    r(FT, "tracefs_options", N),
    r(FT, "tracing_cpumask", A("")),
    r("FtraceConfig.CompactSchedConfig", "enabled", A("")),
    r("FtraceConfig.PrintFilter", "rules", N),
    r("FtraceConfig.PrintFilter.Rule", "prefix", A("")),
    r("FtraceConfig.PrintFilter.Rule", "atrace_msg", N),
    r("FtraceConfig.PrintFilter.Rule", "allow", A("")),
    r("FtraceConfig.PrintFilter.Rule.AtraceMessage", "type", A("")),
    r(
        "FtraceConfig.PrintFilter.Rule.AtraceMessage",
        "prefix",
        A(""),
    ),
    r("FtraceConfig.KprobeEvent", "probe", A("")),
    r("FtraceConfig.KprobeEvent", "type", A("")),
    r("FtraceConfig.TracefsOption", "name", A("")),
    r("FtraceConfig.TracefsOption", "state", A("")),
    // ProcessStatsConfig.
    r(PS, "quirks", A("")),
    r(PS, "scan_all_processes_on_start", A("")),
    r(PS, "record_thread_names", A("")),
    r(PS, "proc_stats_poll_ms", A("")),
    r(PS, "proc_stats_cache_ttl_ms", A("")),
    r(
        PS,
        "resolve_process_fds",
        I("open file descriptors are not recorded"),
    ),
    r(
        PS,
        "scan_smaps_rollup",
        A("Rss, Pss and SwapPss from smaps_rollup, in each poll"),
    ),
    r(
        PS,
        "record_process_age",
        A("process_start_from_boot in each tree entry"),
    ),
    r(
        PS,
        "record_process_runtime",
        A("user and kernel CPU time in each poll"),
    ),
    r(
        PS,
        "record_process_dmabuf_rss",
        I("dmabuf RSS is not recorded (the dmabuf_rss file is Android's)"),
    ),
    r(
        PS,
        "skip_main_thread_message",
        A("recorder writes no thread entry for a process's main thread"),
    ),
    // SysStatsConfig.
    r(SS, "meminfo_period_ms", A("")),
    r(SS, "meminfo_counters", A("")),
    r(SS, "vmstat_period_ms", A("")),
    r(SS, "vmstat_counters", A("")),
    r(SS, "stat_period_ms", A("")),
    r(SS, "stat_counters", A("")),
    r(SS, "devfreq_period_ms", A("")),
    r(SS, "cpufreq_period_ms", A("")),
    r(SS, "buddyinfo_period_ms", A("")),
    r(SS, "diskstat_period_ms", A("")),
    r(SS, "psi_period_ms", A("")),
    r(SS, "thermal_period_ms", A("")),
    r(SS, "cpuidle_period_ms", A("")),
    r(
        SS,
        "gpufreq_period_ms",
        I("GPU frequencies are not read (the period still sets the tick, as in Perfetto)"),
    ),
    r(
        SS,
        "slab_period_ms",
        I("/proc/slabinfo is not read (the period still sets the tick, as in Perfetto)"),
    ),
    // TestConfig.
    r(TEST, "message_count", A("")),
    r(TEST, "max_messages_per_second", A("")),
    r(TEST, "seed", A("")),
    r(TEST, "message_size", A("")),
    r(TEST, "send_batch_on_register", A("")),
    r(
        TEST,
        "dummy_fields",
        I("it exists to test config parsers: no data source reads it, Perfetto's neither"),
    ),
];

/// The data source names of the built-in sources (a sub-config of another
/// built-in source beside them is ignored).
const BUILT_IN: &[&str] = &[
    FTRACE,
    PROCESS_STATS,
    SYS_STATS,
    FOR_TESTING,
    FAKE_PRODUCER,
    "linux.system_info",
];

/// The table's entry for `field` of `message` (package-less full name).
pub(crate) fn rule(message: &str, field: &str) -> Option<Rule> {
    FIELDS
        .iter()
        .find(|f| f.message == message && f.field == field)
        .map(|f| f.rule)
}

/// The package-less full name of a message.
pub(crate) fn short_name(full: &str) -> &str {
    full.strip_prefix("perfetto.protos.").unwrap_or(full)
}

/// What a walk of a config found.
#[derive(Debug, Default)]
pub(crate) struct Judgement {
    /// One per field the config sets.
    pub fields: Vec<FieldReport>,
    /// (path, message): fields the table ignores.
    pub warnings: Vec<(String, String)>,
    /// (path, message): fields the table refuses.
    pub errors: Vec<(String, String)>,
}

/// Walks `msg` (a TraceConfig, or a message under it at `path`) against the
/// table; `outcomes` are validation's own decisions by exact path.
pub(crate) fn judge(
    msg: &DynamicMessage,
    path: &str,
    outcomes: &[(String, FieldStatus)],
    out: &mut Judgement,
) {
    let message = short_name(msg.descriptor().full_name()).to_string();
    let recorded = |p: &str| {
        outcomes
            .iter()
            .find(|(q, _)| q == p)
            .map(|(_, s)| s.clone())
    };
    for (fd, value) in msg.fields() {
        let p = if path.is_empty() {
            fd.name().to_string()
        } else {
            format!("{path}.{}", fd.name())
        };
        if let Some(status) = recorded(&p) {
            out.fields.push(FieldReport {
                path: p,
                value: render(&fd, value),
                status,
            });
            continue;
        }
        // A repeated message is reported item by item, by index.
        let items: Vec<String> = match value {
            Value::List(l) if matches!(fd.kind(), Kind::Message(_)) => {
                (0..l.len()).map(|i| format!("{p}[{i}]")).collect()
            }
            _ => vec![p.clone()],
        };
        let leaf = |status: FieldStatus, out: &mut Judgement| {
            for item in &items {
                out.fields.push(FieldReport {
                    path: item.clone(),
                    value: if items.len() == 1 && *item == p {
                        render(&fd, value)
                    } else {
                        "{…}".into()
                    },
                    status: status.clone(),
                })
            }
        };
        let warn = |why: &str, out: &mut Judgement| {
            for item in &items {
                out.warnings.push((item.clone(), format!("ignored: {why}")));
            }
        };
        let nested = |out: &mut Judgement| match value {
            Value::Message(m) => judge(m, &p, outcomes, out),
            Value::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    let pi = format!("{p}[{i}]");
                    if let Some(status) = recorded(&pi) {
                        out.fields.push(FieldReport {
                            path: pi,
                            value: "{…}".into(),
                            status,
                        });
                    } else if let Value::Message(m) = item {
                        judge(m, &pi, outcomes, out);
                    }
                }
            }
            _ => {}
        };
        match rule(&message, fd.name()) {
            Some(Rule::Nested) => nested(out),
            Some(Rule::SubConfig(owners)) => {
                let name = msg
                    .get_field_by_name("name")
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                if owners.contains(&name.as_str()) {
                    nested(out);
                } else if BUILT_IN.contains(&name.as_str()) {
                    let why = format!("{name} does not read {}", fd.name());
                    warn(&why, out);
                    leaf(FieldStatus::Ignored(why), out);
                } else {
                    leaf(
                        FieldStatus::Applied(format!(
                            "passed as written to the producer of {name:?}"
                        )),
                        out,
                    );
                }
            }
            Some(Rule::Applied(how)) => leaf(FieldStatus::Applied(how.into()), out),
            Some(Rule::ServiceOwned) => leaf(
                FieldStatus::Changed(
                    "set by the recorder for the session, as Perfetto's service does".into(),
                ),
                out,
            ),
            Some(Rule::Ignored(why)) => {
                warn(why, out);
                leaf(FieldStatus::Ignored(why.into()), out);
            }
            Some(Rule::Refused(why)) => out.errors.push((p.clone(), why.into())),
            None => {
                let why = "recorder does not read this field";
                warn(why, out);
                leaf(FieldStatus::Ignored(why.into()), out);
            }
        }
    }
}

/// A field's value as written, short.
fn render(fd: &FieldDescriptor, v: &Value) -> String {
    const MAX_ITEMS: usize = 6;
    match v {
        Value::List(items) => {
            let mut parts: Vec<String> = items
                .iter()
                .take(MAX_ITEMS)
                .map(|i| scalar(fd, i))
                .collect();
            if items.len() > MAX_ITEMS {
                parts.push(format!("… {} in all", items.len()));
            }
            format!("[{}]", parts.join(", "))
        }
        Value::Map(m) => format!("{{{} entries}}", m.len()),
        v => scalar(fd, v),
    }
}

fn scalar(fd: &FieldDescriptor, v: &Value) -> String {
    match v {
        Value::Message(_) => "{…}".into(),
        Value::String(s) => format!("{s:?}"),
        Value::Bytes(b) => format!("<{} bytes>", b.len()),
        Value::EnumNumber(n) => match fd.kind() {
            Kind::Enum(e) => e
                .get_value(*n)
                .map_or_else(|| n.to_string(), |ev| ev.name().to_string()),
            _ => n.to_string(),
        },
        Value::Bool(b) => b.to_string(),
        Value::I32(n) => n.to_string(),
        Value::I64(n) => n.to_string(),
        Value::U32(n) => n.to_string(),
        Value::U64(n) => n.to_string(),
        Value::F32(n) => n.to_string(),
        Value::F64(n) => n.to_string(),
        Value::List(_) | Value::Map(_) => "…".into(),
    }
}

/// The explanation `config check --explain` prints: every field the config
/// sets, by path, with its fate.
pub(crate) fn explain(fields: &[FieldReport], unknown: &[String]) -> String {
    let mut s = String::new();
    for f in fields {
        s.push_str(&format!("  {f}\n"));
    }
    for u in unknown {
        s.push_str(&format!(
            "  {u}: not in recorder's schema (kept as written, for the data source)\n"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use prost_reflect::MessageDescriptor;

    use super::*;
    use crate::config::{RecorderSpec, load_text, pool};

    /// The messages the table reaches from TraceConfig (through `Nested`
    /// fields and the built-in sources' sub-configs), and the table's gaps.
    fn reached() -> (BTreeSet<String>, Vec<String>) {
        let mut todo = vec!["TraceConfig".to_string()];
        let mut seen = BTreeSet::new();
        let mut missing = Vec::new();
        while let Some(m) = todo.pop() {
            if !seen.insert(m.clone()) {
                continue;
            }
            for f in descriptor(&m).fields() {
                match rule(&m, f.name()) {
                    None => missing.push(format!("{m}.{}", f.name())),
                    Some(Rule::Nested) => todo.push(child(&f)),
                    Some(Rule::SubConfig(owners)) if !owners.is_empty() => todo.push(child(&f)),
                    Some(_) => {}
                }
            }
        }
        (seen, missing)
    }

    fn descriptor(short: &str) -> MessageDescriptor {
        pool()
            .get_message_by_name(&format!("perfetto.protos.{short}"))
            .unwrap_or_else(|| panic!("{short} is in our schema"))
    }

    fn child(f: &FieldDescriptor) -> String {
        match f.kind() {
            Kind::Message(m) => short_name(m.full_name()).to_string(),
            k => panic!("{} is Nested but of kind {k:?}", f.full_name()),
        }
    }

    /// Every field of TraceConfig, DataSourceConfig, FtraceConfig and the
    /// messages under them that recorder reads is in the table, and every
    /// row names a field that exists, once.
    #[test]
    fn every_field_is_handled_or_on_the_list() {
        let (seen, missing) = reached();
        assert!(missing.is_empty(), "fields with no entry: {missing:#?}");
        for must in [
            "TraceConfig.BufferConfig",
            "TraceConfig.DataSource",
            "TraceConfig.TriggerConfig",
            "TraceConfig.TriggerConfig.Trigger",
            "TraceConfig.BuiltinDataSource",
            "TraceConfig.IncrementalStateConfig",
            "DataSourceConfig",
            "FtraceConfig",
            "FtraceConfig.CompactSchedConfig",
            "FtraceConfig.PrintFilter",
            "FtraceConfig.PrintFilter.Rule",
            "FtraceConfig.PrintFilter.Rule.AtraceMessage",
            "FtraceConfig.KprobeEvent",
            "FtraceConfig.TracefsOption",
            "ProcessStatsConfig",
            "SysStatsConfig",
            "TestConfig",
        ] {
            assert!(seen.contains(must), "{must} is not reached: {seen:?}");
        }
        for f in FIELDS {
            assert!(
                descriptor(f.message).get_field_by_name(f.field).is_some(),
                "{}.{} is not a field",
                f.message,
                f.field
            );
            assert_eq!(
                FIELDS
                    .iter()
                    .filter(|g| g.message == f.message && g.field == f.field)
                    .count(),
                1,
                "{}.{} is listed twice",
                f.message,
                f.field
            );
        }
    }

    const BASE: &str =
        r#"buffers { size_kb: 1024 } data_sources { config { name: "for_testing" } } "#;

    /// Where each reached message sits in a config: text before the field,
    /// the fields it needs (replaced when they are the one tested), after.
    fn template(
        m: &str,
    ) -> (
        String,
        &'static [(&'static str, &'static str)],
        &'static str,
    ) {
        let ftrace = r#"buffers { size_kb: 1024 } data_sources { config { name: "linux.ftrace" ftrace_config { "#;
        let (before, needs, after): (String, &'static [(&str, &str)], &str) = match m {
            "TraceConfig" => (BASE.into(), &[], ""),
            "TraceConfig.BufferConfig" => (
                "buffers { ".into(),
                &[("size_kb", "1024")],
                r#" } data_sources { config { name: "for_testing" } }"#,
            ),
            "TraceConfig.DataSource" => (
                "buffers { size_kb: 1024 } data_sources { ".into(),
                &[("config", r#"{ name: "for_testing" }"#)],
                " }",
            ),
            "TraceConfig.BuiltinDataSource" => (format!("{BASE}builtin_data_sources {{ "), &[], " }"),
            "TraceConfig.IncrementalStateConfig" => {
                (format!("{BASE}incremental_state_config {{ "), &[], " }")
            }
            "TraceConfig.CompressionConfig" => (format!("{BASE}compression {{ "), &[], " }"),
            "TraceConfig.CompressionConfig.Zstd" => {
                (format!("{BASE}compression {{ zstd {{ "), &[], " } }")
            }
            "TraceConfig.TriggerConfig" => (
                format!("{BASE}trigger_config {{ "),
                &[
                    ("trigger_mode", "STOP_TRACING"),
                    ("trigger_timeout_ms", "5000"),
                    ("triggers", r#"{ name: "t" }"#),
                ],
                " }",
            ),
            "TraceConfig.TriggerConfig.Trigger" => (
                format!(
                    "{BASE}trigger_config {{ trigger_mode: STOP_TRACING trigger_timeout_ms: 5000 triggers {{ "
                ),
                &[("name", r#""t""#)],
                " } }",
            ),
            "DataSourceConfig" => (
                r#"buffers { size_kb: 1024 } buffers { size_kb: 1024 name: "b" } data_sources { config { "#.into(),
                &[("name", r#""for_testing""#)],
                " } }",
            ),
            "FtraceConfig" => (
                ftrace.into(),
                &[("ftrace_events", r#""sched/sched_switch""#)],
                " } } }",
            ),
            "FtraceConfig.CompactSchedConfig" => (
                format!(r#"{ftrace}ftrace_events: "sched/sched_switch" compact_sched {{ "#),
                &[],
                " } } } }",
            ),
            "FtraceConfig.PrintFilter.Rule" => (
                format!(r#"{ftrace}ftrace_events: "ftrace/print" print_filter {{ rules {{ "#),
                &[("prefix", r#""p""#)],
                " } } } } }",
            ),
            "FtraceConfig.PrintFilter.Rule.AtraceMessage" => (
                format!(
                    r#"{ftrace}ftrace_events: "ftrace/print" print_filter {{ rules {{ atrace_msg {{ "#
                ),
                &[("type", r#""B""#)],
                " } } } } } }",
            ),
            "FtraceConfig.KprobeEvent" => (
                format!("{ftrace}kprobe_events {{ "),
                &[("probe", r#""do_sys_open""#), ("type", "KPROBE_TYPE_KPROBE")],
                " } } } }",
            ),
            "FtraceConfig.TracefsOption" => (
                format!(r#"{ftrace}ftrace_events: "sched/sched_switch" tracefs_options {{ "#),
                &[("name", r#""event-fork""#), ("state", "STATE_ENABLED")],
                " } } } }",
            ),
            "ProcessStatsConfig" => (
                r#"buffers { size_kb: 1024 } data_sources { config { name: "linux.process_stats" process_stats_config { "#.into(),
                &[],
                " } } }",
            ),
            "SysStatsConfig" => (
                r#"buffers { size_kb: 1024 } data_sources { config { name: "linux.sys_stats" sys_stats_config { "#.into(),
                &[],
                " } } }",
            ),
            "TestConfig" => (
                r#"buffers { size_kb: 1024 } data_sources { config { name: "for_testing" for_testing { "#.into(),
                &[],
                " } } }",
            ),
            m => panic!("no template for {m}"),
        };
        (before, needs, after)
    }

    /// Other fields a field needs beside it to mean anything.
    fn context(m: &str, f: &str) -> &'static str {
        match (m, f) {
            (
                "TraceConfig",
                "file_write_period_ms"
                | "max_file_size_bytes"
                | "fflush_post_write"
                | "output_path"
                | "write_flush_mode",
            ) => "write_into_file: true ",
            (
                "FtraceConfig",
                "function_filters" | "function_graph_roots" | "function_graph_max_depth",
            ) => "enable_function_graph: true ",
            ("ProcessStatsConfig", "proc_stats_cache_ttl_ms") => "proc_stats_poll_ms: 1000 ",
            _ => "",
        }
    }

    /// A value to set a field to: not its default.
    fn sample(m: &str, f: &FieldDescriptor) -> String {
        let fixed = match (m, f.name()) {
            ("DataSourceConfig", "name") => r#""linux.sys_stats""#,
            ("DataSourceConfig", "target_buffer") => "1",
            ("DataSourceConfig", "target_buffer_name") => r#""b""#,
            ("FtraceConfig", "syscall_events") => r#""sys_read""#,
            ("FtraceConfig", "tracing_cpumask") => r#""1""#,
            ("FtraceConfig", "drain_buffer_percent") => "30",
            ("FtraceConfig", "ftrace_events") => r#""sched/sched_wakeup""#,
            ("FtraceConfig.KprobeEvent", "probe") => r#""vfs_read""#,
            ("FtraceConfig.CompactSchedConfig", "enabled") => "false",
            ("TraceConfig", "max_file_size_bytes") => "100000",
            ("TraceConfig.TriggerConfig", "trigger_mode") => "START_TRACING",
            ("TraceConfig.TriggerConfig.Trigger", "skip_probability") => "0.5",
            ("TraceConfig.BuiltinDataSource", "primary_trace_clock") => "BUILTIN_CLOCK_BOOTTIME",
            _ => "",
        };
        if !fixed.is_empty() {
            return fixed.to_string();
        }
        match f.kind() {
            Kind::Bool => "true".into(),
            Kind::Double | Kind::Float => "0.5".into(),
            Kind::String | Kind::Bytes => r#""x""#.into(),
            Kind::Message(_) => "{ }".into(),
            Kind::Enum(e) => e
                .values()
                .max_by_key(|v| v.number())
                .map(|v| v.name().to_string())
                .unwrap_or_default(),
            _ => "1000".into(),
        }
    }

    fn text(m: &str, set: Option<(&str, &str)>, ctx: &str) -> String {
        let (mut s, needs, after) = template(m);
        for (n, v) in needs {
            if set.is_none_or(|(f, _)| f != *n) {
                s.push_str(&format!("{n}: {v} "));
            }
        }
        if let Some((f, v)) = set {
            s.push_str(&format!("{f}: {v} "));
        }
        s.push_str(ctx);
        s.push_str(after);
        s
    }

    /// The spec without what any change changes.
    fn essence(mut s: RecorderSpec) -> RecorderSpec {
        s.config_bytes.clear();
        s.fields.clear();
        s.warnings.clear();
        s.notes.clear();
        for d in &mut s.data_sources {
            d.raw_config.clear();
        }
        s
    }

    /// Applied by construction: recorder never writes what they turn off,
    /// the policy is what recorder does anyway, or the sample is the
    /// default's own value (BOOTTIME).
    const NO_SPEC_EFFECT: &[&str] = &[
        "FtraceConfig.atrace_userspace_only",
        "TraceConfig.BuiltinDataSource.disable_chunk_usage_histograms",
        "TraceConfig.BuiltinDataSource.disable_extension_descriptors",
        "TraceConfig.BuiltinDataSource.primary_trace_clock",
    ];

    fn report<'a>(spec: &'a RecorderSpec, field: &str) -> &'a FieldReport {
        spec.fields
            .iter()
            .find(|r| {
                let last = r.path.rsplit('.').next().unwrap_or_default();
                last == field || last.starts_with(&format!("{field}["))
            })
            .unwrap_or_else(|| panic!("no report for {field}: {:?}", spec.fields))
    }

    /// Each field, set alone in a config, does what the table says: an
    /// applied one changes the validated spec (or is on the short list of
    /// fields applied by construction) and is not reported ignored; an
    /// ignored one gets a warning naming its path; a refused one an error
    /// naming it; a service-owned one is reported as rewritten.
    #[test]
    fn each_field_does_what_the_table_says() {
        let (seen, _) = reached();
        let mut checked = 0;
        for m in &seen {
            for f in descriptor(m).fields() {
                let Some(rule) = rule(m, f.name()) else {
                    continue;
                };
                if matches!(rule, Rule::Nested | Rule::SubConfig(_)) {
                    continue;
                }
                let ctx = context(m, f.name());
                let value = sample(m, &f);
                let test_text = text(m, Some((f.name(), &value)), ctx);
                let what = format!("{m}.{}: {test_text}", f.name());
                let base = load_text(&text(m, None, ctx), "base", false)
                    .and_then(|l| l.validate())
                    .unwrap_or_else(|e| panic!("base of {what}: {e}"));
                let got = load_text(&test_text, "t", false).and_then(|l| l.validate());
                match rule {
                    Rule::Refused(_) => {
                        let e = got.expect_err(&what).to_string();
                        assert!(e.contains(f.name()), "{what}: {e}");
                    }
                    Rule::Ignored(_) => {
                        let spec = got.unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert!(
                            spec.warnings.iter().any(|w| (w.path.ends_with(f.name())
                                || w.path.ends_with(&format!("{}[0]", f.name())))
                                && w.message.starts_with("ignored: ")),
                            "{what}: {:?}",
                            spec.warnings
                        );
                        let r = report(&spec, f.name());
                        assert!(matches!(r.status, FieldStatus::Ignored(_)), "{what}: {r}");
                    }
                    Rule::ServiceOwned => {
                        let spec = got.unwrap_or_else(|e| panic!("{what}: {e}"));
                        let r = report(&spec, f.name());
                        assert!(matches!(r.status, FieldStatus::Changed(_)), "{what}: {r}");
                    }
                    Rule::Applied(_) => {
                        let spec = got.unwrap_or_else(|e| panic!("{what}: {e}"));
                        let r = report(&spec, f.name());
                        assert!(!matches!(r.status, FieldStatus::Ignored(_)), "{what}: {r}");
                        if !NO_SPEC_EFFECT.contains(&format!("{m}.{}", f.name()).as_str()) {
                            assert_ne!(
                                essence(spec),
                                essence(base),
                                "{what}: the validated spec does not change"
                            );
                        }
                    }
                    Rule::Nested | Rule::SubConfig(_) => unreachable!(),
                }
                checked += 1;
            }
        }
        assert!(checked >= 140, "{checked} fields checked");
    }
}
