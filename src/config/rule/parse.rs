//! One rule's text into a [`Rule`] (the grammar is in the module docs).

use std::sync::Arc;
use std::time::Duration;

use super::filter::{Compare, Filter, FilterExpr, FilterOp, FilterValue, MAX_COMPARES, MAX_DEPTH};
use super::lex::{self, Tok, Token};
use super::{
    Condition, CounterOp, CounterRef, CounterSource, DEFAULT_COUNT, DEFAULT_RATE, EventRef,
    MAX_COUNT, MAX_FILTER_BYTES, Rate, Rule, RuleAction, RuleError, RuleSource, Span, SpanKey,
};
use crate::config::diagnostic::closest;

/// The words that start a condition.
const CONDITIONS: &[&str] = &["event", "latency", "counter", "loss", "fill", "disk-budget"];
/// The words that start an option.
const OPTIONS: &[&str] = &["freeze", "count", "rate", "then"];
/// Longest rule (trigger) name, as `recorder trigger` takes names.
const MAX_NAME_BYTES: usize = 256;
/// PSI resources.
pub const PSI_RESOURCES: &[&str] = &["cpu", "io", "memory"];
/// Process fields a counter rule reads (`process.NAME.FIELD`).
pub const PROCESS_FIELDS: &[&str] = &[
    "rss",
    "rss_anon",
    "rss_file",
    "rss_shmem",
    "swap",
    "size",
    "locked",
    "hwm",
    "oom_score_adj",
];

const EXAMPLE: &str =
    "a rule reads NAME: CONDITION [OPTIONS], e.g. crash: event signal/signal_deliver if sig == 11";

struct Parser<'s> {
    src: &'s Arc<RuleSource>,
    toks: Vec<Token>,
    pos: usize,
    /// Where the rule ends (errors about what is missing point there).
    end: usize,
    compares: usize,
}

/// Parses the rule at `span` of `src`.
pub(super) fn rule(src: &Arc<RuleSource>, span: Span) -> Result<Rule, RuleError> {
    let toks = lex::tokens(src, span)?;
    let mut p = Parser {
        src,
        toks,
        pos: 0,
        end: span.end(),
        compares: 0,
    };
    let (name, name_span) = match p.next() {
        Some(Token {
            tok: Tok::Word,
            span,
        }) => (src.slice(span).to_string(), span),
        Some(t) => return Err(p.err(t.span, "a rule starts with its name", Some(EXAMPLE.into()))),
        None => return Err(p.err(span, "an empty rule", Some(EXAMPLE.into()))),
    };
    if name.len() > MAX_NAME_BYTES {
        return Err(p.err(
            name_span,
            format!(
                "a name of {} bytes; trigger names are at most {MAX_NAME_BYTES}",
                name.len()
            ),
            None,
        ));
    }
    p.expect_op(":", "after the rule's name", Some(EXAMPLE.into()))?;
    let cond_start = p.peek().map_or(p.end, |t| t.span.start);
    let condition = p.condition()?;
    let condition_span = Span::new(cond_start, p.last().end().saturating_sub(cond_start));
    let mut rule = Rule {
        source: src.clone(),
        span,
        name,
        name_span,
        condition,
        condition_span,
        action: RuleAction::Trigger,
        count: DEFAULT_COUNT,
        rate: DEFAULT_RATE,
        freeze: None,
    };
    p.options(&mut rule)?;
    Ok(rule)
}

