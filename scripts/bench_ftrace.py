#!/usr/bin/env python3
"""Side by side on one machine, in one run: the release `recorder`,
`trace-cmd record` and `perf record -a` capturing sched_switch +
sched_wakeup while `stress-ng --switch 2` runs, plus the load alone as the
baseline.

  cargo build --release && sudo python3 scripts/bench_ftrace.py [--secs 10] [--dir /var/tmp]
      [--zstd 1,3] [--rounds N] [--rotate-size 16M]

Per tracer: events recorded, events lost (kernel overruns and lost-event
flags), CPU seconds of the tracer's processes (wait4 rusage: every thread
and waited-for child), output bytes per event against the raw ftrace bytes
per event, and the load's throughput against the untraced baseline.
The recorder's events are counted by decoding its trace with the PyPI
`perfetto` package (perfetto_trace_pb2), not with our own code.

trace-cmd 3.1.x opens /proc/sys/kernel/ftrace_enabled and set_ftrace_*
for writing; in sandboxes that refuse those (EPERM) it is run in a private
mount namespace with plain files bound over them. Prints Markdown.

`--zstd LEVELS` adds a recorder row per zstd level (`--compress=LEVEL`);
`--rotate-size` adds one more at the first level cutting segments of that
size, and reports its write passes and rotations (from `-v` logs).
`--rounds N` repeats every row N times, interleaved (one table per round),
and ends with the medians over the rounds of the two ratios the goals are
stated in: the load's throughput under the recorder ÷ under trace-cmd, and
the recorder's CPU per event while the load runs ÷ trace-cmd's.
`--baseline-bin PATH` adds a row per round for another recorder build (an
A/B of two builds in the same interleaved run).

Each round's header names the CPU model, the kernel and whether the guest
reports free pages to its host: trace-cmd's cost per event is mostly the
kernel copying its raw pages into the page cache, and moves with the host
(a first write to a reported page is faulted in by the host) far more than
the recorder's user-space encoding does.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("RECORDER_BIN") or os.path.join(os.path.dirname(__file__), "..", "target", "release", "recorder")
TRACEFS = "/sys/kernel/tracing"

CONFIG = """
buffers {{ size_kb: 65536 fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "linux.ftrace" ftrace_config {{
  {events}
  compact_sched {{ enabled: true }}
}} }} }}
write_into_file: true
file_write_period_ms: 1000
duration_ms: 3600000
"""

WRAPPER = r"""#!/bin/bash
# Plain files over the ones this sandbox refuses, in this mount namespace only.
set -e
d=$(mktemp -d)
echo 1 > "$d/ftrace_enabled"
mount --bind "$d/ftrace_enabled" /proc/sys/kernel/ftrace_enabled
for f in set_ftrace_pid set_ftrace_filter set_ftrace_notrace set_ftrace_notrace_pid set_graph_function set_graph_notrace; do
  p=/sys/kernel/tracing/$f
  [ -e "$p" ] || continue
  if ! ( : < "$p" ) 2>/dev/null; then touch "$d/$f"; mount --bind "$d/$f" "$p"; fi
done
exec "$@"
"""


def ensure_tools():
    missing = [p for p, b in (("stress-ng", "stress-ng"), ("trace-cmd", "trace-cmd"), ("linux-perf", "perf"))
               if not shutil.which(b)]
    if missing:
        subprocess.run(["apt-get", "install", "-y", *missing], check=True, stdout=subprocess.DEVNULL)


# The stressor and its instance count (`stress-ng --switch 2` unless a
# script sets another, e.g. ("fork", 2) for a heavier mix of events).
LOAD = ("switch", 2)


def load_name():
    return f"stress-ng --{LOAD[0]} {LOAD[1]}"


def load(secs):
    """Runs the load; returns its bogo ops/s."""
    name, n = LOAD
    out = subprocess.run(["stress-ng", f"--{name}", str(n), "--timeout", f"{secs}s", "--metrics-brief"],
                         capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    m = re.search(name + r"\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", text)
    return float(m.group(2)) if m else float("nan")


def wait_for(pred, what, timeout=20.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def tree_cpu(root):
    """CPU seconds so far of `root` and its live descendants (every thread)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        parent[int(pid)] = int(fields[1])
        cpu[int(pid)] = (int(fields[11]) + int(fields[12])) / ticks
    total = 0.0
    for pid, c in cpu.items():
        p = pid
        while p and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += c
    return total


def measured_load(proc, secs):
    """Runs the load while `proc` records: (bogo ops/s, the tracer's CPU
    seconds during the load window only, i.e. without start-up and stop)."""
    c0 = tree_cpu(proc.pid)
    ops = load(secs)
    return ops, tree_cpu(proc.pid) - c0


def stop_and_rusage(proc):
    proc.send_signal(signal.SIGINT)
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime


