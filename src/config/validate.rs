//! Validation of a decoded TraceConfig into a [`RecorderSpec`], following the
//! tracing service's rules (ARCHITECTURE.md §8.1) and saying so where Perfetto would do
//! something surprising without a word.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use prost::Message;
use prost_reflect::DescriptorPool;

use super::fields::{FieldReport, FieldStatus, Judgement, judge};
use super::raw;
use super::spec::*;
use crate::protos;
use crate::protos::trace_config::{BufferConfig, TriggerConfig};

/// One semantic error: where, and what would be valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Field path, e.g. `buffers[1].size_kb`.
    pub path: String,
    /// What is wrong and what would be valid.
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Longest duration and trigger timeout the service accepts: 7 days.
pub(crate) const MAX_DURATION_MS: u64 = 7 * 24 * 3600 * 1000;
/// Most buffers per session.
pub(crate) const MAX_BUFFERS: usize = 128;
/// A buffer must be under 4 GiB.
pub(crate) const MAX_BUFFER_KB: u64 = 4 * 1024 * 1024 - 1;
/// write_into_file period defaults.
pub(crate) const DEFAULT_WRITE_PERIOD_MS: u32 = 5000;
/// Smallest write_into_file period.
pub(crate) const MIN_WRITE_PERIOD_MS: u32 = 100;
/// The flush cadence the service uses under write_into_file in AUTO mode.
pub(crate) const AUTO_FLUSH_PERIOD_MS: u32 = 5000;

/// BuiltinClock BOOTTIME, the trace clock.
const BOOTTIME: i32 = 6;

/// Names of the sources recorder provides itself.
pub(crate) const FTRACE: &str = "linux.ftrace";
/// `linux.process_stats`.
pub(crate) const PROCESS_STATS: &str = "linux.process_stats";
/// `linux.sys_stats`.
pub(crate) const SYS_STATS: &str = "linux.sys_stats";
/// The synthetic test source, under our name...
pub(crate) const FOR_TESTING: &str = "for_testing";
/// ...and under the name Perfetto's own test producer registers.
pub(crate) const FAKE_PRODUCER: &str = "android.perfetto.FakeProducer";

struct Ctx<'a> {
    errors: Vec<Invalid>,
    warnings: Vec<Warning>,
    notes: Vec<Warning>,
    /// What validation decided about particular field paths; the rest take
    /// their disposition from the field table ([`super::fields`]).
    outcomes: Vec<(String, FieldStatus)>,
    pool: &'a DescriptorPool,
    /// Each distinct regular expression checked so far, with its error:
    /// a config repeating one pattern compiles it once.
    regexes: std::collections::HashMap<String, Option<String>>,
}

impl Ctx<'_> {
    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(Invalid {
            path: path.into(),
            message: message.into(),
        });
    }
    fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Warning {
            path: path.into(),
            message: message.into(),
        });
    }
    fn note(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.notes.push(Warning {
            path: path.into(),
            message: message.into(),
        });
    }
    /// The field is used with a different value than written: `how`.
    fn changed(&mut self, path: impl Into<String>, how: impl Into<String>) {
        self.outcomes
            .push((path.into(), FieldStatus::Changed(how.into())));
    }
    /// [`Ctx::changed`], and a warning saying so.
    fn changed_warn(&mut self, path: impl Into<String>, how: impl Into<String>) {
        let (path, how) = (path.into(), how.into());
        self.warn(path.clone(), how.clone());
        self.changed(path, how);
    }
    /// The field has no effect: a warning naming it and `why`.
    fn ignore(&mut self, path: impl Into<String>, why: impl Into<String>) {
        let (path, why) = (path.into(), why.into());
        self.warn(path.clone(), format!("ignored: {why}"));
        self.outcomes.push((path, FieldStatus::Ignored(why)));
    }
    /// The field is applied as `how` says (where the table's word is not enough).
    fn applied(&mut self, path: impl Into<String>, how: impl Into<String>) {
        self.outcomes
            .push((path.into(), FieldStatus::Applied(how.into())));
    }
}

fn ms(v: u32) -> Duration {
    Duration::from_millis(u64::from(v))
}

fn nonzero_ms(v: Option<u32>) -> Option<Duration> {
    v.filter(|v| *v > 0).map(ms)
}

/// Compiles `pattern` as the session will (bounded in size, see
/// [`crate::config::pattern::anchored`]), each distinct one once, and at
/// most [`crate::config::pattern::MAX_DISTINCT_REGEXES`] of them: a
/// config of thousands of patterns is refused instead of costing minutes.
fn check_regex(cx: &mut Ctx<'_>, path: String, pattern: &str) {
    use crate::config::pattern::{MAX_DISTINCT_REGEXES, anchored};
    let error = match cx.regexes.get(pattern) {
        Some(e) => e.clone(),
        None if cx.regexes.len() >= MAX_DISTINCT_REGEXES => {
            cx.err(
                path,
                format!(
                    "more than {MAX_DISTINCT_REGEXES} distinct regular expressions in one config"
                ),
            );
            return;
        }
        None => {
            let e = anchored(pattern).err().map(|e| {
                e.to_string()
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim()
                    .to_string()
            });
            cx.regexes.insert(pattern.to_string(), e.clone());
            e
        }
    };
    if let Some(first) = error {
        let shown = super::diagnostic::visible(pattern, 200);
        cx.err(
            path,
            format!("invalid regular expression \"{shown}\": {first}"),
        );
    }
}

/// Every writer holds at least one chunk of its buffer while it writes: a
/// buffer with more writers than chunks refuses some of them whatever its
/// fill (their packets are discarded, "every free chunk was held by another
/// writer"). Said at check time, with the numbers.
fn writers_fit(cx: &mut Ctx<'_>, buffers: &[BufferSpec], data_sources: &[DataSourceSpec]) {
    for b in buffers {
        let writers = data_sources
            .iter()
            .filter(|d| d.target_buffer == b.id)
            .count() as u64;
        let size = b.size.bytes();
        let chunk = crate::ringbuf::BufferParams::new(
            usize::try_from(size).unwrap_or(usize::MAX),
            crate::ringbuf::FillPolicy::Discard,
        )
        .chunk_size as u64;
        if writers > 1 && writers.saturating_mul(chunk) > size {
            cx.warn(
                format!("buffers[{}]", b.id.0),
                format!(
                    "{writers} data sources write into this {size}-byte buffer, and each holds at least a {chunk}-byte chunk while it writes ({} bytes in all): some will have their packets discarded; raise size_kb or spread them over buffers",
                    writers.saturating_mul(chunk)
                ),
            );
        }
    }
}

