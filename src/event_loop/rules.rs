//! A session's trigger rules as its runner keeps them: the firings the
//! sources queued (ftrace events, counters) and those of the rules on the
//! session's own state (loss, a buffer's fill, the disk budget), checked
//! every [`STATE_PERIOD`]; each firing's fate; the figures the summary,
//! `recorder query` and the trace's attributes show.

use std::time::{Duration, Instant};

use crate::config::rule::{Condition, Rule, RuleAction};
use crate::config::spec::RecorderSpec;
use crate::ringbuf::BufferStats;
use crate::sources::rules::{Firing, Limiter, RulePlan, Tally};

/// How often the rules on the session's state look at it.
pub(crate) const STATE_PERIOD: Duration = Duration::from_millis(100);
/// Delays kept per rule for the median.
const MAX_DELAYS: usize = 1024;

enum StateKind {
    /// Events or packets lost so far.
    Loss { seen: u64 },
    Fill {
        buffer: usize,
        percent: f64,
        held: bool,
    },
    /// Segments the budget deleted so far; whether the file was near its cap.
    DiskBudget { deleted: u64, near_cap: bool },
}

struct StateRule {
    rule: usize,
    kind: StateKind,
    limiter: Limiter,
}

/// What the state rules look at, read by the runner.
pub(crate) struct StateView<'a> {
    pub buffers: &'a [BufferStats],
    /// Events the sources lost upstream of the buffers (the kernel's).
    pub(crate) upstream_lost: u64,
    /// Segments the disk budget deleted.
    pub(crate) segments_deleted: u64,
    /// Bytes in the output so far, and `max_file_size_bytes`.
    pub written: u64,
    pub(crate) max_size: Option<u64>,
}

/// One rule's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RuleReport {
    pub name: String,
    pub text: String,
    pub matched: u64,
    pub(crate) suppressed: u64,
    pub fired: u64,
    /// Firings the session acted on.
    pub accepted: u64,
    pub refused: u64,
    /// From the matched event to the runner, over the firings: median and
    /// most (ns).
    pub(crate) delay_median_ns: Option<u64>,
    pub(crate) delay_max_ns: Option<u64>,
    /// `freeze`: the last event in the kernel's buffers after the match (ns).
    pub(crate) frozen_after_ns: Option<u64>,
    /// Why the session refused the last refused firing.
    pub(crate) last_refusal: Option<String>,
}

/// A session's rules at its runner.
pub(crate) struct RuleBook {
    pub plan: RulePlan,
    state: Vec<StateRule>,
    next_check: Instant,
    /// A ring buffer overwritten before a streaming session wrote it lost
    /// data; a flight recorder's ring overwrites by design.
    streams: bool,
    delays: Vec<Vec<u64>>,
    refusals: Vec<Option<String>>,
}

