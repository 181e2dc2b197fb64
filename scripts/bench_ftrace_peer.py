#!/usr/bin/env python3
"""The recorder against Perfetto's own tracer (tracebox: `traced` +
`traced_probes` + the `perfetto` client, on private socket paths) and
trace-cmd, on one TraceConfig: sched_switch + sched_wakeup, compact_sched on
and off, a 64 MiB ring, write_into_file every second, while
`stress-ng --switch 2` (or `--load fork:2`, `--load switch:4`) runs. Rows
are interleaved: every round runs each tracer once, in a rotated order.

  cargo build --release && sudo python3 scripts/bench_ftrace_peer.py \\
      [--secs 8] [--rounds 3] [--zstd 1] [--modes mmap,read] [--dir /var/tmp]
      [--load switch:2] [--variants compact,plain] [--serve] [--serve-probes]
      [--rules hot,cold]

  RECORDER_TRACEBOX   tracebox binary (default `tracebox` on PATH)
  RECORDER_BIN        recorder binary (default target/release/recorder)

Per row: events (decoded with the PyPI `perfetto` package, not our code),
events the kernel lost (end FtraceStats overrun + dropped, minus the start
ones, and bundles flagged lost), CPU of every tracer process while the load
runs (recorder: its process tree; Perfetto: traced + traced_probes + the
client), the load's throughput against the untraced baseline, output bytes
per event. `--modes` adds one recorder row per RECORDER_FTRACE_READ mode
(`read@4`: with RECORDER_FTRACE_SUBBUF_KB=4, the kernel's one-page sub-buffers);
`--zstd LEVEL` adds zstd rows on both sides (recorder --compress=LEVEL,
Perfetto `compression { zstd { level } }`). `--serve` adds a row per variant
where the same `perfetto` client talks to a root `recorder serve` in place
of `traced` + `traced_probes`: serve records linux.ftrace with its built-in
source (CPU: serve and its broker, plus the client). `--serve-probes` adds
one with `recorder serve --no-builtin-ftrace` and `traced_probes` reading
ftrace as its producer.

`--rules hot,cold` adds flight-recorder rows, per variant and mode: the
config as a flight recorder (its ring kept to the end, no write_into_file,
which triggers rule out; STOP_TRACING with five triggers, each stopping 10
minutes after it fires, so a firing never ends a row; the four rarer events
the `cold` rules watch recorded too), run by Perfetto, by the recorder with
no rules, and by the recorder with each set of five trigger rules
(`--trigger-rules`; the sets of scripts/bench_rules.py: `hot` watches every
event of the load, `cold` is a flight recorder's usual five on rarer
events). A ring keeps only its last 64 MiB (and writes nothing when no
trigger fired), so these rows count the events the tracer read from the
kernel while the load ran (the `read events` of its tracefs instance's
per-CPU stats; `overrun` + `dropped events` for the loss), not those in the
trace. The ratios add each rule row against the recorder with none and
against Perfetto's flight recorder.

Ends with the ratios recorder ÷ Perfetto (medians over the rounds): CPU per
event, the load's throughput, bytes per event, and the kernel loss of each.
The machine's load average is printed with them: the figures are only as
quiet as the machine.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ftrace as bf  # noqa: E402
import bench_rules as br  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SW = ["sched/sched_switch", "sched/sched_wakeup"]
# What the flight-recorder rows (--rules) record: SW and the events the
# rules watch.
FLIGHT_EVENTS = SW + br.RULE_EVENTS
# The triggers the rule sets fire, none of which ends a row.
FLIGHT_TRIGGERS = ("trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 3600000\n  "
                 + " ".join(f'triggers {{ name: "{t}" stop_delay_ms: 600000 }}' for t in "abcde")
                 + " }")

CONFIG = """
buffers {{ size_kb: 65536 fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "linux.ftrace" ftrace_config {{
  {events}
  compact_sched {{ enabled: {compact} }}
}} }} }}
{end}
{extra}
"""
STREAM = """write_into_file: true
file_write_period_ms: 1000
duration_ms: 3600000"""


def tracebox():
    env = os.environ.get("RECORDER_TRACEBOX")
    if env:
        return env
    found = shutil.which("tracebox")
    if not found:
        raise SystemExit("no tracebox: set RECORDER_TRACEBOX, or put tracebox on PATH")
    return found


def config(compact, extra="", flight=False):
    """The config every row runs; `flight`: as a flight recorder."""
    ev = "\n  ".join(f'ftrace_events: "{e}"' for e in (FLIGHT_EVENTS if flight else SW))
    return CONFIG.format(events=ev, compact="true" if compact else "false",
                         end=FLIGHT_TRIGGERS if flight else STREAM, extra=extra)


def cpu_of(pids):
    return sum(bf.tree_cpu(p) for p in pids)


def packets_of(data):
    """The packets of a trace, compressed batches expanded (Perfetto's zstd
    frames do not state their size: decompressed as a stream)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    import zlib
    trace = pb.Trace()
    trace.ParseFromString(data)
    for p in trace.packet:
        which = p.WhichOneof("data")
        if which == "zstd_compressed_packets":
            import zstandard
            inner = pb.Trace()
            inner.ParseFromString(zstandard.ZstdDecompressor().decompressobj().decompress(p.zstd_compressed_packets))
            yield from inner.packet
        elif which == "compressed_packets":
            inner = pb.Trace()
            inner.ParseFromString(zlib.decompress(p.compressed_packets))
            yield from inner.packet
        else:
            yield p


