#!/usr/bin/env python3
"""Streaming cost of the write path with and without compression and
segments, against `dd`, in one run, interleaved.

  cargo build --release && python3 scripts/bench_streaming.py [--rate 25000] [--size 4000] [--secs 6] [--rounds 3] [--dir /var/tmp]

Each variant records the same for_testing load (RATE packets/s of SIZE bytes,
streamed every 100 ms) for SECS seconds; `dd bs=1M conv=fsync` then writes as
many bytes as the plain run did. Per variant: the recorder's CPU seconds
(wait4 rusage, every thread), trace bytes before and after compression, CPU
seconds per GB of trace data, and whether anything was lost. Medians over
the rounds; the load average is printed with them.

for_testing packets repeat one filler string, so they compress far better
than real traces: the zstd rows bound its cost from below. bench_ftrace.py
measures compression on real scheduling data.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

BIN = os.environ.get("RECORDER_BIN") or os.path.join(os.path.dirname(__file__), "..", "target", "release", "recorder")

CONFIG = """
buffers {{ size_kb: 262144 fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "for_testing" target_buffer: 0
  for_testing {{ message_count: 0 message_size: {size} max_messages_per_second: {rate} seed: 1 }} }} }}
write_into_file: true
file_write_period_ms: 100
duration_ms: {ms}
"""

VARIANTS = [
    ("uncompressed", []),
    ("--compress=1", ["--compress=1"]),
    ("--compress=3", ["--compress=3"]),
    ("--compress=1 --rotate-size 64M", ["--compress=1", "--rotate-size", "64M"]),
    ("uncompressed --rotate-size 64M", ["--rotate-size", "64M"]),
]


def human(n):
    return f"{n / 1e6:.0f} MB"


def run_recorder(d, cfg, extra):
    out = os.path.join(d, "seg/" if any(a.startswith("--rotate") for a in extra) else "t.pftrace")
    t0 = time.monotonic()
    proc = subprocess.Popen([BIN, "--config", cfg, "-o", out, *extra], stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"recorder failed: {err}")
    written = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs
                  if f.endswith(".pftrace")) if os.path.isdir(out) else os.path.getsize(out)
    m = re.search(r"zstd: .* \(([\d.]+)x\)", err)
    ratio = float(m.group(1)) if m else 1.0
    lost = "nothing lost" not in err
    shutil.rmtree(out) if os.path.isdir(out) else os.unlink(out)
    return dict(cpu=ru.ru_utime + ru.ru_stime, wall=wall, written=written, data=written * ratio, lost=lost)


def run_dd(d, nbytes):
    out = os.path.join(d, "dd.out")
    count = max(1, int(nbytes // (1 << 20)))
    t0 = time.monotonic()
    proc = subprocess.Popen(["dd", "if=/dev/zero", f"of={out}", "bs=1M", f"count={count}", "conv=fsync"],
                            stderr=subprocess.DEVNULL)
    _, _, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    os.unlink(out)
    return dict(cpu=ru.ru_utime + ru.ru_stime, wall=wall, written=count << 20, data=count << 20, lost=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=25000)
    ap.add_argument("--size", type=int, default=4000)
    ap.add_argument("--secs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    results = {name: [] for name, _ in VARIANTS}
    results["dd bs=1M conv=fsync (bytes of the uncompressed run)"] = []
    loads = []
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        cfg = os.path.join(d, "stream.cfg")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(size=args.size, rate=args.rate, ms=args.secs * 1000))
        for _ in range(args.rounds):
            plain = None
            for name, extra in VARIANTS:
                r = run_recorder(d, cfg, extra)
                plain = plain or r
                results[name].append(r)
            results["dd bs=1M conv=fsync (bytes of the uncompressed run)"].append(run_dd(d, plain["written"]))
            loads.append(os.getloadavg()[0])
    print(f"for_testing {args.rate} packets/s of {args.size} B ({args.rate * args.size / 1e6:.0f} MB/s offered), "
          f"{args.secs} s per run, {args.rounds} rounds interleaved, medians; load average "
          f"{min(loads):.1f}–{max(loads):.1f}; {os.cpu_count()} CPUs.\n")
    print("| variant | trace data | file bytes | ratio | CPU s | CPU s per GB of data | × uncompressed | lost |")
    print("|---|---|---|---|---|---|---|---|")
    base = statistics.median(r["cpu"] / r["data"] * 1e9 for r in results["uncompressed"])
    for name, rs in results.items():
        data = statistics.median(r["data"] for r in rs)
        written = statistics.median(r["written"] for r in rs)
        cpu = statistics.median(r["cpu"] for r in rs)
        per_gb = statistics.median(r["cpu"] / r["data"] * 1e9 for r in rs)
        print(f"| {name} | {human(data)} | {human(written)} | {data / written:.1f}× | {cpu:.2f} | {per_gb:.2f} | "
              f"{per_gb / base:.2f}× | {'yes' if any(r['lost'] for r in rs) else 'no'} |")


if __name__ == "__main__":
    main()
