//! Trigger rules: the recorder fires the config's own triggers itself, when
//! a kernel event matches a filter, a thread waits too long for a CPU, a
//! counter crosses a threshold, data is lost, a buffer fills or the disk
//! budget bites (docs/rules.md). The TraceConfig stays Perfetto's: its
//! `trigger_config` names the triggers and decides what each does; a rule
//! only says when one is fired, as producer [`PRODUCER_NAME`].
//!
//! ```text
//!  rule      := NAME ':' condition option*
//!  condition := 'event' GROUP/EVENT ['if' FILTER]
//!             | 'latency' 'sched' '>' DURATION ['if' FILTER]
//!             | 'latency' GROUP/EVENT ['if' FILTER] 'to' GROUP/EVENT ['if' FILTER]
//!                   ['by' FIELD ['=' FIELD]] '>' DURATION
//!             | 'counter' SOURCE.NAME ('<' | '<=' | '>' | '>=') VALUE
//!             | 'loss' | 'fill' BUFFER '>' PERCENT | 'disk-budget'
//!  option    := 'freeze' | 'count' N | 'rate' N/DURATION | 'then' ('trigger' | 'rotate')
//! ```
//!
//! FILTER is the kernel's event filter grammar (`filter`). This module
//! reads rules and checks them against the config ([`check`]); the sources
//! compile the filters against the kernel's event formats and evaluate
//! them (`sources::rules`, `sources::ftrace::watch`).

use std::sync::Arc;
use std::time::Duration;

pub(crate) mod check;
pub(crate) mod filter;
mod lex;
mod parse;

pub use filter::{Compare, Filter, FilterExpr, FilterOp, FilterValue};
pub use parse::{PROCESS_FIELDS, PSI_RESOURCES, parse_duration};

use super::diagnostic::TextError;

/// The producer name the recorder's own firings carry.
pub(crate) const PRODUCER_NAME: &str = "recorder";
/// Rules a session takes at most.
pub(crate) const MAX_RULES: usize = 256;
/// Bytes of one rule at most.
pub(crate) const MAX_RULE_BYTES: usize = 8192;
/// Bytes of one filter at most: the kernel takes a filter or trigger in one
/// page.
pub(crate) const MAX_FILTER_BYTES: usize = 4000;
/// Bytes of a `--trigger-rules` file at most.
pub(crate) const MAX_RULES_FILE_BYTES: usize = 1 << 20;
/// Firings of one rule in a session, unless `count` says: a rule that
/// matches every event takes at most this many snapshots (fewer than a
/// session's snapshot budget).
pub(crate) const DEFAULT_COUNT: u32 = 10;
/// Firings of one rule per period, unless `rate` says: one per 10 s, so
/// that a rule matching every event leaves a snapshot time to be written.
pub(crate) const DEFAULT_RATE: Rate = Rate {
    n: 1,
    per: Duration::from_secs(10),
};
/// The largest `count`.
pub(crate) const MAX_COUNT: u32 = 1_000_000;

/// A byte range of a rule's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Span {
    /// Byte offset of the first byte in the source's text.
    pub start: usize,
    /// Bytes covered (0 for a point, such as the end of the text).
    pub len: usize,
}

impl Span {
    /// The `len` bytes from `start`.
    pub fn new(start: usize, len: usize) -> Self {
        Self { start, len }
    }

    /// Offset just past the range.
    pub fn end(self) -> usize {
        self.start + self.len
    }

    /// From the start of `self` to the end of `other`.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start, other.end().saturating_sub(self.start))
    }
}

/// Where rules came from: a `--trigger-rule` argument or a `--trigger-rules`
/// file, with its text (errors point into it).
#[derive(Debug, PartialEq, Eq)]
pub struct RuleSource {
    /// `--trigger-rule[2]` or the file's path.
    pub origin: String,
    /// The argument, or the whole file's text.
    pub text: String,
}

impl RuleSource {
    /// A source named `origin` holding `text`.
    pub fn new(origin: &str, text: &str) -> Self {
        Self {
            origin: origin.to_string(),
            text: text.to_string(),
        }
    }