/// Validates `config_bytes`, a serialized TraceConfig. `unknown_fields` are the
/// paths the loader found our schema does not know; they are carried along.
pub(crate) fn validate(
    config_bytes: &[u8],
    unknown_fields: Vec<String>,
    pool: &DescriptorPool,
) -> Result<RecorderSpec, Vec<Invalid>> {
    let tc = protos::TraceConfig::decode(config_bytes).map_err(|e| {
        vec![Invalid {
            path: String::new(),
            message: format!("not a TraceConfig: {e}"),
        }]
    })?;
    let raw_configs = raw::data_source_configs(config_bytes).map_err(|e| {
        vec![Invalid {
            path: "data_sources".into(),
            message: format!("malformed: {e}"),
        }]
    })?;
    let mut cx = Ctx {
        errors: Vec::new(),
        warnings: Vec::new(),
        notes: Vec::new(),
        outcomes: Vec::new(),
        pool,
        regexes: std::collections::HashMap::new(),
    };
    let buffers = buffers(&mut cx, &tc);
    let data_sources = data_sources(&mut cx, &tc, &buffers, raw_configs);
    writers_fit(&mut cx, &buffers, &data_sources);
    let trigger = triggers(&mut cx, &tc);

    let duration_ms = tc.duration_ms();
    if u64::from(duration_ms) > MAX_DURATION_MS {
        cx.err(
            "duration_ms",
            format!("{duration_ms} is over the 7-day maximum ({MAX_DURATION_MS})"),
        );
    }
    let file = file(&mut cx, &tc, trigger.as_ref());
    let flush = flush(&mut cx, &tc, file.as_ref());

    let compression = compression(&mut cx, &tc);
    if let Some(name) = tc.bugreport_filename.as_deref()
        && !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        cx.err(
            "bugreport_filename",
            "only [a-zA-Z0-9-_.] characters are allowed",
        );
    }
    if !tc.activate_triggers.is_empty() {
        cx.note(
            "activate_triggers",
            format!(
                "this config only sends triggers ({}); nothing is recorded",
                tc.activate_triggers.join(", ")
            ),
        );
    }

    let builtin = {
        let b = tc.builtin_data_sources.unwrap_or_default();
        let clock = b.primary_trace_clock.unwrap_or(0);
        // The clock snapshots name BOOTTIME as the trace clock (trace::service).
        if clock > 0 && clock != BOOTTIME {
            cx.ignore(
                "builtin_data_sources.primary_trace_clock",
                "the clock snapshots name BOOTTIME as the trace clock; trace processor converts every clock to it",
            );
        }
        BuiltinSourcesSpec {
            disable_clock_snapshotting: b.disable_clock_snapshotting(),
            disable_trace_config: b.disable_trace_config(),
            disable_system_info: b.disable_system_info(),
            disable_service_events: b.disable_service_events(),
            primary_trace_clock: if clock <= 0 { 6 } else { clock as u32 },
            snapshot_interval: nonzero_ms(b.snapshot_interval_ms)
                .unwrap_or(Duration::from_secs(10)),
            prefer_suspend_clock_for_snapshot: b.prefer_suspend_clock_for_snapshot(),
            disable_chunk_usage_histograms: b.disable_chunk_usage_histograms(),
        }
    };

    // Every field the config sets, against the field table.
    let mut judged = Judgement::default();
    let mut custom_fields = Vec::new();
    if let Some(d) = pool.get_message_by_name("perfetto.protos.TraceConfig")
        && let Ok(msg) = prost_reflect::DynamicMessage::decode(d, config_bytes)
    {
        judge(&msg, "", &cx.outcomes, &mut judged);
        custom_fields = custom(&msg, &mut judged);
    }
    for (path, message) in judged.warnings {
        cx.warn(path, message);
    }
    for (path, message) in judged.errors {
        cx.err(path, message);
    }

    cx.errors.extend(super::resources::check(
        &buffers,
        file.as_ref(),
        super::resources::available_memory("/proc".as_ref(), "/sys/fs/cgroup".as_ref()),
        config_bytes.len(),
        !builtin.disable_trace_config,
    ));
    if !cx.errors.is_empty() {
        return Err(cx.errors);
    }
    let recorded = as_run(config_bytes, &tc, flush, file.as_ref());
    Ok(RecorderSpec {
        fields: judged.fields,
        buffers,
        data_sources,
        duration: nonzero_ms(tc.duration_ms),
        trigger,
        file,
        flush,
        flush_timeout: nonzero_ms(tc.flush_timeout_ms).unwrap_or(Duration::from_secs(5)),
        data_source_stop_timeout: nonzero_ms(tc.data_source_stop_timeout_ms)
            .unwrap_or(Duration::from_secs(5)),
        incremental_state_clear_period: tc
            .incremental_state_config
            .as_ref()
            .and_then(|c| nonzero_ms(c.clear_period_ms)),
        activate_triggers: tc.activate_triggers.clone(),
        unique_session_name: tc.unique_session_name.clone().filter(|s| !s.is_empty()),
        deferred_start: tc.deferred_start(),
        trace_uuid: match (tc.trace_uuid_msb, tc.trace_uuid_lsb) {
            (None, None) => None,
            (m, l) => Some((m.unwrap_or(0), l.unwrap_or(0))),
        },
        builtin,
        compression,
        config_bytes: recorded,
        unknown_fields,
        custom_fields,
        warnings: cx.warnings,
        notes: cx.notes,
    })
}

