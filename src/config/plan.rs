//! A human-readable account of what a validated config will do: buffers and
//! who writes into them, sources, the timeline, warnings.

use std::fmt::Write as _;
use std::time::Duration;

use super::spec::*;

fn dur(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0 ms".into()
    } else if ms.is_multiple_of(3_600_000) {
        format!("{} h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{} min", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

fn kind_text(k: &SourceKind) -> String {
    match k {
        SourceKind::Ftrace(f) => {
            let mut s = format!(
                "ftrace: {} event(s), drain every {}, compact_sched {}",
                f.events.len(),
                dur(f.drain_period),
                if f.compact_sched { "on" } else { "off" }
            );
            if !f.atrace_categories.is_empty() {
                let _ = write!(
                    s,
                    ", atrace categories {} (+{} kernel event(s) where the kernel has them, ftrace/print)",
                    f.atrace_categories.join(", "),
                    f.category_events.len()
                );
            }
            if let Some(b) = f.buffer_size {
                let _ = write!(s, ", kernel buffer {b} per CPU");
            }
            if let Some(i) = &f.instance_name {
                let _ = write!(s, ", instance {i:?}");
            }
            s
        }
        SourceKind::ProcessStats(p) => {
            let mut parts = Vec::new();
            if p.scan_all_processes_on_start {
                parts.push("all processes at start".to_string());
            }
            if !p.disable_on_demand {
                parts.push("processes seen by ftrace".to_string());
            }
            if let Some(poll) = p.poll_period {
                parts.push(format!("stats every {}", dur(poll)));
            }
            format!(
                "process tree/stats: {}",
                if parts.is_empty() {
                    "nothing".into()
                } else {
                    parts.join(", ")
                }
            )
        }
        SourceKind::SysStats(s) => {
            let mut parts = Vec::new();
            for (name, p) in [
                ("meminfo", s.meminfo_period),
                ("vmstat", s.vmstat_period),
                ("stat", s.stat_period),
                ("devfreq", s.devfreq_period),
                ("cpufreq", s.cpufreq_period),
                ("buddyinfo", s.buddyinfo_period),
                ("diskstat", s.diskstat_period),
                ("psi", s.psi_period),
                ("thermal", s.thermal_period),
                ("cpuidle", s.cpuidle_period),
                ("gpufreq", s.gpufreq_period),
                ("slab", s.slab_period),
            ] {
                if let Some(p) = p {
                    parts.push(format!("{name} every {}", dur(p)));
                }
            }
            format!(
                "system stats: {}",
                if parts.is_empty() {
                    "nothing".into()
                } else {
                    parts.join(", ")
                }
            )
        }
        SourceKind::ForTesting(t) => format!(
            "synthetic test packets: {} of {} bytes, {}",
            t.message_count,
            t.message_size,
            if t.max_messages_per_second == 0 {
                "unthrottled".to_string()
            } else {
                format!("{}/s", t.max_messages_per_second)
            }
        ),
        SourceKind::TrackEvent => "track events from connected SDK apps".into(),
        SourceKind::SystemInfo => "system info (written by recorder itself)".into(),
        SourceKind::Other => "not provided here: records nothing".into(),
    }
}

/// The plan, as `config check` prints it.
pub(crate) fn describe(spec: &RecorderSpec) -> String {
    let mut s = String::new();
    if !spec.activate_triggers.is_empty() {
        // Such a config only fires its triggers (as Perfetto's cmdline does):
        // no session, no buffers, no file.
        let _ = writeln!(s, "sends triggers: {}", spec.activate_triggers.join(", "));
        let _ = writeln!(
            s,
            "timeline:\n  fires the triggers at every running session and exits: records nothing, writes no file"
        );
        notes(&mut s, spec);
        return s;
    }
    let _ = writeln!(s, "buffers:");
    for b in &spec.buffers {
        let policy = match b.fill_policy {
            FillPolicy::RingBuffer => "RING_BUFFER",
            FillPolicy::Discard => "DISCARD",
        };
        let writers: Vec<&str> = spec.sources_of(b.id).map(|d| d.name.as_str()).collect();
        let name = b
            .name
            .as_deref()
            .map(|n| format!(" {n:?}"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  {}{name}: {} {policy}, written by: {}",
            b.id,
            b.size,
            if writers.is_empty() {
                "(nothing)".to_string()
            } else {
                writers.join(", ")
            }
        );
    }
    let _ = writeln!(s, "data sources:");
    for d in &spec.data_sources {
        let _ = writeln!(
            s,
            "  {} -> buffer {}: {}",
            d.name,
            d.target_buffer,
            kind_text(&d.kind)
        );
    }
    let _ = writeln!(s, "timeline:");
    match &spec.trigger {
        Some(t) => {
            let mode = match t.mode {
                TriggerMode::StartTracing => {
                    "START_TRACING: waits for a trigger, then records for its stop delay"
                }
                TriggerMode::StopTracing => {
                    "STOP_TRACING: records now; a trigger stops it after its stop delay"
                }
                TriggerMode::CloneSnapshot => {
                    "CLONE_SNAPSHOT: records now; a trigger snapshots the buffers"
                }
            };
            let _ = writeln!(s, "  {mode}; gives up after {}", dur(t.timeout));
            for tr in &t.triggers {
                let _ = writeln!(
                    s,
                    "  trigger {:?}: stop delay {}",
                    tr.name,
                    dur(tr.stop_delay)
                );
            }
        }
        None => match spec.duration {
            Some(d) => {
                let _ = writeln!(s, "  records for {}", dur(d));
            }
            None => {
                let _ = writeln!(
                    s,
                    "  records until stopped (Ctrl-C, SIGTERM or `recorder stop`)"
                );
            }
        },
    }
    match &spec.file {
        Some(f) => {
            let cap = f
                .max_size
                .map(|m| format!(", at most {m}"))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  streams to the file every {}{cap}{}",
                dur(f.write_period),
                if f.fdatasync_each_pass {
                    ", fdatasync after each pass"
                } else {
                    ""
                }
            );
        }
        None => {
            let _ = writeln!(s, "  writes the buffers to the file at the end");
        }
    }
    match spec.flush {
        FlushPlan::AtStop => {}
        FlushPlan::Periodic(p) => {
            let _ = writeln!(s, "  flushes data sources every {}", dur(p));
        }
        FlushPlan::BeforeEachWritePass => {
            let _ = writeln!(s, "  flushes data sources before each write pass");
        }
    }
    match spec.compression {
        Compression::Zstd { level } => {
            let _ = writeln!(
                s,
                "  compresses with zstd level {}: each write pass becomes zstd_compressed_packets (under 512 KiB each)",
                if level == 0 {
                    crate::storage::compress::DEFAULT_ZSTD_LEVEL
                } else {
                    level
                }
            );
        }
        Compression::None => {
            let _ = writeln!(s, "  writes packets uncompressed");
        }
    }
    if !spec.custom_fields.is_empty() {
        let _ = writeln!(s, "custom fields (passed as encoded):");
        for c in &spec.custom_fields {
            let _ = writeln!(
                s,
                "  {} -> data source {:?} ({}): {}",
                c.path, c.data_source, c.declared_in, c.value
            );
        }
    }
    if !spec.unknown_fields.is_empty() {
        let _ = writeln!(s, "fields not understood (kept as is):");
        for u in &spec.unknown_fields {
            let _ = writeln!(s, "  {u}");
        }
    }
    notes(&mut s, spec);
    s
}

/// The validation's notes and warnings, one a line.
fn notes(s: &mut String, spec: &RecorderSpec) {
    for n in &spec.notes {
        let _ = writeln!(s, "note: {n}");
    }
    for w in &spec.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
}
