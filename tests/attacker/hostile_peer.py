#!/usr/bin/env python3
"""A hostile local user against recorder's control plane, for the hardening
tests. Run as an unprivileged user; prints "ready" once in place, then runs
until killed (or for --seconds).

  hold SOCKET N [--dribble S]   keep N connections open, reconnecting when
                                dropped; with --dribble, send one byte every S s
  fake DIR SUFFIX MODE [--pid P]
                                listen at DIR/recorder-P.SUFFIX (P: our pid)
                                and answer every client by MODE:
                                  flood    endless bytes
                                  dribble  one byte every 5 s
                                  lie      read the request, answer
                                           "stopping" or "accepted", or a
                                           status that claims uid 0
"""

import argparse
import json
import os
import socket
import sys
import threading
import time


def hold(path, n, dribble, seconds):
    end = time.time() + seconds
    conns = []
    said_ready = False
    while time.time() < end:
        while len(conns) < n:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(path)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                s.close()
                time.sleep(0.05)
                break
            conns.append(s)
        if not said_ready and len(conns) >= n:
            print("ready", flush=True)
            said_ready = True
        for s in list(conns):
            try:
                if dribble:
                    s.send(b"{")
                else:
                    # Notice a dropped connection without sending anything.
                    if s.recv(4096, socket.MSG_DONTWAIT) == b"":
                        raise OSError("closed")
            except BlockingIOError:
                pass
            except OSError:
                conns.remove(s)
                s.close()
        time.sleep(dribble if dribble else 0.1)


def serve(conn, mode):
    try:
        if mode == "flood":
            junk = b"x" * 65536
            while True:
                conn.sendall(junk)
        elif mode == "dribble":
            while True:
                conn.sendall(b"{")
                time.sleep(5)
        elif mode == "lie":
            req = b""
            while b"\n" not in req:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                req += chunk
            op = json.loads(req.decode() or "{}")
            if op.get("op") == "trigger":
                outcomes = [{"name": n, "accepted": True} for n in op.get("names", [])]
                reply = {"triggers": outcomes}
            elif op.get("op") == "query":
                # Claims to be root's session.
                reply = {"status": {
                    "pid": os.getpid(), "uid": 0, "config": "/root/secret.cfg",
                    "output": "/root/trace.pftrace", "state": "recording",
                    "elapsed_ms": 1000, "bytes_written": 0, "buffers": [],
                    "control_requests_refused": 0}}
            else:
                reply = "stopping"
            conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        pass
    finally:
        conn.close()


def fake(directory, suffix, mode, pid, seconds):
    path = os.path.join(directory, "recorder-%d.%s" % (pid, suffix))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o666)
    s.listen(64)
    print("ready", flush=True)
    s.settimeout(0.2)
    end = time.time() + seconds
    while time.time() < end:
        try:
            conn, _ = s.accept()
        except socket.timeout:
            continue
        conn.settimeout(None)
        threading.Thread(target=serve, args=(conn, mode), daemon=True).start()
    os.unlink(path)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hold")
    h.add_argument("socket")
    h.add_argument("n", type=int)
    h.add_argument("--dribble", type=float, default=0.0)
    h.add_argument("--seconds", type=float, default=120)
    f = sub.add_parser("fake")
    f.add_argument("dir")
    f.add_argument("suffix", choices=["trigger", "control"])
    f.add_argument("mode", choices=["flood", "dribble", "lie"])
    f.add_argument("--pid", type=int, default=os.getpid())
    f.add_argument("--seconds", type=float, default=120)
    a = p.parse_args()
    if a.cmd == "hold":
        hold(a.socket, a.n, a.dribble, a.seconds)
    else:
        fake(a.dir, a.suffix, a.mode, a.pid, a.seconds)


if __name__ == "__main__":
    sys.exit(main())
