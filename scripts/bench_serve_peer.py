#!/usr/bin/env python3
"""`recorder serve` beside Perfetto's own service (tracebox v58.2: traced +
traced_probes), both on private socket paths, driven by the same consumer
client (this script, speaking the ConsumerPort) with the same config: N
sessions of `linux.sys_stats` with small buffers, spread over uids as each
service's per-uid limit asks (5 a uid).

For each service and N (1, 15; and 100 for serve, past traced's limit):

- the service's threads and resident memory idle, then with N sessions
  recording: per session, (with N - idle) / N; traced counts traced and
  traced_probes, which records sys_stats for it;
- EnableTracing -> all_data_sources_started (ObserveEvents), Flush (until
  its reply), ReadBuffers (until the last slice) and stop (DisableTracing
  until the held EnableTracing reply), per session: p50 and p99.

Runs as root (the clients become uids 65500..); services alternate each
round (interleaved, medians of the rounds' p50s and p99s):

  cargo build --release
  python3 scripts/bench_serve_peer.py [--rounds 3] [--sessions 1,15,100]

  RECORDER_TRACEBOX   tracebox binary (default `tracebox` on PATH)
  RECORDER_BIN        the recorder (default target/release/recorder)
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "producer"))
from producer_ipc import Frames, field_bytes, field_varint, fields, frame  # noqa: E402

ENABLE, DISABLE, READ, FLUSH, OBSERVE = 1, 2, 3, 5, 11
PER_UID = 5
CONFIG = """buffers { size_kb: 256 }
duration_ms: 600000
data_sources { config { name: "linux.sys_stats" sys_stats_config {
  meminfo_period_ms: 1000 meminfo_counters: MEMINFO_MEM_AVAILABLE } } }
"""


def recorder_bin():
    return os.environ.get("RECORDER_BIN") or os.path.join(ROOT, "target", "release", "recorder")


def tracebox():
    t = os.environ.get("RECORDER_TRACEBOX") or shutil.which("tracebox")
    if not t:
        raise SystemExit("no tracebox: set RECORDER_TRACEBOX, or put tracebox on PATH")
    return t


def binary_config(d):
    txt = os.path.join(d, "bench.pbtx")
    with open(txt, "w") as f:
        f.write(CONFIG)
    return subprocess.run([recorder_bin(), "config", "convert", "--to", "binary", txt],
                          check=True, capture_output=True).stdout


def invoke(req, method, args):
    m = field_varint(1, 1) + field_varint(2, method) + field_bytes(3, args)
    return frame(req, field_bytes(5, m))


def reply_of(f):
    r = dict(fields(f.get(6, b"")))
    return r.get(1, 0) == 1, r.get(2, 0) == 1, r.get(3, b"")


class Session:
    def __init__(self, path, config):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.f = Frames(self.s)
        self.s.sendall(frame(1, field_bytes(3, field_bytes(1, b"ConsumerPort"))))
        self.f.reply(1)
        self.config = config

    def start(self):
        """EnableTracing, timed to all_data_sources_started."""
        self.s.sendall(invoke(2, OBSERVE, field_varint(1, 2)))
        t = time.monotonic()
        self.s.sendall(invoke(3, ENABLE, field_bytes(1, self.config)))
        while True:
            f = self.f.next()
            if f.get(2) == 3:
                raise RuntimeError("the session ended at once: %r" % (reply_of(f),))
            if f.get(2) != 2:
                continue
            _, _, body = reply_of(f)
            events = dict(fields(dict(fields(body)).get(1, b"")))
            if events.get(2):
                return time.monotonic() - t

    def timed(self, req, method, args=b""):
        t = time.monotonic()
        self.s.sendall(invoke(req, method, args))
        while True:
            f = self.f.reply(req)
            _, more, _ = reply_of(f)
            if not more:
                return time.monotonic() - t

    def stop(self):
        t = time.monotonic()
        self.s.sendall(invoke(9, DISABLE, b""))
        self.f.reply(3)
        return time.monotonic() - t


def worker(path, config, uid, count, out_w, go_r):
    """One uid's sessions: starts them, says so, waits for the go, then
    flushes, reads and stops each; writes its timings as JSON."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    t = {"start": [], "flush": [], "read": [], "stop": []}
    sessions = [Session(path, config) for _ in range(count)]
    for s in sessions:
        t["start"].append(s.start())
    os.write(out_w, b"started\n")
    os.read(go_r, 1)
    for s in sessions:
        t["flush"].append(s.timed(4, FLUSH, field_varint(1, 5000)))
        t["read"].append(s.timed(5, READ))
        t["stop"].append(s.stop())
    os.write(out_w, (json.dumps(t) + "\n").encode())
    os._exit(0)


