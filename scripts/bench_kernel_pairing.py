#!/usr/bin/env python3
"""A scheduling-latency rule in user space against the same pairing done in
the kernel, counted over the whole machine, while `stress-ng --switch 2`
runs:

  cargo build --release && sudo python3 scripts/bench_kernel_pairing.py [--rounds 3] [--secs 6]

The recorder's latency rule (`latency sched > 10s`, docs/rules.md) pairs
each wakeup with the switch that puts its thread on a CPU after reading
them from the kernel's buffers: its cost is the recorder's own CPU. The
usual way to do this in the kernel is a BPF program on `sched_waking` and
`sched_switch` keeping each woken thread's time in a map (as the BPF
tools' runqslower does); its cost is paid on every switch and wakeup by
the threads that make them, so it shows in neither tracer's process, only
in what the load gets done. Each row records the same config (the one of
scripts/bench_rules.py); the rows:

- `none`: the recorder, no rules;
- `rule`: the recorder with the latency rule;
- `kernel`: the recorder with no rules, beside a bpftrace program doing the
  rule's pairing in the kernel (needs `bpftrace`).

Per row: stress-ng's bogo ops/s (the whole machine: both CPUs are busy, so
any cost anywhere takes from the load), the recorder's CPU per event, and
bpftrace's own CPU. Rows interleaved, order rotated; prints Markdown, then
the medians and the load average.
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ftrace as bf  # noqa: E402
import bench_rules as br  # noqa: E402

RULE = "d: latency sched > 10s\n"

# The rule's pairing as a BPF program: a woken thread's time kept by tid,
# taken when a switch puts it on a CPU, a wait over 10 s printed.
PROGRAM = """
tracepoint:sched:sched_waking { @q[args->pid] = nsecs; }
tracepoint:sched:sched_switch {
  $t = @q[args->next_pid];
  if ($t) {
    if (nsecs - $t > 10000000000) { printf("slow %d\\n", args->next_pid); }
    delete(@q[args->next_pid]);
  }
}
"""


def kernel_pairing(d):
    """bpftrace running PROGRAM, once its probes are attached."""
    path = os.path.join(d, "pairing.bt")
    with open(path, "w") as f:
        f.write(PROGRAM)
    out = open(os.path.join(d, "bpftrace.out"), "w+")
    proc = subprocess.Popen(["bpftrace", path], stdout=out, stderr=subprocess.STDOUT)
    bf.wait_for(lambda: "Attaching" in open(out.name).read(), "bpftrace's probes")
    time.sleep(1.0)
    return proc


def row(d, secs, kind):
    bpf = kernel_pairing(d) if kind == "kernel" else None
    c0 = bf.tree_cpu(bpf.pid) if bpf else 0.0
    try:
        r = br.cpu_row(d, secs, RULE if kind == "rule" else None)
    finally:
        if bpf:
            bpf_cpu = bf.tree_cpu(bpf.pid) - c0
            bpf.send_signal(signal.SIGINT)
            bpf.wait()
    if "events" not in r:
        raise SystemExit(f"the kernel lost events and the loss rule stopped the row: {r}")
    r["bpf_cpu"] = bpf_cpu if bpf else 0.0
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=int, default=6)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the recorder's ftrace and the BPF program need it")
    for tool in ("stress-ng", "bpftrace"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed")
    kinds = ["none", "rule", "kernel"]
    print(f"# Latency pairing, user space against the kernel: {a.rounds} rounds, "
          f"`stress-ng --switch 2` for {a.secs} s per row; load average {os.getloadavg()[0]:.2f} at the start")
    print()
    print("| round | row | ops/s | ops/s ÷ none | recorder ns/event | bpftrace CPU s | events | kernel lost |")
    print("|---|---|---|---|---|---|---|---|")
    per = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as d:
        for rnd in range(a.rounds):
            order = kinds[rnd % 3:] + kinds[:rnd % 3]
            got = {k: row(d, a.secs, k) for k in order}
            for k in kinds:
                r = got[k]
                ns = r["window"] / r["events"] * 1e9
                rel = r["ops"] / got["none"]["ops"]
                per[k].append((r["ops"], rel, ns))
                print(f"| {rnd + 1} | {k} | {r['ops']:.0f} | {rel:.3f} | {ns:.1f} | {r['bpf_cpu']:.2f} | "
                      f"{r['events']} | {r['lost']} |", flush=True)
    print()
    for k in kinds:
        ops = statistics.median(x[0] for x in per[k])
        rel = statistics.median(x[1] for x in per[k])
        ns = statistics.median(x[2] for x in per[k])
        print(f"- {k}: {ops:.0f} ops/s median, {rel:.3f} of none, recorder {ns:.1f} ns/event")
    print(f"- load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
