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
import array
import json
import mmap
import os
import socket
import struct
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


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def ipc_frame(request_id, body):
    f = field_varint(2, request_id) + body
    return len(f).to_bytes(4, "little") + f


def ipc_bind():
    return ipc_frame(1, field_bytes(3, field_bytes(1, b"ProducerPort")))


def ipc_invoke(request_id, method, args):
    m = field_varint(1, 1) + field_varint(2, method) + field_bytes(3, args)
    return ipc_frame(request_id, field_bytes(5, m))


def ipc_init(name):
    return ipc_invoke(2, 1, field_bytes(3, name))


def ipc_register(request_id, name):
    return ipc_invoke(request_id, 2, field_bytes(1, field_bytes(1, name)))


def ipc_fields(data):
    pos = 0
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            v, pos = read_varint(data, pos)
        elif wt == 2:
            n, pos = read_varint(data, pos)
            v = data[pos:pos + n]
            pos += n
        elif wt == 1:
            v, pos = data[pos:pos + 8], pos + 8
        elif wt == 5:
            v, pos = data[pos:pos + 4], pos + 4
        else:
            raise OSError("bad wire type %d" % wt)
        yield num, v


def read_varint(data, pos):
    r = s = 0
    while True:
        b = data[pos]
        pos += 1
        r |= (b & 0x7F) << s
        if not b & 0x80:
            return r, pos
        s += 7


class Producer:
    """One producer connection: its frames, and the SMB when it comes."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.fd = None
        self.target = None

    def frame(self):
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack("<I", self.buf[:4])[0]
                if len(self.buf) >= 4 + n:
                    f, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    f = dict(ipc_fields(f))
                    self.note(f)
                    return f
            data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(4))
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(cdata[: len(cdata) - (len(cdata) % 4)])
                    self.fd = fds[0]
            if not data:
                raise OSError("closed by the recorder")
            self.buf += data

    def note(self, f):
        """A StartDataSource on the async stream (request 4): its target
        buffer."""
        if f.get(2) != 4:
            return
        reply = dict(ipc_fields(f.get(6, b"")))
        for k, cmd in ipc_fields(reply.get(3, b"")):
            if k == 1:
                start = dict(ipc_fields(cmd))
                self.target = dict(ipc_fields(start[2])).get(2, 0)

    def reply(self, rid):
        while self.frame().get(2) != rid:
            pass


def patches(path, conns, ds_name, mib, seconds):
    page, size = 32 * 1024, 256 * 1024
    prods = []
    for _ in range(conns):
        try:
            p = Producer(path)
            p.sock.sendall(ipc_bind())
            p.reply(1)
            init = field_varint(1, page) + field_varint(2, size) + field_bytes(3, b"patch_holder")
            p.sock.sendall(ipc_invoke(2, 1, init))
            p.reply(2)
            p.sock.sendall(ipc_register(3, ds_name.encode()))
            p.reply(3)
            # GetAsyncCommand: its replies are the commands.
            p.sock.sendall(ipc_invoke(4, 5, b""))
            prods.append(p)
        except OSError:
            pass
    for p in prods:
        while p.target is None or p.fd is None:
            p.frame()
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
                p.sock.sendall(ipc_invoke(rid, 4, moves))
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
            s.sendall(ipc_bind() + ipc_init(b"name_flood"))
            socks.append(s)
        except OSError:
            # Refused (this uid's connections are capped): go on with the rest.
            s.close()
    print("ready", flush=True)
    for i in range(count):
        for k, s in enumerate(socks):
            name = (b"n%d.%06d." % (k, i)).ljust(size, b"x")
            try:
                s.sendall(ipc_register(10 + i, name))
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
            s.sendall(ipc_bind() + ipc_init(name) + ipc_register(3, b"track_event"))
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


def fields(data):
    pos = 0
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            v, pos = read_varint(data, pos)
        elif wt == 2:
            n, pos = read_varint(data, pos)
            v = data[pos:pos + n]
            pos += n
        elif wt == 1:
            v, pos = data[pos:pos + 8], pos + 8
        elif wt == 5:
            v, pos = data[pos:pos + 4], pos + 4
        else:
            raise SystemExit(f"bad wire type {wt}")
        yield num, v


def read_varint(data, pos):
    r = sh = 0
    while True:
        b = data[pos]
        pos += 1
        r |= (b & 0x7F) << sh
        if not b & 0x80:
            return r, pos
        sh += 7


class Frames:
    """Frames from the service, and the last descriptor that came along."""

    def __init__(self, sock):
        self.sock, self.buf, self.fd = sock, b"", None

    def next(self):
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack("<I", self.buf[:4])[0]
                if len(self.buf) >= 4 + n:
                    f, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    return dict(fields(f))
            data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(4))
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(cdata[: len(cdata) - (len(cdata) % 4)])
                    self.fd = fds[0]
            if not data:
                raise SystemExit("the service closed the connection")
            self.buf += data

    def reply(self, request_id):
        while True:
            f = self.next()
            if f.get(2) == request_id:
                return f


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
    s.sendall(ipc_bind())
    rd.reply(1)
    init = field_varint(1, 4096) + field_varint(2, 64 * 1024) + field_bytes(3, b"foreign_writer")
    s.sendall(ipc_invoke(2, 1, init))
    rd.reply(2)
    s.sendall(ipc_register(3, ds.encode()))
    rd.reply(3)
    s.sendall(ipc_invoke(4, 5, b""))
    own = None
    while own is None:
        f = rd.next()
        if f.get(2) != 4 or 6 not in f:
            continue
        reply = dict(fields(f[6]))
        cmd = dict(fields(reply.get(3, b"")))
        if 1 in cmd:  # StartDataSource: its config's target_buffer
            own = dict(fields(dict(fields(cmd[1]))[2])).get(2, 0)
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
        s.sendall(ipc_invoke(rid, 4, moves))
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
