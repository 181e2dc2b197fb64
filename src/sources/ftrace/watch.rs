//! Rules evaluated where ftrace events are decoded: each filter compiled
//! against its event's format into a [`Program`] over the raw record (the
//! offsets `format` read from tracefs), called for the events that have
//! rules and for no others (`EventEntry::watch`). The encoder's fast walk
//! over a page hands over its watched events at its end
//! ([`Watch::on_walk`]); each hook then runs over all of them, a filter one
//! comparison at a time, so the kind of a hook or a comparison is matched
//! once per walk, not once per event.
//!
//! An `event` rule fires as the walk that decoded its event ends. Latency
//! rules pair two events of one thread (a wakeup and the switch that puts
//! it on a CPU) or one key (a span's begin and end), which may come from
//! different CPUs: the reader drains the CPUs one after the other, so
//! those events are kept first. At the end of each drain they are put in
//! time order (each CPU's run is already in order) and those older than
//! the drain's start are paired: every CPU's buffer has been read past that time by
//! then (a drain reads each CPU until the page the kernel is writing).
//! The rest wait for the next drain; the last drain pairs everything.
//!
//! `filter` compiles the filters; `latency` holds and pairs a scheduling-
//! latency rule's events.

mod filter;
mod latency;

use std::collections::HashMap;

use super::event_table::{EventTable, IntAt, TextAt};
use super::format::{EventFormat, parse_event_format};
use super::tracefs::Tracefs;
use crate::config::diagnostic::closest;
use crate::config::rule::{Condition, Rule, RuleError, Span};
use crate::sources::rules::{Limiter, RulePlan};
use filter::{Leaf, Node, Program, compile, flatten};
use latency::SchedRule;

/// Threads (or span keys) awaiting their end at most per rule: beyond, the
/// oldest half is forgotten (a thread woken and never run is rare).
const MAX_PENDING: usize = 1 << 16;
/// Span stamps held for ordering at most; beyond, they are paired as they
/// stand.
const MAX_ORDERED: usize = 1 << 18;

