//! `counter` rules, evaluated on the packets `linux.sys_stats` and
//! `linux.process_stats` write: the [`Tap`] between such a source and its
//! buffer hands each packet to the [`CounterWatch`], which reads the
//! values a rule names (meminfo and vmstat entries, PSI stall times,
//! a named process's memory) out of it. A rule fires when its comparison
//! becomes true, and again only after it was false in between.

use std::collections::{HashMap, HashSet};

use crate::config::diagnostic::closest;
use crate::config::rule::{Condition, CounterOp, CounterRef, CounterSource, Rule, RuleError};
use crate::config::spec::{RecorderSpec, SourceKind};
use crate::sources::output::PacketOutput;
use crate::sources::rules::{Limiter, RulePlan};
use crate::sources::sys_stats::{
    MEMINFO_KEYS, PSI_CPU_FULL, PSI_CPU_SOME, PSI_IO_FULL, PSI_IO_SOME, PSI_MEMORY_FULL,
    PSI_MEMORY_SOME, VMSTAT_KEYS,
};
use crate::wire::fields::{Value, fields};
use crate::wire::{
    key_value, process_stats, process_stats_process as psp, process_tree, process_tree_process,
    process_tree_thread, psi_sample, sys_stats, trace_packet,
};

/// Processes whose names are remembered at most.
const MAX_NAMES: usize = 1 << 16;

/// What a counter rule reads, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CounterKey {
    /// A `MeminfoCounters` number (values in KiB).
    Meminfo(u64),
    /// A `VmstatCounters` number.
    Vmstat(u64),
    /// A `PsiSample.PsiResource` value.
    Psi(u64),
    /// A process (by name) and a `ProcessStats.Process` field number.
    Process { name: String, field: u32 },
}

/// Which source a key is read from.
fn is_process(k: &CounterKey) -> bool {
    matches!(k, CounterKey::Process { .. })
}

/// The key a counter names, or a refusal pointing at it.
pub(crate) fn resolve(rule: &Rule, c: &CounterRef) -> Result<CounterKey, RuleError> {
    let table = |t: &'static [(&'static str, u32)], what: &str| {
        t.iter()
            .find(|(k, _)| *k == c.key)
            .map(|(_, n)| u64::from(*n))
            .ok_or_else(|| {
                let help = match closest(&c.key, t.iter().map(|(k, _)| *k)) {
                    Some(k) => format!("did you mean {what}.{k}?"),
                    None => format!("the names of /proc/{what}, e.g. {what}.{}", t[0].0),
                };
                rule.error(
                    c.span,
                    format!("{what} has no counter {}", c.key),
                    Some(help),
                )
            })
    };
    Ok(match &c.source {
        CounterSource::Meminfo => CounterKey::Meminfo(table(MEMINFO_KEYS, "meminfo")?),
        CounterSource::Vmstat => CounterKey::Vmstat(table(VMSTAT_KEYS, "vmstat")?),
        CounterSource::Psi => CounterKey::Psi(match c.key.as_str() {
            "cpu.some" => PSI_CPU_SOME,
            "cpu.full" => PSI_CPU_FULL,
            "io.some" => PSI_IO_SOME,
            "io.full" => PSI_IO_FULL,
            "memory.some" => PSI_MEMORY_SOME,
            _ => PSI_MEMORY_FULL,
        }),
        CounterSource::Process(name) => CounterKey::Process {
            name: name.clone(),
            field: match c.key.as_str() {
                "rss" => psp::VM_RSS_KB,
                "rss_anon" => psp::RSS_ANON_KB,
                "rss_file" => psp::RSS_FILE_KB,
                "rss_shmem" => psp::RSS_SHMEM_KB,
                "swap" => psp::VM_SWAP_KB,
                "size" => psp::VM_SIZE_KB,
                "locked" => psp::VM_LOCKED_KB,
                "hwm" => psp::VM_HWM_KB,
                _ => psp::OOM_SCORE_ADJ,
            },
        },
    })
}