/// The extensions each `data_sources[i].config` sets, reported as applied:
/// the recorder passes them to the data source as encoded.
fn custom(tc: &prost_reflect::DynamicMessage, judged: &mut Judgement) -> Vec<CustomField> {
    use prost_reflect::Value;
    let mut out = Vec::new();
    let Some(Value::List(sources)) = tc.get_field_by_name("data_sources").map(|v| v.into_owned())
    else {
        return out;
    };
    for (i, ds) in sources.iter().enumerate() {
        let Some(Value::Message(cfg)) = ds
            .as_message()
            .and_then(|m| m.get_field_by_name("config"))
            .map(|v| v.into_owned())
        else {
            continue;
        };
        let name = cfg
            .get_field_by_name("name")
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let mut exts: Vec<_> = cfg.extensions().collect();
        exts.sort_by_key(|(e, _)| e.number());
        for (ext, value) in exts {
            let path = format!("data_sources[{i}].config.[{}]", ext.full_name());
            let text = super::text::print_inline(&ext.kind(), value, 120);
            judged.fields.push(FieldReport {
                path: path.clone(),
                value: text.clone(),
                status: FieldStatus::Applied(format!(
                    "custom field (declared in {}), passed as encoded to the data source {name:?}",
                    ext.parent_file().name()
                )),
            });
            out.push(CustomField {
                path,
                data_source: name.clone(),
                declared_in: ext.parent_file().name().to_string(),
                value: text,
            });
        }
    }
    out
}

fn buffers(cx: &mut Ctx<'_>, tc: &protos::TraceConfig) -> Vec<BufferSpec> {
    if tc.buffers.is_empty() && tc.activate_triggers.is_empty() {
        cx.err(
            "buffers",
            "at least one buffer is required, e.g. buffers { size_kb: 65536 }",
        );
    }
    if tc.buffers.len() > MAX_BUFFERS {
        cx.err(
            "buffers",
            format!(
                "{} buffers given; at most {MAX_BUFFERS} are allowed",
                tc.buffers.len()
            ),
        );
    }
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, b) in tc.buffers.iter().enumerate() {
        let path = format!("buffers[{i}]");
        let kb = u64::from(b.size_kb());
        if kb == 0 {
            cx.err(
                format!("{path}.size_kb"),
                "must be > 0 (a size in KiB, under 4 GiB)",
            );
        } else if kb > MAX_BUFFER_KB {
            cx.err(
                format!("{path}.size_kb"),
                format!("{kb} KiB is 4 GiB or more; the largest buffer is {MAX_BUFFER_KB} KiB"),
            );
        }
        let fill_policy = match b.fill_policy.map(BufferConfig::fill_policy_from) {
            None | Some(Some(protos::trace_config::buffer_config::FillPolicy::Unspecified)) => {
                FillPolicy::RingBuffer
            }
            Some(Some(protos::trace_config::buffer_config::FillPolicy::RingBuffer)) => {
                FillPolicy::RingBuffer
            }
            Some(Some(protos::trace_config::buffer_config::FillPolicy::Discard)) => {
                FillPolicy::Discard
            }
            Some(None) => {
                cx.err(
                    format!("{path}.fill_policy"),
                    format!(
                        "unknown value {}; valid: RING_BUFFER, DISCARD",
                        b.fill_policy.unwrap_or_default()
                    ),
                );
                FillPolicy::RingBuffer
            }
        };
        if let Some(name) = b.name.as_deref().filter(|n| !n.is_empty())
            && !names.insert(name.to_string())
        {
            cx.err(
                format!("{path}.name"),
                format!("buffer name {name:?} is used twice; names must be unique"),
            );
        }
        out.push(BufferSpec {
            id: BufferId(i as u32),
            name: b.name.clone().filter(|n| !n.is_empty()),
            size: ByteSize::from_kb(kb),
            fill_policy,
            transfer_on_clone: b.transfer_on_clone(),
            clear_before_clone: b.clear_before_clone(),
        });
    }
    out
}

impl BufferConfig {
    fn fill_policy_from(v: i32) -> Option<protos::trace_config::buffer_config::FillPolicy> {
        protos::trace_config::buffer_config::FillPolicy::try_from(v).ok()
    }
}

fn data_sources(
    cx: &mut Ctx<'_>,
    tc: &protos::TraceConfig,
    buffers: &[BufferSpec],
    raw: Vec<Vec<u8>>,
) -> Vec<DataSourceSpec> {
    let mut out = Vec::new();
    for (i, (ds, raw_config)) in tc.data_sources.iter().zip(raw).enumerate() {
        let path = format!("data_sources[{i}]");
        let cfg = ds.config.clone().unwrap_or_default();
        let name = cfg.name().to_string();
        if name.is_empty() {
            cx.err(
                format!("{path}.config.name"),
                "a data source needs a name, e.g. \"linux.ftrace\"",
            );
            continue;
        }
        for (j, p) in ds.producer_name_regex_filter.iter().enumerate() {
            check_regex(cx, format!("{path}.producer_name_regex_filter[{j}]"), p);
        }
        let target = target_buffer(cx, &path, &cfg, buffers);
        let kind = source_kind(cx, &path, &name, &cfg);
        out.push(DataSourceSpec {
            name,
            target_buffer: target,
            raw_config,
            producer_name_filter: ds.producer_name_filter.clone(),
            producer_name_regex_filter: ds.producer_name_regex_filter.clone(),
            kind,
        });
    }
    out
}

fn target_buffer(
    cx: &mut Ctx<'_>,
    path: &str,
    cfg: &protos::DataSourceConfig,
    buffers: &[BufferSpec],
) -> BufferId {
    let by_index = cfg.target_buffer();
    if let Some(bname) = cfg.target_buffer_name.as_deref().filter(|n| !n.is_empty()) {
        let found = buffers.iter().find(|b| b.name.as_deref() == Some(bname));
        match found {
            None => {
                let known: Vec<String> = buffers.iter().filter_map(|b| b.name.clone()).collect();
                cx.err(
                    format!("{path}.config.target_buffer_name"),
                    format!(
                        "no buffer is named {bname:?}; named buffers: [{}]",
                        known.join(", ")
                    ),
                );
                BufferId(0)
            }
            Some(b) if by_index > 0 && b.id.0 != by_index => {
                cx.err(
                    format!("{path}.config.target_buffer"),
                    format!(
                        "{by_index} disagrees with target_buffer_name {bname:?} (buffer {})",
                        b.id.0
                    ),
                );
                b.id
            }
            Some(b) => b.id,
        }
    } else {
        if by_index as usize >= buffers.len() && !buffers.is_empty() {
            cx.err(
                format!("{path}.config.target_buffer"),
                format!(
                    "buffer {by_index} does not exist; valid: 0..={} ({} buffers)",
                    buffers.len() - 1,
                    buffers.len()
                ),
            );
        } else if buffers.is_empty() {
            cx.err(
                format!("{path}.config.target_buffer"),
                "there are no buffers to write into",
            );
        }
        BufferId(by_index)
    }
}

