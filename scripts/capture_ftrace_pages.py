#!/usr/bin/env python3
"""Captures raw ring-buffer pages from a private tracefs instance into
fixture files, for the offline encoder benchmark (benches/ftrace.rs) and
the tests that compare encoders on real pages.

  sudo python3 scripts/capture_ftrace_pages.py [--rounds 4000] [--pages 32]
      [--events sched/sched_switch,sched/sched_wakeup] [--out tests/fixtures/ftrace/pingpong]

The traced load is a bounded pipe ping-pong between two processes (the
shape of `stress-ng --switch`, a few thousand round trips, well under a
second), plus a few short-lived children so that forks, execs and more
than one comm appear. Writes OUT_cpuN.raw per CPU: whole pages as
`per_cpu/cpuN/trace_pipe_raw` returns them (a short read is padded to the
page size, as the reader does), at most --pages per CPU.
"""
import argparse
import os
import subprocess
import time

TRACEFS = "/sys/kernel/tracing"
PAGE = 4096


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def ping_pong(rounds, cpus=None):
    """`cpus`: (parent's, child's) CPU, else wherever the scheduler puts them."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        if cpus:
            os.sched_setaffinity(0, {cpus[1]})
        for _ in range(rounds):
            os.read(r1, 1)
            os.write(w2, b"x")
        os._exit(0)
    mask = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    for _ in range(rounds):
        os.write(w1, b"x")
        os.read(r2, 1)
    os.waitpid(pid, 0)
    os.sched_setaffinity(0, mask)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4000)
    ap.add_argument("--pages", type=int, default=32, help="at most this many pages per CPU")
    ap.add_argument("--events", default="sched/sched_switch,sched/sched_wakeup")
    ap.add_argument("--out", default="tests/fixtures/ftrace/pingpong")
    args = ap.parse_args()

    inst = os.path.join(TRACEFS, "instances", f"capture-{os.getpid()}")
    os.mkdir(inst)
    try:
        write(os.path.join(inst, "tracing_on"), "0")
        write(os.path.join(inst, "buffer_size_kb"), "2048")
        for e in args.events.split(","):
            write(os.path.join(inst, "events", e, "enable"), "1")
        write(os.path.join(inst, "tracing_on"), "1")
        ncpu = os.cpu_count() or 1
        # Same CPU (every round trip two switches), then across two CPUs
        # (wakeups of a thread elsewhere, switches to and from idle).
        for cpus in (None, (0, 1 % ncpu), (1 % ncpu, 0)):
            subprocess.run(["ls", "/proc/self/"], stdout=subprocess.DEVNULL, check=True)
            ping_pong(args.rounds, cpus)
            time.sleep(0.01)
        write(os.path.join(inst, "tracing_on"), "0")
        cpus = sorted(int(c[3:]) for c in os.listdir(os.path.join(inst, "per_cpu")))
        for cpu in cpus:
            fd = os.open(os.path.join(inst, "per_cpu", f"cpu{cpu}", "trace_pipe_raw"),
                         os.O_RDONLY | os.O_NONBLOCK)
            pages = []
            while True:
                try:
                    b = os.read(fd, PAGE)
                except BlockingIOError:
                    break
                if not b:
                    break
                pages.append(b + bytes(PAGE - len(b)))
            os.close(fd)
            # The newest pages: the ping-pong, not the start-up.
            pages = pages[-args.pages:]
            path = f"{args.out}_cpu{cpu}.raw"
            with open(path, "wb") as f:
                f.write(b"".join(pages))
            print(f"{path}: {len(pages)} pages")
    finally:
        write(os.path.join(inst, "tracing_on"), "0")
        for e in args.events.split(","):
            write(os.path.join(inst, "events", e, "enable"), "0")
        os.rmdir(inst)


if __name__ == "__main__":
    main()