def threads_and_rss(pids):
    th = rss = 0
    for p in pids:
        th += len(os.listdir(f"/proc/{p}/task"))
        with open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
    return th, rss


def start_service(kind, d, n):
    env = dict(os.environ,
               PERFETTO_PRODUCER_SOCK_NAME=os.path.join(d, "producer.sock"),
               PERFETTO_CONSUMER_SOCK_NAME=os.path.join(d, "consumer.sock"))
    log = open(os.path.join(d, kind + ".log"), "w")
    if kind == "traced":
        procs = [subprocess.Popen([tracebox(), "traced"], env=env, stdout=log, stderr=log)]
        time.sleep(0.3)
        procs.append(subprocess.Popen([tracebox(), "traced_probes"], env=env, stdout=log, stderr=log))
    else:
        args = [recorder_bin(), "serve", "--max-sessions", str(max(n, 15)),
                "--max-sessions-per-uid", str(PER_UID), "--no-builtin-ftrace"]
        procs = [subprocess.Popen(args, env=env, stdout=log, stderr=log)]
    deadline = time.monotonic() + 20
    path = env["PERFETTO_CONSUMER_SOCK_NAME"]
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(kind + " never listened")
        time.sleep(0.02)
    os.chmod(d, 0o777)
    time.sleep(1.0)  # traced_probes registers its data sources
    return procs, path


def run(kind, n, config):
    d = tempfile.mkdtemp(prefix="bench-serve-")
    os.chmod(d, 0o777)
    procs, path = start_service(kind, d, n)
    os.chmod(path, 0o777)
    pids = [p.pid for p in procs]
    idle = threads_and_rss(pids)
    uids = [65500 + i for i in range((n + PER_UID - 1) // PER_UID)]
    counts = [min(PER_UID, n - i * PER_UID) for i in range(len(uids))]
    workers = []
    for uid, count in zip(uids, counts):
        out_r, out_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                worker(path, config, uid, count, out_w, go_r)
            finally:
                os._exit(1)
        os.close(out_w)
        os.close(go_r)
        workers.append((pid, os.fdopen(out_r), go_w))
    for _, r, _ in workers:
        if r.readline().strip() != "started":
            raise RuntimeError(kind + ": a worker failed to start its sessions")
    time.sleep(1.0)
    busy = threads_and_rss(pids)
    for _, _, go in workers:
        os.write(go, b"g")
    t = {"start": [], "flush": [], "read": [], "stop": []}
    for pid, r, _ in workers:
        for k, v in json.loads(r.readline()).items():
            t[k].extend(v)
        os.waitpid(pid, 0)
    for p in reversed(procs):
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(d, ignore_errors=True)
    return {
        "threads_idle": idle[0], "threads": busy[0], "rss_idle_kb": idle[1], "rss_kb": busy[1],
        "per_session_threads": (busy[0] - idle[0]) / n,
        "per_session_rss_kb": (busy[1] - idle[1]) / n,
        **{k: v for k, v in t.items()},
    }


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", default="1,15,100")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the clients become uids 65500..")
    config = binary_config(tempfile.mkdtemp(prefix="bench-cfg-"))
    results = {}
    print(f"load average at start: {os.getloadavg()}")
    for rnd in range(a.rounds):
        for n in [int(x) for x in a.sessions.split(",")]:
            kinds = ["traced", "serve"] if n <= 15 else ["serve"]
            if rnd % 2:
                kinds.reverse()
            for kind in kinds:
                r = run(kind, n, config)
                results.setdefault((kind, n), []).append(r)
                print(f"round {rnd} {kind:6} n={n:3}: threads {r['threads_idle']}->{r['threads']} "
                      f"rss {r['rss_idle_kb']}->{r['rss_kb']} KiB; "
                      + " ".join(f"{k} p50 {pct(r[k], .5):.2f} p99 {pct(r[k], .99):.2f} ms"
                                 for k in ("start", "flush", "read", "stop")), flush=True)
    print(f"load average at end: {os.getloadavg()}")
    print("\nmedians over rounds (ms; per-session threads and KiB):")
    for (kind, n), rs in sorted(results.items(), key=lambda x: (x[0][1], x[0][0])):
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        print(f"{kind:6} n={n:3}: threads {med(lambda r: r['threads_idle']):.0f}->"
              f"{med(lambda r: r['threads']):.0f} ({med(lambda r: r['per_session_threads']):.2f}/session) "
              f"rss +{med(lambda r: r['per_session_rss_kb']):.0f} KiB/session; "
              + " ".join(f"{k} {med(lambda r: pct(r[k], .5)):.2f}/{med(lambda r: pct(r[k], .99)):.2f}"
                         for k in ("start", "flush", "read", "stop")))


if __name__ == "__main__":
    main()