/// Hashes thread ids and span keys: one multiply (the maps are the
/// recorder's own, keyed by what the kernel recorded).
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_i64(&mut self, v: i64) {
        self.0 = (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type KeyMap = HashMap<i64, u64, std::hash::BuildHasherDefault<KeyHasher>>;

/// Reads the format of `group/name` from `tracefs`.
fn format_of(
    rule: &Rule,
    tracefs: &Tracefs,
    group: &str,
    name: &str,
    at: Span,
) -> Result<EventFormat, RuleError> {
    let text = tracefs
        .read(&format!("events/{group}/{name}/format"))
        .map_err(|_| {
            let known = tracefs.events_of(group);
            let help = match closest(name, known.iter().map(String::as_str)) {
                Some(c) => format!("did you mean {group}/{c}?"),
                None if known.is_empty() => format!("this kernel has no event group {group}"),
                None => format!("events/{group}/ holds {} events", known.len()),
            };
            rule.error(
                at,
                format!("this kernel has no event {group}/{name}"),
                Some(help),
            )
        })?;
    parse_event_format(group, &text).map_err(|e| {
        rule.error(
            at,
            format!("the kernel's format of {group}/{name} cannot be read: {e}"),
            None,
        )
    })
}

/// Checks a rule's events and filters against the kernel's formats in
/// `tracefs` (the same the recording's instance has).
pub(crate) fn check(rule: &Rule, tracefs: &Tracefs) -> Result<(), RuleError> {
    match &rule.condition {
        Condition::Event { event, filter } => {
            let f = format_of(rule, tracefs, &event.group, &event.name, event.span)?;
            if let Some(filter) = filter {
                compile(rule, filter, &f)?;
            }
        }
        Condition::SchedLatency { filter, .. } => {
            format_of(rule, tracefs, "sched", "sched_switch", rule.condition_span)?;
            let waking = format_of(rule, tracefs, "sched", "sched_waking", rule.condition_span)
                .or_else(|_| {
                    format_of(rule, tracefs, "sched", "sched_wakeup", rule.condition_span)
                })?;
            if let Some(filter) = filter {
                compile(rule, filter, &waking)?;
            }
        }
        Condition::Span {
            begin,
            begin_filter,
            end,
            end_filter,
            key,
            ..
        } => {
            for (e, filter, field) in [
                (begin, begin_filter, &key.begin),
                (end, end_filter, &key.end),
            ] {
                let f = format_of(rule, tracefs, &e.group, &e.name, e.span)?;
                if let Some(filter) = filter {
                    compile(rule, filter, &f)?;
                }
                key_of(rule, &f, field, key.span)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Where a span's key is read.
#[derive(Clone, Copy, Debug)]
enum KeyAt {
    Int(IntAt),
    Text(TextAt),
}

impl KeyAt {
    /// The key of `rec`: the integer, or a hash of the text.
    fn read(self, rec: &[u8]) -> Option<i64> {
        match self {
            KeyAt::Int(at) => at.int(rec),
            KeyAt::Text(at) => at.read(rec).map(|s| {
                // FNV-1a: keys only need to tell a few live spans apart.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for &b in s {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
                h as i64
            }),
        }
    }
}

fn key_of(rule: &Rule, f: &EventFormat, field: &str, at: Span) -> Result<KeyAt, RuleError> {
    let event = format!("{}/{}", f.group, f.name);
    let Some(fd) = f.field(field) else {
        let names: Vec<&str> = f
            .fields
            .iter()
            .chain(&f.common)
            .map(|f| f.name.as_str())
            .collect();
        return Err(rule.error(
            at,
            format!("{event} has no field {field} to pair its events by"),
            Some(match closest(field, names.iter().copied()) {
                Some(n) => format!("did you mean {n}?"),
                None => format!("{event} has {}", names.join(", ")),
            }),
        ));
    };
    IntAt::of(fd)
        .map(KeyAt::Int)
        .or_else(|| TextAt::of(fd).map(KeyAt::Text))
        .ok_or_else(|| rule.error(at, format!("{field} of {event} cannot be a key"), None))
}

/// A span rule's begin or end (its slot).
#[derive(Clone, Copy, Debug)]
enum Hook {
    Begin(u16),
    End(u16),
}

struct EventRule {
    rule: usize,
    /// `common_pid`, for the firing's note.
    pid: Option<IntAt>,
    /// `group/name`, to know whether its freeze was armed.
    event: (String, String),
    limiter: Limiter,
    /// `freeze`: the first match's time, once matched.
    freeze: Option<Option<u64>>,
}

impl EventRule {
    /// Its matches `evs` (in time order) of a walk over `bytes` on `cpu`:
    /// those its limiter admits fire; all are counted once.
    #[inline]
    fn fire<'a>(
        &mut self,
        plan: &RulePlan,
        to_boot: i64,
        bytes: &[u8],
        cpu: u32,
        evs: impl Iterator<Item = &'a Seen>,
    ) {
        let mut matched = 0;
        // Few: the limiter admits at most its rate. Counted before they are
        // queued, so that what takes them never counts more than fired.
        let mut admitted = Vec::new();
        for e in evs {
            if let Some(None) = self.freeze {
                self.freeze = Some(Some(e.ts));
            }
            matched += 1;
            let boot = e.ts.saturating_add_signed(to_boot);
            if self.limiter.admit(boot) {
                admitted.push((boot, e));
            }
        }
        plan.count(self.rule, matched, admitted.len() as u64);
        for (boot, e) in admitted {
            let pid = self.pid.and_then(|p| p.int(e.rec(bytes))).unwrap_or(0);
            plan.fire(self.rule, boot, format!("pid {pid} on cpu {cpu}"));
        }
    }
}

struct SpanRule {
    rule: usize,
    over: u64,
    begin: (Option<Program>, KeyAt),
    end: (Option<Program>, KeyAt),
    limiter: Limiter,
    /// Open spans: key → begin time.
    open: KeyMap,
}

/// An `event` rule's checks on one event: its slot, whether all its
/// leaves must hold (else any) and where they are in `Watch::leaves`.
#[derive(Clone, Copy, Debug)]
struct EventHook {
    slot: u16,
    all: bool,
    leaves: (u32, u32),
}

/// The hooks of one watched event, by kind, while the rules are compiled.
#[derive(Clone, Debug, Default)]
struct IdHooks {
    checks: Vec<EventHook>,
    waking: Vec<u16>,
    switch: Vec<u16>,
    spans: Vec<Hook>,
}

/// Every watched event's hooks while the rules are compiled; the event
/// table holds each one's index + 1 (`EventEntry::watch`).
#[derive(Default)]
struct Hooks {
    list: Vec<IdHooks>,
    by_id: std::collections::BTreeMap<u16, usize>,
}

impl Hooks {
    /// Event `id`'s hooks, marking it watched in `table` the first time.
    fn of(&mut self, table: &mut EventTable, id: u16) -> &mut IdHooks {
        let n = self.list.len();
        let i = *self.by_id.entry(id).or_insert_with(|| {
            table.set_watch(id, (n + 1) as u16);
            n
        });
        if i == n {
            self.list.push(IdHooks::default());
        }
        &mut self.list[i]
    }
}

/// One thing a watched event does; an event's are one run of
/// `Watch::ops`, so it costs a walk over a few adjacent words.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// A latency rule's switch: `next_pid` stamped, with the CPU.
    Switch { slot: u16, at: IntAt },
    /// A latency rule's wakeup: `pid` stamped, if the rule's filter passes.
    Waking { slot: u16, at: IntAt },
    /// An `event` rule's checks.
    Check(EventHook),
    /// A span's begin or end.
    Span(Hook),
}

/// A watched event of the encoder's walk: its time and where its record is.
#[derive(Clone, Copy, Debug)]
struct Seen {
    ts: u64,
    at: u32,
    len: u32,
}

impl Seen {
    #[inline(always)]
    fn rec(self, bytes: &[u8]) -> &[u8] {
        let at = self.at as usize;
        bytes.get(at..at + self.len as usize).unwrap_or_default()
    }

    /// The `N` bytes at `offset` of its record, if the record holds them.
    #[inline(always)]
    fn field<const N: usize>(self, bytes: &[u8], offset: usize) -> Option<[u8; N]> {
        if offset + N > self.len as usize {
            return None;
        }
        bytes
            .get(self.at as usize + offset..)?
            .first_chunk::<N>()
            .copied()
    }

    /// The integer `at` of its record: a thread id (a signed 32-bit field
    /// in the kernel's formats) read as itself, any other width through
    /// the general read.
    #[inline(always)]
    fn int(self, bytes: &[u8], at: IntAt) -> Option<i64> {
        if (at.size, at.signed) == (4, true) {
            self.field::<4>(bytes, at.offset)
                .map(|b| i64::from(i32::from_le_bytes(b)))
        } else {
            at.int(self.rec(bytes))
        }
    }
}

/// A span rule's event, kept for ordering.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    ts: u64,
    key: i64,
    hook: Hook,
}

/// The rules of one ftrace source, compiled against its event table.
pub struct Watch {
    plan: RulePlan,
    /// What each watched event does: one run of `ops` per watched event
    /// (`EventEntry::watch` − 1).
    runs: Vec<(u32, u32)>,
    ops: Vec<Op>,
    /// The watched events of the encoder's current walk, by watched event.
    seen: Vec<Vec<Seen>>,
    /// Scratch of `check`: the events that passed, and those left to test.
    pass: Vec<u32>,
    left: Vec<u32>,
    /// Every `event` rule's comparisons, each rule's in one run.
    leaves: Vec<Leaf>,
    /// What does not fit a leaf (text, nested expressions).
    trees: Vec<Node>,
    events: Vec<EventRule>,
    sched: Vec<SchedRule>,
    spans: Vec<SpanRule>,
    ordered: Vec<Stamp>,
    /// Added to an event's timestamp to make it BOOTTIME (non-zero with the
    /// mono_raw trace clock).
    to_boot: i64,
}

impl Watch {
    /// Compiles the rules of `plan` that watch ftrace against `table`,
    /// marking the events they watch. `None` when none does.
    pub fn new(
        plan: &RulePlan,
        table: &mut EventTable,
        to_boot: i64,
    ) -> Result<Option<Watch>, RuleError> {
        let mut w = Watch {
            plan: plan.clone(),
            runs: Vec::new(),
            ops: Vec::new(),
            seen: Vec::new(),
            pass: Vec::new(),
            left: Vec::new(),
            leaves: Vec::new(),
            trees: Vec::new(),
            events: Vec::new(),
            sched: Vec::new(),
            spans: Vec::new(),
            ordered: Vec::new(),
            to_boot,
        };
        let mut hooks = Hooks::default();
        for (i, rule) in plan.rules.iter().enumerate() {
            let find = |group: &str, name: &str| {
                table
                    .find(group, name)
                    .map(|(id, e)| (id, e.format.clone()))
            };
            let missing = |what: String, at: Span| {
                rule.error(
                    at,
                    format!(
                        "{what} is not recorded (the kernel lacks it, or it could not be enabled)"
                    ),
                    None,
                )
            };
            match &rule.condition {
                Condition::Event { event, filter } => {
                    let (id, format) = find(&event.group, &event.name)
                        .ok_or_else(|| missing(event.path(), event.span))?;
                    let program = filter
                        .as_ref()
                        .map(|f| compile(rule, f, &format))
                        .transpose()?;
                    let slot = w.events.len() as u16;
                    let (all, leaves) = flatten(program, &mut w.trees);
                    let first = w.leaves.len() as u32;
                    w.leaves.extend(leaves);
                    hooks.of(table, id).checks.push(EventHook {
                        slot,
                        all,
                        leaves: (first, w.leaves.len() as u32),
                    });
                    w.events.push(EventRule {
                        rule: i,
                        pid: format.field("common_pid").and_then(IntAt::of),
                        event: (event.group.clone(), event.name.clone()),
                        limiter: Limiter::of(rule),
                        freeze: rule.freeze.map(|_| None),
                    });
                }
                Condition::SchedLatency { over, filter } => {
                    let (switch_id, switch) = find("sched", "sched_switch")
                        .ok_or_else(|| missing("sched/sched_switch".into(), rule.condition_span))?;
                    let (wake_id, wake) = find("sched", "sched_waking")
                        .or_else(|| find("sched", "sched_wakeup"))
                        .ok_or_else(|| missing("sched/sched_waking".into(), rule.condition_span))?;
                    let int = |f: &EventFormat, n: &str| {
                        f.field(n).and_then(IntAt::of).ok_or_else(|| {
                            rule.error(
                                rule.condition_span,
                                format!("{}/{} has no integer {n}", f.group, f.name),
                                None,
                            )
                        })
                    };
                    let slot = w.sched.len() as u16;
                    w.sched.push(SchedRule::new(
                        i,
                        nanos(*over),
                        filter
                            .as_ref()
                            .map(|f| compile(rule, f, &wake))
                            .transpose()?,
                        int(&wake, "pid")?,
                        int(&switch, "next_pid")?,
                        Limiter::of(rule),
                    ));
                    hooks.of(table, wake_id).waking.push(slot);
                    hooks.of(table, switch_id).switch.push(slot);
                }
                Condition::Span {
                    begin,
                    begin_filter,
                    end,
                    end_filter,
                    key,
                    over,
                } => {
                    let (bid, bf) = find(&begin.group, &begin.name)
                        .ok_or_else(|| missing(begin.path(), begin.span))?;
                    let (eid, ef) =
                        find(&end.group, &end.name).ok_or_else(|| missing(end.path(), end.span))?;
                    let slot = w.spans.len() as u16;
                    w.spans.push(SpanRule {
                        rule: i,
                        over: nanos(*over),
                        begin: (
                            begin_filter
                                .as_ref()
                                .map(|f| compile(rule, f, &bf))
                                .transpose()?,
                            key_of(rule, &bf, &key.begin, key.span)?,
                        ),
                        end: (
                            end_filter
                                .as_ref()
                                .map(|f| compile(rule, f, &ef))
                                .transpose()?,
                            key_of(rule, &ef, &key.end, key.span)?,
                        ),
                        limiter: Limiter::of(rule),
                        open: KeyMap::default(),
                    });
                    hooks.of(table, bid).spans.push(Hook::Begin(slot));
                    hooks.of(table, eid).spans.push(Hook::End(slot));
                }
                _ => {}
            }
        }
        for h in hooks.list {
            let start = w.ops.len() as u32;
            for &slot in &h.switch {
                if let Some(r) = w.sched.get(usize::from(slot)) {
                    w.ops.push(Op::Switch {
                        slot,
                        at: r.next_pid,
                    });
                }
            }
            for &slot in &h.waking {
                if let Some(r) = w.sched.get(usize::from(slot)) {
                    w.ops.push(Op::Waking { slot, at: r.pid });
                }
            }
            w.ops.extend(h.checks.iter().map(|&hk| Op::Check(hk)));
            w.ops.extend(h.spans.iter().map(|&hk| Op::Span(hk)));
            w.runs.push((start, w.ops.len() as u32));
            w.seen.push(Vec::new());
        }
        let watches = !(w.events.is_empty() && w.sched.is_empty() && w.spans.is_empty());
        Ok(watches.then_some(w))
    }

    /// Events that `freeze` rules stop the kernel at, with their filters:
    /// `(group, name, filter)`.
    pub(crate) fn freezes(plan: &RulePlan) -> Vec<(String, String, Option<String>)> {
        plan.rules
            .iter()
            .filter(|r| r.freeze.is_some())
            .filter_map(|r| match &r.condition {
                Condition::Event { event, filter } => Some((
                    event.group.clone(),
                    event.name.clone(),
                    filter.as_ref().map(|f| r.filter_text(f).to_string()),
                )),
                _ => None,
            })
            .collect()
    }

    /// Now on the trace clock: where a drain starting now cuts.
    pub fn now(&self) -> u64 {
        crate::clock::boottime_ns().saturating_add_signed(-self.to_boot)
    }

    fn boot(&self, ts: u64) -> u64 {
        ts.saturating_add_signed(self.to_boot)
    }

    /// A watched event of the encoder's walk over `bytes` (`watch`: its
    /// entry's `EventEntry::watch`): its record is `len` bytes at `at`.
    /// Kept until the walk ends ([`Self::on_walk`]).
    #[inline(always)]
    pub(crate) fn saw(&mut self, watch: u16, ts: u64, at: usize, len: usize) {
        if let Some(v) = self.seen.get_mut(usize::from(watch).wrapping_sub(1)) {
            v.push(Seen {
                ts,
                at: at as u32,
                len: len as u32,
            });
        }
    }

    /// The end of a walk over `bytes`, on `cpu`: the rules run over the
    /// events it saw, one rule's check at a time over all the events it
    /// watches (what a check costs is then its loads and compares, not a
    /// dispatch per event).
    #[inline(never)]
    pub(crate) fn on_walk(&mut self, bytes: &[u8], cpu: u32) {
        for i in 0..self.seen.len() {
            let Some(evs) = self.seen.get_mut(i).filter(|v| !v.is_empty()) else {
                continue;
            };
            let evs = std::mem::take(evs);
            self.columns(i, bytes, cpu, &evs);
            if let Some(v) = self.seen.get_mut(i) {
                *v = evs;
                v.clear();
            }
        }
    }

    /// One watched event (`watch`: its entry's `EventEntry::watch`), at `ts`,
    /// recorded on `cpu`: what the encoder's general path shows the rules.
    #[inline(never)]
    pub(crate) fn on_event(&mut self, watch: u16, cpu: u32, ts: u64, rec: &[u8]) {
        let one = [Seen {
            ts,
            at: 0,
            len: rec.len() as u32,
        }];
        self.columns(usize::from(watch).wrapping_sub(1), rec, cpu, &one);
    }

    /// The hooks of watched event `i` over its events `evs` (records in
    /// `bytes`), each hook over all of them in turn.
    fn columns(&mut self, i: usize, bytes: &[u8], cpu: u32, evs: &[Seen]) {
        let Some(&(a, b)) = self.runs.get(i) else {
            return;
        };
        for k in a as usize..b as usize {
            let Some(&op) = self.ops.get(k) else {
                break;
            };
            let Watch {
                sched,
                spans,
                ordered,
                plan,
                to_boot,
                ..
            } = self;
            match op {
                Op::Switch { slot, at } => {
                    let Some(r) = sched.get_mut(usize::from(slot)) else {
                        continue;
                    };
                    for e in evs {
                        if let Some(tid) = e.int(bytes, at) {
                            r.stamp(plan, *to_boot, e.ts, tid, Some(cpu));
                        }
                    }
                }
                Op::Waking { slot, at } => {
                    let Some(r) = sched.get_mut(usize::from(slot)) else {
                        continue;
                    };
                    for e in evs {
                        if let Some(tid) = e.int(bytes, at)
                            && r.filter.as_ref().is_none_or(|p| p.eval(e.rec(bytes), cpu))
                        {
                            r.stamp(plan, *to_boot, e.ts, tid, None);
                        }
                    }
                }
                Op::Check(hk) => self.check(hk, bytes, cpu, evs),
                Op::Span(hook) => {
                    let (Hook::Begin(s) | Hook::End(s)) = hook;
                    let Some(r) = spans.get(usize::from(s)) else {
                        continue;
                    };
                    let (filter, key) = if matches!(hook, Hook::Begin(_)) {
                        &r.begin
                    } else {
                        &r.end
                    };
                    for e in evs {
                        let rec = e.rec(bytes);
                        if filter.as_ref().is_none_or(|p| p.eval(rec, cpu))
                            && let Some(key) = key.read(rec)
                        {
                            ordered.push(Stamp {
                                ts: e.ts,
                                key,
                                hook,
                            });
                        }
                    }
                }
            }
        }
        if self.ordered.len() >= MAX_ORDERED {
            // Pair what is held as it stands rather than grow without bound.
            self.settle(u64::MAX);
        }
    }

    /// An `event` rule's check over `evs`: an `&&` chain leaf by leaf, each
    /// over the events the ones before passed (most rules' first leaf
    /// passes none); an `||` chain each leaf over them all, the events any
    /// passed merged. The matches fire in time order.
    fn check(&mut self, hk: EventHook, bytes: &[u8], cpu: u32, evs: &[Seen]) {
        let Watch {
            leaves,
            trees,
            events,
            plan,
            to_boot,
            pass,
            left,
            ..
        } = self;
        let leaves = leaves
            .get(hk.leaves.0 as usize..hk.leaves.1 as usize)
            .unwrap_or_default();
        let Some(r) = events.get_mut(usize::from(hk.slot)) else {
            return;
        };
        let all = 0..evs.len() as u32;
        pass.clear();
        match leaves.split_first() {
            // No filter: every event matches.
            None => return r.fire(plan, *to_boot, bytes, cpu, evs.iter()),
            Some((first, rest)) if hk.all => {
                first.sift(trees, bytes, cpu, evs, all, |k, p| {
                    if p {
                        pass.push(k)
                    }
                });
                for leaf in rest {
                    if pass.is_empty() {
                        break;
                    }
                    std::mem::swap(pass, left);
                    pass.clear();
                    leaf.sift(trees, bytes, cpu, evs, left.iter().copied(), |k, p| {
                        if p {
                            pass.push(k)
                        }
                    });
                }
            }
            // Each comparison over every event, what passes gathered: with
            // the usual comparison that most events fail there is nothing
            // to narrow, and a list of what failed would cost more than
            // the tests it saves.
            Some(_) => {
                for leaf in leaves {
                    leaf.sift(trees, bytes, cpu, evs, all.clone(), |k, p| {
                        if p {
                            pass.push(k)
                        }
                    });
                }
                pass.sort_unstable();
                pass.dedup();
            }
        }
        r.fire(
            plan,
            *to_boot,
            bytes,
            cpu,
            pass.iter().filter_map(|&k| evs.get(k as usize)),
        );
    }

    /// The end of a drain that began at `cutoff` (trace clock; `u64::MAX`
    /// for the last): pairs the latency events older than it, in time
    /// order.
    pub fn settle(&mut self, cutoff: u64) {
        for r in &mut self.sched {
            r.settle(&self.plan, self.to_boot, cutoff);
        }
        if self.ordered.is_empty() {
            return;
        }
        // Stable: each CPU's run is in order already, so this merges runs.
        self.ordered.sort_by_key(|s| s.ts);
        let n = self.ordered.partition_point(|s| s.ts < cutoff);
        let mut held = std::mem::take(&mut self.ordered);
        for s in held.drain(..n) {
            self.pair(s);
        }
        self.ordered = held;
    }

    fn pair(&mut self, s: Stamp) {
        let boot = self.boot(s.ts);
        match s.hook {
            Hook::Begin(i) => {
                let r = &mut self.spans[usize::from(i)];
                if r.open.len() >= MAX_PENDING {
                    forget_older_half(&mut r.open);
                }
                r.open.insert(s.key, s.ts);
            }
            Hook::End(i) => {
                let r = &mut self.spans[usize::from(i)];
                if let Some(b) = r.open.remove(&s.key) {
                    let took = s.ts.saturating_sub(b);
                    if took > r.over {
                        self.plan.matched(r.rule, &mut r.limiter, boot, || {
                            format!("a span of {:.3} ms", took as f64 / 1e6)
                        });
                    }
                }
            }
        }
    }

    /// After the last drain: for each `freeze` rule whose trigger the kernel
    /// took (`armed`: its events) and that matched, how long after its
    /// match the last event of any CPU was (`last_ts`, trace clock), in the
    /// rule's tally.
    pub(crate) fn note_freeze(&self, last_ts: u64, armed: &[(String, String)]) {
        for r in &self.events {
            if let Some(Some(at)) = r.freeze
                && armed.contains(&r.event)
                && let Some(t) = self.plan.tallies.get(r.rule)
            {
                let after = last_ts.saturating_sub(at);
                t.frozen_after_ns
                    .store(after, std::sync::atomic::Ordering::Relaxed);
                log::info!(
                    "freeze: the kernel's buffers hold events up to {:.1} µs after the match of rule {:?}",
                    after as f64 / 1e3,
                    self.plan.rules.get(r.rule).map_or("", |r| r.name.as_str())
                );
            }
        }
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Forgets the older half of `map` (by its time values).
fn forget_older_half(map: &mut KeyMap) {
    let mut times: Vec<u64> = map.values().copied().collect();
    let mid = times.len() / 2;
    let (_, median, _) = times.select_nth_unstable(mid);
    let median = *median;
    map.retain(|_, t| *t >= median);
}

#[cfg(test)]
mod tests;
