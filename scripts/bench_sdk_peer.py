#!/usr/bin/env python3
"""One Perfetto SDK app (tests/sdk_producer, `bench` mode, the SDK's SYSTEM
backend: producer socket and shared memory, as apps on a real system) writing
`for_testing` packets as fast as it can into three services, interleaved:

- `traced`: Perfetto v58.2's own service (tracebox) on private socket paths,
  the session started by its `perfetto` client;
- `serve`: `recorder serve` on private socket paths, the same `perfetto`
  client and the same config;
- `recorder`: `recorder --config` with its producer socket (no client).

Same app, same shared-memory hint, same buffer size and fill policy
(DISCARD, large enough for every packet: what is missing was lost on the
way, not by the policy).

  cargo build --release
  python3 scripts/bench_sdk_peer.py [--rounds 3] [--sizes 64,1024]
        [--payload-mib 128] [--shmem-kb 0] [--buffer-mib 512] [--dir DIR]

  RECORDER_TRACEBOX   tracebox binary (as scripts/bench_ftrace_peer.py)
  RECORDER_BIN, SDK_PRODUCER_BIN   as scripts/bench_producer.py

Per run: packets/s kept (packets in the trace over the app's writing loop),
packets lost (written minus kept) with the sequence gaps, the service's CPU
while the app writes (traced or the recorder process, from the data source's
start; the client is idle then), and for the two services behind the `perfetto` client the read-out:
the trace's bytes over the time from the client's stop (SIGINT) to its exit,
which is ReadBuffers through the consumer socket and the client writing its
file. Ends with medians and the ratios against traced.
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
import bench_ftrace_peer as peer  # noqa: E402
import bench_producer as bp  # noqa: E402

CONFIG = """buffers {{ size_kb: {kb} fill_policy: DISCARD }}
data_sources {{ config {{ name: "{ds}" }} }}
duration_ms: 600000
"""


def wait_path(path, proc, what):
    t = time.monotonic()
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() - t > 30:
            raise RuntimeError(f"{what} never listened on {path}")
        time.sleep(0.01)


def run_service(a, size, packets, work, service):
    """The app into `traced` or `recorder serve`, through the `perfetto` client."""
    run = tempfile.mkdtemp(dir=work, prefix=service)
    os.chmod(run, 0o755)  # recorder serve drops root: its sockets' directory must be reachable
    psock, csock = os.path.join(run, "producer.sock"), os.path.join(run, "consumer.sock")
    env = dict(os.environ, PERFETTO_PRODUCER_SOCK_NAME=psock, PERFETTO_CONSUMER_SOCK_NAME=csock)
    cmd = [peer.tracebox(), "traced"] if service == "traced" else [bp.RECORDER, "serve"]
    logs = open(os.path.join(run, "service.log"), "w")
    svc = subprocess.Popen(cmd, env=env, stdout=logs, stderr=logs)
    procs = [svc]
    try:
        wait_path(psock, svc, service)
        wait_path(csock, svc, service)
        cfg = os.path.join(run, "sdk.pbtxt")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(kb=a.buffer_mib * 1024, ds=bp.DS_NAME))
        trace = os.path.join(run, "trace.pftrace")
        client = subprocess.Popen([peer.tracebox(), "perfetto", "--txt", "-c", cfg, "-o", trace], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(client)
        time.sleep(0.5)  # the session is set up before the app registers its data source
        app = subprocess.Popen([bp.APP, "bench", "--backend", "system", "--size", str(size),
                                "--packets", str(packets), "--shmem-kb", str(a.shmem_kb)],
                               env=dict(os.environ, PERFETTO_PRODUCER_SOCK_NAME=psock),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(app)
        # From the data source's start: the session's set-up (a service
        # that populates its buffer up front) is not the app's traffic.
        lines = bp.read_app(app, "started")
        cpu0 = bp.proc_cpu(svc.pid)
        lines += bp.read_app(app, "wrote")
        cpu_writing = bp.proc_cpu(svc.pid) - cpu0
        t0 = time.monotonic()
        client.send_signal(signal.SIGINT)
        err = client.communicate(timeout=300)[1]
        readout = time.monotonic() - t0
        cpu = bp.proc_cpu(svc.pid) - cpu0
        if client.returncode != 0:
            raise RuntimeError(f"perfetto client ({service}) exited {client.returncode}: {err}")
        lines += list(app.stdout)
        app.wait(timeout=60)
        r = bp.result(service, bp.parse_app(lines), trace, cpu, "service process", cpu_writing)
        r["readout_s"] = readout
        r["trace_bytes"] = os.path.getsize(trace)
        return r
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


def run_recorder(a, size, packets, work):
    r = bp.run_recorder(a, size, packets, work)
    os.unlink(r["trace"])
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="64,1024")
    p.add_argument("--payload-mib", type=int, default=128, help="packet bytes written per run")
    p.add_argument("--shmem-kb", type=int, default=0, help="shared memory hint (0: the SDK's 256 KiB)")
    p.add_argument("--buffer-mib", type=int, default=512)
    p.add_argument("--sides", default="traced,serve,recorder")
    p.add_argument("--dir", default=None)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    sides = [s for s in a.sides.split(",") if s]
    print(f"command: {' '.join(sys.argv)}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = tempfile.mkdtemp(prefix="bench_sdk_peer.", dir=a.dir)
    os.chmod(work, 0o755)
    fns = {"traced": lambda *x: run_service(*x, "traced"), "serve": lambda *x: run_service(*x, "serve"),
           "recorder": run_recorder}
    runs = {}
    try:
        for rnd in range(a.rounds):
            for size in sizes:
                packets = a.payload_mib * 1048576 // size
                order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]
                for side in order:
                    r = fns[side](a, size, packets, work)
                    runs.setdefault((size, side), []).append(r)
                    ro = (f", read-out {r['trace_bytes'] / 1e6 / r['readout_s']:.0f} MB/s"
                          if "readout_s" in r else "")
                    print(f"round {rnd + 1} {size} B {side}: {r['rate'] / 1e6:.3f} M/s kept, "
                          f"{r['kept']}/{r['wrote']} kept ({r['gaps']} gaps), service CPU while writing "
                          f"{r['cpu_writing']:.3f} s{ro}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("| packet | service | packets/s kept | ÷ traced | kept of written | lost (seq gaps) "
          "| service CPU per MB kept, writing | read-out MB/s | ÷ traced |")
    print("|---|---|---|---|---|---|---|---|---|")
    med = statistics.median
    for size in sizes:
        base = runs.get((size, "traced"))
        for side in sides:
            rs = runs[(size, side)]
            rate = med(r["rate"] for r in rs)
            ratio = f"{med(x['rate'] / y['rate'] for x, y in zip(rs, base)):.2f}×" if base else "–"
            if "readout_s" in rs[0]:
                ro = med(r["trace_bytes"] / 1e6 / r["readout_s"] for r in rs)
                ro_ratio = (f"{med((x['trace_bytes'] / x['readout_s']) / (y['trace_bytes'] / y['readout_s']) for x, y in zip(rs, base)):.2f}×"
                            if base else "–")
                ro = f"{ro:.0f}"
            else:
                ro, ro_ratio = "–", "–"
            print(f"| {size} B | {side} | {rate / 1e6:.3f} M | {ratio} "
                  f"| {med(r['kept'] / r['wrote'] for r in rs) * 100:.2f}% "
                  f"| {med(r['lost'] for r in rs)} ({med(r['gaps'] for r in rs)}) "
                  f"| {med(r['writing_per_mb'] for r in rs) * 1e3:.2f} ms | {ro} | {ro_ratio} |")


if __name__ == "__main__":
    main()
