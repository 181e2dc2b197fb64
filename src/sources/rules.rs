//! Rules as the sources evaluate them: where a match goes ([`FiringQueue`],
//! drained by the session's runner on the loop's thread), what each rule
//! did so far ([`Tallies`]), the bound on its firings ([`Limiter`]), and
//! the checks that need what only the sources know: the kernel's event
//! formats (each filter compiled against its event) and the counters the
//! stats sources read.
//!
//! A match is bounded where it happens: a rule matching every
//! `sched_switch` costs a compare and a count per event, and at most one
//! firing per its rate goes any further.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::rule::{Condition, Rule, RuleError, RuleErrors};
use crate::sources::ftrace::tracefs::Tracefs;

/// Firings waiting for the runner at most; more are counted and dropped
/// (each rule's own limits keep far below it).
pub(crate) const MAX_QUEUED: usize = 4096;

/// One firing: the rule (its index in the session's rules) and when what
/// it matched happened (BOOTTIME ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Firing {
    /// The rule's index in the session's rules.
    pub rule: usize,
    pub(crate) ts_ns: u64,
    /// What was matched, for the log (`pid 1234 on cpu 1`).
    pub note: String,
}

/// Where sources put firings; the runner takes them.
#[derive(Clone, Default)]
pub struct FiringQueue(Arc<Mutex<(VecDeque<Firing>, u64)>>);

impl std::fmt::Debug for FiringQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FiringQueue")
    }
}

impl FiringQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, (VecDeque<Firing>, u64)> {
        // A plain queue: whatever a panicking holder left is valid.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a firing; past [`MAX_QUEUED`] it is counted as dropped instead.
    pub fn push(&self, f: Firing) {
        let mut q = self.lock();
        if q.0.len() >= MAX_QUEUED {
            q.1 += 1;
        } else {
            q.0.push_back(f);
        }
    }

    /// Everything queued, oldest first.
    pub fn take(&self) -> Vec<Firing> {
        self.lock().0.drain(..).collect()
    }

    /// Firings dropped for want of room.
    pub fn dropped(&self) -> u64 {
        self.lock().1
    }
}

/// One rule's counts so far.
#[derive(Debug, Default)]
pub struct Tally {
    /// Its condition held.
    pub matched: AtomicU64,
    /// Matches its count or rate left out.
    pub(crate) suppressed: AtomicU64,
    /// Matches that went on to the session.
    pub fired: AtomicU64,
    /// Firings the session acted on.
    pub accepted: AtomicU64,
    /// Firings the session refused (its trigger's own rules).
    pub refused: AtomicU64,
    /// With `freeze`: how long after its first match the kernel's buffers
    /// held their last event (ns; `u64::MAX` until known).
    pub(crate) frozen_after_ns: AtomicU64,
}

/// The counts of every rule of a session, by rule index.
#[derive(Clone, Debug)]
pub struct Tallies(Arc<[Tally]>);

impl Tallies {
    /// Zeroed counts for `rules` rules.
    pub fn new(rules: usize) -> Self {
        Self(
            (0..rules)
                .map(|_| Tally {
                    frozen_after_ns: AtomicU64::new(u64::MAX),
                    ..Tally::default()
                })
                .collect(),
        )
    }