impl RuleBook {
    /// The book of `plan`'s rules for a session of `spec` (`streams`: it
    /// writes while it records).
    pub(crate) fn new(plan: RulePlan, spec: &RecorderSpec, streams: bool) -> Self {
        let state = plan
            .rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let kind = match &r.condition {
                    Condition::Loss => StateKind::Loss { seen: 0 },
                    Condition::Fill {
                        buffer, percent, ..
                    } => StateKind::Fill {
                        buffer: crate::config::rule::check::buffer_index(spec, buffer)?,
                        percent: *percent,
                        held: false,
                    },
                    Condition::DiskBudget => StateKind::DiskBudget {
                        deleted: 0,
                        near_cap: false,
                    },
                    _ => return None,
                };
                Some(StateRule {
                    rule: i,
                    kind,
                    limiter: Limiter::of(r),
                })
            })
            .collect();
        let n = plan.rules.len();
        Self {
            plan,
            state,
            next_check: Instant::now(),
            streams,
            delays: vec![Vec::new(); n],
            refusals: vec![None; n],
        }
    }

    pub(crate) fn rules(&self) -> &[Rule] {
        &self.plan.rules
    }

    /// When the state rules next look (none without such rules).
    pub(crate) fn next_due(&self) -> Option<Instant> {
        (!self.state.is_empty()).then_some(self.next_check)
    }

    /// Whether the state rules are due at `now`.
    pub(crate) fn state_due(&self, now: Instant) -> bool {
        !self.state.is_empty() && now >= self.next_check
    }

    /// The state rules look at `view`.
    pub(crate) fn check_state(&mut self, now: Instant, view: &StateView<'_>) {
        self.next_check = now + STATE_PERIOD;
        let boot = crate::clock::boottime_ns();
        let lost: u64 = view.upstream_lost
            + view
                .buffers
                .iter()
                .map(|b| {
                    b.packets_discarded
                        + b.packets_refused
                        + if self.streams {
                            b.packets_overwritten
                        } else {
                            0
                        }
                })
                .sum::<u64>();
        for s in &mut self.state {
            let note = match &mut s.kind {
                StateKind::Loss { seen } => {
                    let before = std::mem::replace(seen, lost);
                    (lost > before).then(|| format!("{} lost since the last look", lost - before))
                }
                StateKind::Fill {
                    buffer,
                    percent,
                    held,
                } => {
                    let fill = view.buffers.get(*buffer).map_or(0.0, |b| {
                        100.0 * b.bytes_buffered as f64 / b.buffer_size.max(1) as f64
                    });
                    let holds = fill > *percent;
                    let was = std::mem::replace(held, holds);
                    (holds && !was).then(|| format!("buffer {buffer} {fill:.0}% full"))
                }
                StateKind::DiskBudget { deleted, near_cap } => {
                    let more = view.segments_deleted > *deleted;
                    *deleted = view.segments_deleted;
                    let near = view
                        .max_size
                        .is_some_and(|m| view.written.saturating_mul(10) >= m.saturating_mul(9));
                    let was = std::mem::replace(near_cap, near);
                    if more {
                        Some(format!(
                            "{} segments deleted by the budget",
                            view.segments_deleted
                        ))
                    } else {
                        (near && !was).then(|| {
                            format!("{} bytes written of max_file_size_bytes", view.written)
                        })
                    }
                }
            };
            if let Some(note) = note {
                self.plan.matched(s.rule, &mut s.limiter, boot, || note);
            }
        }
    }

    /// The firings queued since the last call, each with its rule's action.
    pub(crate) fn take(&mut self) -> Vec<(Firing, RuleAction)> {
        let now = crate::clock::boottime_ns();
        let firings = self.plan.queue.take();
        firings
            .into_iter()
            .filter_map(|f| {
                let action = self.plan.rules.get(f.rule)?.action;
                if let Some(d) = self.delays.get_mut(f.rule)
                    && d.len() < MAX_DELAYS
                {
                    d.push(now.saturating_sub(f.ts_ns));
                }
                Some((f, action))
            })
            .collect()
    }

    /// The session's answer to a firing of rule `i`.
    pub(crate) fn answered(&mut self, i: usize, refusal: Option<&str>) {
        let Some(t) = self.plan.tallies.get(i) else {
            return;
        };
        match refusal {
            None => Tally::add(&t.accepted, 1),
            Some(why) => {
                Tally::add(&t.refused, 1);
                if let Some(r) = self.refusals.get_mut(i) {
                    *r = Some(why.to_string());
                }
            }
        }
    }

    /// Every rule's figures, in the rules' order.
    pub(crate) fn reports(&self) -> Vec<RuleReport> {
        self.plan
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let t = self.plan.tallies.get(i);
                let load = |f: fn(&Tally) -> &std::sync::atomic::AtomicU64| {
                    t.map_or(0, |t| Tally::load(f(t)))
                };
                let mut d = self.delays.get(i).cloned().unwrap_or_default();
                d.sort_unstable();
                let frozen = load(|t| &t.frozen_after_ns);
                RuleReport {
                    name: r.name.clone(),
                    text: r.text().to_string(),
                    matched: load(|t| &t.matched),
                    suppressed: load(|t| &t.suppressed),
                    fired: load(|t| &t.fired),
                    accepted: load(|t| &t.accepted),
                    refused: load(|t| &t.refused),
                    delay_median_ns: d.get(d.len() / 2).copied(),
                    delay_max_ns: d.last().copied(),
                    frozen_after_ns: (frozen != u64::MAX).then_some(frozen),
                    last_refusal: self.refusals.get(i).cloned().flatten(),
                }
            })
            .collect()
    }

    /// The figures as `trace_attributes` entries:
    /// `recorder.rule.<name>.{matched,fired,accepted,suppressed}`.
    pub(crate) fn attributes(&self) -> Vec<(String, i64)> {
        let mut v = Vec::new();
        for r in self.reports() {
            for (what, n) in [
                ("matched", r.matched),
                ("fired", r.fired),
                ("accepted", r.accepted),
                ("suppressed", r.suppressed),
            ] {
                v.push((
                    format!("{RULE_KEY_PREFIX}{}.{what}", r.name),
                    i64::try_from(n).unwrap_or(i64::MAX),
                ));
            }
        }
        v
    }
}

