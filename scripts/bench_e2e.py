#!/usr/bin/env python3
"""End-to-end benchmarks of the built `recorder` (release), each against a
baseline measured in the same run, printed as Markdown for BENCHMARKS.md.

  cargo build --release && python3 scripts/bench_e2e.py [--dir DIR] [--runs 3]

- streaming: the for_testing source at full speed with write_into_file,
  MB/s reaching the disk (file size over the wall time from start to exit)
  and CPU-seconds per GB (the whole process's, from its rusage once it has
  exited; and without the synthetic writer, whose share is sampled last
  just before the exit), io_uring and pwritev, against
  `dd if=/dev/zero bs=1M conv=fsync` (page cache) and `oflag=direct` to the
  same filesystem;
- idle: CPU of a session waiting for a start trigger and of a streaming
  session with nothing to record, over 10 s;
- memory: peak RSS against the sum of buffer sizes;
- trigger to finished file: a full 64 MiB ring, STOP_TRACING with
  stop_delay_ms 0, wall time from `recorder trigger` to the recorder's exit,
  each run right after `dd` writing 64 MiB with `oflag=direct conv=fsync` to
  the same filesystem (the disk's speed at that moment; `--trigger-only`).

`--idle-only --baseline-bin PATH [--peer]` runs only the idle part, this
build and another in turn (the build before a change, say), and with
`--peer` Perfetto's `traced` + `perfetto` client on the same configs
(RECORDER_TRACEBOX).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_ftrace import wait_for

BIN = os.environ.get("RECORDER_BIN") or os.path.join(os.path.dirname(__file__), "..", "target", "release", "recorder")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of(pid):
    """(total CPU s, {thread name: CPU s}) of a live process."""
    threads = {}
    total = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                st = f.read()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        s = (int(fields[11]) + int(fields[12])) / TICKS
        threads[comm] = threads.get(comm, 0.0) + s
        total += s
    return total, threads


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1))
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1))
    return rss, hwm


def dd(path, mib, direct=False):
    t0 = time.monotonic()
    r0 = os.times()
    flags = ["oflag=direct"] if direct else []
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"] + flags,
                   check=True, capture_output=True)
    wall = time.monotonic() - t0
    r1 = os.times()
    cpu = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    os.unlink(path)
    return mib * 1048576 / wall / 1e6, cpu / (mib / 1024)


def config(body):
    f = tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False)
    f.write(body)
    f.close()
    return f.name


def run_session(cfg, out, env_extra):
    """Runs a session to its exit: (wall s from spawn to exit, CPU s of the
    whole process from its rusage after the exit, each thread's CPU as last
    sampled while it ran, peak RSS kB)."""
    env = dict(os.environ, RECORDER_RUNTIME_DIR=tempfile.mkdtemp(), **env_extra)
    err = tempfile.TemporaryFile()
    t0 = time.monotonic()
    p = subprocess.Popen([BIN, "--config", cfg, "-o", out, "-q"], env=env,
                         stdout=subprocess.DEVNULL, stderr=err)
    threads = {}
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            break
        try:
            # Keep each thread's latest figure, also once it has exited.
            for name, v in cpu_of(p.pid)[1].items():
                threads[name] = max(v, threads.get(name, 0.0))
        except OSError:
            pass
        time.sleep(0.05)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        err.seek(0)
        sys.exit(f"recorder failed: {err.read().decode()}")
    return wall, ru.ru_utime + ru.ru_stime, threads, ru.ru_maxrss


def streaming(dirpath, io, secs=8, direct=True):
    cfg = config(f"""
buffers {{ size_kb: 262144 fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "for_testing" target_buffer: 0
  for_testing {{ message_count: 0 message_size: 4000 }} }} }}
write_into_file: true
file_write_period_ms: 100
duration_ms: {secs * 1000}
""")
    out = os.path.join(dirpath, "stream.pftrace")
    env = {"RECORDER_IO": io}
    if not direct:
        env["RECORDER_DIRECT_IO"] = "off"
    wall, cpu, threads, hwm = run_session(cfg, out, env)
    size = os.path.getsize(out)
    os.unlink(out)
    os.unlink(cfg)
    gb = size / 2**30
    writer = sum(v for k, v in threads.items() if "for_te" in k)
    mbps = size / wall / 1e6
    return mbps, cpu / gb, (cpu - writer) / gb, hwm, 262144


def on_cpu_ns(pid):
    """Nanoseconds on CPU of every thread of a live process (schedstat: clock
    ticks are too coarse for an idle process)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            continue
    return total


