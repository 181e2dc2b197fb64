//! Rules checked against the config they run with: the trigger each fires
//! is one the config lists (in a mode a rule can fire), what each watches is
//! recorded, `freeze` and `then rotate` fit the session. Each refusal
//! points at the rule's words and says what to change.

use std::collections::HashSet;

use super::{Condition, CounterSource, EventRef, Rule, RuleAction, RuleError, RuleErrors};
use crate::config::diagnostic::closest;
use crate::config::spec::{
    FtraceSpec, ProcessStatsSpec, RecorderSpec, SourceKind, SysStatsSpec, TriggerMode,
};

/// What the session the rules run in is, beyond its config.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RuleContext {
    /// The output is cut into segments (`--rotate-size`, `--rotate-period`).
    pub segmented: bool,
    /// Segments are deleted by a budget (`--max-disk`, `--max-segments`).
    pub(crate) segment_budget: bool,
}

/// Checks every rule; all refusals are returned.
pub(crate) fn against(
    rules: &[Rule],
    spec: &RecorderSpec,
    ctx: RuleContext,
) -> Result<(), RuleErrors> {
    let mut errors = Vec::new();
    let mut names = HashSet::new();
    for r in rules {
        if !names.insert(r.name.as_str()) {
            errors.push(r.error(
                r.name_span,
                format!("a second rule named {:?}", r.name),
                Some("rules are counted by name: give each its own, or join two conditions in one filter (`a || b`)".into()),
            ));
            continue;
        }
        if let Err(e) = one(r, spec, ctx) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(RuleErrors(errors))
    }
}

fn one(r: &Rule, spec: &RecorderSpec, ctx: RuleContext) -> Result<(), RuleError> {
    match r.action {
        RuleAction::Trigger => trigger(r, spec)?,
        RuleAction::Rotate if !ctx.segmented => {
            return Err(r.error(
                r.name_span,
                "`then rotate` cuts segments, and this session writes one file",
                Some("give --rotate-size or --rotate-period (or NAME.segments.toml beside the config)".into()),
            ));
        }
        RuleAction::Rotate => {}
    }
    if let Some(at) = r.freeze {
        if !matches!(r.condition, Condition::Event { .. }) {
            return Err(r.error(
                at,
                "`freeze` arms the kernel's own trigger on one event: it applies to `event` rules",
                None,
            ));
        }
        let stops = r.action == RuleAction::Trigger
            && spec
                .trigger
                .as_ref()
                .is_some_and(|t| t.mode == TriggerMode::StopTracing);
        if !stops {
            return Err(r.error(
                at,
                "`freeze` stops the kernel's buffers for good: only a rule that fires a STOP_TRACING trigger may",
                Some("drop `freeze`, or use trigger_mode: STOP_TRACING".into()),
            ));
        }
    }
    condition(r, spec, ctx)
}

fn trigger(r: &Rule, spec: &RecorderSpec) -> Result<(), RuleError> {
    let Some(plan) = &spec.trigger else {
        return Err(r.error(
            r.name_span,
            format!("this rule fires trigger {:?}, and the config has no trigger_config", r.name),
            Some(format!(
                "add trigger_config {{ trigger_mode: STOP_TRACING trigger_timeout_ms: 86400000 triggers {{ name: {:?} stop_delay_ms: 1000 }} }} to the config",
                r.name
            )),
        ));
    };
    if plan.mode == TriggerMode::StartTracing {
        return Err(r.error(
            r.name_span,
            "a START_TRACING session records nothing before its trigger, so nothing a rule watches can fire it",
            Some("use trigger_mode: STOP_TRACING (a flight recorder) or CLONE_SNAPSHOT".into()),
        ));
    }
    if plan.triggers.iter().any(|t| t.name == r.name) {
        return Ok(());
    }
    let listed: Vec<&str> = plan.triggers.iter().map(|t| t.name.as_str()).collect();
    let help = match closest(&r.name, listed.iter().copied()) {
        Some(c) => format!(
            "did you mean {c:?}? (trigger_config lists {})",
            listed.join(", ")
        ),
        None => format!(
            "add triggers {{ name: {:?} }} to trigger_config (it lists {})",
            r.name,
            if listed.is_empty() {
                "none".to_string()
            } else {
                listed.join(", ")
            }
        ),
    };
    Err(r.error(
        r.name_span,
        format!("trigger_config lists no trigger {:?}", r.name),
        Some(help),
    ))
}

/// The config's ftrace sources, with their index.
fn ftrace_sources(spec: &RecorderSpec) -> Vec<(usize, &FtraceSpec)> {
    spec.data_sources
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match &d.kind {
            SourceKind::Ftrace(f) => Some((i, f)),
            _ => None,
        })
        .collect()
}

/// Whether `f` records `group/name`: listed (exactly, as `group/*`, or by
/// bare name), added by an atrace category, or implied (ftrace/print with
/// atrace, raw_syscalls with syscall_events).
pub(crate) fn records(f: &FtraceSpec, group: &str, name: &str) -> bool {
    let path = format!("{group}/{name}");
    let listed = f
        .events
        .iter()
        .any(|e| e == &path || e == name || e.strip_suffix("/*").is_some_and(|g| g == group));
    listed
        || f.category_events.contains(&path)
        || (path == "ftrace/print"
            && (!f.atrace_categories.is_empty() || !f.atrace_apps.is_empty()))
        || (group == "raw_syscalls" && !f.syscall_events.is_empty())
}

