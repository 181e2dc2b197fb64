use std::time::Duration;

use super::check::{RuleContext, against};
use super::*;

fn one(text: &str) -> Rule {
    let mut rules = parse_text("r", text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(rules.len(), 1);
    rules.remove(0)
}

fn refused(text: &str) -> String {
    match parse_text("r", text) {
        Ok(_) => panic!("{text}: accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_condition_parses() {
    let r = one("crash: event signal/signal_deliver if sig == 11 freeze");
    assert_eq!(r.name, "crash");
    let Condition::Event { event, filter } = &r.condition else {
        panic!("{:?}", r.condition)
    };
    assert_eq!(event.path(), "signal/signal_deliver");
    let f = filter.as_ref().expect("a filter");
    assert_eq!(r.filter_text(f), "sig == 11");
    assert!(r.freeze.is_some());
    assert_eq!((r.count, r.rate), (DEFAULT_COUNT, DEFAULT_RATE));
    assert_eq!(
        r.slice(r.condition_span),
        "event signal/signal_deliver if sig == 11"
    );

    let r = one(
        r#"j: event sched/sched_switch if comm == "myapp" && prev_state & 2 count 3 rate 2/10s"#,
    );
    let Condition::Event {
        filter: Some(f), ..
    } = &r.condition
    else {
        panic!()
    };
    assert_eq!(f.expr.compares().len(), 2);
    assert_eq!(r.count, 3);
    assert_eq!(r.rate.interval(), Duration::from_secs(5));

    let r = one("slow: latency sched > 50ms if comm ~ \"my*\"");
    assert!(
        matches!(&r.condition, Condition::SchedLatency { over, filter: Some(_) } if *over == Duration::from_millis(50))
    );

    let r =
        one(r#"iter: latency ftrace/print if buf ~ "B|*" to ftrace/print if buf ~ "E|*" > 100ms"#);
    let Condition::Span {
        begin,
        end,
        key,
        over,
        begin_filter,
        end_filter,
    } = &r.condition
    else {
        panic!()
    };
    assert_eq!(
        (begin.path(), end.path()),
        ("ftrace/print".into(), "ftrace/print".into())
    );
    assert_eq!(
        (key.begin.as_str(), key.end.as_str()),
        ("common_pid", "common_pid")
    );
    assert_eq!(*over, Duration::from_millis(100));
    assert_eq!(
        r.filter_text(begin_filter.as_ref().expect("begin filter")),
        r#"buf ~ "B|*""#
    );
    assert_eq!(
        r.filter_text(end_filter.as_ref().expect("end filter")),
        r#"buf ~ "E|*""#
    );

    let r = one("w: latency sched/sched_waking to sched/sched_switch by pid = next_pid > 2ms");
    let Condition::Span { key, .. } = &r.condition else {
        panic!()
    };
    assert_eq!((key.begin.as_str(), key.end.as_str()), ("pid", "next_pid"));

    let r = one("mem: counter meminfo.MemAvailable < 200M");
    let Condition::Counter {
        counter,
        op,
        threshold,
        ..
    } = &r.condition
    else {
        panic!()
    };
    assert_eq!(counter.source, CounterSource::Meminfo);
    assert_eq!(counter.key, "MemAvailable");
    assert_eq!(*op, CounterOp::Lt);
    assert_eq!(*threshold, 200.0 * 1024.0 * 1024.0);
    let r = one("p: counter psi.memory.some > 10%");
    assert!(matches!(&r.condition, Condition::Counter { threshold, .. } if *threshold == 10.0));
    let r = one("big: counter process.python3.11.rss >= 1G");
    let Condition::Counter { counter, .. } = &r.condition else {
        panic!()
    };
    assert_eq!(counter.source, CounterSource::Process("python3.11".into()));
    assert_eq!(counter.key, "rss");

    assert_eq!(one("l: loss").condition, Condition::Loss);
    assert_eq!(one("d: disk-budget then rotate").action, RuleAction::Rotate);
    assert!(
        matches!(one("f: fill 0 > 80%").condition, Condition::Fill { percent, .. } if percent == 80.0)
    );
}

#[test]
fn a_file_skips_comments_and_blank_lines() {
    let rules = parse_text("rules.txt", "# mine\n\n  a: loss\nb: disk-budget  \n").expect("parses");
    assert_eq!(
        rules.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(rules[0].text(), "a: loss");
}

#[test]
fn errors_point_at_the_word_and_suggest() {
    let e = refused("crash: evnt signal/signal_deliver");
    assert!(e.contains("r:1:8: error: unknown condition `evnt`"), "{e}");
    assert!(
        e.contains("\ncrash: evnt signal/signal_deliver\n       ^~~~\n"),
        "{e}"
    );
    assert!(e.contains("note: did you mean `event`?"), "{e}");

    let e = refused("x: event sched/sched_switch if prev_state = 2");
    assert!(
        e.contains("1:43: error: expected an operator after `prev_state`, found `=`"),
        "{e}"
    );
    assert!(
        e.contains("note: the kernel's filter compares with `==`"),
        "{e}"
    );

    let e = refused("x: event sched/sched_switch if prev_state == 2 freze");
    assert!(e.contains("unexpected `freze`"), "{e}");
    assert!(e.contains("did you mean `freeze`?"), "{e}");

    let e = refused("x: event sched");
    assert!(e.contains("\"sched\" is not an event"), "{e}");
    let e = refused("x: latency sched > 50");
    assert!(e.contains("\"50\" is not a duration"), "{e}");
    let e = refused("x event a/b");
    assert!(e.contains("expected `:` after the rule's name"), "{e}");
    let e = refused("x: event a/b if (sig == 1");
    assert!(e.contains("expected `)` to close the `(`"), "{e}");
    let e = refused("x: counter meminfo.MemAvailable < lots");
    assert!(e.contains("\"lots\" is not a number"), "{e}");
    let e = refused("x: loss count 0");
    assert!(e.contains("count \"0\""), "{e}");
    // The line of a file is the file's.
    let e = refused("a: loss\n\nb: los\n");
    assert!(e.contains("r:3:4: error: unknown condition `los`"), "{e}");
}

#[test]
fn hostile_rules_get_bounded_errors() {
    // A 64 KiB filter: refused by size before anything parses it.
    let big = format!(
        "x: event a/b if {}",
        "sig == 1 || ".repeat(6000) + "sig == 2"
    );
    let e = refused(&big);
    assert!(e.contains("a rule is at most 8192"), "{e}");
    assert!(e.len() < 2000, "{}", e.len());
    // Deep nesting is refused, not recursed into.
    let deep = format!(
        "x: event a/b if {}sig == 1{}",
        "(".repeat(200),
        ")".repeat(200)
    );
    assert!(refused(&deep).contains("nests deeper than"));
    let wide = format!("x: event a/b if {}", vec!["sig == 1"; 100].join(" && "));
    assert!(refused(&wide).contains("more than 64 comparisons"));
    // 10^4 rules: one error, at the first rule too many.
    let many: String = (0..10_000).map(|i| format!("r{i}: loss\n")).collect();
    let e = refused(&many);
    assert!(
        e.contains("r:257:1: error: rule 257: a session takes at most 256 rules"),
        "{e}"
    );
    let args: Vec<String> = (0..10_000).map(|i| format!("r{i}: loss")).collect();
    let e = read(&args, &[]).expect_err("refused").to_string();
    assert!(
        e.contains("10000 rules given; a session takes at most 256"),
        "{e}"
    );
    // Unprintable names are refused, shown escaped.
    let e = refused("cr\x07sh: loss");
    assert!(e.contains("U+0007") && !e.contains('\x07'), "{e:?}");
    let e = refused("\u{202e}x: loss");
    assert!(!e.contains('\u{202e}'), "{e:?}");
}

fn spec(text: &str) -> crate::config::RecorderSpec {
    crate::config::load_text(text, "c.cfg", false)
        .expect("loads")
        .validate()
        .expect("valid")
}

const FLIGHT: &str = r#"
buffers { size_kb: 1024 }
data_sources { config { name: "linux.ftrace" ftrace_config { ftrace_events: "sched/sched_switch" ftrace_events: "sched/sched_waking" ftrace_events: "signal/*" } } }
data_sources { config { name: "linux.sys_stats" sys_stats_config { meminfo_period_ms: 100 } } }
trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 60000 triggers { name: "crash" stop_delay_ms: 500 } triggers { name: "slow" } }
"#;

fn check(cfg: &str, rules: &str, ctx: RuleContext) -> Result<(), String> {
    let rules = parse_text("r", rules).expect("parses");
    against(&rules, &spec(cfg), ctx).map_err(|e| e.to_string())
}

#[test]
fn rules_fit_the_config_or_say_what_to_add() {
    let ok = RuleContext::default();
    check(
        FLIGHT,
        "crash: event signal/signal_deliver if sig == 11 freeze\nslow: latency sched > 50ms",
        ok,
    )
    .expect("fits");
    check(FLIGHT, "crash: counter meminfo.MemAvailable < 200M", ok).expect("fits");

    let e = check(FLIGHT, "crashh: loss", ok).expect_err("refused");
    assert!(
        e.contains("trigger_config lists no trigger \"crashh\""),
        "{e}"
    );
    assert!(e.contains("did you mean \"crash\"?"), "{e}");

    let e = check(FLIGHT, "crash: event irq/irq_handler_entry", ok).expect_err("refused");
    assert!(
        e.contains("r:1:14: error: the config does not record irq/irq_handler_entry"),
        "{e}"
    );
    assert!(
        e.contains(
            "add ftrace_events: \"irq/irq_handler_entry\" to data_sources[0].config.ftrace_config"
        ),
        "{e}"
    );

    let e = check(FLIGHT, "crash: counter vmstat.pgmajfault > 10", ok).expect_err("refused");
    assert!(
        e.contains("add vmstat_period_ms: 1000 to data_sources[1].config.sys_stats_config"),
        "{e}"
    );

    let e = check(FLIGHT, "crash: loss then rotate", ok).expect_err("refused");
    assert!(e.contains("--rotate-size"), "{e}");
    check(
        FLIGHT,
        "cut: loss then rotate",
        RuleContext {
            segmented: true,
            ..ok
        },
    )
    .expect("rotates");

    let e = check(FLIGHT, "crash: loss freeze", ok).expect_err("refused");
    assert!(e.contains("applies to `event` rules"), "{e}");
    let e = check(FLIGHT, "crash: disk-budget", ok).expect_err("refused");
    assert!(e.contains("no disk budget"), "{e}");
    let e = check(FLIGHT, "crash: fill 3 > 50%", ok).expect_err("refused");
    assert!(e.contains("no buffer \"3\""), "{e}");
    let e = check(FLIGHT, "crash: loss\ncrash: disk-budget", ok).expect_err("refused");
    assert!(e.contains("a second rule named \"crash\""), "{e}");

    let plain = "buffers { size_kb: 1024 } data_sources { config { name: \"linux.ftrace\" } }";
    let e = check(plain, "crash: loss", ok).expect_err("refused");
    assert!(e.contains("has no trigger_config"), "{e}");
    let start = FLIGHT.replace("STOP_TRACING", "START_TRACING");
    let e = check(&start, "crash: loss", ok).expect_err("refused");
    assert!(e.contains("START_TRACING"), "{e}");
    let clone = FLIGHT.replace("STOP_TRACING", "CLONE_SNAPSHOT");
    let e = check(&clone, "crash: event signal/signal_deliver freeze", ok).expect_err("refused");
    assert!(
        e.contains("only a rule that fires a STOP_TRACING trigger"),
        "{e}"
    );
}

#[test]
fn describe_says_what_each_rule_does() {
    let s = spec(FLIGHT);
    let r = one("crash: event signal/signal_deliver if sig == 11 freeze");
    let d = describe(&r, s.trigger.as_ref());
    assert_eq!(
        d,
        "fires trigger \"crash\" (stops the session after 500 ms) when signal/signal_deliver matches `sig == 11`; at most 10 times, 1 per 10 s; freeze: the kernel stops the ftrace buffers at the event"
    );
}