fn source_kind(
    cx: &mut Ctx<'_>,
    path: &str,
    name: &str,
    cfg: &protos::DataSourceConfig,
) -> SourceKind {
    match name {
        FTRACE => SourceKind::Ftrace(ftrace(
            cx,
            path,
            cfg.ftrace_config.clone().unwrap_or_default(),
        )),
        PROCESS_STATS => SourceKind::ProcessStats(process_stats(
            cx,
            path,
            cfg.process_stats_config.clone().unwrap_or_default(),
        )),
        SYS_STATS => SourceKind::SysStats(sys_stats(
            cx,
            path,
            cfg.sys_stats_config.clone().unwrap_or_default(),
        )),
        FOR_TESTING | FAKE_PRODUCER => {
            let t = cfg.for_testing.clone().unwrap_or_default();
            SourceKind::ForTesting(TestSourceSpec {
                message_count: t.message_count(),
                max_messages_per_second: t.max_messages_per_second(),
                seed: t.seed(),
                message_size: t.message_size(),
                send_batch_on_register: t.send_batch_on_register(),
            })
        }
        "track_event" => {
            let how =
                "track_event: written only by SDK apps that connect to recorder's producer socket";
            cx.applied(format!("{path}.config.name"), how);
            cx.note(format!("{path}.config.name"), how);
            SourceKind::TrackEvent
        }
        "linux.system_info" => {
            let how = "linux.system_info: recorder writes the system_info packet itself";
            cx.applied(format!("{path}.config.name"), how);
            cx.note(format!("{path}.config.name"), how);
            SourceKind::SystemInfo
        }
        other => {
            let why = if other.starts_with("android.") {
                "exists only on Android"
            } else {
                "is not provided by any built-in source"
            };
            cx.warn(
                format!("{path}.config.name"),
                format!(
                    "data source {other:?} {why}; it records nothing unless a producer provides it"
                ),
            );
            cx.applied(
                format!("{path}.config.name"),
                format!("{why}: records only if a producer provides it"),
            );
            SourceKind::Other
        }
    }
}

/// The kernel events `atrace_categories` add on Linux, as Perfetto's probes
/// add them (none with `atrace_userspace_only`), less those `ftrace_events`
/// names already; what each category does is noted.
fn ftrace_categories(cx: &mut Ctx<'_>, base: &str, f: &protos::FtraceConfig) -> Vec<String> {
    use super::categories;
    let path = format!("{base}.atrace_categories");
    if f.atrace_categories.is_empty() {
        return Vec::new();
    }
    let (known, userspace): (Vec<&str>, Vec<&str>) = f
        .atrace_categories
        .iter()
        .map(String::as_str)
        .partition(|c| categories::find(c).is_some());
    if !userspace.is_empty() {
        cx.warn(
            path.clone(),
            format!(
                "{} add(s) no kernel events on Linux (Android's userspace atrace categories): only ftrace/print records their markers",
                userspace.join(", ")
            ),
        );
    }
    if f.atrace_userspace_only() {
        cx.applied(
            path,
            "atrace_userspace_only: no kernel events, only ftrace/print",
        );
        return Vec::new();
    }
    let events: Vec<String> = categories::events_of(known.iter().copied())
        .into_iter()
        .filter(|e| !f.ftrace_events.iter().any(|x| x == e))
        .map(str::to_string)
        .collect();
    if !known.is_empty() {
        let how = format!(
            "{}: {} kernel event(s) where the kernel has them, and ftrace/print",
            known.join(", "),
            events.len()
        );
        cx.note(path.clone(), how.clone());
        cx.applied(path, how);
    }
    events
}

/// The default ftrace drain period (Perfetto's).
pub(crate) const DEFAULT_DRAIN_PERIOD_MS: u32 = 100;
/// The watermark of the early ftrace drain when the config sets none: half
/// full, so a burst still has the other half while the reader catches up.
pub const DEFAULT_DRAIN_BUFFER_PERCENT: u32 = 50;

/// `sys_read` or `read` → its number on the architecture recorder was built
/// for (the one it runs on).
pub fn syscall_number(name: &str) -> Option<u32> {
    use std::str::FromStr;
    let bare = name.strip_prefix("sys_").unwrap_or(name);
    syscalls::Sysno::from_str(bare).ok().map(|s| s.id() as u32)
}

/// A plain name tracefs accepts as a file or probe name.
use super::event_name::is_plain_name as plain_name;

