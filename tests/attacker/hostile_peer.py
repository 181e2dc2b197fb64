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
  names SOCKET CONNS COUNT SIZE
                                on a producer socket: CONNS producers that
                                each register COUNT data sources named with
                                SIZE bytes; says "done" once all are sent and
                                holds the connections
  churn SOCKET CYCLES NAMELEN   on a producer socket: CYCLES times connect,
                                initialize as a producer named with NAMELEN
                                bytes, register a data source and close
                                (CYCLES 0: until --seconds); says "done"
  foreign SOCKET DS FIRST LAST  on a producer socket: a producer of DS that,
                                once started, commits a chunk (a for_testing
                                packet, counter 4242, str "FOREIGN") for every
                                buffer id FIRST..LAST but its own, then one
                                (counter 4343) for its own; says "started"
                                with its buffer id, then "done", and holds
                                the connection
  patches SOCKET CONNS DATA_SOURCE MIB
                                on a producer socket: CONNS producers that get
                                DATA_SOURCE started, then each commit MIB MiB
                                of chunks that need patches and never send
                                the patches; says "done" once all are
                                committed and holds the connections
"""

import argparse
import json
import mmap
import os
import socket
import struct
import sys
import threading
import time

# The producer IPC the hostile producer speaks too.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "producer"))
from producer_ipc import (COMMIT_DATA, GET_ASYNC_COMMAND, Frames, bind, field_bytes,  # noqa: E402
                          field_varint, fields, handshake, initialize, invoke, register)


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


class Producer(Frames):
    """One producer connection: its frames, the SMB when it comes, and the
    target buffer its data source was started with."""

    def __init__(self, path):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        super().__init__(sock)
        self.target = None

    def next(self):
        f = super().next()
        self.note(f)
        return f

    def note(self, f):
        """A StartDataSource on the async stream (request 4): its target
        buffer."""
        if f.get(2) != 4:
            return
        reply = dict(fields(f.get(6, b"")))
        for k, cmd in fields(reply.get(3, b"")):
            if k == 1:
                start = dict(fields(cmd))
                self.target = dict(fields(start[2])).get(2, 0)


def patches(path, conns, ds_name, mib, seconds):
    page, size = 32 * 1024, 256 * 1024
    prods = []
    for _ in range(conns):
        try:
            p = Producer(path)
            handshake(p, b"patch_holder", ds_name.encode(), page_bytes=page, smb_bytes=size)
            # GetAsyncCommand: its replies are the commands.
            p.sock.sendall(invoke(4, GET_ASYNC_COMMAND, b""))
            prods.append(p)
        except OSError:
            pass
    for p in prods:
        while p.target is None or p.fd is None:
            p.next()
    print("ready", flush=True)
    maps = [mmap.mmap(p.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) for p in prods]
    pages = size // page
    csize = page - 8
    payload = b"p" * (csize - 8 - 4)
    n = len(payload)
    frag = bytes([(n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, ((n >> 14) & 0x7F) | 0x80, n >> 21]) + payload
    complete = struct.pack("<I", (1 << 28) | 3)  # layout 1, its chunk complete
    rounds = mib * 1024 * 1024 // (pages * csize) + 1
    chunk_id = 0
    rid = 10
    for _ in range(rounds):
        for p, shm in zip(prods, maps):
            moves = b""
            for i in range(pages):
                # Writer 1, one fragment, NEEDS_PATCHING (4): held until
                # patches that never come.
                head = struct.pack("<IHH", chunk_id + i, 1, 1 | (4 << 10))
                shm[i * page:i * page + 4] = complete
                shm[i * page + 8:i * page + 8 + 8 + len(frag)] = head + frag
                moves += field_bytes(1, field_varint(1, i) + field_varint(2, 0) + field_varint(3, p.target))
            try:
                p.sock.sendall(invoke(rid, COMMIT_DATA, moves))
                p.reply(rid)
            except OSError:
                pass
        chunk_id += pages
        rid += 1
    print("done", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        for p in prods:
            drain(p.sock)
        time.sleep(0.2)


def drain(s):
    try:
        while s.recv(65536, socket.MSG_DONTWAIT):
            pass
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        pass


def names(path, conns, count, size, seconds):
    socks = []
    for _ in range(conns):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            s.sendall(bind() + initialize(b"name_flood"))
            socks.append(s)
        except OSError:
            # Refused (this uid's connections are capped): go on with the rest.
            s.close()
    print("ready", flush=True)
    for i in range(count):
        for k, s in enumerate(socks):
            name = (b"n%d.%06d." % (k, i)).ljust(size, b"x")
            try:
                s.sendall(register(10 + i, name))
            except OSError:
                pass
            drain(s)
    print("done", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        for s in socks:
            drain(s)
        time.sleep(0.2)


def churn(path, cycles, namelen, seconds):
    print("ready", flush=True)
    end = time.time() + seconds
    n = 0
    while (cycles and n < cycles) or (not cycles and time.time() < end):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            name = (b"churn.%06d." % n).ljust(namelen, b"c")
            s.sendall(bind() + initialize(name) + register(3, b"track_event"))
            # Gone once answered: a producer that said who it is.
            s.settimeout(1)
            s.recv(4096)
        except OSError:
            time.sleep(0.01)
        s.close()
        n += 1
    print("done", flush=True)
    while time.time() < end:
        time.sleep(0.2)


def test_packet(counter, text):
    # TracePacket: timestamp 8, for_testing 900 (TestEvent: str 1, counter 3).
    return field_varint(8, 1) + field_bytes(900, field_bytes(1, text) + field_varint(3, counter))


def one_chunk(chunk_id, packet, size):
    n = len(packet)
    frag = bytes([(n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, ((n >> 14) & 0x7F) | 0x80, (n >> 21) & 0x7F])
    c = struct.pack("<IHH", chunk_id, 1, 1) + frag + packet
    return c.ljust(size, b"\0")[:size]


def foreign(path, ds, first, last, seconds):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    rd = Frames(s)
    handshake(rd, b"foreign_writer", ds.encode(), page_bytes=4096, smb_bytes=64 * 1024)
    s.sendall(invoke(4, GET_ASYNC_COMMAND, b""))
    own = None
    for kind, body in rd.commands(4):
        if kind == 1:  # StartDataSource: its config's target_buffer
            own = dict(fields(dict(fields(body))[2])).get(2, 0)
            break
    if rd.fd is None:
        raise SystemExit("no shared memory")
    shm = mmap.mmap(rd.fd, os.fstat(rd.fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    page, pages = 4096, os.fstat(rd.fd).st_size // 4096
    csize = (page - 8) & ~3
    print("started %d" % own, flush=True)
    targets = [b for b in range(first, last + 1) if b != own] + [own]
    rid, chunk_id = 10, 0
    for at in range(0, len(targets), pages):
        moves = b""
        for p, b in enumerate(targets[at:at + pages]):
            counter = 4343 if b == own else 4242
            text = b"OWN" if b == own else b"FOREIGN"
            shm[p * page:p * page + 4] = struct.pack("<I", (1 << 28) | 3)  # layout 1, chunk 0 complete
            shm[p * page + 8:p * page + 8 + csize] = one_chunk(chunk_id, test_packet(counter, text), csize)
            moves += field_bytes(1, field_varint(1, p) + field_varint(2, 0) + field_varint(3, b))
            chunk_id += 1
        s.sendall(invoke(rid, COMMIT_DATA, moves))
        rd.reply(rid)
        rid += 1
    print("done", flush=True)
    end = time.time() + seconds
    s.setblocking(False)
    while time.time() < end:
        drain(s)
        time.sleep(0.2)


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
    n = sub.add_parser("names")
    n.add_argument("socket")
    n.add_argument("conns", type=int)
    n.add_argument("count", type=int)
    n.add_argument("size", type=int)
    n.add_argument("--seconds", type=float, default=120)
    c = sub.add_parser("churn")
    c.add_argument("socket")
    c.add_argument("cycles", type=int)
    c.add_argument("namelen", type=int)
    c.add_argument("--seconds", type=float, default=120)
    fo = sub.add_parser("foreign")
    fo.add_argument("socket")
    fo.add_argument("ds")
    fo.add_argument("first", type=int)
    fo.add_argument("last", type=int)
    fo.add_argument("--seconds", type=float, default=120)
    t = sub.add_parser("patches")
    t.add_argument("socket")
    t.add_argument("conns", type=int)
    t.add_argument("data_source")
    t.add_argument("mib", type=int)
    t.add_argument("--seconds", type=float, default=120)
    a = p.parse_args()
    if a.cmd == "hold":
        hold(a.socket, a.n, a.dribble, a.seconds)
    elif a.cmd == "names":
        names(a.socket, a.conns, a.count, a.size, a.seconds)
    elif a.cmd == "patches":
        patches(a.socket, a.conns, a.data_source, a.mib, a.seconds)
    elif a.cmd == "churn":
        churn(a.socket, a.cycles, a.namelen, a.seconds)
    elif a.cmd == "foreign":
        foreign(a.socket, a.ds, a.first, a.last, a.seconds)
    else:
        fake(a.dir, a.suffix, a.mode, a.pid, a.seconds)


if __name__ == "__main__":
    sys.exit(main())