/// Checks a counter rule against the counters the config samples: a
/// meminfo or vmstat counter left out of its list is never recorded.
pub(crate) fn check_listed(
    rule: &Rule,
    c: &CounterRef,
    spec: &RecorderSpec,
) -> Result<(), RuleError> {
    let key = resolve(rule, c)?;
    let (meminfo, n, list) = match key {
        CounterKey::Meminfo(n) => (true, n, "meminfo_counters"),
        CounterKey::Vmstat(n) => (false, n, "vmstat_counters"),
        _ => return Ok(()),
    };
    let ok = spec.data_sources.iter().any(|d| match &d.kind {
        SourceKind::SysStats(s) => {
            let l = if meminfo {
                &s.meminfo_counters
            } else {
                &s.vmstat_counters
            };
            l.is_empty() || l.iter().any(|c| c.id as u64 == n)
        }
        _ => false,
    });
    if ok {
        return Ok(());
    }
    Err(rule.error(
        c.span,
        format!("the config's {list} leaves {} out", rule.slice(c.span)),
        Some(format!("add it to {list} (or list none, for all)")),
    ))
}

struct CounterRule {
    rule: usize,
    key: CounterKey,
    op: CounterOp,
    threshold: f64,
    limiter: Limiter,
    /// The comparison held at the last sample.
    held: bool,
    /// PSI: the last (time, total stall ns).
    last: Option<(u64, u64)>,
    /// Processes whose comparison holds now.
    held_pids: HashSet<i64>,
}

/// The counter rules of one stats source.
pub(crate) struct CounterWatch {
    plan: RulePlan,
    rules: Vec<CounterRule>,
    /// Process names by pid (command base name), from process trees.
    names: HashMap<i64, String>,
}

