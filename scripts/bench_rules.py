#!/usr/bin/env python3
"""Trigger rules (docs/rules.md), measured in one run with the release
recorder, as root, while `stress-ng --switch 2` runs:

  cargo build --release && sudo python3 scripts/bench_rules.py [--rounds 3] [--secs 8]

1. CPU per ftrace event with five rules ÷ with none: sched_switch +
   sched_wakeup (compact_sched) and four rarer events, the same
   STOP_TRACING config every time; the recorder's process tree's CPU while
   the load runs, per event it logged. Two sets of five rules, none of
   which fires: `hot`, benches/ftrace.rs's FIVE_RULES (three filtered event
   rules on the load's own events, a scheduling-latency rule, a loss rule:
   every event is watched), and `cold`, a flight recorder's usual five
   (a crash signal, a print marker, a process's exit and start, loss: the
   load's events are not watched); and `every switch`, one rule matching
   every sched_switch, held back by its rate (what a match costs when
   matches are most of the events). Rows interleaved, order rotated.
2. Event → recorder: a CLONE_SNAPSHOT session whose rule matches
   `ftrace/print` markers written at random intervals (50-250 ms) into the
   recorder's instance; the summary's median and longest delay from the
   marker's timestamp to the recorder acting on it, against the drain
   period (100 ms) and the default write period (5 s).
3. Event → frozen: a STOP_TRACING flight recorder (stop delay 0) with
   `crash: event signal/signal_deliver if sig == 11`, a child killed by
   SIGSEGV: how long after the matched event the last kernel event of any
   CPU is in the trace, with `freeze` (the kernel's traceoff trigger) and
   without (the user-space path: the drain that reads it, then the stop).

Prints Markdown; ends with the medians and the load average.

With `--against OTHER_RECORDER` it runs only (1), for this build and the
other interleaved, order rotated, splits `hot` into its three event
rules and its latency rule, and adds `every switch`: what a change to the
rules' evaluation did, each build against its own `none`.
"""
import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ftrace as bf  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BIN = os.environ.get("RECORDER_BIN") or os.path.join(REPO, "target", "release", "recorder")
TRACEFS = "/sys/kernel/tracing"


def five_rules():
    """FIVE_RULES of benches/ftrace.rs, so both benchmarks measure the same."""
    src = open(os.path.join(REPO, "benches", "ftrace.rs")).read()
    m = re.search(r'pub const FIVE_RULES: &str = r#"(.*?)"#;', src, re.S)
    return m.group(1).strip() + "\n"


# Rules on events other than the load's (each watched event costs its
# compare; the others nothing): a flight recorder's usual five.
COLD_RULES = """
a: event signal/signal_deliver if sig == 11
b: event ftrace/print if buf ~ "*ANR*"
c: event sched/sched_process_exit if comm == "myapp"
d: event task/task_newtask if comm == "myapp"
e: loss
"""

# The events COLD_RULES watch.
RULE_EVENTS = ["signal/signal_deliver", "ftrace/print", "sched/sched_process_exit", "task/task_newtask"]

CPU_CONFIG = """
buffers { size_kb: 65536 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" ftrace_config {
""" + "".join(f'  ftrace_events: "{e}"\n' for e in ["sched/sched_switch", "sched/sched_wakeup", *RULE_EVENTS]) + """\
  compact_sched { enabled: true }
} } }
trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 3600000
  triggers { name: "a" } triggers { name: "b" } triggers { name: "c" } triggers { name: "d" } triggers { name: "e" }
  triggers { name: "s" stop_delay_ms: 600000 } }
"""

# One rule matching every sched_switch (most of the load's events), fired
# once by its rate in a row (its stop comes after the row ends).
EVERY_SWITCH = "s: event sched/sched_switch\n"

MARK_CONFIG = """
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" ftrace_config {
  ftrace_events: "ftrace/print"
  ftrace_events: "sched/sched_switch"
} } }
trigger_config { trigger_mode: CLONE_SNAPSHOT trigger_timeout_ms: 3600000 triggers { name: "mark" } }
"""

CRASH_CONFIG = """
buffers { size_kb: 32768 fill_policy: RING_BUFFER }
data_sources { config { name: "linux.ftrace" ftrace_config {
  ftrace_events: "sched/sched_switch"
  ftrace_events: "sched/sched_waking"
  ftrace_events: "signal/signal_deliver"
} } }
trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 3600000 triggers { name: "crash" stop_delay_ms: 0 } }
"""


def start(d, config, extra):
    cfg = os.path.join(d, "rules_bench.cfg")
    with open(cfg, "w") as f:
        f.write(config)
    out = os.path.join(d, "rules_bench.pftrace")
    env = dict(os.environ, RECORDER_RUNTIME_DIR=os.path.join(d, "run"))
    proc = subprocess.Popen([BIN, "--config", cfg, "-o", out, *extra], stderr=subprocess.PIPE, text=True, env=env)
    inst = f"{TRACEFS}/instances/recorder-{proc.pid}"
    bf.wait_for(lambda: bf.read(f"{inst}/tracing_on") == "1", "the recorder's instance")
    time.sleep(0.3)
    return proc, out, inst