    /// The text of `span`.
    pub fn slice(&self, span: Span) -> &str {
        self.text.get(span.start..span.end()).unwrap_or_default()
    }

    /// An error at `span`, rendered as config errors are (`ORIGIN:LINE:COL`,
    /// the line, a caret, a note).
    pub fn error(&self, span: Span, message: impl Into<String>, help: Option<String>) -> RuleError {
        let error = TextError::new(span.start, span.len.max(1), message).with_help(help);
        let rendered = error.render(&self.origin, &self.text);
        RuleError::At { error, rendered }
    }
}

/// A rule that cannot be used, or rules that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// At a place in a rule: rendered with its line and a caret.
    #[error("{rendered}")]
    At {
        /// The message, its place in the source and its help.
        error: TextError,
        /// Text: the user's rule quoted under a caret (`error` is its typed
        /// form).
        rendered: String,
    },
    /// A `--trigger-rules` file could not be opened or read.
    #[error("{origin}: cannot read: {source}")]
    Io {
        /// The file's path.
        origin: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Too many rules (`counted`: given on the command line, or in all).
    #[error("{origin}: {count} rules {counted}; a session takes at most {MAX_RULES}")]
    TooMany {
        /// `--trigger-rule` when the arguments alone are too many, `rules`
        /// for arguments and files together.
        origin: &'static str,
        /// Rules counted.
        count: usize,
        /// `given` or `in all`, for the message.
        counted: &'static str,
    },
    /// Too large a rules file.
    #[error("{origin}: larger than {MAX_RULES_FILE_BYTES} bytes: is this the right file?")]
    TooLarge {
        /// The file's path.
        origin: String,
    },
}

/// Every error found in a set of rules.
#[derive(Debug, thiserror::Error)]
#[error("{}", render_all(.0))]
pub struct RuleErrors(pub Vec<RuleError>);

/// Errors shown at most; the rest are counted.
const MAX_ERRORS_SHOWN: usize = 10;

fn render_all(errors: &[RuleError]) -> String {
    let mut lines: Vec<String> = errors
        .iter()
        .take(MAX_ERRORS_SHOWN)
        .map(ToString::to_string)
        .collect();
    if errors.len() > MAX_ERRORS_SHOWN {
        lines.push(format!(
            "… and {} more rule errors",
            errors.len() - MAX_ERRORS_SHOWN
        ));
    }
    lines.join("\n")
}

/// At most `n` firings per `per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Firings allowed per period (1 to 1000).
    pub n: u32,
    /// The period.
    pub per: Duration,
}

impl Rate {
    /// The shortest time between two firings.
    pub fn interval(self) -> Duration {
        self.per / self.n.max(1)
    }
}

/// A kernel event a rule names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRef {
    /// The event's tracefs group (`sched`, `syscalls`, ...).
    pub group: String,
    /// The event within its group (`sched_switch`, ...).
    pub name: String,
    pub(crate) span: Span,
}

impl EventRef {
    /// `group/name`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.group, self.name)
    }
}

/// Where a counter comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterSource {
    /// `/proc/meminfo` as `linux.sys_stats` records it (values in bytes).
    Meminfo,
    /// `/proc/vmstat` as `linux.sys_stats` records it.
    Vmstat,
    /// `/proc/pressure/*`: the share of time stalled between two samples,
    /// in percent.
    Psi,
    /// A process `linux.process_stats` samples, by name (its command's
    /// base name or its thread name).
    Process(String),
}

/// A counter a rule watches: `meminfo.MemAvailable`, `psi.memory.some`,
/// `process.myapp.rss`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterRef {
    /// Which sampled data the counter is read from.
    pub source: CounterSource,
    /// The counter within its source: a meminfo or vmstat key, a PSI
    /// `resource.some|full`, a process field.
    pub key: String,
    pub(crate) span: Span,
}

/// How a value is compared with a threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterOp {
    /// `<`: the value is below the threshold.
    Lt,
    /// `<=`: the value is at most the threshold.
    Le,
    /// `>`: the value is above the threshold.
    Gt,
    /// `>=`: the value is at least the threshold.
    Ge,
}