    /// The counts of rule `rule`.
    pub fn get(&self, rule: usize) -> Option<&Tally> {
        self.0.get(rule)
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the session has no rule.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Tally {
    /// Adds `n` to one of a tally's counters.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value of one of a tally's counters.
    pub fn load(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// A rule's bound: `count` firings in all, and one per `rate.interval()`,
/// on the clock of what it matched (an event's own timestamp), so a burst
/// costs nothing but the check.
#[derive(Clone, Copy, Debug)]
pub struct Limiter {
    left: u32,
    interval_ns: u64,
    next_ns: u64,
}

impl Limiter {
    /// The bound of `rule`: its `count` firings, one per its rate's interval.
    pub fn of(rule: &Rule) -> Self {
        Self {
            left: rule.count,
            interval_ns: u64::try_from(rule.rate.interval().as_nanos()).unwrap_or(u64::MAX),
            next_ns: 0,
        }
    }

    /// Whether a match at `ts_ns` may fire.
    #[inline]
    pub fn admit(&mut self, ts_ns: u64) -> bool {
        if self.left == 0 || ts_ns < self.next_ns {
            return false;
        }
        self.left -= 1;
        self.next_ns = ts_ns.saturating_add(self.interval_ns);
        true
    }
}

/// What a rule set needs from the sources, and where its firings go.
#[derive(Clone, Debug)]
pub struct RulePlan {
    /// The session's trigger rules, by index.
    pub rules: Vec<Rule>,
    /// Where the sources put their firings.
    pub queue: FiringQueue,
    pub(crate) tallies: Tallies,
}

impl RulePlan {
    /// The plan of `rules`, with an empty queue and zeroed tallies.
    pub fn new(rules: Vec<Rule>) -> Self {
        let tallies = Tallies::new(rules.len());
        Self {
            rules,
            queue: FiringQueue::default(),
            tallies,
        }
    }

    /// A match of rule `i` at `ts_ns`, admitted or not by `limiter`.
    pub fn matched(
        &self,
        i: usize,
        limiter: &mut Limiter,
        ts_ns: u64,
        note: impl FnOnce() -> String,
    ) {
        let admitted = limiter.admit(ts_ns);
        self.count(i, 1, u64::from(admitted));
        if admitted {
            self.fire(i, ts_ns, note());
        }
    }

    /// A firing of rule `i` at `ts_ns` its limiter admitted, counted
    /// first ([`Self::count`]).
    pub(crate) fn fire(&self, i: usize, ts_ns: u64, note: String) {
        self.queue.push(Firing {
            rule: i,
            ts_ns,
            note,
        });
    }

    /// Counts `matched` matches of rule `i`, `fired` of them fired and the
    /// rest held back: once for many matches (a rule matching every event
    /// of a load costs its compares, not shared counters per match).
    pub(crate) fn count(&self, i: usize, matched: u64, fired: u64) {
        let Some(t) = self.tallies.get(i).filter(|_| matched > 0) else {
            return;
        };
        Tally::add(&t.matched, matched);
        if fired > 0 {
            Tally::add(&t.fired, fired);
        }
        if matched > fired {
            Tally::add(&t.suppressed, matched - fired);
        }
    }
}

/// Checks what the config cannot: each filter against its event's format
/// as the kernel publishes it in `tracefs` (when it can be read: as root),
/// each counter against what its source reads. Every refusal is returned.
pub(crate) fn check(
    rules: &[Rule],
    spec: &crate::config::RecorderSpec,
    tracefs: Option<&Tracefs>,
) -> Result<(), RuleErrors> {
    let mut errors: Vec<RuleError> = Vec::new();
    for r in rules {
        if let Condition::Counter { counter, .. } = &r.condition
            && let Err(e) = crate::sources::counter_watch::check_listed(r, counter, spec)
        {
            errors.push(e);
        }
        if let Some(t) = tracefs
            && let Err(e) = crate::sources::ftrace::watch::check(r, t)
        {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(RuleErrors(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_bounds_count_and_rate_on_the_events_own_clock() {
        let r = crate::config::rule::parse_text("r", "x: loss count 3 rate 2/1s")
            .expect("parses")
            .remove(0);
        let mut l = Limiter::of(&r);
        let ms = 1_000_000;
        let admitted: Vec<u64> = (0..40)
            .map(|i| i * 100 * ms)
            .filter(|&t| l.admit(t))
            .collect();
        assert_eq!(admitted, [0, 500 * ms, 1000 * ms]);
    }

    #[test]
    fn a_full_queue_counts_what_it_drops() {
        let q = FiringQueue::default();
        for i in 0..MAX_QUEUED + 5 {
            q.push(Firing {
                rule: 0,
                ts_ns: i as u64,
                note: String::new(),
            });
        }
        assert_eq!(q.dropped(), 5);
        assert_eq!(q.take().len(), MAX_QUEUED);
        assert!(q.take().is_empty());
    }
}