fn ftrace(cx: &mut Ctx<'_>, path: &str, f: protos::FtraceConfig) -> FtraceSpec {
    let base = format!("{path}.config.ftrace_config");
    let at = |field: &str| format!("{base}.{field}");
    let (drain, drain_buffer_percent) = ftrace_drain(cx, &base, &f);
    if f.ftrace_events.is_empty()
        && f.atrace_categories.is_empty()
        && f.atrace_apps.is_empty()
        && f.syscall_events.is_empty()
        && f.kprobe_events.is_empty()
        && !f.enable_function_graph()
    {
        cx.warn(
            base.clone(),
            "no ftrace_events: linux.ftrace records nothing",
        );
    }
    let category_events = ftrace_categories(cx, &base, &f);
    if !f.atrace_apps.is_empty() {
        cx.changed_warn(
            at("atrace_apps"),
            "atrace apps only work on Android; only ftrace/print is added, for userspace atrace markers",
        );
    }
    let print_filter = ftrace_print_filter(cx, &base, &f);
    ftrace_names(cx, &base, &f);
    let syscall_events = ftrace_syscalls(cx, &base, &f);
    let kprobe_events = ftrace_kprobes(cx, &base, &f);
    let tracefs_options = ftrace_tracefs_options(cx, &base, &f);
    if !f.enable_function_graph() {
        for (field, set) in [
            ("function_filters", !f.function_filters.is_empty()),
            ("function_graph_roots", !f.function_graph_roots.is_empty()),
            (
                "function_graph_max_depth",
                f.function_graph_max_depth.is_some(),
            ),
        ] {
            if set {
                cx.ignore(at(field), "enable_function_graph is not set");
            }
        }
    }
    // Set to false it asks for what recorder does; true is ignored (table).
    if f.denser_generic_event_encoding == Some(false) {
        cx.applied(
            at("denser_generic_event_encoding"),
            "events without a typed message are written as GenericFtraceEvent",
        );
    }
    FtraceSpec {
        events: f.ftrace_events.clone(),
        atrace_categories: f.atrace_categories.clone(),
        atrace_apps: f.atrace_apps.clone(),
        category_events,
        buffer_size: Some(f.buffer_size_kb())
            .filter(|v| *v > 0)
            .map(|v| ByteSize::from_kb(u64::from(v))),
        buffer_size_lower_bound: f.buffer_size_lower_bound(),
        drain_period: ms(drain),
        drain_buffer_percent,
        compact_sched: f
            .compact_sched
            .as_ref()
            .and_then(|c| c.enabled)
            .unwrap_or(true),
        throttle_rss_stat: f.throttle_rss_stat(),
        disable_generic_events: f.disable_generic_events(),
        syscall_events,
        enable_function_graph: f.enable_function_graph(),
        function_filters: f.function_filters.clone(),
        function_graph_roots: f.function_graph_roots.clone(),
        function_graph_max_depth: f.function_graph_max_depth.filter(|d| *d > 0),
        preserve_ftrace_buffer: f.preserve_ftrace_buffer(),
        use_monotonic_raw_clock: f.use_monotonic_raw_clock(),
        instance_name: f.instance_name.clone().filter(|s| !s.is_empty()),
        tracing_cpumask: f.tracing_cpumask.clone().filter(|s| !s.is_empty()),
        tids_to_trace: f.tids_to_trace.clone(),
        kprobe_events,
        tracefs_options,
        print_filter,
    }
}

/// The drain period and the watermark that drains a CPU buffer early.
fn ftrace_drain(cx: &mut Ctx<'_>, base: &str, f: &protos::FtraceConfig) -> (u32, u32) {
    let at = |field: &str| format!("{base}.{field}");
    let drain = match f.drain_period_ms {
        None | Some(0) => DEFAULT_DRAIN_PERIOD_MS,
        Some(v @ 1..=60000) => v,
        Some(v) => {
            cx.changed_warn(
                at("drain_period_ms"),
                format!("{v} is outside 1..=60000; {DEFAULT_DRAIN_PERIOD_MS} ms used"),
            );
            DEFAULT_DRAIN_PERIOD_MS
        }
    };
    let drain_buffer_percent = match f.drain_buffer_percent {
        None => DEFAULT_DRAIN_BUFFER_PERCENT,
        Some(0) => {
            cx.changed(
                at("drain_buffer_percent"),
                format!("0 means the default, {DEFAULT_DRAIN_BUFFER_PERCENT}"),
            );
            DEFAULT_DRAIN_BUFFER_PERCENT
        }
        Some(v) if v > 100 => {
            cx.changed_warn(
                at("drain_buffer_percent"),
                format!("{v} is over 100: a CPU buffer is drained when full (100)"),
            );
            100
        }
        Some(v) => v,
    };
    (drain, drain_buffer_percent)
}

/// `print_filter`: its rules in order; a rule matching nothing is ignored.
fn ftrace_print_filter(cx: &mut Ctx<'_>, base: &str, f: &protos::FtraceConfig) -> PrintFilter {
    use crate::protos::ftrace_config::print_filter::rule::Match;
    let at = |field: &str| format!("{base}.{field}");
    let mut print_filter = PrintFilter::default();
    if let Some(pf) = &f.print_filter {
        for (i, r) in pf.rules.iter().enumerate() {
            let matches = match &r.r#match {
                Some(Match::Prefix(p)) => PrintMatch::Prefix(p.clone()),
                Some(Match::AtraceMsg(m)) => PrintMatch::Atrace {
                    kind: m.r#type.clone().unwrap_or_default(),
                    prefix: m.prefix.clone().unwrap_or_default(),
                },
                None => {
                    cx.ignore(
                        at(&format!("print_filter.rules[{i}]")),
                        "rule has neither prefix nor atrace_msg: it matches nothing",
                    );
                    continue;
                }
            };
            print_filter.rules.push(PrintRule {
                matches,
                allow: r.allow.unwrap_or(false),
            });
        }
    }
    print_filter
}

/// Names that become tracefs paths or values: events, the instance, the
/// CPU mask. Anything else is refused before a root session touches
/// tracefs.
fn ftrace_names(cx: &mut Ctx<'_>, base: &str, f: &protos::FtraceConfig) {
    let at = |field: &str| format!("{base}.{field}");
    for (i, e) in f.ftrace_events.iter().enumerate() {
        if let Some(why) = super::event_name::event_spec_problem(e) {
            cx.err(at(&format!("ftrace_events[{i}]")), why.to_string());
        }
    }
    if let Some(inst) = f.instance_name.as_deref()
        && (inst == "hyp" || inst == "hypervisor" || (!inst.is_empty() && !plain_name(inst)))
    {
        cx.err(
            at("instance_name"),
            format!(
                "{inst:?} is reserved or not a plain name; choose another tracefs instance name"
            ),
        );
    }
    if let Some(mask) = f.tracing_cpumask.as_deref()
        && !mask.is_empty()
        && !mask.chars().all(|c| c.is_ascii_hexdigit() || c == ',')
    {
        cx.err(
            at("tracing_cpumask"),
            format!(
                "{mask:?} is not a hex CPU mask (comma-separated 32-bit hex chunks, e.g. \"ff\")"
            ),
        );
    }
}

/// `syscall_events`, by this architecture's numbers.
fn ftrace_syscalls(cx: &mut Ctx<'_>, base: &str, f: &protos::FtraceConfig) -> Vec<Syscall> {
    let at = |field: &str| format!("{base}.{field}");
    let mut syscall_events = Vec::new();
    for name in &f.syscall_events {
        match syscall_number(name) {
            Some(number) => syscall_events.push(Syscall {
                name: name.clone(),
                number,
            }),
            None => cx.err(
                at("syscall_events"),
                format!(
                    "unknown syscall {name:?} on {} (names as in the kernel: \"sys_read\", \"sys_openat\")",
                    std::env::consts::ARCH
                ),
            ),
        }
    }
    syscall_events
}

