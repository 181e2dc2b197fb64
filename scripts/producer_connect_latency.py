#!/usr/bin/env python3
"""How quickly an SDK app that is already waiting connects once recorder's
producer socket appears.

An SDK app (tests/sdk_producer, system backend) starts first and waits: its
connect fails, it retries with back-off and watches the socket's directory.
After `--wait` seconds recorder starts. The figure is the time from the
socket file's appearance (polled every 0.2 ms) to the app printing `started`
(connected, initialized, data source registered and started).

usage: scripts/producer_connect_latency.py [--runs N] [--wait S]
       (after `cargo build` and building tests/sdk_producer into
       target/sdk_producer)
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDER = os.path.join(ROOT, "target/debug/recorder")
APP = os.path.join(ROOT, "target/sdk_producer/release/sdk_producer")
CONFIG = """buffers { size_kb: 1024 }
data_sources { config { name: "recorder.test.sequence" } }
duration_ms: 3000
"""


def one(wait):
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "producer.sock")
        cfg = os.path.join(d, "c.cfg")
        open(cfg, "w").write(CONFIG)
        env = dict(os.environ, PERFETTO_PRODUCER_SOCK_NAME=sock)
        app = subprocess.Popen([APP, "--packets", "1"], env=env, stdout=subprocess.PIPE, text=True)
        time.sleep(wait)
        rec = subprocess.Popen(
            [RECORDER, "-c", cfg, "-o", os.path.join(d, "t.pftrace"), "--producer-socket", sock],
            env=dict(os.environ, RECORDER_RUNTIME_DIR=os.path.join(d, "run")),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while not os.path.exists(sock):
            time.sleep(0.0002)
        t_sock = time.monotonic()
        for line in app.stdout:
            if line.startswith("started"):
                break
        t_started = time.monotonic()
        app.wait()
        rec.wait()
        return t_started - t_sock


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--wait", type=float, default=2.5)
    a = ap.parse_args()
    times = [one(a.wait) for _ in range(a.runs)]
    print("load:", open("/proc/loadavg").read().strip())
    print("socket appears -> app started (ms):", " ".join(f"{t * 1000:.1f}" for t in times))
    print(f"median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms")


main()