impl CounterWatch {
    /// The counter rules `plan` has for a source of process stats
    /// (`processes`) or of system stats; `None` when there are none.
    pub(crate) fn new(plan: &RulePlan, processes: bool) -> Option<CounterWatch> {
        let rules: Vec<CounterRule> = plan
            .rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match &r.condition {
                Condition::Counter {
                    counter,
                    op,
                    threshold,
                    ..
                } => {
                    let key = resolve(r, counter).ok()?;
                    (is_process(&key) == processes).then(|| CounterRule {
                        rule: i,
                        key,
                        op: *op,
                        threshold: *threshold,
                        limiter: Limiter::of(r),
                        held: false,
                        last: None,
                        held_pids: HashSet::new(),
                    })
                }
                _ => None,
            })
            .collect();
        (!rules.is_empty()).then(|| CounterWatch {
            plan: plan.clone(),
            rules,
            names: HashMap::new(),
        })
    }

    /// One packet the source wrote.
    pub(crate) fn on_packet(&mut self, packet: &[u8]) {
        let mut ts = 0;
        let mut body = None;
        for f in fields(packet).flatten() {
            match (f.number, f.value) {
                (trace_packet::TIMESTAMP, Value::Varint(v)) => ts = v,
                (
                    n @ (trace_packet::SYS_STATS
                    | trace_packet::PROCESS_TREE
                    | trace_packet::PROCESS_STATS),
                    Value::Len(b),
                ) => {
                    body = Some((n, b));
                }
                _ => {}
            }
        }
        match body {
            Some((trace_packet::SYS_STATS, b)) => self.sys_stats(ts, b),
            Some((trace_packet::PROCESS_TREE, b)) => self.process_tree(b),
            Some((_, b)) => self.process_stats(ts, b),
            None => {}
        }
    }

    fn sys_stats(&mut self, ts: u64, b: &[u8]) {
        let mut values: Vec<(u64, f64)> = Vec::new();
        for f in fields(b).flatten() {
            let Value::Len(entry) = f.value else { continue };
            match f.number {
                sys_stats::MEMINFO | sys_stats::VMSTAT => {
                    let (mut k, mut v) = (0, 0);
                    for e in fields(entry).flatten() {
                        match (e.number, e.value) {
                            (key_value::KEY, Value::Varint(x)) => k = x,
                            (key_value::VALUE, Value::Varint(x)) => v = x,
                            _ => {}
                        }
                    }
                    for r in &self.rules {
                        let hit = match r.key {
                            CounterKey::Meminfo(n) => f.number == sys_stats::MEMINFO && n == k,
                            CounterKey::Vmstat(n) => f.number == sys_stats::VMSTAT && n == k,
                            _ => false,
                        };
                        if hit {
                            let scale = if f.number == sys_stats::MEMINFO {
                                1024.0
                            } else {
                                1.0
                            };
                            values.push((k | (u64::from(f.number) << 32), v as f64 * scale));
                        }
                    }
                }
                sys_stats::PSI => {
                    let (mut res, mut total) = (0, 0);
                    for e in fields(entry).flatten() {
                        match (e.number, e.value) {
                            (psi_sample::RESOURCE, Value::Varint(x)) => res = x,
                            (psi_sample::TOTAL_NS, Value::Varint(x)) => total = x,
                            _ => {}
                        }
                    }
                    for i in 0..self.rules.len() {
                        if self.rules[i].key != CounterKey::Psi(res) {
                            continue;
                        }
                        let prev = self.rules[i].last.replace((ts, total));
                        if let Some((t0, s0)) = prev
                            && ts > t0
                        {
                            let share = 100.0 * total.saturating_sub(s0) as f64 / (ts - t0) as f64;
                            self.sample(i, ts, share, 0);
                        }
                    }
                }
                _ => {}
            }
        }
        for i in 0..self.rules.len() {
            let want = match self.rules[i].key {
                CounterKey::Meminfo(n) => n | (u64::from(sys_stats::MEMINFO) << 32),
                CounterKey::Vmstat(n) => n | (u64::from(sys_stats::VMSTAT) << 32),
                _ => continue,
            };
            if let Some(&(_, v)) = values.iter().find(|(k, _)| *k == want) {
                self.sample(i, ts, v, 0);
            }
        }
    }

    fn process_tree(&mut self, b: &[u8]) {
        for f in fields(b).flatten() {
            let Value::Len(p) = f.value else { continue };
            let (mut pid, mut name) = (0i64, None);
            let (pid_field, name_field) = match f.number {
                process_tree::PROCESSES => {
                    (process_tree_process::PID, process_tree_process::CMDLINE)
                }
                process_tree::THREADS => (process_tree_thread::TID, process_tree_thread::NAME),
                _ => continue,
            };
            for e in fields(p).flatten() {
                match (e.number, e.value) {
                    (n, Value::Varint(x)) if n == pid_field => pid = x as i64,
                    (n, Value::Len(s)) if n == name_field && name.is_none() => {
                        let s = String::from_utf8_lossy(s);
                        let base = s.rsplit('/').next().unwrap_or_default().to_string();
                        name = Some(base);
                    }
                    _ => {}
                }
            }
            if let Some(n) = name
                && pid > 0
            {
                if self.names.len() >= MAX_NAMES {
                    self.names.clear();
                }
                // A thread's name does not replace its process's command.
                if f.number == process_tree::PROCESSES || !self.names.contains_key(&pid) {
                    self.names.insert(pid, n);
                }
            }
        }
    }

    fn process_stats(&mut self, ts: u64, b: &[u8]) {
        for f in fields(b).flatten() {
            let (process_stats::PROCESSES, Value::Len(p)) = (f.number, f.value) else {
                continue;
            };
            let mut pid = 0i64;
            let mut vals: Vec<(u32, u64)> = Vec::new();
            for e in fields(p).flatten() {
                match (e.number, e.value) {
                    (psp::PID, Value::Varint(x)) => pid = x as i64,
                    (n, Value::Varint(x)) => vals.push((n, x)),
                    _ => {}
                }
            }
            let Some(name) = self.names.get(&pid).cloned() else {
                continue;
            };
            for i in 0..self.rules.len() {
                let CounterKey::Process { name: want, field } = &self.rules[i].key else {
                    continue;
                };
                if *want != name {
                    continue;
                }
                let field = *field;
                if let Some(&(_, x)) = vals.iter().find(|(n, _)| *n == field) {
                    let v = if field == psp::OOM_SCORE_ADJ {
                        // int32, as a varint of its sign-extended 64 bits.
                        x as i64 as f64
                    } else {
                        x as f64 * 1024.0
                    };
                    self.sample(i, ts, v, pid);
                }
            }
        }
    }

    /// One sample of rule `i`'s counter (of process `pid`, or 0).
    fn sample(&mut self, i: usize, ts: u64, v: f64, pid: i64) {
        let r = &mut self.rules[i];
        let holds = r.op.holds(v, r.threshold);
        let was = if pid == 0 {
            std::mem::replace(&mut r.held, holds)
        } else if holds {
            !r.held_pids.insert(pid)
        } else {
            r.held_pids.remove(&pid);
            true
        };
        if holds && !was {
            let (op, th) = (r.op.as_str(), r.threshold);
            self.plan.matched(r.rule, &mut r.limiter, ts, || {
                if pid == 0 {
                    format!("value {v} {op} {th}")
                } else {
                    format!("pid {pid}: value {v} {op} {th}")
                }
            });
        }
    }
}