/// `kprobe_events`: a kernel function and a probe kind each.
fn ftrace_kprobes(cx: &mut Ctx<'_>, base: &str, f: &protos::FtraceConfig) -> Vec<KprobeSpec> {
    use crate::protos::ftrace_config::kprobe_event::KprobeType;
    let at = |field: &str| format!("{base}.{field}");
    let mut kprobe_events = Vec::new();
    for (i, k) in f.kprobe_events.iter().enumerate() {
        let p = at(&format!("kprobe_events[{i}]"));
        let function = k.probe().to_string();
        if !plain_name(&function) || function.contains('-') {
            cx.err(
                format!("{p}.probe"),
                format!("{function:?} is not a kernel function name"),
            );
            continue;
        }
        let kind = match KprobeType::try_from(k.r#type.unwrap_or(0)) {
            Ok(KprobeType::Kprobe) => KprobeKind::Kprobe,
            Ok(KprobeType::Kretprobe) => KprobeKind::Kretprobe,
            Ok(KprobeType::Both) => KprobeKind::Both,
            _ => {
                cx.err(
                    format!("{p}.type"),
                    "set KPROBE_TYPE_KPROBE, KPROBE_TYPE_KRETPROBE or KPROBE_TYPE_BOTH",
                );
                continue;
            }
        };
        kprobe_events.push(KprobeSpec { function, kind });
    }
    kprobe_events
}

/// `tracefs_options`: a plain option name and on or off each.
fn ftrace_tracefs_options(
    cx: &mut Ctx<'_>,
    base: &str,
    f: &protos::FtraceConfig,
) -> Vec<(String, bool)> {
    use crate::protos::ftrace_config::tracefs_option::State;
    let at = |field: &str| format!("{base}.{field}");
    let mut tracefs_options = Vec::new();
    for (i, o) in f.tracefs_options.iter().enumerate() {
        let p = at(&format!("tracefs_options[{i}]"));
        let name = o.name().to_string();
        if !plain_name(&name) {
            cx.err(
                format!("{p}.name"),
                format!("{name:?} is not a tracefs option name (see options/ in tracefs)"),
            );
            continue;
        }
        let on = match State::try_from(o.state.unwrap_or(0)) {
            Ok(State::Enabled) => true,
            Ok(State::Disabled) => false,
            _ => {
                cx.err(format!("{p}.state"), "set STATE_ENABLED or STATE_DISABLED");
                continue;
            }
        };
        tracefs_options.push((name, on));
    }
    tracefs_options
}

/// Process polls faster than this are raised to it (Perfetto's minimum).
pub(crate) const MIN_PROC_POLL_MS: u32 = 100;

fn process_stats(cx: &mut Ctx<'_>, path: &str, p: protos::ProcessStatsConfig) -> ProcessStatsSpec {
    let base = format!("{path}.config.process_stats_config");
    let poll = match p.proc_stats_poll_ms() {
        0 => None,
        v if v < MIN_PROC_POLL_MS => {
            cx.changed_warn(
                format!("{base}.proc_stats_poll_ms"),
                format!("{v} ms is under the {MIN_PROC_POLL_MS} ms minimum; raised to {MIN_PROC_POLL_MS}"),
            );
            Some(MIN_PROC_POLL_MS)
        }
        v => Some(v),
    };
    // The counter cache is forgotten every N polls: the TTL in whole polls.
    let cache_ttl = match (poll, p.proc_stats_cache_ttl_ms()) {
        (_, 0) => None,
        (None, _) => {
            cx.ignore(
                format!("{base}.proc_stats_cache_ttl_ms"),
                "proc_stats_poll_ms is not set: there is no periodic poll to cache",
            );
            None
        }
        (Some(poll), ttl) => {
            let whole = (ttl / poll).max(1) * poll;
            if whole != ttl {
                cx.changed(
                    format!("{base}.proc_stats_cache_ttl_ms"),
                    format!("{whole} ms: a whole number of {poll} ms polls, at least one"),
                );
            }
            Some(ms(whole))
        }
    };
    for (i, q) in p.quirks.iter().enumerate() {
        let path = format!("{base}.quirks[{i}]");
        match q {
            1 => cx.ignore(
                path,
                "DISABLE_INITIAL_DUMP is deprecated and ignored by Perfetto too",
            ),
            2 => {}
            v => cx.ignore(path, format!("unknown quirk {v}")),
        }
    }
    ProcessStatsSpec {
        scan_all_processes_on_start: p.scan_all_processes_on_start(),
        record_thread_names: p.record_thread_names(),
        poll_period: poll.map(ms),
        cache_ttl,
        disable_on_demand: p.quirks.contains(&2),
        scan_smaps_rollup: p.scan_smaps_rollup(),
        record_process_age: p.record_process_age(),
        record_process_runtime: p.record_process_runtime(),
        record_process_dmabuf_rss: p.record_process_dmabuf_rss(),
        resolve_process_fds: p.resolve_process_fds(),
        skip_main_thread_message: p.skip_main_thread_message(),
    }
}

fn counters(cx: &mut Ctx<'_>, path: String, enum_name: &str, values: &[i32]) -> Vec<Counter> {
    let Some(ed) = cx.pool.get_enum_by_name(enum_name) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for v in values {
        match ed.get_value(*v) {
            Some(ev) if ev.number() != 0 => out.push(Counter {
                id: ev.number(),
                name: ev.name().to_string(),
            }),
            _ => cx.warn(path.clone(), format!("counter {v} is not known; skipped")),
        }
    }
    out
}

