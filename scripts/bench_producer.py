#!/usr/bin/env python3
"""One Perfetto SDK producer (tests/sdk_producer, `bench` mode) writing
`for_testing` packets of 64 B and 1 KiB as fast as it can, into `recorder`
(the SDK's system backend, over the producer socket and shared memory) and
into Perfetto's own tracing service (the SDK's in-process backend): the same
writing loop, the same packets, the same shared-memory size, the same trace
buffer size and fill policy. Rounds interleave the two sides (the order
alternates), and medians are printed as Markdown for BENCHMARKS.md.

  cargo build --release
  python3 scripts/bench_producer.py [--rounds 5] [--sizes 64,1024]
        [--payload-mib 256] [--shmem-kb 0] [--buffer-mib 512] [--dir DIR]
        [--baseline OTHER_RECORDER]

`--baseline` runs another recorder build as a third side of every round
(before and after a change, in the same run).

Per run:
- packets/s kept: the `for_testing` packets found in the trace (counted by
  `recorder inspect --json`, the same reader for both traces) over the
  writing loop's own time (first packet to the flush of the last, timed by
  the app);
- loss: packets written minus packets in the trace (their sequence numbers
  say which), and each service's own counters from its last TraceStats
  (trace_writer_packet_loss: the SDK's drop markers, one per run of drops;
  chunks_discarded, abi_violations, patches_failed);
- CPU per MB kept, while writing and to the end: recorder, the whole
  process, from just before the app starts to the app's last packet (its
  CPU clock) and to its exit (wait4 rusage), which includes the stop and
  writing the trace file; in-process, the thread the SDK runs Perfetto's
  service on (per-thread se.sum_exec_runtime), from just before the loop to
  its last packet and to after the trace was read out into its file. The
  app's own threads are printed too.

`--test` runs one short round with a shared memory large enough that
nothing can be dropped and checks every packet arrived (a smoke test of this
path, not a measurement); `--keep DIR` keeps the traces.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RECORDER = os.environ.get("RECORDER_BIN") or os.path.join(ROOT, "target", "release", "recorder")
APP = os.environ.get("SDK_PRODUCER_BIN") or os.path.join(
    ROOT, "target", "sdk_producer", "release", "sdk_producer")
DS_NAME = "recorder.bench.sdk"
COUNTERS = ["trace_writer_packet_loss", "chunks_discarded", "abi_violations", "patches_failed",
            "bytes_overwritten"]


def proc_cpu(pid):
    """CPU seconds of a live process so far (its CPU clock: nanoseconds)."""
    return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9


def wait_cpu(proc, limit):
    """Waits for `proc`; its CPU seconds from rusage."""
    t = time.monotonic()
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return ru.ru_utime + ru.ru_stime
        if time.monotonic() - t > limit:
            proc.kill()
            raise RuntimeError(f"{proc.args[0]} did not exit within {limit} s")
        time.sleep(0.005)


def read_app(app, until):
    """App lines up to and including the first starting with `until`."""
    lines = []
    for line in app.stdout:
        line = line.rstrip("\n")
        lines.append(line)
        if line.startswith(until):
            return lines
    raise RuntimeError(f"the app ended before {until!r}: {lines}")


def parse_app(lines):
    r = {"threads": {}, "during": {}}
    for line in lines:
        w = line.split()
        if w[:1] == ["wrote"]:
            r["wrote"], r["secs"] = int(w[1]), float(w[3])
        elif w[:1] == ["packet_bytes"]:
            r["packet_bytes"] = int(w[1])
        elif w[:1] in (["thread"], ["during"]):
            r["threads" if w[0] == "thread" else "during"][f"{w[2]}:{w[1]}"] = float(w[3])
    return r


def inspect(trace):
    out = subprocess.run([RECORDER, "inspect", "--json", trace], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"inspect {trace}: {out.stderr}")
    rep = json.loads(out.stdout)
    seqs = [s["for_testing"] for s in rep["by_sequence"].values() if s.get("for_testing")]
    if len(seqs) != 1:
        raise RuntimeError(f"{trace}: {len(seqs)} for_testing sequences")
    stats = rep.get("last_trace_stats") or {}
    buf = (stats.get("buffers") or [{}])[0]
    counters = {k: buf.get(k, 0) for k in COUNTERS}
    counters["chunks_discarded"] += (stats.get("counters") or {}).get("chunks_discarded", 0)
    return seqs[0], counters


def result(side, app, trace, cpu, cpu_note, cpu_writing):
    seq, counters = inspect(trace)
    kept = seq["count"]
    mb = kept * app["packet_bytes"] / 1e6
    return {
        "side": side, "wrote": app["wrote"], "secs": app["secs"], "kept": kept,
        "lost": app["wrote"] - kept, "gaps": seq["gaps"], "out_of_order": seq["out_of_order"],
        "first": seq["first"], "last": seq["last"], "counters": counters,
        "rate": kept / app["secs"], "mb": mb, "cpu": cpu, "cpu_per_mb": cpu / mb if mb else 0.0,
        "cpu_writing": cpu_writing, "writing_per_mb": cpu_writing / mb if mb else 0.0,
        "cpu_note": cpu_note, "threads": app["threads"], "packet_bytes": app["packet_bytes"],
    }


def run_recorder(a, size, packets, work, binary=RECORDER, side="recorder"):
    cfg = os.path.join(work, "bench.cfg")
    with open(cfg, "w") as f:
        f.write(f'buffers {{ size_kb: {a.buffer_mib * 1024} fill_policy: DISCARD }}\n'
                f'data_sources {{ config {{ name: "{DS_NAME}" }} }}\n')
    trace = os.path.join(work, f"{side}-{size}.pftrace")
    sock = os.path.join(work, "producer.sock")
    env = dict(os.environ, RECORDER_RUNTIME_DIR=os.path.join(work, "run"))
    rec = subprocess.Popen([binary, "--config", cfg, "-o", trace, "--producer-socket", sock],
                           env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    t = time.monotonic()
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
            break
        except OSError:
            if rec.poll() is not None or time.monotonic() - t > 30:
                raise RuntimeError(f"recorder never listened: {rec.stderr.read().decode()}")
            time.sleep(0.005)
    cpu0 = proc_cpu(rec.pid)
    app = subprocess.Popen([APP, "bench", "--backend", "system", "--size", str(size),
                            "--packets", str(packets), "--shmem-kb", str(a.shmem_kb)],
                           env=dict(os.environ, PERFETTO_PRODUCER_SOCK_NAME=sock),
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = read_app(app, "wrote")
    cpu_writing = proc_cpu(rec.pid) - cpu0
    rec.send_signal(signal.SIGINT)
    lines += list(app.stdout)
    app.wait(timeout=60)
    cpu = wait_cpu(rec, 120)
    err = rec.stderr.read().decode()
    if rec.returncode != 0:
        raise RuntimeError(f"recorder exited {rec.returncode}: {err}")
    r = result(side, parse_app(lines), trace, cpu - cpu0, f"process, total {cpu:.3f} s",
               cpu_writing)
    r["trace"] = trace
    return r


def run_in_process(a, size, packets, work):
    trace = os.path.join(work, f"perfetto-{size}.pftrace")
    app = subprocess.Popen([APP, "bench", "--backend", "in-process", "--size", str(size),
                            "--packets", str(packets), "--shmem-kb", str(a.shmem_kb),
                            "--buffer-kb", str(a.buffer_mib * 1024), "--fill", "discard",
                            "--out", trace], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = list(app.stdout)
    err = app.stderr.read()
    total = wait_cpu(app, 120)
    if app.returncode != 0:
        raise RuntimeError(f"app exited {app.returncode}: {lines} {err}")
    parsed = parse_app(lines)
    # The service's thread: the SDK's one busy thread besides the writer
    # (the main thread, whose name is the process's).
    main = os.path.basename(APP)[:15]
    others = {k: v for k, v in parsed["threads"].items() if not k.startswith(main + ":")}
    name, cpu = max(others.items(), key=lambda kv: kv[1]) if others else ("none", 0.0)
    r = result("perfetto", parsed, trace, cpu, f"thread {name}, process total {total:.3f} s",
               parsed["during"].get(name, 0.0))
    r["trace"] = trace
    return r


def fmt_counters(c):
    return ", ".join(f"{k} {v}" for k, v in c.items() if v) or "none"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", default="64,1024")
    p.add_argument("--payload-mib", type=int, default=256, help="packet bytes written per run")
    p.add_argument("--shmem-kb", type=int, default=0, help="shared memory hint (0: 256 KiB)")
    p.add_argument("--buffer-mib", type=int, default=512)
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", default=None, help="keep the last traces in this directory")
    p.add_argument("--baseline", default=None,
                   help="another recorder binary, run as a third side (`recorder-base`)")
    p.add_argument("--test", action="store_true")
    a = p.parse_args()
    if a.test:
        a.rounds, a.payload_mib, a.shmem_kb, a.buffer_mib = 1, 0, 4096, 16
    sizes = [int(s) for s in a.sizes.split(",")]
    print(f"command: {' '.join(sys.argv)}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = a.keep or tempfile.mkdtemp(prefix="bench_producer.", dir=a.dir)
    os.makedirs(work, exist_ok=True)
    runs = {}
    for rnd in range(a.rounds):
        for size in sizes:
            packets = 2000 if a.test else a.payload_mib * 1048576 // size
            order = [run_recorder, run_in_process]
            if a.baseline:
                order.append(lambda *x: run_recorder(*x, binary=a.baseline, side="recorder-base"))
            # Each side goes first in turn.
            order = order[rnd % len(order):] + order[:rnd % len(order)]
            for f in order:
                r = f(a, size, packets, work)
                runs.setdefault((size, r["side"]), []).append(r)
                print(f"round {rnd + 1} {size} B {r['side']}: {r['rate'] / 1e6:.3f} M/s kept, "
                      f"{r['kept']}/{r['wrote']} kept ({r['gaps']} gaps), cpu while writing "
                      f"{r['cpu_writing']:.3f} s, to the end {r['cpu']:.3f} s "
                      f"({r['cpu_note']}), counters: {fmt_counters(r['counters'])}", flush=True)
                if not a.keep:
                    os.unlink(r["trace"])
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("| packet | service | packets/s kept | ratio | kept of written | lost (seq gaps) "
          "| its own loss counters (last round) | CPU per MB kept: writing / to the end |")
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    sides = ["perfetto", "recorder"] + (["recorder-base"] if a.baseline else [])
    for size in sizes:
        med = {}
        for side in sides:
            rs = runs[(size, side)]
            med[side] = statistics.median(r["rate"] for r in rs)
        for side in sides:
            rs = runs[(size, side)]
            last = rs[-1]
            print(f"| {last['packet_bytes']} B | {side} | {med[side] / 1e6:.3f} M "
                  f"({statistics.median(r['mb'] / r['secs'] for r in rs):.0f} MB/s) "
                  f"| {med[side] / med['perfetto']:.2f}x "
                  f"| {statistics.median(r['kept'] / r['wrote'] for r in rs) * 100:.2f}% "
                  f"| {statistics.median(r['lost'] for r in rs)} "
                  f"({statistics.median(r['gaps'] for r in rs)}) "
                  f"| {fmt_counters(last['counters'])} "
                  f"| {statistics.median(r['writing_per_mb'] for r in rs) * 1e3:.2f} / "
                  f"{statistics.median(r['cpu_per_mb'] for r in rs) * 1e3:.2f} ms |")
            if a.test:
                bad = [r for r in rs if r["lost"] or r["out_of_order"] or r["kept"] != r["wrote"]]
                failed |= bool(bad)
    if a.test:
        print("test: " + ("FAILED (packets missing)" if failed else "every packet arrived"))
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
