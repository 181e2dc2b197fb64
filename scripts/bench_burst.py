#!/usr/bin/env python3
"""A 10 s burst of `stress-ng --switch 2` (about 2 M sched events/s) into the
long-capture config: ring bytes written, chunk padding and overwrite from the
last trace_stats, and kernel loss, decoded with the PyPI `perfetto` package.

  sudo python3 scripts/bench_burst.py LABEL=BINARY:CONFIG [...]
"""
import subprocess, sys, time, os, signal
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
def run(binary, cfg, label):
    out = "/var/tmp/burst.pftrace"
    p = subprocess.Popen([binary, "--config", cfg, "-o", out, "-q"], stderr=subprocess.DEVNULL)
    inst = f"/sys/kernel/tracing/instances/recorder-{p.pid}/events/sched/sched_switch/enable"
    t0 = time.time()
    while True:
        try:
            if open(inst).read().strip() == "1": break
        except OSError: pass
        time.sleep(0.05)
    time.sleep(1.0)
    subprocess.run(["stress-ng", "--switch", "2", "--timeout", "10s", "--quiet"])
    time.sleep(1.0)
    p.send_signal(signal.SIGINT); p.wait()
    t = pb.Trace(); t.ParseFromString(open(out, "rb").read())
    stats = [x.trace_stats for x in t.packet if x.HasField("trace_stats")][-1]
    b = stats.buffer_stats[0]
    ev = sum(len(x.ftrace_events.event) + len(x.ftrace_events.compact_sched.switch_timestamp) + len(x.ftrace_events.compact_sched.waking_timestamp) for x in t.packet if x.HasField("ftrace_events"))
    lost = sum(x.ftrace_events.lost_events for x in t.packet if x.HasField("ftrace_events"))
    print(f"| {label} | {ev/1e6:.2f} M | {b.bytes_written/1e6:.1f} MB | {b.padding_bytes_written/1e6:.1f} MB ({b.padding_bytes_written/max(b.bytes_written,1):.3f} per byte) | {b.bytes_overwritten/1e6:.2f} MB | {lost} |")
    os.unlink(out)
print("| run | events | bytes written | chunk padding | overwritten | bundles with lost_events |")
print("|---|---|---|---|---|---|")
for arg in sys.argv[1:]:
    label, rest = arg.split("=", 1)
    binary, cfg = rest.split(":", 1)
    run(binary, cfg, label)