fn sys_stats(cx: &mut Ctx<'_>, path: &str, s: protos::SysStatsConfig) -> SysStatsSpec {
    let base = format!("{path}.config.sys_stats_config");
    let period = |cx: &mut Ctx<'_>, field: &str, v: Option<u32>| -> Option<Duration> {
        match v.unwrap_or(0) {
            0 => None,
            v if v < 10 => {
                cx.warn(
                    format!("{base}.{field}"),
                    format!("{v} ms is under the 10 ms minimum; raised to 10"),
                );
                Some(ms(10))
            }
            v => Some(ms(v)),
        }
    };
    let spec = SysStatsSpec {
        meminfo_period: period(cx, "meminfo_period_ms", s.meminfo_period_ms),
        meminfo_counters: Vec::new(),
        vmstat_period: period(cx, "vmstat_period_ms", s.vmstat_period_ms),
        vmstat_counters: Vec::new(),
        stat_period: period(cx, "stat_period_ms", s.stat_period_ms),
        stat_counters: s
            .stat_counters
            .iter()
            .filter_map(|c| match c {
                1 => Some(StatCounter::CpuTimes),
                2 => Some(StatCounter::IrqCounts),
                3 => Some(StatCounter::SoftirqCounts),
                4 => Some(StatCounter::ForkCount),
                _ => None,
            })
            .collect(),
        devfreq_period: period(cx, "devfreq_period_ms", s.devfreq_period_ms),
        cpufreq_period: period(cx, "cpufreq_period_ms", s.cpufreq_period_ms),
        buddyinfo_period: period(cx, "buddyinfo_period_ms", s.buddyinfo_period_ms),
        diskstat_period: period(cx, "diskstat_period_ms", s.diskstat_period_ms),
        psi_period: period(cx, "psi_period_ms", s.psi_period_ms),
        thermal_period: period(cx, "thermal_period_ms", s.thermal_period_ms),
        cpuidle_period: period(cx, "cpuidle_period_ms", s.cpuidle_period_ms),
        gpufreq_period: period(cx, "gpufreq_period_ms", s.gpufreq_period_ms),
        slab_period: period(cx, "slab_period_ms", s.slab_period_ms),
    };
    let meminfo_counters = counters(
        cx,
        format!("{base}.meminfo_counters"),
        "perfetto.protos.MeminfoCounters",
        &s.meminfo_counters,
    );
    let vmstat_counters = counters(
        cx,
        format!("{base}.vmstat_counters"),
        "perfetto.protos.VmstatCounters",
        &s.vmstat_counters,
    );
    // One tick drives every reader, so each period must be a multiple of the
    // smallest; Perfetto then schedules nothing at all, silently.
    let periods: Vec<Duration> = [
        spec.meminfo_period,
        spec.vmstat_period,
        spec.stat_period,
        spec.devfreq_period,
        spec.cpufreq_period,
        spec.buddyinfo_period,
        spec.diskstat_period,
        spec.psi_period,
        spec.thermal_period,
        spec.cpuidle_period,
        spec.gpufreq_period,
        spec.slab_period,
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(tick) = periods.iter().min()
        && let Some(bad) = periods
            .iter()
            .find(|p| p.as_millis() % tick.as_millis() != 0)
    {
        cx.err(
            base.clone(),
            format!(
                "every *_period_ms must be a multiple of the smallest ({} ms); {} ms is not",
                tick.as_millis(),
                bad.as_millis()
            ),
        );
    }
    SysStatsSpec {
        meminfo_counters,
        vmstat_counters,
        ..spec
    }
}

fn triggers(cx: &mut Ctx<'_>, tc: &protos::TraceConfig) -> Option<TriggerPlan> {
    let t: &TriggerConfig = tc.trigger_config.as_ref()?;
    let raw_mode = t.trigger_mode.unwrap_or(0);
    let mode = match raw_mode {
        0 => {
            if !t.triggers.is_empty() {
                cx.err(
                    "trigger_config.trigger_mode",
                    "triggers are listed but trigger_mode is UNSPECIFIED (Perfetto would then never write any data); set START_TRACING, STOP_TRACING or CLONE_SNAPSHOT",
                );
            }
            if t.use_clone_snapshot_if_available() {
                cx.err(
                    "trigger_config.use_clone_snapshot_if_available",
                    "only valid with trigger_mode: STOP_TRACING",
                );
            }
            return None;
        }
        1 => TriggerMode::StartTracing,
        2 if t.use_clone_snapshot_if_available() => TriggerMode::CloneSnapshot,
        2 => TriggerMode::StopTracing,
        4 => TriggerMode::CloneSnapshot,
        v => {
            cx.err(
                "trigger_config.trigger_mode",
                format!("unknown value {v}; valid: START_TRACING, STOP_TRACING, CLONE_SNAPSHOT"),
            );
            return None;
        }
    };
    if t.use_clone_snapshot_if_available() && raw_mode != 2 {
        cx.err(
            "trigger_config.use_clone_snapshot_if_available",
            "only valid with trigger_mode: STOP_TRACING",
        );
    }
    let timeout = t.trigger_timeout_ms();
    if timeout == 0 {
        cx.err(
            "trigger_config.trigger_timeout_ms",
            format!("required with a trigger mode: a value in 1..={MAX_DURATION_MS} ms (7 days)"),
        );
    } else if u64::from(timeout) > MAX_DURATION_MS {
        cx.err(
            "trigger_config.trigger_timeout_ms",
            format!("{timeout} is over the 7-day maximum; valid: 1..={MAX_DURATION_MS} ms"),
        );
    }
    if tc.duration_ms() != 0 {
        cx.err(
            "duration_ms",
            "must be 0 (unset) with a trigger mode: the triggers' stop_delay_ms and trigger_timeout_ms bound the session",
        );
    }
    if tc.write_into_file() && matches!(mode, TriggerMode::StopTracing | TriggerMode::CloneSnapshot)
    {
        cx.err(
            "trigger_config.trigger_mode",
            "STOP_TRACING and CLONE_SNAPSHOT cannot be combined with write_into_file (START_TRACING can)",
        );
    }
    if t.triggers.is_empty() {
        cx.warn(
            "trigger_config.triggers",
            "no triggers listed: the session waits for its timeout",
        );
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, tr) in t.triggers.iter().enumerate() {
        let path = format!("trigger_config.triggers[{i}]");
        let name = tr.name().to_string();
        if name.is_empty() {
            cx.err(format!("{path}.name"), "a trigger needs a name");
        } else if !seen.insert(name.clone()) {
            cx.err(
                format!("{path}.name"),
                format!("trigger name {name:?} is used twice; names must be unique"),
            );
        }
        if let Some(p) = tr.producer_name_regex.as_deref().filter(|p| !p.is_empty()) {
            check_regex(cx, format!("{path}.producer_name_regex"), p);
        }
        let p = tr.skip_probability();
        if !(0.0..=1.0).contains(&p) {
            cx.err(
                format!("{path}.skip_probability"),
                format!("{p} is not a probability in [0, 1]"),
            );
        }
        out.push(TriggerSpec {
            name,
            producer_name_regex: tr.producer_name_regex.clone().filter(|p| !p.is_empty()),
            stop_delay: ms(tr.stop_delay_ms()),
            max_per_24_h: tr.max_per_24_h.filter(|v| *v > 0),
            skip_probability: p,
        });
    }
    Some(TriggerPlan {
        mode,
        timeout: ms(timeout),
        triggers: out,
    })
}