impl Parser<'_> {
    fn err(&self, span: Span, msg: impl Into<String>, help: Option<String>) -> RuleError {
        self.src.error(span, msg, help)
    }

    fn peek(&self) -> Option<&Token> {
        self.toks.get(self.pos)
    }

    fn peek_op(&self, op: &str) -> bool {
        matches!(self.peek(), Some(Token { tok: Tok::Op(o), .. }) if *o == op)
    }

    fn peek_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(t) if t.tok == Tok::Word && self.src.slice(t.span) == w)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += usize::from(t.is_some());
        t
    }

    /// Where the rule ends: what is missing is pointed at there.
    fn at_end(&self) -> Span {
        Span::new(self.end, 1)
    }

    /// The span of the last token taken.
    fn last(&self) -> Span {
        self.pos
            .checked_sub(1)
            .and_then(|i| self.toks.get(i))
            .map_or(self.at_end(), |t| t.span)
    }

    fn expect_op(
        &mut self,
        op: &str,
        context: &str,
        help: Option<String>,
    ) -> Result<Span, RuleError> {
        match self.next() {
            Some(Token {
                tok: Tok::Op(o),
                span,
            }) if o == op => Ok(span),
            Some(t) => Err(self.err(
                t.span,
                format!(
                    "expected `{op}` {context}, found `{}`",
                    self.src.slice(t.span)
                ),
                help,
            )),
            None => Err(self.err(self.at_end(), format!("expected `{op}` {context}"), help)),
        }
    }

    /// The next token as a word: `what` names it in the error.
    fn word(&mut self, what: &str, help: Option<String>) -> Result<(String, Span), RuleError> {
        match self.next() {
            Some(Token {
                tok: Tok::Word,
                span,
            }) => Ok((self.src.slice(span).to_string(), span)),
            Some(t) => Err(self.err(
                t.span,
                format!("expected {what}, found `{}`", self.src.slice(t.span)),
                help,
            )),
            None => Err(self.err(self.at_end(), format!("expected {what}"), help)),
        }
    }

    fn condition(&mut self) -> Result<Condition, RuleError> {
        let (kind, span) = self.word(
            "a condition",
            Some(format!("conditions: {}", CONDITIONS.join(", "))),
        )?;
        match kind.as_str() {
            "event" => {
                let event = self.event()?;
                let filter = self.maybe_filter()?;
                Ok(Condition::Event { event, filter })
            }
            "latency" => self.latency(),
            "counter" => self.counter(),
            "loss" => Ok(Condition::Loss),
            "disk-budget" => Ok(Condition::DiskBudget),
            "fill" => {
                let (buffer, buffer_span) = match self.next() {
                    Some(Token {
                        tok: Tok::Word,
                        span,
                    }) => (self.src.slice(span).to_string(), span),
                    Some(Token {
                        tok: Tok::Str(s),
                        span,
                    }) => (s, span),
                    _ => {
                        return Err(self.err(
                            self.last(),
                            "expected a buffer (its index, or its name) after `fill`",
                            Some("e.g. fill 0 > 80%".into()),
                        ));
                    }
                };
                self.expect_op(">", "after the buffer", Some("e.g. fill 0 > 80%".into()))?;
                let (p, pspan) = self.word("a percentage", Some("e.g. 80%".into()))?;
                let percent = parse_percent(&p)
                    .filter(|v| *v > 0.0 && *v <= 100.0)
                    .ok_or_else(|| {
                        self.err(
                            pspan,
                            format!("{p:?} is not a percentage from 0 to 100"),
                            Some("e.g. 80%".into()),
                        )
                    })?;
                Ok(Condition::Fill {
                    buffer,
                    buffer_span,
                    percent,
                })
            }
            other => Err(self.err(
                span,
                format!("unknown condition `{other}`"),
                Some(match closest(other, CONDITIONS.iter().copied()) {
                    Some(c) => format!(
                        "did you mean `{c}`? (conditions: {})",
                        CONDITIONS.join(", ")
                    ),
                    None => format!("conditions: {}", CONDITIONS.join(", ")),
                }),
            )),
        }
    }

    /// `GROUP/EVENT`.
    fn event(&mut self) -> Result<EventRef, RuleError> {
        let help = Some("name one event as GROUP/EVENT, e.g. sched/sched_switch".to_string());
        let (w, span) = self.word("an event (GROUP/EVENT)", help.clone())?;
        let ok =
            |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match w.split_once('/') {
            Some((g, n)) if ok(g) && ok(n) => Ok(EventRef {
                group: g.to_string(),
                name: n.to_string(),
                span,
            }),
            _ => Err(self.err(span, format!("{w:?} is not an event"), help)),
        }
    }

    fn maybe_filter(&mut self) -> Result<Option<Filter>, RuleError> {
        if !self.peek_word("if") {
            return Ok(None);
        }
        let if_span = self.next().map_or(self.at_end(), |t| t.span);
        if self.peek().is_none() {
            return Err(self.err(
                if_span,
                "`if` needs a filter after it",
                Some("e.g. if sig == 11 (the kernel's filter grammar)".into()),
            ));
        }
        let start = self.peek().map_or(self.end, |t| t.span.start);
        let expr = self.or(0)?;
        let span = Span::new(start, self.last().end() - start);
        if span.len > MAX_FILTER_BYTES {
            return Err(self.err(
                Span::new(start, 1),
                format!(
                    "this filter is {} bytes; the kernel takes one of at most {MAX_FILTER_BYTES}",
                    span.len
                ),
                None,
            ));
        }
        Ok(Some(Filter { expr, span }))
    }

    fn or(&mut self, depth: usize) -> Result<FilterExpr, RuleError> {
        let mut a = self.and(depth)?;
        while self.peek_op("||") {
            self.next();
            let b = self.and(depth)?;
            a = FilterExpr::Or(Box::new(a), Box::new(b));
        }
        Ok(a)
    }

    fn and(&mut self, depth: usize) -> Result<FilterExpr, RuleError> {
        let mut a = self.unary(depth)?;
        while self.peek_op("&&") {
            self.next();
            let b = self.unary(depth)?;
            a = FilterExpr::And(Box::new(a), Box::new(b));
        }
        Ok(a)
    }

    fn unary(&mut self, depth: usize) -> Result<FilterExpr, RuleError> {
        let here = self.peek().map_or(self.at_end(), |t| t.span);
        if depth > MAX_DEPTH {
            return Err(self.err(
                here,
                format!("the filter nests deeper than {MAX_DEPTH} levels"),
                None,
            ));
        }
        if self.peek_op("!") {
            self.next();
            return Ok(FilterExpr::Not(Box::new(self.unary(depth + 1)?)));
        }
        if self.peek_op("(") {
            self.next();
            let e = self.or(depth + 1)?;
            self.expect_op(")", "to close the `(`", None)?;
            return Ok(e);
        }
        let (field, field_span) = self.word(
            "a field name",
            Some("a filter compares fields: sig == 11, comm == \"myapp\" && prev_state & 2".into()),
        )?;
        let (op, op_span) = match self.next() {
            Some(Token {
                tok: Tok::Op(o),
                span,
            }) if FilterOp::from_op(o).is_some() => (FilterOp::from_op(o), span),
            Some(t) => {
                let found = self.src.slice(t.span).to_string();
                return Err(self.err(
                    t.span,
                    format!("expected an operator after `{field}`, found `{found}`"),
                    Some(if found == "=" {
                        "the kernel's filter compares with `==`".into()
                    } else {
                        "operators: == != < <= > >= & ~".into()
                    }),
                ));
            }
            None => {
                return Err(self.err(
                    self.at_end(),
                    format!("expected an operator after `{field}`"),
                    Some("operators: == != < <= > >= & ~".into()),
                ));
            }
        };
        let Some(op) = op else {
            return Err(self.err(op_span, "not an operator", None));
        };
        let (value, value_span) = match self.next() {
            Some(Token {
                tok: Tok::Word,
                span,
            }) => (FilterValue::Word(self.src.slice(span).to_string()), span),
            Some(Token {
                tok: Tok::Str(s),
                span,
            }) => (FilterValue::Text(s), span),
            Some(t) => {
                return Err(self.err(
                    t.span,
                    format!("expected a value, found `{}`", self.src.slice(t.span)),
                    None,
                ));
            }
            None => {
                return Err(self.err(
                    self.at_end(),
                    format!("expected a value after `{field}`"),
                    None,
                ));
            }
        };
        self.compares += 1;
        if self.compares > MAX_COMPARES {
            return Err(self.err(
                field_span,
                format!("more than {MAX_COMPARES} comparisons in one filter"),
                None,
            ));
        }
        Ok(FilterExpr::Compare(Box::new(Compare {
            field,
            field_span,
            op,
            op_span,
            value,
            value_span,
        })))
    }

    fn duration(&mut self, what: &str) -> Result<Duration, RuleError> {
        let help = Some("durations: 500us, 50ms, 2s, 1m".to_string());
        let (w, span) = self.word(what, help.clone())?;
        parse_duration(&w)
            .filter(|d| !d.is_zero() && *d <= Duration::from_secs(7 * 24 * 3600))
            .ok_or_else(|| {
                self.err(
                    span,
                    format!("{w:?} is not a duration from 1 ns to 7 days"),
                    help,
                )
            })
    }

    fn latency(&mut self) -> Result<Condition, RuleError> {
        let sched = self.peek_word("sched")
            && matches!(
                self.toks.get(self.pos + 1),
                Some(Token {
                    tok: Tok::Op(">"),
                    ..
                })
            );
        if sched {
            self.next();
            self.next();
            let over = self.duration("a duration")?;
            let filter = self.maybe_filter()?;
            return Ok(Condition::SchedLatency { over, filter });
        }
        let form = "latency sched > 50ms, or latency GROUP/EVENT [if F] to GROUP/EVENT [if F] [by FIELD] > DURATION";
        let begin = self.event().map_err(|_| {
            self.err(
                self.last(),
                "expected `sched` or an event after `latency`",
                Some(form.into()),
            )
        })?;
        let begin_filter = self.maybe_filter()?;
        if !self.peek_word("to") {
            let at = self.peek().map_or(self.at_end(), |t| t.span);
            return Err(self.err(
                at,
                "expected `to` and the event that ends the span",
                Some(form.into()),
            ));
        }
        self.next();
        let end = self.event()?;
        let end_filter = self.maybe_filter()?;
        let key = if self.peek_word("by") {
            self.next();
            let (b, bspan) = self.word("a field (the key both events share)", None)?;
            if self.peek_op("=") {
                self.next();
                let (e, espan) = self.word("the end event's field", None)?;
                SpanKey {
                    begin: b,
                    end: e,
                    span: bspan.to(espan),
                }
            } else {
                SpanKey {
                    end: b.clone(),
                    begin: b,
                    span: bspan,
                }
            }
        } else {
            SpanKey {
                begin: "common_pid".into(),
                end: "common_pid".into(),
                span: begin.span,
            }
        };
        self.expect_op(">", "before the span's longest duration", Some(form.into()))?;
        let over = self.duration("a duration")?;
        Ok(Condition::Span {
            begin,
            begin_filter,
            end,
            end_filter,
            key,
            over,
        })
    }

    fn counter(&mut self) -> Result<Condition, RuleError> {
        let sources =
            "counters: meminfo.KEY, vmstat.KEY, psi.RESOURCE.some|full, process.NAME.FIELD";
        let (w, span) = self.word("a counter", Some(sources.into()))?;
        let bad = |p: &Self, msg: String, help: String| p.err(span, msg, Some(help));
        let (source, rest) = w.split_once('.').unwrap_or((&w, ""));
        let (source, key) = match source {
            "meminfo" | "vmstat" if !rest.is_empty() => (
                if source == "meminfo" {
                    CounterSource::Meminfo
                } else {
                    CounterSource::Vmstat
                },
                rest.to_string(),
            ),
            "psi" => {
                let ok = rest.split_once('.').is_some_and(|(r, k)| {
                    PSI_RESOURCES.contains(&r) && matches!(k, "some" | "full")
                });
                if !ok {
                    return Err(bad(
                        self,
                        format!("{w:?} is not a PSI counter"),
                        format!(
                            "psi.RESOURCE.some or psi.RESOURCE.full, RESOURCE one of {}",
                            PSI_RESOURCES.join(", ")
                        ),
                    ));
                }
                (CounterSource::Psi, rest.to_string())
            }
            "process" => match rest.rsplit_once('.') {
                Some((name, field)) if !name.is_empty() && PROCESS_FIELDS.contains(&field) => {
                    (CounterSource::Process(name.to_string()), field.to_string())
                }
                _ => {
                    return Err(bad(
                        self,
                        format!("{w:?} is not a process counter"),
                        format!(
                            "process.NAME.FIELD, FIELD one of {}",
                            PROCESS_FIELDS.join(", ")
                        ),
                    ));
                }
            },
            _ => {
                return Err(bad(self, format!("{w:?} is not a counter"), sources.into()));
            }
        };
        let op = match self.next() {
            Some(Token {
                tok: Tok::Op(o), ..
            }) if matches!(o, "<" | "<=" | ">" | ">=") => match o {
                "<" => CounterOp::Lt,
                "<=" => CounterOp::Le,
                ">" => CounterOp::Gt,
                _ => CounterOp::Ge,
            },
            t => {
                let at = t.map_or(self.at_end(), |t| t.span);
                return Err(self.err(at, "expected <, <=, > or >= after the counter", None));
            }
        };
        let (v, vspan) = self.word("a value", Some("e.g. 200M, 10%, 5000".into()))?;
        let percent = source == CounterSource::Psi;
        let threshold = if percent {
            parse_percent(&v)
        } else {
            parse_quantity(&v)
        }
        .ok_or_else(|| {
            self.err(
                vspan,
                format!("{v:?} is not a {}", if percent { "percentage" } else { "number" }),
                Some(if percent {
                    "PSI counters compare the share of time stalled: 10%".into()
                } else {
                    "a number, with K, M, G or T for powers of 1024 (memory counters are in bytes: 200M)".into()
                }),
            )
        })?;
        Ok(Condition::Counter {
            counter: CounterRef { source, key, span },
            op,
            threshold,
            threshold_text: v,
        })
    }

    fn options(&mut self, rule: &mut Rule) -> Result<(), RuleError> {
        let help = || {
            Some(
                "after the condition come options: freeze, count N, rate N/DURATION, then rotate"
                    .to_string(),
            )
        };
        let mut seen: Vec<&str> = Vec::new();
        while let Some(t) = self.next() {
            let w = self.src.slice(t.span).to_string();
            if t.tok != Tok::Word || !OPTIONS.contains(&w.as_str()) {
                let hint = closest(&w, OPTIONS.iter().copied())
                    .map(|c| format!("did you mean `{c}`? (options: freeze, count N, rate N/DURATION, then rotate)"));
                return Err(self.err(t.span, format!("unexpected `{w}`"), hint.or_else(help)));
            }
            if let Some(prev) = seen.iter().find(|s| **s == w) {
                return Err(self.err(t.span, format!("`{prev}` is given twice"), None));
            }
            seen.push(
                OPTIONS
                    .iter()
                    .copied()
                    .find(|o| *o == w)
                    .unwrap_or("option"),
            );
            match w.as_str() {
                "freeze" => rule.freeze = Some(t.span),
                "count" => {
                    let (n, span) = self.word("a count", Some("e.g. count 10".into()))?;
                    rule.count = n
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=MAX_COUNT).contains(n))
                        .ok_or_else(|| {
                            self.err(
                                span,
                                format!("count {n:?}: a whole number from 1 to {MAX_COUNT}"),
                                None,
                            )
                        })?;
                }
                "rate" => {
                    let (r, span) =
                        self.word("a rate (N/DURATION)", Some("e.g. rate 1/10s".into()))?;
                    rule.rate = parse_rate(&r).ok_or_else(|| {
                        self.err(
                            span,
                            format!("rate {r:?}: N/DURATION with N from 1 to 1000 and DURATION from 1 ms to 1 day"),
                            Some("e.g. rate 1/s, rate 5/10s".into()),
                        )
                    })?;
                }
                _ => {
                    let (a, span) = self.word("`rotate` or `trigger` after `then`", None)?;
                    rule.action = match a.as_str() {
                        "rotate" => RuleAction::Rotate,
                        "trigger" => RuleAction::Trigger,
                        _ => {
                            return Err(self.err(
                                span,
                                format!("unknown action `{a}`"),
                                Some("actions: then trigger (the default), then rotate".into()),
                            ));
                        }
                    };
                }
            }
        }
        Ok(())
    }
}