def packets_of(data):
    """The packets of a trace, zstd_compressed_packets expanded."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    trace = pb.Trace()
    trace.ParseFromString(data)
    for p in trace.packet:
        if p.WhichOneof("data") == "zstd_compressed_packets":
            import zstandard
            inner = pb.Trace()
            inner.ParseFromString(zstandard.ZstdDecompressor().decompress(p.zstd_compressed_packets))
            yield from inner.packet
        else:
            yield p


def decode_recorder(path):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".pftrace"))
    data = b"".join(open(f, "rb").read() for f in files)
    events = lost_bundles = 0
    end_stats = None
    for p in (q for f in files for q in packets_of(open(f, "rb").read())):
        if p.HasField("ftrace_events"):
            b = p.ftrace_events
            events += len(b.event) + len(b.compact_sched.switch_timestamp) + len(b.compact_sched.waking_timestamp)
            lost_bundles += b.lost_events
        if p.HasField("ftrace_stats") and p.ftrace_stats.phase == pb.FtraceStats.END_OF_TRACE:
            end_stats = p.ftrace_stats
    overrun = sum(c.overrun + c.dropped_events for c in end_stats.cpu_stats) if end_stats else None
    return events, lost_bundles, overrun, len(data)


def run_recorder(dirpath, secs, events, extra=(), binary=None):
    cfg = os.path.join(dirpath, "ftrace_bench.cfg")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(events="\n  ".join(f'ftrace_events: "{e}"' for e in events)))
    segmented = any(a.startswith("--rotate") for a in extra)
    out = os.path.join(dirpath, "ftrace_bench_segments/" if segmented else "ftrace_bench.pftrace")
    proc = subprocess.Popen([binary or BIN, "--config", cfg, "-o", out, *extra], stderr=subprocess.PIPE, text=True)
    inst = f"{TRACEFS}/instances/recorder-{proc.pid}"
    wait_for(lambda: read(f"{inst}/tracing_on") == "1", "the recorder's instance")
    ops, window = measured_load(proc, secs)
    cpu = stop_and_rusage(proc)
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"recorder failed ({proc.returncode}): {err}")
    m = re.search(r"linux\.ftrace: (\d+) events from (\d+) bytes of raw pages in \d+ bundles; (\d+) early drains", err)
    logged_events, raw = int(m.group(1)), int(m.group(2))
    events_n, lost_bundles, overrun, size = decode_recorder(out)
    if events_n != logged_events:
        print(f"warning: decoded {events_n} events, the recorder logged {logged_events}", file=sys.stderr)
    passes = [float(x) * {"ms": 1e-3, "µs": 1e-6, "s": 1.0}[u]
              for x, u in re.findall(r"pass \d+: \d+ bytes in ([\d.]+)(ms|µs|s)\b", err)]
    rotations = [float(x) * {"ms": 1e-3, "µs": 1e-6, "s": 1.0}[u]
                 for x, u in re.findall(r"rotation to segment \d+: ([\d.]+)(ms|µs|s)\b", err)]
    if os.path.isdir(out):
        shutil.rmtree(out)
    else:
        os.unlink(out)
    return dict(events=events_n, raw=raw, out=size, lost=f"{overrun} overrun, {lost_bundles} bundles flagged",
                lost_n=overrun + lost_bundles, cpu=cpu, window=window, ops=ops, early=int(m.group(3)),
                passes=passes, rotations=rotations)


def trace_cmd_prefix(dirpath):
    probe = subprocess.run(["trace-cmd", "record", "-e", "sched:sched_switch", "-o", os.path.join(dirpath, "probe.dat"),
                            "true"], capture_output=True, text=True)
    if probe.returncode == 0:
        return [], "as is"
    wrapper = os.path.join(dirpath, "trace_cmd_wrap.sh")
    with open(wrapper, "w") as f:
        f.write(WRAPPER)
    os.chmod(wrapper, 0o755)
    why = (probe.stderr.strip().splitlines() or ["?"])[0]
    return ["unshare", "-m", "--propagation", "private", wrapper], f"in a mount namespace (stock run: {why})"


def event_args(events):
    """`-e group:name` per event, as trace-cmd and perf take them."""
    return [a for e in events for a in ("-e", e.replace("/", ":"))]


def run_trace_cmd(dirpath, secs, prefix, events=("sched/sched_switch", "sched/sched_wakeup")):
    out = os.path.join(dirpath, "ftrace_bench.dat")
    proc = subprocess.Popen([*prefix, "trace-cmd", "record", *event_args(events), "-o", out],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: read(f"{TRACEFS}/events/sched/sched_switch/enable") == "1"
             and read(f"{TRACEFS}/tracing_on") == "1", "trace-cmd to start")
    time.sleep(0.5)  # its per-CPU readers start after the events are on
    ops, window = measured_load(proc, secs)
    cpu = stop_and_rusage(proc)
    text = proc.stdout.read()
    raw = sum(int(x) for x in re.findall(r"\((\d+) uncompressed\)", text))
    if raw == 0:
        raw = sum(int(x) for x in re.findall(r"(\d+) bytes in size", text))
    stat = subprocess.run(["trace-cmd", "report", "--stat", "-i", out], capture_output=True, text=True).stdout
    events = sum(int(x) for x in re.findall(r"read events: (\d+)", stat))
    overrun = sum(int(x) for x in re.findall(r"^overrun: (\d+)", stat, re.M))
    dropped = sum(int(x) for x in re.findall(r"dropped events: (\d+)", stat))
    size = os.path.getsize(out)
    os.unlink(out)
    return dict(events=events, raw=raw, out=size, lost=f"{overrun} overrun, {dropped} dropped", lost_n=overrun + dropped,
                cpu=cpu, window=window, ops=ops, early=None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=10)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--zstd", default="", help="comma-separated zstd levels for extra recorder rows")
    ap.add_argument("--rotate-size", default="", help="one more row: the first zstd level, cut in segments")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--baseline-bin", default="", help="another recorder build: one more row per round")
    args = ap.parse_args()
    ensure_tools()
    levels = [int(x) for x in args.zstd.split(",") if x]
    ratios = []
    for rnd in range(args.rounds):
        ratios.append(one_round(args, levels, rnd))
    if args.rounds > 1:
        def median(xs):
            xs = sorted(xs)
            n = len(xs)
            return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
        print(f"\n### Medians over {args.rounds} rounds\n")
        print("| ratio | per round | median |")
        print("|---|---|---|")
        for key, what in (("ops", "load under the recorder ÷ under trace-cmd (goal ≥ 1)"),
                          ("cpu", "recorder CPU/event while the load runs ÷ trace-cmd's (goal ≤ 1)"),
                          ("base_ops", "load under the recorder ÷ under the baseline build"),
                          ("base_cpu", "recorder CPU/event ÷ the baseline build's"),
                          ("perf_ops", "load under the recorder ÷ under perf record"),
                          ("perf_cpu", "recorder CPU/event in the load window ÷ perf record's"),
                          ("waking_ops", "sched_waking pair: load under the recorder ÷ under trace-cmd"),
                          ("waking_cpu", "sched_waking pair: recorder CPU/event in the load window ÷ trace-cmd's")):
            xs = [r[key] for r in ratios if key in r]
            if xs:
                print(f"| {what} | {', '.join(f'{x:.2f}' for x in xs)} | **{median(xs):.2f}** |")
        print(f"\nLoad average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")


def raw_per_event(r):
    """Raw ftrace bytes per event; perf has no such figure."""
    return "–" if r["raw"] is None else f"{r['raw'] / max(r['events'], 1):.1f}"


def out_vs_raw(r):
    return "" if r["raw"] is None else f" ({r['out'] / max(r['raw'], 1):.3f}×)"


def one_round(args, levels, rnd):
    sw = ["sched/sched_switch", "sched/sched_wakeup"]
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        prefix, how = trace_cmd_prefix(d)
        base = load(args.secs)
        load_before = os.getloadavg()[0]
        rows = [
            ("recorder, sched_switch + sched_wakeup", run_recorder(d, args.secs, sw)),
            (f"trace-cmd {trace_cmd_version()} record ({how})", run_trace_cmd(d, args.secs, prefix)),
        ]
        rows.append(("perf record -a", run_perf(d, args.secs)))
        if args.baseline_bin:
            rows.append(("baseline recorder build, sched_switch + sched_wakeup",
                         run_recorder(d, args.secs, sw, binary=args.baseline_bin)))
        for lvl in levels:
            rows.append((f"recorder --compress={lvl}", run_recorder(d, args.secs, sw, [f"--compress={lvl}"])))
        if args.rotate_size and levels:
            extra = [f"--compress={levels[0]}", "--rotate-size", args.rotate_size, "-v"]
            rows.append((f"recorder --compress={levels[0]} --rotate-size {args.rotate_size}",
                         run_recorder(d, args.secs, sw, extra)))
        if not levels:
            # Perfetto's recommended pair (both in compact_sched), against
            # trace-cmd recording the same events.
            waking = ["sched/sched_switch", "sched/sched_waking"]
            rows.append(("recorder, sched_switch + sched_waking (both compact)",
                         run_recorder(d, args.secs, waking)))
            rows.append(("trace-cmd, sched_switch + sched_waking",
                         run_trace_cmd(d, args.secs, prefix, waking)))
    if args.rounds > 1:
        print(f"\n### Round {rnd + 1} of {args.rounds}\n")
    load_avg = os.getloadavg()
    print(f"`stress-ng --switch 2` for {args.secs} s per row; untraced baseline {base:,.0f} bogo ops/s; "
          f"load average {load_before:.2f} before the round, {load_avg[0]:.2f} after it; "
          f"{os.cpu_count()} CPUs ({host()}).\n")
    print("| tracer | events | rate | lost | CPU s during the load (% of a core) | ns/event | whole run CPU s (ns/event) | raw B/event | output B/event (× raw) | load vs untraced |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        ev = max(r["events"], 1)
        print(f"| {name} | {r['events'] / 1e6:.2f} M | {r['events'] / args.secs / 1e6:.2f} M/s | {r['lost']} | "
              f"{r['window']:.2f} ({100 * r['window'] / args.secs:.1f}%) | {1e9 * r['window'] / ev:.0f} | "
              f"{r['cpu']:.2f} ({1e9 * r['cpu'] / ev:.0f}) | {raw_per_event(r)} | "
              f"{r['out'] / ev:.1f}{out_vs_raw(r)} | {r['ops'] / base:.2f}× |")
    early = [r["early"] for _, r in rows if r["early"] is not None]
    print(f"\nRecorder watermark drains per run: {early}.")
    for name, r in rows:
        if r.get("rotations"):
            p = sorted(r["passes"])
            print(f"\n{name}: {len(r['rotations'])} rotations, longest {1e3 * max(r['rotations']):.1f} ms "
                  f"(median {1e3 * sorted(r['rotations'])[len(r['rotations']) // 2]:.1f} ms); "
                  f"{len(p)} write passes, median {1e3 * p[len(p) // 2]:.1f} ms, longest {1e3 * p[-1]:.1f} ms.")
    rec, tc = rows[0][1], rows[1][1]
    per_event = lambda r: r["window"] / max(r["events"], 1)
    out = dict(ops=rec["ops"] / tc["ops"], cpu=per_event(rec) / per_event(tc))
    named = dict(rows)
    if args.baseline_bin:
        b = named["baseline recorder build, sched_switch + sched_wakeup"]
        out.update(base_ops=rec["ops"] / b["ops"], base_cpu=per_event(rec) / per_event(b))
    pf = named["perf record -a"]
    out.update(perf_ops=rec["ops"] / pf["ops"], perf_cpu=per_event(rec) / per_event(pf))
    wrec = named.get("recorder, sched_switch + sched_waking (both compact)")
    wtc = named.get("trace-cmd, sched_switch + sched_waking")
    if wrec and wtc:
        out.update(waking_ops=wrec["ops"] / wtc["ops"], waking_cpu=per_event(wrec) / per_event(wtc))
    return out


def run_perf(dirpath, secs, events=("sched/sched_switch", "sched/sched_wakeup")):
    """`perf record -a` on the same tracepoints: its samples are the events;
    lost chunks are the LOST records perf reports."""
    out = os.path.join(dirpath, "ftrace_bench.perf.data")
    proc = subprocess.Popen(["perf", "record", *event_args(events), "-a", "-o", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # perf writes its header once the events are open.
    wait_for(lambda: os.path.exists(out) and os.path.getsize(out) > 0, "perf record to start")
    time.sleep(0.5)
    ops, window = measured_load(proc, secs)
    cpu = stop_and_rusage(proc)
    err = proc.stderr.read()
    if proc.returncode not in (0, 130, -2):
        raise SystemExit(f"perf record failed ({proc.returncode}): {err}")
    stat = subprocess.run(["perf", "report", "-i", out, "--stats"], capture_output=True, text=True).stdout
    m = re.search(r"^\s*SAMPLE events:\s*(\d+)", stat, re.M)
    events = int(m.group(1)) if m else 0
    m = re.search(r"^\s*LOST events:\s*(\d+)", stat, re.M)
    lost = int(m.group(1)) if m else 0
    size = os.path.getsize(out)
    os.unlink(out)
    return dict(events=events, raw=None, out=size, lost=f"{lost} lost chunks", lost_n=lost,
                cpu=cpu, window=window, ops=ops, early=None)


def host():
    """The CPU model, the kernel, and whether the guest reports free pages to
    its host: ratios against trace-cmd move with them (with page reporting,
    every page-cache folio trace-cmd fills is faulted in by the host)."""
    model = next((line.split(":", 1)[1].strip() for line in read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), "?")
    reported = read("/sys/module/page_reporting/parameters/reported_kib")
    # This counter is not in every kernel; without it the state is unknown.
    pages = (f"{int(reported) / 2**20:.0f} GiB of free pages reported to the host" if reported.isdigit()
             else "free page reporting unknown")
    return f"{model}, kernel {os.uname().release}, {pages}"


def trace_cmd_version():
    out = subprocess.run(["trace-cmd", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\S+)", out)
    return m.group(1) if m else "?"


if __name__ == "__main__":
    main()