fn file(
    cx: &mut Ctx<'_>,
    tc: &protos::TraceConfig,
    _trigger: Option<&TriggerPlan>,
) -> Option<FileSpec> {
    if !tc.write_into_file() {
        for (field, set) in [
            ("file_write_period_ms", tc.file_write_period_ms.is_some()),
            ("max_file_size_bytes", tc.max_file_size_bytes.is_some()),
            ("fflush_post_write", tc.fflush_post_write.is_some()),
            ("output_path", tc.output_path.is_some()),
        ] {
            if set {
                cx.ignore(field, "needs write_into_file: true");
            }
        }
        return None;
    }
    let (period, changed) = write_period_ms(tc.file_write_period_ms());
    match (changed, tc.file_write_period_ms) {
        (Some(how), Some(0)) => cx.changed("file_write_period_ms", how),
        (Some(how), Some(_)) => cx.changed_warn("file_write_period_ms", how),
        _ => {}
    }
    Some(FileSpec {
        write_period: ms(period),
        max_size: tc.max_file_size_bytes.filter(|v| *v > 0).map(ByteSize),
        fdatasync_each_pass: tc.fflush_post_write()
            == protos::trace_config::FFlushMode::FflushEnabled,
        output_path: tc.output_path.clone().filter(|p| !p.is_empty()),
    })
}

/// The write period a `file_write_period_ms` value gives (ARCHITECTURE.md §8.5: 0 is
/// 5000, under 100 is raised to 100), and what changed, if anything.
pub(crate) fn write_period_ms(v: u32) -> (u32, Option<String>) {
    match v {
        0 => (
            DEFAULT_WRITE_PERIOD_MS,
            Some(format!("0 means the default, {DEFAULT_WRITE_PERIOD_MS} ms")),
        ),
        v if v < MIN_WRITE_PERIOD_MS => (
            MIN_WRITE_PERIOD_MS,
            Some(format!(
                "{v} ms is under the {MIN_WRITE_PERIOD_MS} ms minimum; raised to {MIN_WRITE_PERIOD_MS}"
            )),
        ),
        v => (v, None),
    }
}

fn flush(cx: &mut Ctx<'_>, tc: &protos::TraceConfig, file: Option<&FileSpec>) -> FlushPlan {
    let flush_period = tc.flush_period_ms();
    let Some(file) = file else {
        return if flush_period > 0 {
            FlushPlan::Periodic(ms(flush_period))
        } else {
            FlushPlan::AtStop
        };
    };
    let write_period = file.write_period.as_millis() as u32;
    // ARCHITECTURE.md §8.5: the write_flush_mode decides; flush_period_ms is honoured only
    // with WRITE_FLUSH_DISABLED.
    match tc.write_flush_mode.unwrap_or(0) {
        2 => {
            if flush_period > 0 {
                FlushPlan::Periodic(ms(flush_period))
            } else {
                cx.warn(
                    "write_flush_mode",
                    "WRITE_FLUSH_DISABLED without flush_period_ms: data sources are flushed only at stop, so trace processor must sort the whole file in memory (it says config_write_into_file_no_flush)",
                );
                FlushPlan::AtStop
            }
        }
        mode => {
            if flush_period > 0 {
                cx.ignore(
                    "flush_period_ms",
                    "with write_into_file it counts only with write_flush_mode WRITE_FLUSH_DISABLED, as in Perfetto",
                );
            }
            if mode == 3 || write_period > AUTO_FLUSH_PERIOD_MS {
                FlushPlan::BeforeEachWritePass
            } else {
                FlushPlan::Periodic(ms(AUTO_FLUSH_PERIOD_MS))
            }
        }
    }
}

/// The config the `trace_config` packet records: the bytes as loaded, except
/// that a streaming session (`write_into_file`) that flushes its data sources
/// while it runs says how often, in `flush_period_ms`. Trace processor takes a
/// streamed trace without that field for one that was never flushed
/// (`config_write_into_file_no_flush`, an error the UI shows) and sorts it
/// whole in memory; with the flush plan's period recorded it reads the flush
/// markers incrementally, as for a Perfetto trace. A session that only
/// flushes at stop leaves the field as written, so that warning stays true.
fn as_run(
    config_bytes: &[u8],
    tc: &protos::TraceConfig,
    flush: FlushPlan,
    file: Option<&FileSpec>,
) -> Vec<u8> {
    let period = match (file, flush) {
        (None, _) | (_, FlushPlan::AtStop) => return config_bytes.to_vec(),
        (Some(_), FlushPlan::Periodic(p)) => p,
        (Some(f), FlushPlan::BeforeEachWritePass) => f.write_period,
    };
    let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
    let mut out = config_bytes.to_vec();
    if u64::from(tc.flush_period_ms()) != period_ms {
        // A later occurrence of a scalar field wins; every other byte,
        // unknown fields included, stays as loaded.
        use crate::wire::{WireType, key, trace_config, varint};
        varint::push(
            &mut out,
            key(trace_config::FLUSH_PERIOD_MS, WireType::Varint),
        );
        varint::push(&mut out, period_ms);
    }
    out
}

/// Highest zstd level (zstd clamps above it).
const MAX_ZSTD_LEVEL: i32 = 22;

/// zstd is written as configured. Deflate is refused by the field table
/// (`compression.deflate`, `compression_type`) rather than silently replaced.
fn compression(cx: &mut Ctx<'_>, tc: &protos::TraceConfig) -> Compression {
    if let Some(z) = tc.compression.as_ref().and_then(|c| c.zstd.as_ref()) {
        let level = z.level();
        if level > MAX_ZSTD_LEVEL {
            cx.warn(
                "compression.zstd.level",
                format!("{level} is above zstd's highest level; {MAX_ZSTD_LEVEL} is used"),
            );
            return Compression::Zstd {
                level: MAX_ZSTD_LEVEL,
            };
        }
        return Compression::Zstd { level };
    }
    Compression::None
}