def finish(proc, interrupt=True):
    if interrupt:
        proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"recorder failed ({proc.returncode}): {err}")
    return err


def cpu_row(d, secs, rules):
    extra = []
    if rules:
        path = os.path.join(d, "five.rules")
        with open(path, "w") as f:
            f.write(rules)
        extra = ["--trigger-rules", path]
    proc, out, _ = start(d, CPU_CONFIG, extra)
    ops, window = bf.measured_load(proc, secs)
    err = finish(proc)
    m = re.search(r"linux\.ftrace: (\d+) events from", err)
    events = int(m.group(1))
    lost = re.search(r"the kernel lost (\d+) events", err)
    if 'ended: stop trigger "e"' in err:
        # Kernel loss fired the loss rule (`e` of both sets): the row is cut
        # short, and the caller runs it again, saying so.
        return dict(stopped=int(lost.group(1)) if lost else 0)
    if "ended: stopped by a signal" not in err:
        raise SystemExit(f"a benchmark rule fired and stopped the session: {err}")
    return dict(events=events, window=window, ops=ops, lost=int(lost.group(1)) if lost else 0)


def latency_row(d, markers, loaded):
    rule = 'mark: event ftrace/print if buf ~ "rules-bench*" count 1000 rate 1000/1s'
    proc, out, inst = start(d, MARK_CONFIG, ["--trigger-rule", rule])
    load = None
    if loaded:
        load = subprocess.Popen(["stress-ng", "--switch", "2", "--timeout", "600s", "--quiet"])
    with open(f"{inst}/trace_marker", "w") as m:
        for i in range(markers):
            time.sleep(random.uniform(0.05, 0.25))
            m.write(f"rules-bench {i}\n")
            m.flush()
    time.sleep(0.5)
    if load:
        load.send_signal(signal.SIGINT)
        load.wait()
    err = finish(proc)
    m = re.search(r'rule "mark": matched (\d+), fired (\d+).*?event to recorder ([\d.]+) ms median, ([\d.]+) ms most', err)
    if not m:
        raise SystemExit(f"no figures for the rule: {err}")
    # Markers the kernel overwrote before they were read never reach the rule.
    lost = re.search(r"the kernel lost (\d+) events", err)
    return dict(matched=int(m.group(1)), fired=int(m.group(2)), median=float(m.group(3)),
                most=float(m.group(4)), lost=int(lost.group(1)) if lost else 0)


def frozen_row(d, freeze):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb  # noqa: F401
    rule = "crash: event signal/signal_deliver if sig == 11" + (" freeze" if freeze else "")
    proc, out, _ = start(d, CRASH_CONFIG, ["--trigger-rule", rule])
    load = subprocess.Popen(["stress-ng", "--switch", "2", "--timeout", "600s", "--quiet"])
    time.sleep(1.0)
    subprocess.run(["sh", "-c", "kill -SEGV $$"])
    err = finish(proc, interrupt=False)
    load.send_signal(signal.SIGINT)
    load.wait()
    if freeze and "freeze: armed" not in err:
        raise SystemExit(f"freeze was not armed: {err}")
    match = None
    last = 0
    for p in bf.packets_of(open(out, "rb").read()):
        if p.HasField("trigger"):
            match = p.timestamp
        if p.HasField("ftrace_events"):
            b = p.ftrace_events
            for e in b.event:
                last = max(last, e.timestamp)
            for col in (b.compact_sched.switch_timestamp, b.compact_sched.waking_timestamp):
                ts = 0
                for delta in col:
                    ts += delta
                last = max(last, ts)
    os.unlink(out)
    if match is None:
        raise SystemExit(f"no trigger packet: {err}")
    return dict(after_us=(last - match) / 1e3)


def measured_row(d, secs, rules, cut):
    """cpu_row, run again (up to twice) when kernel loss fired the loss rule
    and stopped it; `cut` collects what was run again and why."""
    for _ in range(3):
        v = cpu_row(d, secs, rules)
        if "stopped" not in v:
            return v
        cut.append(f"{v['stopped']:,} events lost")
    raise SystemExit("kernel loss stopped the row three times")