impl CounterOp {
    /// Whether `value` compares so with `threshold`.
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            CounterOp::Lt => value < threshold,
            CounterOp::Le => value <= threshold,
            CounterOp::Gt => value > threshold,
            CounterOp::Ge => value >= threshold,
        }
    }

    /// The operator as a rule writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            CounterOp::Lt => "<",
            CounterOp::Le => "<=",
            CounterOp::Gt => ">",
            CounterOp::Ge => ">=",
        }
    }
}

/// A field on each side of a span, whose values pair a begin with its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanKey {
    /// The begin event's field (`common_pid` unless `by` names one).
    pub begin: String,
    /// The end event's field: the same name as `begin` unless `by A = B`
    /// names another.
    pub end: String,
    pub(crate) span: Span,
}

/// When a rule fires.
#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    /// A kernel event the session records, matching `filter`.
    Event {
        /// The event.
        event: EventRef,
        /// The `if` filter over the event's fields; `None` matches every
        /// occurrence.
        filter: Option<Filter>,
    },
    /// A thread woken (sched_waking, or sched_wakeup) and switched in more
    /// than `over` later; `filter` is over the wakeup event's fields.
    SchedLatency {
        /// The wait that fires the rule when exceeded.
        over: Duration,
        /// The `if` filter over the wakeup event's fields, if any.
        filter: Option<Filter>,
    },
    /// A `begin` event followed by an `end` event of the same key more than
    /// `over` later.
    Span {
        /// The event that opens a span.
        begin: EventRef,
        /// The `if` filter an opening event must match, if any.
        begin_filter: Option<Filter>,
        /// The event that closes it.
        end: EventRef,
        /// The `if` filter a closing event must match, if any.
        end_filter: Option<Filter>,
        /// The fields that pair an end with its begin.
        key: SpanKey,
        /// The span length that fires the rule when exceeded.
        over: Duration,
    },
    /// A counter's sample crosses `threshold` (fires when the comparison
    /// becomes true).
    Counter {
        /// The counter watched.
        counter: CounterRef,
        /// How a sample is compared with the threshold.
        op: CounterOp,
        /// The threshold, in the counter's unit (bytes for meminfo,
        /// percent for PSI).
        threshold: f64,
        /// The threshold as written.
        threshold_text: String,
    },
    /// Any data lost: the kernel's ftrace buffers, a DISCARD buffer, a ring
    /// buffer overwritten before a streaming session wrote it, producers'.
    Loss,
    /// A buffer more than `percent` full.
    Fill {
        /// The buffer as written: its index in the config, or its name.
        buffer: String,
        /// Where the buffer is named in the rule, for errors.
        buffer_span: Span,
        /// The fill level, above 0 and at most 100.
        percent: f64,
    },
    /// The disk budget bites: a segment deleted by `--max-disk` or
    /// `--max-segments`, or the file within 10% of `max_file_size_bytes`.
    DiskBudget,
}

impl Condition {
    /// The kernel events the condition needs.
    pub fn events(&self) -> Vec<&EventRef> {
        match self {
            Condition::Event { event, .. } => vec![event],
            Condition::Span { begin, end, .. } => vec![begin, end],
            _ => Vec::new(),
        }
    }

    /// The keyword that starts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Condition::Event { .. } => "event",
            Condition::SchedLatency { .. } | Condition::Span { .. } => "latency",
            Condition::Counter { .. } => "counter",
            Condition::Loss => "loss",
            Condition::Fill { .. } => "fill",
            Condition::DiskBudget => "disk-budget",
        }
    }
}

/// What a firing does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleAction {
    /// Fires the trigger of the rule's name (the config's trigger_config
    /// says what it does).
    Trigger,
    /// Closes the segment being written and opens the next.
    Rotate,
}

