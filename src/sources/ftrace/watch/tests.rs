use super::filter::IntTest;
use super::*;
use crate::config::rule::{FilterOp, parse_text};
use crate::sources::ftrace::format::FieldKind;
use crate::sources::rules::Tally;

fn format(group: &str, name: &str) -> EventFormat {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ftrace/tree/events")
        .join(group)
        .join(name)
        .join("format");
    parse_event_format(group, &std::fs::read_to_string(p).expect("fixture format")).expect("parses")
}

/// A record of `f` with the given fields set (integers or text).
fn record(f: &EventFormat, set: &[(&str, &str)]) -> Vec<u8> {
    let size = f
        .fields
        .iter()
        .map(|x| x.offset + x.size)
        .max()
        .unwrap_or(8);
    let mut rec = vec![0u8; size];
    rec[..2].copy_from_slice(&f.id.to_le_bytes());
    for (name, value) in set {
        let field = f.field(name).unwrap_or_else(|| panic!("no {name}"));
        let at = field.offset;
        match field.kind {
            FieldKind::Int => {
                let v: i64 = value.parse().expect("an integer");
                rec[at..at + field.size].copy_from_slice(&v.to_le_bytes()[..field.size]);
            }
            _ => rec[at..at + value.len()].copy_from_slice(value.as_bytes()),
        }
    }
    rec
}

fn rule(text: &str) -> Rule {
    parse_text("r", text).expect("parses").remove(0)
}

fn program(text: &str, f: &EventFormat) -> Result<Program, String> {
    let r = rule(text);
    let Condition::Event {
        filter: Some(filter),
        ..
    } = &r.condition
    else {
        panic!("an event rule with a filter")
    };
    compile(&r, filter, f).map_err(|e| e.to_string())
}