def compare(args):
    """CPU per event of this build and `args.against`, interleaved."""
    global BIN
    hot = five_rules()
    lines = hot.strip().splitlines()
    sets = {
        "none": None,
        "hot": hot,
        "hot's event rules": "\n".join(x for x in lines if " event " in x) + "\n",
        "hot's latency rule": "\n".join(x for x in lines if " latency " in x) + "\n",
        "every switch": EVERY_SWITCH,
    }
    bins = {"this build": BIN, "against": args.against}
    plan = [(b, k) for b in bins for k in sets]
    per = {p: [] for p in plan}
    cut = []
    print(f"# Rules, this build ({BIN}) against {args.against}: {args.rounds} rounds, "
          f"`stress-ng --switch 2` for {args.secs} s per row; {os.cpu_count()} CPUs ({bf.host()}), "
          f"load average {os.getloadavg()[0]:.2f} at the start\n")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for rnd in range(args.rounds):
            shift = rnd % len(plan)
            for b, k in plan[shift:] + plan[:shift]:
                BIN = bins[b]
                v = measured_row(d, args.secs, sets[k], cut)
                per[(b, k)].append(1e9 * v["window"] / max(v["events"], 1))
    print("| build | rules | ns/event per round | median | ÷ its none (median of rounds) |")
    print("|---|---|---|---|---|")
    for b, k in plan:
        xs = per[(b, k)]
        ratios = [x / n for x, n in zip(xs, per[(b, "none")])]
        print(f"| {b} | {k} | {', '.join(f'{x:.1f}' for x in xs)} | {median(xs):.1f} | **{median(ratios):.3f}** |")
    if cut:
        print(f"\nRows run again after kernel loss fired the loss rule: {', '.join(cut)}.")
    print(f"\nLoad average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--markers", type=int, default=40)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--against", help="another recorder binary: compare CPU per event only")
    args = ap.parse_args()
    if not __import__("shutil").which("stress-ng"):
        raise SystemExit("stress-ng is not installed (apt-get install stress-ng)")
    if args.against:
        return compare(args)
    rules = five_rules()
    lat, frozen = {False: [], True: []}, {False: [], True: []}
    print(f"# Trigger rules, {args.rounds} rounds, `stress-ng --switch 2` for {args.secs} s per CPU row; "
          f"{os.cpu_count()} CPUs ({bf.host()}), load average {os.getloadavg()[0]:.2f} at the start\n")
    sets = {"hot": rules, "cold": COLD_RULES.strip() + "\n", "every switch": EVERY_SWITCH}
    ratios = {k: [] for k in sets}
    for rnd in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            order = ["none", *sets]
            order = order[rnd % len(order):] + order[:rnd % len(order)]
            cut = []
            rows = {k: measured_row(d, args.secs, sets.get(k), cut) for k in order}
            per = {k: 1e9 * v["window"] / max(v["events"], 1) for k, v in rows.items()}
            for k in sets:
                ratios[k].append(per[k] / per["none"])
            print(f"## Round {rnd + 1}\n")
            print("| rules | events | CPU s in the load window | ns/event | kernel lost | load (bogo ops/s) |")
            print("|---|---|---|---|---|---|")
            for k in ("none", *sets):
                v = rows[k]
                print(f"| {k} | {v['events'] / 1e6:.2f} M | {v['window']:.2f} | {per[k]:.1f} | {v['lost']} | {v['ops']:,.0f} |")
            print("\nCPU per event ÷ none: " + ", ".join(f"{k} {ratios[k][-1]:.3f}" for k in sets) + "\n")
            if cut:
                print(f"Rows run again after kernel loss fired the loss rule: {', '.join(cut)}\n")
            for loaded in (False, True):
                r = latency_row(d, args.markers, loaded)
                lat[loaded].append(r["median"])
                lost = f", the kernel lost {r['lost']:,} events" if r["lost"] else ""
                print(f"Event → recorder ({'loaded' if loaded else 'idle'}): {r['matched']} of {args.markers} markers{lost}, "
                      f"median {r['median']:.1f} ms, longest {r['most']:.1f} ms\n")
            for freeze in (True, False):
                r = frozen_row(d, freeze)
                frozen[freeze].append(r["after_us"])
                print(f"Event → {'frozen (freeze)' if freeze else 'stopped (no freeze)'}: last kernel event "
                      f"{r['after_us']:,.1f} µs after the match\n")
    print("## Medians\n")
    print("| figure | per round | median |")
    print("|---|---|---|")
    for k in sets:
        xs = ratios[k]
        what = "one rule matching every switch" if k == "every switch" else f"five {k} rules"
        print(f"| CPU per event, {what} ÷ none (goal ≤ 1.1) | {', '.join(f'{x:.3f}' for x in xs)} | **{median(xs):.3f}** |")
    for loaded in (False, True):
        xs = lat[loaded]
        print(f"| event → recorder, {'loaded' if loaded else 'idle'} (ms; goal ≤ one write period, 5000) | "
              f"{', '.join(f'{x:.1f}' for x in xs)} | **{median(xs):.1f}** |")
    for freeze in (True, False):
        xs = frozen[freeze]
        print(f"| event → last kernel event, {'freeze' if freeze else 'no freeze'} (µs) | "
              f"{', '.join(f'{x:,.1f}' for x in xs)} | **{median(xs):,.1f}** |")
    print(f"\nLoad average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")


if __name__ == "__main__":
    main()