/// Where rule figures live in `trace_attributes`.
pub(crate) const RULE_KEY_PREFIX: &str = "recorder.rule.";

#[cfg(test)]
mod tests {
    use super::*;

    fn book(rules: &str, streams: bool) -> RuleBook {
        let spec = crate::config::load_text(
            "buffers { size_kb: 1024 name: \"main\" } data_sources { config { name: \"for_testing\" } }",
            "c",
            false,
        )
        .expect("loads")
        .validate()
        .expect("valid");
        let rules = crate::config::rule::parse_text("r", rules).expect("parses");
        RuleBook::new(RulePlan::new(rules), &spec, streams)
    }

    fn stats(buffered: u64, discarded: u64, overwritten: u64) -> BufferStats {
        BufferStats {
            buffer_size: 1000,
            bytes_buffered: buffered,
            packets_discarded: discarded,
            packets_overwritten: overwritten,
            ..BufferStats::default()
        }
    }

    fn look(b: &mut RuleBook, buffers: &[BufferStats], deleted: u64, written: u64) -> Vec<usize> {
        let view = StateView {
            buffers,
            upstream_lost: 0,
            segments_deleted: deleted,
            written,
            max_size: Some(1000),
        };
        b.check_state(Instant::now(), &view);
        b.take().into_iter().map(|(f, _)| f.rule).collect()
    }

    #[test]
    fn state_rules_fire_when_their_condition_becomes_true() {
        let mut b = book(
            "full: fill main > 50% rate 100/1ms\nlost: loss rate 100/1ms\nbudget: disk-budget rate 100/1ms",
            false,
        );
        assert!(b.next_due().is_some());
        assert!(look(&mut b, &[stats(100, 0, 0)], 0, 0).is_empty());
        // Fill crosses 50%: once, until it falls back.
        assert_eq!(look(&mut b, &[stats(600, 0, 0)], 0, 0), [0]);
        assert!(look(&mut b, &[stats(700, 0, 0)], 0, 0).is_empty());
        assert!(look(&mut b, &[stats(100, 0, 0)], 0, 0).is_empty());
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(look(&mut b, &[stats(900, 0, 0)], 0, 0), [0]);
        // A DISCARD buffer's refusals are loss; a flight recorder's
        // overwrites are not.
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(look(&mut b, &[stats(900, 3, 50)], 0, 0), [1]);
        assert!(look(&mut b, &[stats(900, 3, 90)], 0, 0).is_empty());
        // A segment deleted by the budget, or the file near its cap.
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(look(&mut b, &[stats(900, 3, 90)], 1, 0), [2]);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(look(&mut b, &[stats(900, 3, 90)], 1, 950), [2]);
        assert!(look(&mut b, &[stats(900, 3, 90)], 1, 960).is_empty());
        // Streaming: an overwrite is loss.
        let mut s = book("lost: loss", true);
        assert_eq!(look(&mut s, &[stats(0, 0, 5)], 0, 0), [0]);
        let r = &b.reports()[0];
        assert_eq!((r.matched, r.fired), (2, 2));
    }
}