fn event(r: &Rule, spec: &RecorderSpec, e: &EventRef) -> Result<(), RuleError> {
    let sources = ftrace_sources(spec);
    if sources.iter().any(|(_, f)| records(f, &e.group, &e.name)) {
        return Ok(());
    }
    let recorded: Vec<&str> = sources
        .iter()
        .flat_map(|(_, f)| f.events.iter().chain(&f.category_events))
        .map(String::as_str)
        .filter(|e| e.contains('/') && !e.ends_with("/*"))
        .collect();
    let path = e.path();
    let help = match (closest(&path, recorded.iter().copied()), sources.first()) {
        (Some(c), _) => format!("did you mean {c}? (the config records it)"),
        (None, Some((i, _))) => format!(
            "add ftrace_events: {:?} to data_sources[{i}].config.ftrace_config",
            e.path()
        ),
        (None, None) => format!(
            "add data_sources {{ config {{ name: \"linux.ftrace\" ftrace_config {{ ftrace_events: {:?} }} }} }} to the config",
            e.path()
        ),
    };
    Err(r.error(
        e.span,
        format!("the config does not record {}", e.path()),
        Some(help),
    ))
}

fn condition(r: &Rule, spec: &RecorderSpec, ctx: RuleContext) -> Result<(), RuleError> {
    match &r.condition {
        Condition::Event { event: e, .. } => event(r, spec, e),
        Condition::Span { begin, end, .. } => {
            event(r, spec, begin)?;
            event(r, spec, end)
        }
        Condition::SchedLatency { .. } => {
            let sources = ftrace_sources(spec);
            let has = |n: &str| sources.iter().any(|(_, f)| records(f, "sched", n));
            let missing: Vec<&str> = [
                (!has("sched_switch")).then_some("sched/sched_switch"),
                (!has("sched_waking") && !has("sched_wakeup")).then_some("sched/sched_waking"),
            ]
            .into_iter()
            .flatten()
            .collect();
            if missing.is_empty() {
                return Ok(());
            }
            let at = sources
                .first()
                .map_or("a linux.ftrace data source".to_string(), |(i, _)| {
                    format!("data_sources[{i}].config.ftrace_config")
                });
            Err(r.error(
                r.condition_span,
                format!(
                    "scheduling latency is read from sched_switch and sched_waking (or sched_wakeup), and the config does not record {}",
                    missing.join(" or ")
                ),
                Some(format!(
                    "add {} to {at}",
                    missing
                        .iter()
                        .map(|m| format!("ftrace_events: {m:?}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )),
            ))
        }
        Condition::Counter { counter, .. } => {
            let sys: Vec<(usize, &SysStatsSpec)> = spec
                .data_sources
                .iter()
                .enumerate()
                .filter_map(|(i, d)| match &d.kind {
                    SourceKind::SysStats(s) => Some((i, s)),
                    _ => None,
                })
                .collect();
            let procs: Vec<(usize, &ProcessStatsSpec)> = spec
                .data_sources
                .iter()
                .enumerate()
                .filter_map(|(i, d)| match &d.kind {
                    SourceKind::ProcessStats(p) => Some((i, p)),
                    _ => None,
                })
                .collect();
            let (ok, field, source) = match &counter.source {
                CounterSource::Meminfo => (
                    sys.iter().any(|(_, s)| s.meminfo_period.is_some()),
                    "meminfo_period_ms: 1000",
                    "sys_stats_config",
                ),
                CounterSource::Vmstat => (
                    sys.iter().any(|(_, s)| s.vmstat_period.is_some()),
                    "vmstat_period_ms: 1000",
                    "sys_stats_config",
                ),
                CounterSource::Psi => (
                    sys.iter().any(|(_, s)| s.psi_period.is_some()),
                    "psi_period_ms: 1000",
                    "sys_stats_config",
                ),
                CounterSource::Process(_) => (
                    procs.iter().any(|(_, p)| p.poll_period.is_some()),
                    "proc_stats_poll_ms: 1000",
                    "process_stats_config",
                ),
            };
            if ok {
                return Ok(());
            }
            let (name, index) = match counter.source {
                CounterSource::Process(_) => ("linux.process_stats", procs.first().map(|p| p.0)),
                _ => ("linux.sys_stats", sys.first().map(|s| s.0)),
            };
            let help = match index {
                Some(i) => format!("add {field} to data_sources[{i}].config.{source}"),
                None => format!(
                    "add data_sources {{ config {{ name: {name:?} {source} {{ {field} }} }} }} to the config"
                ),
            };
            Err(r.error(
                counter.span,
                format!("the config does not sample {}", r.slice(counter.span)),
                Some(help),
            ))
        }
        Condition::Fill {
            buffer,
            buffer_span,
            ..
        } => buffer_index(spec, buffer).map(|_| ()).ok_or_else(|| {
            r.error(
                *buffer_span,
                format!("the config has no buffer {buffer:?}"),
                Some(format!(
                    "buffers are named by index (0 to {}) or by their name",
                    spec.buffers.len().saturating_sub(1)
                )),
            )
        }),
        Condition::DiskBudget => {
            let capped = spec.file.as_ref().is_some_and(|f| f.max_size.is_some());
            if ctx.segment_budget || capped {
                Ok(())
            } else {
                Err(r.error(
                    r.condition_span,
                    "this session has no disk budget to bite",
                    Some("give --max-disk or --max-segments with segments, or max_file_size_bytes with write_into_file".into()),
                ))
            }
        }
        Condition::Loss => Ok(()),
    }
}

/// The index of the buffer a rule names (its index or its name).
pub(crate) fn buffer_index(spec: &RecorderSpec, name: &str) -> Option<usize> {
    match name.parse::<usize>() {
        Ok(i) => (i < spec.buffers.len()).then_some(i),
        Err(_) => spec
            .buffers
            .iter()
            .position(|b| b.name.as_deref() == Some(name)),
    }
}