/// A stats source's output with its counter rules looking on: each packet
/// goes on to `out`, then to the watch.
pub(crate) struct Tap<'a> {
    pub out: &'a mut dyn PacketOutput,
    pub watch: &'a mut CounterWatch,
}

impl PacketOutput for Tap<'_> {
    fn write_packet(&mut self, packet: &[u8]) {
        self.out.write_packet(packet);
        self.watch.on_packet(packet);
    }

    fn flush(&mut self) {
        self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::encoder::ProtoEncoder;

    fn plan(text: &str) -> RulePlan {
        RulePlan::new(crate::config::rule::parse_text("r", text).expect("parses"))
    }

    fn meminfo_packet(ts: u64, available_kb: u64) -> Vec<u8> {
        let mut buf = vec![0u8; 256];
        let mut e = ProtoEncoder::new(&mut buf);
        e.uint(trace_packet::TIMESTAMP, ts);
        let s = e.begin_nested(trace_packet::SYS_STATS);
        let m = e.begin_nested(sys_stats::MEMINFO);
        e.uint(key_value::KEY, 3);
        e.uint(key_value::VALUE, available_kb);
        e.end_nested(m);
        e.end_nested(s);
        let n = e.finish().expect("fits");
        buf.truncate(n);
        buf
    }

    #[test]
    fn a_meminfo_threshold_fires_when_crossed_and_again_after_recovering() {
        let p = plan("low: counter meminfo.MemAvailable < 200M rate 1/1ms");
        let mut w = CounterWatch::new(&p, false).expect("a counter rule");
        assert!(CounterWatch::new(&p, true).is_none(), "not a process rule");
        for (ts, kb) in [
            (1, 500_000),
            (2, 100_000),
            (3, 90_000),
            (4, 300_000),
            (5, 1),
        ] {
            w.on_packet(&meminfo_packet(ts * 1_000_000, kb));
        }
        let fired: Vec<u64> = p.queue.take().iter().map(|f| f.ts_ns / 1_000_000).collect();
        assert_eq!(fired, [2, 5]);
    }

    #[test]
    fn counters_are_resolved_with_suggestions() {
        let r = crate::config::rule::parse_text("r", "x: counter meminfo.MemAvailble < 1M")
            .expect("parses")
            .remove(0);
        let Condition::Counter { counter, .. } = &r.condition else {
            panic!()
        };
        let e = resolve(&r, counter).expect_err("refused").to_string();
        assert!(e.contains("meminfo has no counter MemAvailble"), "{e}");
        assert!(e.contains("did you mean meminfo.MemAvailable?"), "{e}");
    }
}
