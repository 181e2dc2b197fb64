//! A scheduling-latency rule: each wakeup and switch kept as one packed
//! word until the drain's end, then paired in time order (the wakeups and
//! each CPU's switches merged), a thread's first wakeup since it last ran
//! with its next switch-in.

use super::filter::Program;
use crate::sources::ftrace::event_table::IntAt;
use crate::sources::rules::{Limiter, RulePlan};

/// A latency rule's packed stamps held at most (8 MiB); beyond, they are
/// paired as they stand.
const MAX_HELD: usize = 1 << 20;

/// A `latency sched` rule, and the wakeups and switches it holds.
pub(super) struct SchedRule {
    rule: usize,
    over: u64,
    /// Over the wakeup's record.
    pub(super) filter: Option<Program>,
    /// Where the wakeup's thread id and the switch's are.
    pub(super) pid: IntAt,
    pub(super) next_pid: IntAt,
    limiter: Limiter,
    /// Each thread's wakeup not yet served, or that it is on a CPU.
    woken: Woken,
    /// The thread each CPU last switched to, by CPU.
    on_cpu: Vec<i64>,
    /// Wakeups and switches awaiting their turn.
    held: Held,
}

impl SchedRule {
    /// Rule `rule` of its plan: a wait over `over` ns, from a wakeup
    /// `filter` passes (the tid at `pid`) to the switch to that thread (the
    /// tid at `next_pid`).
    pub(super) fn new(
        rule: usize,
        over: u64,
        filter: Option<Program>,
        pid: IntAt,
        next_pid: IntAt,
        limiter: Limiter,
    ) -> Self {
        SchedRule {
            rule,
            over,
            filter,
            pid,
            next_pid,
            limiter,
            woken: Woken::new(),
            on_cpu: Vec::new(),
            held: Held::new(),
        }
    }

    /// Stamps held, for tests.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held.len
    }

    /// Keeps a wakeup of `tid` (or a switch to it on `cpu`) at `ts` for
    /// pairing; pairs what is held as it stands when there is no room or
    /// the time does not fit.
    #[inline(always)]
    pub(super) fn stamp(
        &mut self,
        plan: &RulePlan,
        to_boot: i64,
        ts: u64,
        tid: i64,
        switch: Option<u32>,
    ) {
        if !self.held.push(ts, tid, switch) {
            self.settle(plan, to_boot, u64::MAX);
            self.held.push(ts, tid, switch);
        }
    }

    /// Pairs the held stamps older than `cutoff`, in time order: the
    /// wakeups and each CPU's switches merged. A switch on a CPU also ends
    /// the run of the thread that CPU last switched to, so a wakeup of a
    /// thread while it runs (on its way to sleep) is served by that run.
    pub(super) fn settle(&mut self, plan: &RulePlan, to_boot: i64, cutoff: u64) {
        let nw = self.held.sort_before(cutoff);
        let Held {
            base,
            wakes,
            switches,
            heads,
            ..
        } = &mut self.held;
        let base = *base;
        let wakes = wakes.get(..nw).unwrap_or_default();
        if self.on_cpu.len() < switches.len() {
            self.on_cpu.resize(switches.len(), -1);
        }
        // The earliest switch of any CPU not yet paired, and the earliest
        // of the other CPUs' (until which that CPU's switches come next):
        // a compare per CPU, once per run of one CPU's switches.
        let earliest = |heads: &[(usize, usize)]| {
            let (mut s, mut cpu, mut bound) = (u64::MAX, usize::MAX, u64::MAX);
            for (c, (&(at, end), list)) in heads.iter().zip(switches.iter()).enumerate() {
                if at < end
                    && let Some(&h) = list.get(at)
                {
                    if h < s {
                        (s, cpu, bound) = (h, c, s);
                    } else if h < bound {
                        bound = h;
                    }
                }
            }
            (s, cpu, bound)
        };
        let mut i = 0;
        let (mut s, mut cpu, mut bound) = earliest(heads);
        loop {
            // A wakeup first at the same time (and tid): it led to the switch.
            if let Some(&w) = wakes.get(i)
                && (cpu == usize::MAX || w <= s)
            {
                let (ts, tid) = Held::unpack(base, w);
                self.woken.wake(tid, ts);
                i += 1;
                continue;
            }
            let (Some(head), Some(last)) = (heads.get_mut(cpu), self.on_cpu.get_mut(cpu)) else {
                break;
            };
            head.0 += 1;
            let (ts, tid) = Held::unpack(base, s);
            match switches.get(cpu).and_then(|v| v.get(head.0)) {
                Some(&next) if head.0 < head.1 && next <= bound => s = next,
                _ => (s, cpu, bound) = earliest(heads),
            }
            // The thread it switched from ran since any wakeup it had. The
            // idle task (tid 0), never woken, takes no place among them.
            if *last > 0 && *last != tid {
                self.woken.ran(*last);
            }
            *last = tid;
            let Some(woke) = (tid > 0).then(|| self.woken.run(tid)).flatten() else {
                continue;
            };
            let waited = ts.saturating_sub(woke);
            if waited > self.over {
                let boot = ts.saturating_add_signed(to_boot);
                plan.matched(self.rule, &mut self.limiter, boot, || {
                    format!(
                        "tid {tid} waited {:.3} ms from its wakeup to a CPU",
                        waited as f64 / 1e6
                    )
                });
            }
        }
        self.held.keep_after(nw, cutoff);
    }
}