/// One rule.
#[derive(Clone, Debug)]
pub struct Rule {
    /// The argument or file the rule was read from.
    pub source: Arc<RuleSource>,
    /// The whole rule in its source.
    pub(crate) span: Span,
    /// The trigger a `then trigger` rule fires (one the config's
    /// `trigger_config` lists); its counts in the summary and the trace's
    /// attributes go by it too.
    pub name: String,
    pub(crate) name_span: Span,
    /// When it fires.
    pub condition: Condition,
    /// Where the condition is written.
    pub(crate) condition_span: Span,
    /// What a firing does (`then`; a trigger by default).
    pub action: RuleAction,
    /// Firings in the session at most.
    pub count: u32,
    /// Firings per period at most (`rate`; one per 10 s unless given).
    pub rate: Rate,
    /// `freeze`: the kernel stops the ftrace buffers at the event.
    pub freeze: Option<Span>,
}

impl Rule {
    /// The rule as written.
    pub fn text(&self) -> &str {
        self.source.slice(self.span)
    }

    /// An error at `span` of this rule.
    pub fn error(&self, span: Span, message: impl Into<String>, help: Option<String>) -> RuleError {
        self.source.error(span, message, help)
    }

    /// The text of a span of this rule.
    pub fn slice(&self, span: Span) -> &str {
        self.source.slice(span)
    }

    /// A filter's text, as the kernel takes it.
    pub(crate) fn filter_text(&self, f: &Filter) -> &str {
        self.source.slice(f.span)
    }
}