/// `50ms`, `2s`, `1.5s`, `400us`, `1m`, `1h`, `100ns`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let unit_at = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(unit_at);
    let ns_per = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => return None,
    };
    let v: f64 = num.parse().ok()?;
    let ns = v * ns_per;
    (ns.is_finite() && (0.0..1e19).contains(&ns)).then(|| Duration::from_nanos(ns.round() as u64))
}

/// `80%` or `80`.
fn parse_percent(s: &str) -> Option<f64> {
    let v: f64 = s.strip_suffix('%').unwrap_or(s).parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// A number with an optional K, M, G or T (powers of 1024, `KiB`/`KB`
/// spellings too); may be negative.
fn parse_quantity(s: &str) -> Option<f64> {
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && c == '-')))
        .map_or(s.len(), |(i, _)| i);
    let (num, unit) = s.split_at(end);
    let mult = match unit.trim_end_matches(['B', 'b']).trim_end_matches('i') {
        "" => 1.0,
        "K" | "k" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v: f64 = num.parse().ok()?;
    let v = v * mult;
    v.is_finite().then_some(v)
}

/// `N/DURATION`, the duration's number optional (`1/s`).
fn parse_rate(s: &str) -> Option<Rate> {
    let (n, per) = s.split_once('/')?;
    let n: u32 = n.parse().ok().filter(|n| (1..=1000).contains(n))?;
    let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration(per)?
    } else {
        parse_duration(&format!("1{per}"))?
    };
    (per >= Duration::from_millis(1) && per <= Duration::from_secs(86_400))
        .then_some(Rate { n, per })
}