def idle_body(kind, secs):
    if kind == "waiting for a start trigger":
        return """
buffers { size_kb: 4096 }
data_sources { config { name: "for_testing" target_buffer: 0 for_testing { message_count: 10 } } }
trigger_config { trigger_mode: START_TRACING trigger_timeout_ms: %d triggers { name: "never" } }
""" % (secs * 1000 + 5000)
    return """
buffers { size_kb: 4096 }
write_into_file: true
file_write_period_ms: 100
duration_ms: %d
""" % (secs * 1000 + 5000)


def idle(kind, secs=10, binary=None):
    """% of a core over `secs`, measured after 2 s of start-up."""
    cfg = config(idle_body(kind, secs))
    out = tempfile.mktemp(suffix=".pftrace")
    env = dict(os.environ, RECORDER_RUNTIME_DIR=tempfile.mkdtemp())
    p = subprocess.Popen([binary or BIN, "--config", cfg, "-o", out, "-q"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    a = on_cpu_ns(p.pid)
    time.sleep(secs)
    b = on_cpu_ns(p.pid)
    p.terminate()
    p.wait()
    os.unlink(cfg)
    if os.path.exists(out):
        os.unlink(out)
    return 100.0 * (b - a) / 1e9 / secs


def idle_perfetto(kind, tracebox, secs=10):
    """The same, for Perfetto's `traced` and its `perfetto` client on
    private socket paths (no traced_probes: nothing to record)."""
    run = tempfile.mkdtemp()
    env = dict(os.environ,
               PERFETTO_PRODUCER_SOCK_NAME=os.path.join(run, "producer.sock"),
               PERFETTO_CONSUMER_SOCK_NAME=os.path.join(run, "consumer.sock"))
    cfg = os.path.join(run, "idle.pbtxt")
    with open(cfg, "w") as f:
        f.write(idle_body(kind, secs))
    out = os.path.join(run, "idle.pftrace")
    traced = subprocess.Popen([tracebox, "traced"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [traced]
    try:
        wait_for(lambda: os.path.exists(os.path.join(run, "consumer.sock")), "traced")
        client = subprocess.Popen([tracebox, "perfetto", "--txt", "-c", cfg, "-o", out], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(client)
        time.sleep(2)
        if client.poll() is not None:
            sys.exit(f"perfetto client exited ({client.returncode}) on the idle config")
        a = sum(on_cpu_ns(p.pid) for p in procs)
        time.sleep(secs)
        b = sum(on_cpu_ns(p.pid) for p in procs)
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait()
        shutil.rmtree(run, ignore_errors=True)
    return 100.0 * (b - a) / 1e9 / secs


def trigger_latency(dirpath):
    cfg = config("""
buffers { size_kb: 65536 fill_policy: RING_BUFFER }
data_sources { config { name: "for_testing" target_buffer: 0 for_testing { message_count: 0 message_size: 1000 } } }
trigger_config { trigger_mode: STOP_TRACING trigger_timeout_ms: 60000 triggers { name: "bench" stop_delay_ms: 0 } }
""")
    out = os.path.join(dirpath, "flight.pftrace")
    rt = tempfile.mkdtemp()
    env = dict(os.environ, RECORDER_RUNTIME_DIR=rt)
    p = subprocess.Popen([BIN, "--config", cfg, "-o", out, "-q"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)  # fill the ring (it wraps many times)
    t0 = time.monotonic()
    subprocess.run([BIN, "trigger", "bench", "-q"], env=env, check=True, capture_output=True)
    p.wait()
    dt = time.monotonic() - t0
    size = os.path.getsize(out)
    os.unlink(out)
    os.unlink(cfg)
    return dt * 1000, size


# (row name, RECORDER_IO, O_DIRECT where the filesystem takes it)
VARIANTS = [
    ("io_uring, O_DIRECT", "io_uring", True),
    ("io_uring, page cache", "io_uring", False),
    ("pwritev, O_DIRECT", "pwritev", True),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.environ.get("RECORDER_BENCH_DIR"),
                    help="a directory on the disk under test (default: $RECORDER_BENCH_DIR, "
                         "else a new temporary directory)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--streaming-only", action="store_true")
    ap.add_argument("--trigger-only", action="store_true")
    ap.add_argument("--idle-only", action="store_true",
                    help="only the idle part, --runs rounds, each build in turn")
    ap.add_argument("--baseline-bin",
                    help="with --idle-only: the build to compare against, in the same rounds")
    ap.add_argument("--peer", action="store_true",
                    help="with --idle-only: Perfetto's traced and client too (RECORDER_TRACEBOX)")
    a = ap.parse_args()
    a.dir = a.dir or tempfile.mkdtemp(prefix="recorder-bench-")
    os.makedirs(a.dir, exist_ok=True)
    if a.trigger_only:
        trigger_part(a)
        return
    if a.idle_only:
        idle_part(a)
        return
    load = os.getloadavg()
    rows = []
    for _ in range(a.runs):
        rows.append(("dd",) + dd(os.path.join(a.dir, "dd.bin"), 2048))
        rows.append(("dd_direct",) + dd(os.path.join(a.dir, "dd.bin"), 2048, direct=True))
        for name, io, direct in VARIANTS:
            rows.append((name,) + streaming(a.dir, io, direct=direct))
    print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("| run | MB/s | CPU-s/GB (process) | CPU-s/GB (without the synthetic writer) | peak RSS MiB (buffers MiB) |")
    print("|---|---|---|---|---|")
    med = {}
    for name in ["dd", "dd_direct"] + [v[0] for v in VARIANTS]:
        rs = [r for r in rows if r[0] == name]
        mbps = statistics.median(r[1] for r in rs)
        cpu = statistics.median(r[2] for r in rs)
        med[name] = mbps
        if name == "dd":
            print(f"| dd bs=1M conv=fsync | {mbps:.0f} | {cpu:.3f} | – | – |")
        elif name == "dd_direct":
            print(f"| dd bs=1M oflag=direct conv=fsync | {mbps:.0f} | {cpu:.3f} | – | – |")
        else:
            own = statistics.median(r[3] for r in rs)
            hwm = max(r[4] for r in rs) / 1024
            print(f"| recorder, {name} | {mbps:.0f} ({mbps / med['dd']:.2f}× dd, {mbps / med['dd_direct']:.2f}× dd direct) | {cpu:.3f} | {own:.3f} | {hwm:.0f} ({rs[0][5] // 1024}) |")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if a.streaming_only:
        return
    print()
    for kind in ("waiting for a start trigger", "streaming with nothing to record"):
        print(f"- idle, {kind}: {idle(kind):.3f}% of a core over 10 s")
    trigger_part(a)


IDLE_KINDS = ("waiting for a start trigger", "streaming with nothing to record")


def idle_part(a):
    """Each idle kind, this build and the baseline build in turn, --runs
    rounds; medians and the ratio of medians."""
    builds = [("this build", lambda kind: idle(kind, binary=BIN))]
    if a.baseline_bin:
        builds.append(("baseline", lambda kind: idle(kind, binary=a.baseline_bin)))
    if a.peer:
        tb = os.environ.get("RECORDER_TRACEBOX") or shutil.which("tracebox")
        if not tb:
            sys.exit("--peer: set RECORDER_TRACEBOX, or put tracebox on PATH")
        builds.append(("Perfetto (traced + client)", lambda kind: idle_perfetto(kind, tb)))
    start = os.getloadavg()
    got = {}
    for rnd in range(a.runs):
        order = builds if rnd % 2 == 0 else builds[::-1]
        for kind in IDLE_KINDS:
            for name, measure in order:
                v = measure(kind)
                got.setdefault((kind, name), []).append(v)
                print(f"round {rnd + 1}: {kind}, {name}: {v:.3f}%", file=sys.stderr)
    end = os.getloadavg()
    print(f"load average {start[0]:.2f} at the start, {end[0]:.2f} at the end; "
          f"{a.runs} rounds of 10 s per row\n")
    ratios = [n for n, _ in builds[1:]]
    head = "| session | " + " | ".join(f"{n} (% of a core, per round)" for n, _ in builds)
    head += "".join(f" | this build ÷ {n} (medians)" for n in ratios)
    print(head + " |")
    print("|---" * (len(builds) + 1 + len(ratios)) + "|")
    for kind in IDLE_KINDS:
        cells = []
        for name, _ in builds:
            vs = got[(kind, name)]
            cells.append(f"{statistics.median(vs):.3f} ({', '.join(f'{v:.3f}' for v in vs)})")
        mine = statistics.median(got[(kind, "this build")])
        for n in ratios:
            base = statistics.median(got[(kind, n)])
            cells.append(f"{mine / base:.2f}×" if base > 0 else "–")
        print(f"| {kind} | " + " | ".join(cells) + " |")


def trigger_part(a):
    lat, base = [], []
    for _ in range(a.runs):
        mbps, _ = dd(os.path.join(a.dir, "dd.bin"), 64, direct=True)
        base.append(64 * 1048576 / mbps / 1e3)
        lat.append(trigger_latency(a.dir))
    ms = [l[0] for l in lat]
    ratios = [m / b for m, b in zip(ms, base)]
    load = os.getloadavg()
    print(f"- trigger to finished file, full 64 MiB ring, stop_delay_ms 0: median {statistics.median(ms):.0f} ms"
          f" (runs: {', '.join(f'{m:.0f}' for m in ms)} ms; {lat[0][1] / 2**20:.0f} MiB written);"
          f" dd 64 MiB oflag=direct right before each: {', '.join(f'{b:.0f}' for b in base)} ms;"
          f" median ratio {statistics.median(ratios):.2f}× dd; load {load[0]:.2f}")


if __name__ == "__main__":
    main()