/// A latency rule's wakeups and switches, each packed into one word:
/// `[ts − base: 42 bits][tid: 22 bits]`. The kernel's tids are below 2^22
/// (its PID_MAX_LIMIT); 42 bits of nanoseconds are 73 minutes. Comparing
/// words compares times, and a drain's worth, 8 bytes an event, stays in
/// cache where 24-byte stamps did not. The wakeups are a few runs already
/// in time order (one per CPU read since the last drain, and what that
/// drain left), so sorting them merges them; each CPU's switches are one
/// run, kept apart so that pairing knows which CPU a switch ended a run on.
struct Held {
    /// What the times are counted from: `SLACK` before the last drain's
    /// cutoff (or the first stamp), so that a CPU read later whose events
    /// are older than another's still fits.
    base: u64,
    wakes: Vec<u64>,
    /// Each CPU's switches, by CPU.
    switches: Vec<Vec<u64>>,
    /// Pairing's place in each CPU's switches, and where those older than
    /// the cutoff end.
    heads: Vec<(usize, usize)>,
    /// Stamps held.
    len: usize,
}

impl Held {
    const SHIFT: u32 = 22;
    const TID_LIMIT: i64 = 1 << Self::SHIFT;
    const MAX_DELTA: u64 = (1 << (64 - Self::SHIFT)) - 1;
    const SLACK: u64 = 1 << 38;

    fn new() -> Self {
        Held {
            base: u64::MAX,
            wakes: Vec::new(),
            switches: Vec::new(),
            heads: Vec::new(),
            len: 0,
        }
    }

    /// Holds a wakeup, or a switch on CPU `switch`. False when it does not
    /// fit: more than 73 minutes after the base, or `MAX_HELD` held (the
    /// held ones must be paired first). A tid the kernel cannot have is
    /// dropped (and so is a wakeup of the idle task, tid 0, which has
    /// none; a switch to it ends a run). A time before the base (which the
    /// drain's order rules out) counts as the base.
    #[inline(always)]
    fn push(&mut self, ts: u64, tid: i64, switch: Option<u32>) -> bool {
        if self.len == 0 {
            self.base = ts.saturating_sub(Self::SLACK);
        }
        let delta = ts.saturating_sub(self.base);
        if delta > Self::MAX_DELTA || self.len >= MAX_HELD {
            return false;
        }
        if (0..Self::TID_LIMIT).contains(&tid) {
            let w = delta << Self::SHIFT | tid as u64;
            match switch {
                Some(cpu) => {
                    let cpu = cpu as usize;
                    if self.switches.len() <= cpu {
                        self.switches.resize_with(cpu + 1, Vec::new);
                    }
                    if let Some(list) = self.switches.get_mut(cpu) {
                        list.push(w);
                        self.len += 1;
                    }
                }
                None if tid != 0 => {
                    self.wakes.push(w);
                    self.len += 1;
                }
                None => {}
            }
        }
        true
    }