/// Reads the rules given on the command line: each `--trigger-rule` one
/// rule, each `--trigger-rules` file one per line (`#` comments and blank
/// lines skipped). Every error found is returned.
pub(crate) fn read(args: &[String], files: &[std::path::PathBuf]) -> Result<Vec<Rule>, RuleErrors> {
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    if args.len() > MAX_RULES {
        return Err(RuleErrors(vec![RuleError::TooMany {
            origin: "--trigger-rule",
            count: args.len(),
            counted: "given",
        }]));
    }
    for (i, a) in args.iter().enumerate() {
        let src = Arc::new(RuleSource::new(&format!("--trigger-rule[{}]", i + 1), a));
        match parse_one(&src, Span::new(0, a.len())) {
            Ok(r) => rules.push(r),
            Err(e) => errors.push(e),
        }
    }
    for path in files {
        match read_file(path) {
            Ok(src) => parse_lines(&src, &mut rules, &mut errors),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() && rules.len() > MAX_RULES {
        errors.push(RuleError::TooMany {
            origin: "rules",
            count: rules.len(),
            counted: "in all",
        });
    }
    if errors.is_empty() {
        Ok(rules)
    } else {
        Err(RuleErrors(errors))
    }
}

/// The rules of one text, a line each (what a `--trigger-rules` file holds).
pub fn parse_text(origin: &str, text: &str) -> Result<Vec<Rule>, RuleErrors> {
    let src = Arc::new(RuleSource::new(origin, text));
    let (mut rules, mut errors) = (Vec::new(), Vec::new());
    parse_lines(&src, &mut rules, &mut errors);
    if errors.is_empty() {
        Ok(rules)
    } else {
        Err(RuleErrors(errors))
    }
}

fn read_file(path: &std::path::Path) -> Result<Arc<RuleSource>, RuleError> {
    use std::io::Read;
    let origin = path.display().to_string();
    let io = |source| RuleError::Io {
        origin: origin.clone(),
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    f.take(MAX_RULES_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() > MAX_RULES_FILE_BYTES {
        return Err(RuleError::TooLarge { origin });
    }
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let lossy = String::from_utf8_lossy(e.as_bytes()).into_owned();
            return Err(RuleSource::new(&origin, &lossy).error(
                Span::new(at, 1),
                "this byte is not UTF-8: a rules file is UTF-8 text",
                None,
            ));
        }
    };
    Ok(Arc::new(RuleSource { origin, text }))
}

/// Parses each line of `src` that holds a rule.
fn parse_lines(src: &Arc<RuleSource>, rules: &mut Vec<Rule>, errors: &mut Vec<RuleError>) {
    let mut at = 0;
    let mut count = 0;
    for line in src.text.split_inclusive('\n') {
        let start = at;
        at += line.len();
        let body = line.trim_end_matches(['\n', '\r']);
        let lead = body.len() - body.trim_start().len();
        let trimmed = body.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        count += 1;
        if count > MAX_RULES {
            errors.push(src.error(
                Span::new(start + lead, trimmed.len()),
                format!("rule {count}: a session takes at most {MAX_RULES} rules"),
                Some("merge rules that fire one trigger into one filter (`a || b`)".into()),
            ));
            return;
        }
        match parse_one(src, Span::new(start + lead, trimmed.len())) {
            Ok(r) => rules.push(r),
            Err(e) => errors.push(e),
        }
        if errors.len() > MAX_ERRORS_SHOWN * 10 {
            return;
        }
    }
}

fn parse_one(src: &Arc<RuleSource>, span: Span) -> Result<Rule, RuleError> {
    if span.len > MAX_RULE_BYTES {
        return Err(src.error(
            Span::new(span.start, 1),
            format!(
                "this rule is {} bytes; a rule is at most {MAX_RULE_BYTES}",
                span.len
            ),
            None,
        ));
    }
    parse::rule(src, span)
}

/// What a rule does, in a line, for `config check`.
pub(crate) fn describe(rule: &Rule, trigger: Option<&super::spec::TriggerPlan>) -> String {
    let when = match &rule.condition {
        Condition::Event { event, filter } => match filter {
            Some(f) => format!("when {} matches `{}`", event.path(), rule.filter_text(f)),
            None => format!("on every {}", event.path()),
        },
        Condition::SchedLatency { over, filter } => format!(
            "when a thread waits more than {} from its wakeup to a CPU{}",
            duration_text(*over),
            filter
                .as_ref()
                .map(|f| format!(" (wakeups matching `{}`)", rule.filter_text(f)))
                .unwrap_or_default()
        ),
        Condition::Span {
            begin,
            end,
            key,
            over,
            ..
        } => format!(
            "when {} is followed by {} of the same {} more than {} later",
            begin.path(),
            end.path(),
            if key.begin == key.end {
                key.begin.clone()
            } else {
                format!("{}/{}", key.begin, key.end)
            },
            duration_text(*over)
        ),
        Condition::Counter {
            counter,
            op,
            threshold_text,
            ..
        } => format!(
            "when {} {} {threshold_text} (each time it becomes true)",
            rule.slice(counter.span),
            op.as_str()
        ),
        Condition::Loss => "when data is lost (kernel, buffers or producers)".into(),
        Condition::Fill {
            buffer, percent, ..
        } => format!("when buffer {buffer} is more than {percent}% full"),
        Condition::DiskBudget => {
            "when the disk budget deletes a segment or the file nears max_file_size_bytes".into()
        }
    };
    let what = match rule.action {
        RuleAction::Rotate => "rotates the output".to_string(),
        RuleAction::Trigger => {
            let t = trigger.and_then(|p| p.triggers.iter().find(|t| t.name == rule.name));
            let mode = trigger.map(|p| match p.mode {
                super::spec::TriggerMode::StartTracing => "starts the session",
                super::spec::TriggerMode::StopTracing => "stops the session",
                super::spec::TriggerMode::CloneSnapshot => "snapshots the buffers",
            });
            match (t, mode) {
                (Some(t), Some(m)) => format!(
                    "fires trigger {:?} ({m} after {})",
                    rule.name,
                    duration_text(t.stop_delay)
                ),
                _ => format!("fires trigger {:?}", rule.name),
            }
        }
    };
    let mut s = format!(
        "{what} {when}; at most {} times, {} per {}",
        rule.count,
        rule.rate.n,
        duration_text(rule.rate.per)
    );
    if rule.freeze.is_some() {
        s.push_str("; freeze: the kernel stops the ftrace buffers at the event");
    }
    s
}

/// A duration for people: `50 ms`, `2 s`.
pub(crate) fn duration_text(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0 s".into()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{} s", ns / 1_000_000_000)
    } else if ns.is_multiple_of(1_000_000) {
        format!("{} ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{} µs", ns / 1_000)
    } else {
        format!("{ns} ns")
    }
}

#[cfg(test)]
mod tests;