#[test]
fn filters_read_the_raw_record_as_the_kernel_would() {
    let sw = format("sched", "sched_switch");
    let rec = record(
        &sw,
        &[
            ("prev_comm", "myapp"),
            ("prev_pid", "42"),
            ("prev_state", "2"),
            ("next_comm", "swapper/1"),
            ("next_pid", "-1"),
        ],
    );
    for (filter, want) in [
        (r#"prev_comm == "myapp" && prev_state & 2"#, true),
        (r#"prev_comm == myapp && prev_state & 1"#, false),
        (r#"prev_comm ~ "my*""#, true),
        (r#"next_comm ~ "swapper/*" && next_pid < 0"#, true),
        (r#"!(prev_pid == 42)"#, false),
        (r#"prev_pid == 0x2a || prev_pid == 1"#, true),
        (r#"prev_pid >= 43"#, false),
        (r#"CPU == 3"#, true),
        (r#"common_pid == 0 && prev_comm != "other""#, true),
    ] {
        let p = program(&format!("x: event sched/sched_switch if {filter}"), &sw)
            .unwrap_or_else(|e| panic!("{filter}: {e}"));
        assert_eq!(p.eval(&rec, 3), want, "{filter}");
    }
    // A record too short for the field never matches.
    let p = program("x: event sched/sched_switch if next_pid == 0", &sw).expect("compiles");
    assert!(!p.eval(&rec[..20], 0));
}

#[test]
fn compile_errors_name_the_field_and_suggest() {
    let sw = format("sched", "sched_switch");
    let e = program("x: event sched/sched_switch if prev_stat & 2", &sw).expect_err("refused");
    assert!(
        e.contains("r:1:32: error: sched/sched_switch has no field prev_stat"),
        "{e}"
    );
    assert!(e.contains("did you mean prev_state?"), "{e}");
    let e = program("x: event sched/sched_switch if prev_pid ~ \"1*\"", &sw).expect_err("refused");
    assert!(e.contains("prev_pid is an integer"), "{e}");
    let e = program("x: event sched/sched_switch if prev_comm > \"a\"", &sw).expect_err("refused");
    assert!(e.contains("prev_comm is text"), "{e}");
    let e = program("x: event sched/sched_switch if prev_pid == many", &sw).expect_err("refused");
    assert!(e.contains("\"many\" is not a number"), "{e}");
    let e = program("x: event sched/sched_switch if COMM == \"a\"", &sw).expect_err("refused");
    assert!(e.contains("is not in the sched/sched_switch record"), "{e}");
}

fn table() -> EventTable {
    let mut t = EventTable::new();
    t.insert(format("sched", "sched_switch"), true);
    t.insert(format("sched", "sched_waking"), true);
    t
}

/// The one rule `text` compiled against [`table`]: its plan, its watch,
/// and the table (with the events it watches marked).
fn watch_of(text: &str) -> (RulePlan, Watch, EventTable) {
    let plan = RulePlan::new(vec![rule(text)]);
    let mut t = table();
    let w = Watch::new(&plan, &mut t, 0)
        .expect("compiles")
        .expect("watches");
    (plan, w, t)
}

/// `sched/NAME`'s `EventEntry::watch` in `t`.
fn watched(t: &EventTable, name: &str) -> u16 {
    t.find("sched", name).expect("in the table").1.watch
}

/// The one rule's matched, fired and held back.
fn tally(plan: &RulePlan) -> (u64, u64, u64) {
    let t = plan.tallies.get(0).expect("a tally");
    (
        Tally::load(&t.matched),
        Tally::load(&t.fired),
        Tally::load(&t.suppressed),
    )
}

/// The one firing `plan` queued, which must say `note`: its time.
fn fired_once(plan: &RulePlan, note: &str) -> u64 {
    let f = plan.queue.take();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].note.contains(note), "{}", f[0].note);
    f[0].ts_ns
}

/// A watch of the one latency rule `text`: its plan, the watch, the
/// `EventEntry::watch` of sched_switch and sched_waking, and their formats.
fn latency_watch(text: &str) -> (RulePlan, Watch, u16, u16, EventFormat, EventFormat) {
    let (plan, w, t) = watch_of(text);
    let (sw_id, wk_id) = (watched(&t, "sched_switch"), watched(&t, "sched_waking"));
    let (sw, wk) = (
        format("sched", "sched_switch"),
        format("sched", "sched_waking"),
    );
    (plan, w, sw_id, wk_id, sw, wk)
}

#[test]
fn event_rules_fire_within_their_bounds() {
    let (plan, mut w, t) =
        watch_of("x: event sched/sched_switch if prev_state & 2 count 3 rate 1/10ms");
    let id = watched(&t, "sched_switch");
    assert_ne!(id, 0);
    assert_eq!(watched(&t, "sched_waking"), 0);
    let sw = format("sched", "sched_switch");
    let hit = record(&sw, &[("prev_state", "2")]);
    let miss = record(&sw, &[("prev_state", "1")]);
    for i in 0..1000u64 {
        w.on_event(id, 0, i * 1_000_000, if i % 2 == 0 { &hit } else { &miss });
    }
    let firings = plan.queue.take();
    assert_eq!(
        firings
            .iter()
            .map(|f| f.ts_ns / 1_000_000)
            .collect::<Vec<_>>(),
        [0, 10, 20]
    );
    assert_eq!(tally(&plan), (500, 3, 497));
}

/// A rule with no filter matches every event of a walk: all are counted
/// (once for the walk), those its limits admit fire, in time order, each
/// naming its event's pid.
#[test]
fn a_rule_matching_every_event_of_a_walk_counts_them_all() {
    let (plan, mut w, t) = watch_of("x: event sched/sched_switch count 3 rate 1/10ms");
    let id = watched(&t, "sched_switch");
    let sw = format("sched", "sched_switch");
    let mut bytes = Vec::new();
    for i in 0..1000u64 {
        let rec = record(&sw, &[("common_pid", &(100 + i).to_string())]);
        w.saw(id, i * 1_000_000, bytes.len(), rec.len());
        bytes.extend(&rec);
    }
    w.on_walk(&bytes, 1);
    let firings = plan.queue.take();
    assert_eq!(
        firings
            .iter()
            .map(|f| (f.ts_ns / 1_000_000, f.note.as_str()))
            .collect::<Vec<_>>(),
        [
            (0, "pid 100 on cpu 1"),
            (10, "pid 110 on cpu 1"),
            (20, "pid 120 on cpu 1")
        ]
    );
    assert_eq!(tally(&plan), (1000, 3, 997));
}

#[test]
fn scheduling_latency_pairs_events_read_out_of_order() {
    let (plan, mut w, sw_id, wk_id, sw, wk) =
        latency_watch("slow: latency sched > 50ms if comm == \"sleeper\" rate 10/1s");
    let ms = 1_000_000u64;
    // CPU 0 is drained first: its switch (the sleeper running 400 ms after
    // its wakeup) comes before CPU 1's wakeup in the drain.
    w.on_event(sw_id, 0, 500 * ms, &record(&sw, &[("next_pid", "77")]));
    w.on_event(sw_id, 0, 510 * ms, &record(&sw, &[("next_pid", "88")]));
    w.on_event(
        wk_id,
        1,
        100 * ms,
        &record(&wk, &[("comm", "sleeper"), ("pid", "77")]),
    );
    w.on_event(
        wk_id,
        1,
        505 * ms,
        &record(&wk, &[("comm", "other"), ("pid", "88")]),
    );
    // Another wakeup after the cut, its switch not read yet.
    w.on_event(
        wk_id,
        1,
        900 * ms,
        &record(&wk, &[("comm", "sleeper"), ("pid", "77")]),
    );
    w.settle(800 * ms);
    assert_eq!(fired_once(&plan, "tid 77 waited 400.000 ms"), 500 * ms);
    // The held wakeup pairs with its switch in the next drain.
    w.on_event(sw_id, 0, 990 * ms, &record(&sw, &[("next_pid", "77")]));
    w.settle(u64::MAX);
    assert_eq!(plan.queue.take().len(), 1);
}

/// A wakeup of a thread still on its CPU (woken on its way to sleep) is
/// served by the run it is in: after that run its next wakeup counts, not
/// the old one, however long it ran.
#[test]
fn a_wakeup_while_running_is_served_by_that_run() {
    let (plan, mut w, sw_id, wk_id, sw, wk) = latency_watch("slow: latency sched > 50ms");
    let ms = 1_000_000u64;
    let switch = |prev: &str, next: &str| record(&sw, &[("prev_pid", prev), ("next_pid", next)]);
    let wake = |pid: &str| record(&wk, &[("pid", pid)]);
    w.on_event(sw_id, 0, 0, &switch("0", "77"));
    // Woken while running, then 100 ms on the CPU before it sleeps.
    w.on_event(wk_id, 1, ms, &wake("77"));
    w.on_event(sw_id, 0, 101 * ms, &switch("77", "0"));
    // Woken again, and on a CPU 1 ms later: it waited 1 ms, not 101.
    w.on_event(wk_id, 1, 200 * ms, &wake("77"));
    w.on_event(sw_id, 0, 201 * ms, &switch("0", "77"));
    // Preempted, and back 80 ms later: runnable, but not woken.
    w.on_event(sw_id, 0, 300 * ms, &switch("77", "88"));
    w.on_event(sw_id, 0, 380 * ms, &switch("88", "77"));
    w.settle(u64::MAX);
    let f = plan.queue.take();
    assert!(f.is_empty(), "{f:?}");
    // A wakeup it then waits on still fires.
    w.on_event(sw_id, 0, 400 * ms, &switch("77", "0"));
    w.on_event(wk_id, 1, 500 * ms, &wake("77"));
    w.on_event(sw_id, 0, 570 * ms, &switch("0", "77"));
    w.settle(u64::MAX);
    fired_once(&plan, "tid 77 waited 70.000 ms");
}

/// The idle task, switched to and from all the time, leaves the wakeup of
/// a thread whose tid shares its place (tid 65536) alone.
#[test]
fn switches_to_idle_leave_other_threads_wakeups_alone() {
    let (plan, mut w, sw_id, wk_id, sw, wk) = latency_watch("slow: latency sched > 50ms");
    let ms = 1_000_000u64;
    w.on_event(wk_id, 0, 0, &record(&wk, &[("pid", "65536")]));
    for i in 1..60 {
        let next = if i % 2 == 0 { "0" } else { "5" };
        w.on_event(sw_id, 1, i * ms, &record(&sw, &[("next_pid", next)]));
    }
    w.on_event(sw_id, 0, 60 * ms, &record(&sw, &[("next_pid", "65536")]));
    w.settle(u64::MAX);
    fired_once(&plan, "tid 65536 waited 60.000 ms");
}

#[test]
fn spans_pair_begin_and_end_by_key() {
    let (plan, mut w, t) = watch_of(
        "iter: latency sched/sched_waking if comm ~ \"B*\" to sched/sched_waking if comm ~ \"E*\" by pid > 100ms",
    );
    let id = watched(&t, "sched_waking");
    let wk = format("sched", "sched_waking");
    let ms = 1_000_000u64;
    let ev = |c: &str, pid: &str| record(&wk, &[("comm", c), ("pid", pid)]);
    w.on_event(id, 0, 0, &ev("Begin", "1"));
    w.on_event(id, 0, 10 * ms, &ev("Begin", "2"));
    w.on_event(id, 0, 50 * ms, &ev("End", "1"));
    w.on_event(id, 1, 300 * ms, &ev("End", "2"));
    w.settle(u64::MAX);
    assert_eq!(fired_once(&plan, "290.000 ms"), 300 * ms);
}

proptest::proptest! {
    /// The branch-free integer test agrees with the comparison it stands
    /// for, signed and unsigned, at the edges too.
    #[test]
    fn int_tests_compare_as_the_operator_says(
        raw in proptest::prop_oneof![proptest::prelude::any::<u64>(), 0u64..4, Just(u64::MAX), Just(1u64 << 63), Just((1u64 << 63) - 1)],
        value in proptest::prop_oneof![proptest::prelude::any::<i64>(), -3i64..4, Just(i64::MIN), Just(i64::MAX)],
        op in 0usize..7,
        signed in proptest::prelude::any::<bool>(),
    ) {
        use proptest::prelude::*;
        let op = [FilterOp::Eq, FilterOp::Ne, FilterOp::Lt, FilterOp::Le, FilterOp::Gt, FilterOp::Ge, FilterOp::BitAnd][op];
        let value = if signed { i128::from(value) } else { i128::from(value as u64) };
        let want = if signed {
            let (v, x) = (raw as i64, value as i64);
            match op {
                FilterOp::Eq => v == x,
                FilterOp::Ne => v != x,
                FilterOp::Lt => v < x,
                FilterOp::Le => v <= x,
                FilterOp::Gt => v > x,
                FilterOp::Ge => v >= x,
                _ => v & x != 0,
            }
        } else {
            let (v, x) = (raw, value as u64);
            match op {
                FilterOp::Eq => v == x,
                FilterOp::Ne => v != x,
                FilterOp::Lt => v < x,
                FilterOp::Le => v <= x,
                FilterOp::Gt => v > x,
                FilterOp::Ge => v >= x,
                _ => v & x != 0,
            }
        };
        prop_assert_eq!(IntTest::new(op, value, signed).test(raw), want);
    }
}

use proptest::prelude::Just;

/// The model of a latency rule: every event in time order, a thread's
/// first wakeup since it last ran paired with its next switch-in; none
/// counts while it runs, from its switch-in until the CPU it was switched
/// in on switches to another. Events are `(ts, cpu, wake, tid)`: a wakeup
/// of `tid`, or a switch on `cpu` to `tid`.
fn latency_matches(events: &[(u64, u32, bool, i64)], over: u64) -> u64 {
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.0);
    let mut woken = HashMap::new();
    let mut running = std::collections::HashSet::new();
    let mut on_cpu = HashMap::new();
    let mut matched = 0;
    for (ts, cpu, wake, tid) in sorted {
        if wake {
            // The idle task (tid 0) is never woken.
            if tid != 0 && !running.contains(&tid) {
                woken.entry(tid).or_insert(ts);
            }
            continue;
        }
        if let Some(prev) = on_cpu.insert(cpu, tid)
            && prev != tid
        {
            running.remove(&prev);
            woken.remove(&prev);
        }
        running.insert(tid);
        if let Some(w) = woken.remove(&tid)
            && ts - w > over
        {
            matched += 1;
        }
    }
    matched
}

proptest::proptest! {
    /// However the CPUs' events are spread over drains (each drain reads
    /// every CPU at least up to its start, CPU after CPU), the per-CPU
    /// runs merged at each drain's end pair as one time-ordered stream.
    #[test]
    fn latency_pairs_as_if_every_event_came_in_time_order(
        events in proptest::collection::vec((0u32..4, proptest::bool::ANY, 0i64..6, 1u64..30), 1..200),
        drains in proptest::collection::vec((1u64..400, proptest::collection::vec(0u64..60, 4)), 1..8),
        seconds in proptest::bool::ANY,
    ) {
        // In milliseconds, or in fifths of a second (up to 20 minutes: the
        // times are counted from a base that moves drain after drain).
        let (ms, over) = if seconds { (200_000_000u64, "4s") } else { (1_000_000, "20ms") };
        let (plan, mut w, sw_id, wk_id, sw, wk) =
            latency_watch(&format!("slow: latency sched > {over}"));
        // Unique, increasing times; each CPU's events in its order.
        let mut ts = 0;
        let timed: Vec<(u32, u64, bool, i64)> = events
            .iter()
            .map(|&(cpu, wake, tid, dt)| {
                ts += dt * ms;
                (cpu, ts, wake, tid)
            })
            .collect();
        // Each drain: where it cuts, and how far it reads each CPU (past the
        // cut, by `reads`); the last reads everything and pairs all.
        let mut cutoff = 0;
        let mut plan_of_drains: Vec<(u64, Vec<u64>)> = drains
            .iter()
            .map(|(step, reads)| {
                cutoff += step * ms;
                (cutoff, reads.iter().map(|r| cutoff + r * ms).collect())
            })
            .collect();
        plan_of_drains.push((u64::MAX, vec![u64::MAX; 4]));
        let mut fed = [0usize; 4];
        for (cut, limits) in &plan_of_drains {
            for cpu in 0..4u32 {
                let mine: Vec<_> = timed.iter().filter(|e| e.0 == cpu).collect();
                let at = &mut fed[cpu as usize];
                // Odd CPUs' events as one walk, even ones' one by one.
                let mut walk = Vec::new();
                while let Some(e) = mine.get(*at).filter(|e| e.1 < limits[cpu as usize]) {
                    let pid = e.3.to_string();
                    let rec = if e.2 {
                        record(&wk, &[("pid", &pid)])
                    } else {
                        record(&sw, &[("next_pid", &pid)])
                    };
                    let id = if e.2 { wk_id } else { sw_id };
                    if cpu % 2 == 1 {
                        w.saw(id, e.1, walk.len(), rec.len());
                        walk.extend(&rec);
                    } else {
                        w.on_event(id, cpu, e.1, &rec);
                    }
                    *at += 1;
                }
                w.on_walk(&walk, cpu);
            }
            w.settle(*cut);
        }
        let model: Vec<_> = timed.iter().map(|e| (e.1, e.0, e.2, e.3)).collect();
        proptest::prop_assert_eq!(tally(&plan).0, latency_matches(&model, 20 * ms));
    }
}

/// A filter of `sched_switch` built from `leaves` (indexes into a list of
/// comparisons) joined as `joins` say: `&&`, `||`, or a nested group.
fn switch_filter(leaves: &[(usize, u8)], joins: &[u8]) -> String {
    const COMMS: [&str; 3] = ["myapp", "other", "my"];
    let leaf = |&(kind, v): &(usize, u8)| -> String {
        let v = i64::from(v % 4);
        let comm = COMMS[v as usize % 3];
        match kind % 8 {
            0 => format!("prev_state & {v}"),
            1 => format!("next_pid == {}", v - 2),
            2 => format!("next_pid < {}", v - 1),
            3 => format!("prev_comm == \"{comm}\""),
            4 => format!("prev_comm != \"{comm}\""),
            5 => format!("prev_comm ~ \"{comm}*\""),
            6 => format!("CPU >= {}", v % 3),
            _ => format!("!(next_pid >= {v})"),
        }
    };
    let mut text = leaf(&leaves[0]);
    for (l, j) in leaves[1..].iter().zip(joins) {
        text = match j % 3 {
            0 => format!("{text} && {}", leaf(l)),
            1 => format!("{text} || {}", leaf(l)),
            _ => format!("({text}) && ({} || prev_state & 1)", leaf(l)),
        };
    }
    text
}

proptest::proptest! {
    /// A walk's events checked rule by rule, leaf by leaf, match exactly
    /// the events the filter's tree passes one by one, and fire in time
    /// order.
    #[test]
    fn a_walk_fires_the_events_each_filter_passes(
        leaves in proptest::collection::vec((0usize..8, proptest::num::u8::ANY), 1..5),
        joins in proptest::collection::vec(proptest::num::u8::ANY, 4),
        events in proptest::collection::vec((0u8..4, -3i64..3, 0usize..6), 1..60),
        cpu in 0u32..3,
    ) {
        let filter = switch_filter(&leaves, &joins);
        let text = format!("x: event sched/sched_switch if {filter} count 1");
        let sw = format("sched", "sched_switch");
        let oracle = program(&text, &sw).expect("compiles");
        let (plan, mut w, t) = watch_of(&text);
        let id = watched(&t, "sched_switch");
        // One walk: the records one after another, as on a page.
        let mut bytes = vec![0u8; 4];
        let mut want = Vec::new();
        for (i, &(state, pid, comm)) in events.iter().enumerate() {
            let rec = record(&sw, &[
                ("prev_state", &state.to_string()),
                ("next_pid", &pid.to_string()),
                // Names with old bytes after their NUL, as a renamed
                // task's may have, and one with no NUL at all.
                ("prev_comm", ["myapp", "other", "mine", "my\0pp", "myapp\0xyz", "myappmyappmyappm"][comm]),
            ]);
            let ts = 1_000 + i as u64;
            if oracle.eval(&rec, cpu) {
                want.push(ts);
            }
            w.saw(id, ts, bytes.len(), rec.len());
            bytes.extend(&rec);
            bytes.extend([0u8; 4]);
        }
        w.on_walk(&bytes, cpu);
        proptest::prop_assert_eq!(tally(&plan).0, want.len() as u64, "{}", filter);
        let fired: Vec<u64> = plan.queue.take().iter().map(|f| f.ts_ns).collect();
        proptest::prop_assert_eq!(fired, want.first().copied().into_iter().collect::<Vec<_>>(), "{}", filter);
    }
}

/// Stamps too far apart to count from one base (over 73 minutes) still
/// pair: the held ones are paired first, as they stand.
#[test]
fn a_wait_longer_than_the_packed_times_still_fires() {
    let (plan, mut w, sw_id, wk_id, sw, wk) = latency_watch("slow: latency sched > 1h");
    let hour = 3_600_000_000_000u64;
    w.on_event(wk_id, 0, 5, &record(&wk, &[("pid", "9")]));
    w.on_event(sw_id, 1, 6, &record(&sw, &[("next_pid", "0")]));
    w.on_event(sw_id, 1, 2 * hour, &record(&sw, &[("next_pid", "9")]));
    let held = |w: &Watch| w.sched.iter().map(|r| r.held()).sum::<usize>();
    // The wakeup was paired when the switch did not fit beside it.
    assert_eq!(held(&w), 1);
    w.settle(u64::MAX);
    let fired = plan.queue.take();
    assert_eq!(
        fired.iter().map(|f| f.ts_ns).collect::<Vec<_>>(),
        [2 * hour]
    );
}