    #[inline(always)]
    fn unpack(base: u64, w: u64) -> (u64, i64) {
        (
            base + (w >> Self::SHIFT),
            (w & (Self::TID_LIMIT as u64 - 1)) as i64,
        )
    }

    /// Orders the held stamps and marks, CPU by CPU, the switches older
    /// than `cutoff` (`heads`); how many wakeups are.
    fn sort_before(&mut self, cutoff: u64) -> usize {
        let limit = match cutoff.checked_sub(self.base) {
            Some(d) if d <= Self::MAX_DELTA => d << Self::SHIFT,
            Some(_) => u64::MAX,
            None => 0,
        };
        let before = |v: &mut Vec<u64>| {
            // Stable and run-aware: this merges the runs (a CPU's
            // switches are one already, unless its clock stepped back).
            if !v.is_sorted() {
                v.sort();
            }
            if limit == u64::MAX {
                v.len()
            } else {
                v.partition_point(|&w| w < limit)
            }
        };
        self.heads.clear();
        for list in &mut self.switches {
            let n = before(list);
            self.heads.push((0, n));
        }
        before(&mut self.wakes)
    }

    /// Forgets the first `nw` wakeups and the switches paired, and counts
    /// the rest from `SLACK` before `cutoff`.
    fn keep_after(&mut self, nw: usize, cutoff: u64) {
        self.wakes.drain(..nw.min(self.wakes.len()));
        for (list, &(at, _)) in self.switches.iter_mut().zip(&self.heads) {
            list.drain(..at.min(list.len()));
        }
        self.len = self.wakes.len() + self.switches.iter().map(Vec::len).sum::<usize>();
        let base = cutoff.saturating_sub(Self::SLACK).max(self.base);
        // The rest are newer than the cutoff, so no delta goes below zero.
        let shift = (base - self.base) << Self::SHIFT;
        let low = self
            .switches
            .iter()
            .filter_map(|v| v.first())
            .chain(self.wakes.first())
            .min();
        if shift == 0 || low.is_none_or(|&w| w < shift) {
            return;
        }
        for w in self
            .wakes
            .iter_mut()
            .chain(self.switches.iter_mut().flatten())
        {
            *w -= shift;
        }
        self.base = base;
    }
}

/// Threads woken and not yet run, direct-mapped by tid: one store to note
/// a wakeup, one compare to find it, no hashing. Two pending threads whose
/// tids share their low 16 bits keep only the later wakeup (a latency of
/// the other is missed): that takes tens of thousands of threads waiting
/// at once.
struct Woken(Vec<(i64, u64)>);

impl Woken {
    const PLACES: usize = 1 << 16;
    /// A place's time when it holds no thread.
    const FREE: u64 = u64::MAX;
    /// A place's time when its thread is on a CPU.
    const RUNNING: u64 = u64::MAX - 1;

    fn new() -> Self {
        Woken(vec![(0, Self::FREE); Self::PLACES])
    }

    #[inline]
    fn place(tid: i64) -> usize {
        tid as usize & (Self::PLACES - 1)
    }

    /// A wakeup of `tid` at `ts`: its first since it last ran counts, and
    /// none while it runs.
    #[inline]
    fn wake(&mut self, tid: i64, ts: u64) {
        if let Some(p) = self.0.get_mut(Self::place(tid))
            && (p.0 != tid || p.1 == Self::FREE)
        {
            *p = (tid, ts);
        }
    }

    /// `tid` is switched in: when it was woken, if it waited.
    #[inline]
    fn run(&mut self, tid: i64) -> Option<u64> {
        let p = self.0.get_mut(Self::place(tid))?;
        let woke = (p.0 == tid && p.1 < Self::RUNNING).then_some(p.1);
        *p = (tid, Self::RUNNING);
        woke
    }

    /// `tid` is switched out: it ran since any wakeup it had.
    #[inline]
    fn ran(&mut self, tid: i64) {
        if let Some(p) = self.0.get_mut(Self::place(tid))
            && p.0 == tid
        {
            p.1 = Self::FREE;
        }
    }
}