def decode(path):
    """(events, bundles flagged lost, kernel loss end − start, bytes)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    data = open(path, "rb").read()
    events = flagged = 0
    stats = {}
    for p in packets_of(data):
        if p.HasField("ftrace_events"):
            b = p.ftrace_events
            events += len(b.event) + len(b.compact_sched.switch_timestamp) + len(b.compact_sched.waking_timestamp)
            flagged += b.lost_events
        if p.HasField("ftrace_stats"):
            s = p.ftrace_stats
            stats[s.phase] = sum(c.overrun + c.dropped_events for c in s.cpu_stats)
    end = stats.get(pb.FtraceStats.END_OF_TRACE)
    start = stats.get(pb.FtraceStats.START_OF_TRACE, 0)
    lost = None if end is None else end - start
    return events, flagged, lost, len(data)


def kernel_counts(inst):
    """The events a tracefs instance's readers have read, and those it lost
    (overrun + dropped), summed over its CPUs."""
    read = lost = 0
    for name in os.listdir(f"{inst}/per_cpu"):
        stats = dict(line.split(": ", 1) for line in bf.read(f"{inst}/per_cpu/{name}/stats").splitlines()
                     if ": " in line)
        read += int(stats.get("read events", 0))
        lost += int(stats.get("overrun", 0)) + int(stats.get("dropped events", 0))
    return read, lost


def measured(pids, inst, secs):
    """Runs the load: its bogo ops/s, the tracers' CPU seconds in its window,
    and the events read and lost from `inst` in that window."""
    c0, k0 = cpu_of(pids), kernel_counts(inst)
    ops = bf.load(secs)
    window, k1 = cpu_of(pids) - c0, kernel_counts(inst)
    return ops, window, k1[0] - k0[0], k1[1] - k0[1]


def run_recorder(d, secs, compact, mode, zstd=None, rules=None, flight=False):
    cfg = os.path.join(d, "peer.cfg")
    with open(cfg, "w") as f:
        f.write(config(compact, flight=flight))
    out = os.path.join(d, "recorder.pftrace")
    # `read@4`: the mode with that sub-buffer size in KiB (4: the kernel's one page).
    mode, _, subbuf = mode.partition("@")
    env = dict(os.environ, RECORDER_FTRACE_READ=mode)
    if subbuf:
        env["RECORDER_FTRACE_SUBBUF_KB"] = subbuf
    extra = [f"--compress={zstd}"] if zstd else []
    if rules:
        path = os.path.join(d, "peer.rules")
        with open(path, "w") as f:
            f.write(rules)
        extra.append(f"--trigger-rules={path}")
    proc = subprocess.Popen([bf.BIN, "--config", cfg, "-o", out, *extra], stderr=subprocess.PIPE, text=True, env=env)
    inst = f"{bf.TRACEFS}/instances/recorder-{proc.pid}"
    bf.wait_for(lambda: bf.read(f"{inst}/tracing_on") == "1", "the recorder's instance")
    ops, window, read, kernel_lost = measured([proc.pid], inst, secs)
    bf.stop_and_rusage(proc)
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"recorder failed ({proc.returncode}): {err}")
    events, flagged, lost, size = decode(out)
    os.unlink(out)
    if flight:
        # The ring kept only its end (or nothing, no trigger having fired):
        # the events read from the kernel in the load window instead.
        events, lost = read, kernel_lost
    return dict(events=events, flagged=flagged, lost=lost, out=size, window=window, ops=ops)


def service_cmd(service):
    """The tracing service's command line: Perfetto's `traced`, or
    `recorder serve` in its place (both take the sockets from the
    environment): "serve" records linux.ftrace with its built-in source
    (its root broker prepares the tracefs instance), "serve-probes" leaves
    it to traced_probes."""
    if service == "traced":
        return [tracebox(), "traced"]
    return [bf.BIN, "serve"] + (["--no-builtin-ftrace"] if service == "serve-probes" else [])


def ftrace_started(service):
    """Whether the session's sched_switch is recording: traced_probes uses
    the top-level tracefs, the built-in source an instance of its own."""
    if service != "serve":
        return (bf.read(f"{bf.TRACEFS}/events/sched/sched_switch/enable") == "1"
                and bf.read(f"{bf.TRACEFS}/tracing_on") == "1")
    base = f"{bf.TRACEFS}/instances"
    for name in os.listdir(base):
        inst = os.path.join(base, name)
        if name.startswith("recorder-") and bf.read(f"{inst}/events/sched/sched_switch/enable") == "1" \
                and bf.read(f"{inst}/tracing_on") == "1":
            return True
    return False


def run_perfetto(d, secs, compact, zstd=None, service="traced", flight=False):
    run = tempfile.mkdtemp(dir=d, prefix="pf")
    # recorder serve drops root: its sockets' directory must be reachable.
    os.chmod(run, 0o755)
    env = dict(os.environ,
               PERFETTO_PRODUCER_SOCK_NAME=os.path.join(run, "producer.sock"),
               PERFETTO_CONSUMER_SOCK_NAME=os.path.join(run, "consumer.sock"))
    tb = tracebox()
    logs = open(os.path.join(run, "daemons.log"), "w")
    traced = subprocess.Popen(service_cmd(service), env=env, stdout=logs, stderr=logs)
    procs = [traced]
    if service != "serve":
        procs.append(subprocess.Popen([tb, "traced_probes"], env=env, stdout=logs, stderr=logs))
    try:
        bf.wait_for(lambda: os.path.exists(os.path.join(run, "producer.sock"))
                    and os.path.exists(os.path.join(run, "consumer.sock")), "traced")
        time.sleep(0.5)  # traced_probes registers its data sources
        cfg = os.path.join(run, "peer.pbtxt")
        extra = f"compression {{ zstd {{ level: {zstd} }} }}" if zstd else ""
        with open(cfg, "w") as f:
            f.write(config(compact, extra, flight))
        out = os.path.join(run, "perfetto.pftrace")
        client = subprocess.Popen([tb, "perfetto", "--txt", "-c", cfg, "-o", out], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(client)
        bf.wait_for(lambda: ftrace_started(service), f"{service} to start ftrace")
        time.sleep(0.5)
        pids = [p.pid for p in procs]
        # traced_probes records in the top-level instance.
        ops, window, read, kernel_lost = measured(pids, bf.TRACEFS, secs)
        client.send_signal(signal.SIGINT)
        err = client.communicate(timeout=60)[1]
        if client.returncode != 0:
            raise SystemExit(f"perfetto client failed ({client.returncode}): {err}")
        events, flagged, lost, size = decode(out)
        if flight:
            events, lost = read, kernel_lost
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        logs.close()
        shutil.rmtree(run, ignore_errors=True)
    return dict(events=events, flagged=flagged, lost=lost, out=size, window=window, ops=ops)


def run_trace_cmd(d, secs, prefix):
    r = bf.run_trace_cmd(d, secs, prefix)
    return dict(events=r["events"], flagged=0, lost=r["lost_n"], out=r["out"], window=r["window"], ops=r["ops"])


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--modes", default="mmap,read",
                    help="RECORDER_FTRACE_READ modes, one recorder row each; `read@4` also sets "
                         "RECORDER_FTRACE_SUBBUF_KB=4 (the kernel's one-page sub-buffers)")
    ap.add_argument("--zstd", type=int, default=0, help="zstd level for one more row on each side (0: none)")
    ap.add_argument("--no-trace-cmd", action="store_true")
    ap.add_argument("--load", default="switch:2", help="stress-ng stressor:instances (switch:4, fork:2)")
    ap.add_argument("--variants", default="compact,plain", help="compact_sched on, off, or both")
    ap.add_argument("--serve", action="store_true",
                    help="a row with `recorder serve` in place of traced, reading ftrace itself (as root)")
    ap.add_argument("--serve-probes", action="store_true",
                    help="a row with `recorder serve --no-builtin-ftrace` in place of traced, "
                         "traced_probes reading ftrace")
    ap.add_argument("--rules", default="",
                    help="rule sets of scripts/bench_rules.py (hot, cold): a recorder row with each")
    args = ap.parse_args()
    rule_sets = {}
    if args.rules:
        known = {"hot": br.five_rules(), "cold": br.COLD_RULES.strip() + "\n"}
        for k in args.rules.split(","):
            if k not in known:
                raise SystemExit(f"--rules: no set {k!r} (hot, cold)")
            rule_sets[k] = known[k]
    name, n = args.load.split(":")
    bf.LOAD = (name, int(n))
    variants = [v == "compact" for v in args.variants.split(",") if v]
    bf.ensure_tools()
    modes = [m for m in args.modes.split(",") if m]
    # The zstd pair uses the default way out of the kernel when it is measured.
    zmode = "read" if "read" in modes else modes[0]
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        prefix, how = bf.trace_cmd_prefix(d) if not args.no_trace_cmd else ([], "")
        rows = []
        for compact in variants:
            tag = "compact" if compact else "plain"
            for m in modes:
                rows.append((f"recorder {m}, {tag}", lambda c=compact, m=m: run_recorder(d, args.secs, c, m)))
                if rule_sets:
                    rows.append((f"recorder {m}, {tag}, flight recorder",
                                 lambda c=compact, m=m: run_recorder(d, args.secs, c, m, flight=True)))
                for k, rules in rule_sets.items():
                    rows.append((f"recorder {m}, {tag}, flight recorder, {k} rules",
                                 lambda c=compact, m=m, r=rules: run_recorder(d, args.secs, c, m, rules=r,
                                                                              flight=True)))
            rows.append((f"perfetto, {tag}", lambda c=compact: run_perfetto(d, args.secs, c)))
            if rule_sets:
                rows.append((f"perfetto, {tag}, flight recorder",
                             lambda c=compact: run_perfetto(d, args.secs, c, flight=True)))
            if args.serve:
                rows.append((f"perfetto → recorder serve, {tag}",
                             lambda c=compact: run_perfetto(d, args.secs, c, service="serve")))
            if args.serve_probes:
                rows.append((f"perfetto → recorder serve + traced_probes, {tag}",
                             lambda c=compact: run_perfetto(d, args.secs, c, service="serve-probes")))
        if args.zstd:
            rows.append((f"recorder {zmode}, compact, zstd {args.zstd}",
                         lambda: run_recorder(d, args.secs, True, zmode, args.zstd)))
            rows.append((f"perfetto, compact, zstd {args.zstd}", lambda: run_perfetto(d, args.secs, True, args.zstd)))
        if not args.no_trace_cmd:
            rows.append((f"trace-cmd ({how})", lambda: run_trace_cmd(d, args.secs, prefix)))
        bases = []
        for rnd in range(args.rounds):
            bases.append(bf.load(args.secs))
            k = rnd % len(rows)
            for name, fn in rows[k:] + rows[:k]:
                r = fn()
                r["base"] = bases[-1]
                results.setdefault(name, []).append(r)
                print(f"round {rnd + 1}: {name}: {r['events']} events, {r['window']:.2f} CPU s, "
                      f"lost {r['lost']}", file=sys.stderr)
    la = os.getloadavg()
    print(f"`{bf.load_name()}` for {args.secs} s per row, {args.rounds} interleaved rounds; "
          f"untraced baseline {median(bases):,.0f} bogo ops/s (median); load average at the end "
          f"{la[0]:.2f} {la[1]:.2f} {la[2]:.2f} on {os.cpu_count()} CPUs ({bf.host()}).\n")
    print("| tracer | events (median) | ns CPU/event (per round) | load vs untraced | B/event | kernel loss (per round) | bundles flagged lost |")
    print("|---|---|---|---|---|---|---|")
    per_event = lambda r: 1e9 * r["window"] / max(r["events"], 1)
    for name, rs in results.items():
        print(f"| {name} | {median([r['events'] for r in rs]) / 1e6:.2f} M | "
              f"{', '.join(f'{per_event(r):.0f}' for r in rs)} | "
              f"{median([r['ops'] / r['base'] for r in rs]):.2f}× | "
              f"{median([r['out'] / max(r['events'], 1) for r in rs]):.1f} | "
              f"{', '.join(str(r['lost']) for r in rs)} | {sum(r['flagged'] for r in rs)} |")
    print("\n| recorder ÷ Perfetto (medians of per-round ratios) | CPU/event | load throughput | bytes/event "
          "| kernel loss, summed over the rounds |")
    print("|---|---|---|---|---|")
    pairs = []
    tags = ["compact" if c else "plain" for c in variants]
    for tag in tags:
        for m in modes:
            pairs.append((f"recorder {m}, {tag}", f"perfetto, {tag}"))
            if rule_sets:
                pairs.append((f"recorder {m}, {tag}, flight recorder", f"perfetto, {tag}, flight recorder"))
            for k in rule_sets:
                pairs.append((f"recorder {m}, {tag}, flight recorder, {k} rules", f"perfetto, {tag}, flight recorder"))
        if args.serve:
            pairs.append((f"perfetto → recorder serve, {tag}", f"perfetto, {tag}"))
        if args.serve_probes:
            pairs.append((f"perfetto → recorder serve + traced_probes, {tag}", f"perfetto, {tag}"))
    if args.zstd:
        pairs.append((f"recorder {zmode}, compact, zstd {args.zstd}", f"perfetto, compact, zstd {args.zstd}"))
    def ratio(ra, rb, of):
        """The median over the rounds of `of(row a) / of(row b)`; a round
        whose `of(row b)` is 0 has none (too short for the clock-tick CPU
        counts: `--load fork:2` makes few events; a flight recorder's row
        writes nothing when no trigger fired)."""
        return median([of(x) / of(y) for x, y in zip(ra, rb) if of(y) > 0] or [float("nan")])

    def loss(rs):
        return sum(r["lost"] or 0 for r in rs)

    for a, b in pairs:
        ra, rb = results[a], results[b]
        cpu = ratio(ra, rb, per_event)
        ops = ratio(ra, rb, lambda r: r["ops"])
        byt = ratio(ra, rb, lambda r: r["out"] / max(r["events"], 1))
        print(f"| {a} ÷ {b} | {cpu:.2f}× | {ops:.2f}× | {byt:.2f}× | {loss(ra):,} against {loss(rb):,} |")
    if rule_sets:
        print("\n| rules ÷ none, the recorder (medians of per-round ratios) | CPU/event | load throughput "
              "| kernel loss, summed over the rounds |")
        print("|---|---|---|---|")
        for tag in tags:
            for m in modes:
                base = results[f"recorder {m}, {tag}, flight recorder"]
                for k in rule_sets:
                    name = f"recorder {m}, {tag}, flight recorder, {k} rules"
                    rs = results[name]
                    cpu = ratio(rs, base, per_event)
                    ops = ratio(rs, base, lambda r: r["ops"])
                    print(f"| {k} rules ÷ none, recorder {m}, {tag} | {cpu:.2f}× | {ops:.2f}× | "
                          f"{loss(rs):,} against {loss(base):,} |")
    if len(modes) > 1:
        for tag in tags:
            a, b = results[f"recorder {modes[0]}, {tag}"], results[f"recorder {modes[1]}, {tag}"]
            cpu = ratio(a, b, per_event)
            print(f"\nrecorder {modes[0]} ÷ {modes[1]}, {tag}: CPU/event {cpu:.2f}×")


if __name__ == "__main__":
    main()
