#!/usr/bin/env python3
"""A hostile producer for recorder's producer socket: it speaks Perfetto's IPC
well enough to get a shared memory buffer and a data source started, then
breaks the shared-memory ABI every way it can, and ends with a garbage frame.

usage: hostile_producer.py SOCKET DATA_SOURCE [--start-ack never|MS]

Prints `started`, then `done` once everything is sent.

With `--start-ack`, it plays a different part: a producer whose data source
promises to acknowledge its start (will_notify_on_start) and then never does
(`never`) or does so MS milliseconds late. It prints `setup` and `started` as
the commands come, `acked` after its late ack, and `stopped` when told to
stop; it writes nothing. Messages are encoded
by hand from the field numbers; the one good packet is built with
perfetto_trace_pb2 (counter 7777), as is the packet that forges trusted_uid.
"""
import array
import mmap
import os
import socket
import struct
import sys
import time

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


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


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def frame(request_id, body):
    f = field_varint(2, request_id) + body
    return struct.pack("<I", len(f)) + f


def invoke(sock, request_id, method, args, drop_reply=False):
    m = field_varint(1, 1) + field_varint(2, method) + field_bytes(3, args)
    if drop_reply:
        m += field_varint(4, 1)
    sock.sendall(frame(request_id, field_bytes(5, m)))


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
            v = data[pos:pos + 8]
            pos += 8
        elif wt == 5:
            v = data[pos:pos + 4]
            pos += 4
        else:
            raise SystemExit(f"bad wire type {wt}")
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


class Reader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.fd = None

    def frame(self):
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack("<I", self.buf[:4])[0]
                if len(self.buf) >= 4 + n:
                    f, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    return dict((k, v) for k, v in fields(f))
            fds = array.array("i")
            data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(4))
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    fds.frombytes(cdata[: len(cdata) - (len(cdata) % 4)])
                    self.fd = fds[0]
            if not data:
                raise SystemExit("recorder closed the connection")
            self.buf += data


def chunk(chunk_id, writer, flags, frags, size):
    body = b""
    for f in frags:
        body += f
    packets = (len(frags) & 0x3FF) | (flags << 10)
    c = struct.pack("<IHH", chunk_id, writer, packets) + body
    return c.ljust(size, b"\0")[:size]


def frag(payload):
    n = len(payload)
    return bytes([(n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, ((n >> 14) & 0x7F) | 0x80, (n >> 21) & 0x7F]) + payload


def commands(rd):
    """The GetAsyncCommand stream: (field, body) of each command."""
    while True:
        f = rd.frame()
        if 6 not in f:
            continue
        reply = dict(fields(f[6]))
        if 3 not in reply:
            continue
        for k, v in fields(reply[3]):
            yield k, v


def slow_starter(path, ds_name, ack):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    rd = Reader(sock)
    sock.sendall(frame(1, field_bytes(3, field_bytes(1, b"ProducerPort"))))
    rd.frame()
    init = field_bytes(3, b"slow_starter") + field_varint(4, 1)
    invoke(sock, 2, 1, init)
    rd.frame()
    # Descriptor: name, will_notify_on_start.
    desc = field_bytes(1, ds_name.encode()) + field_varint(3, 1) + field_varint(7, 42)
    invoke(sock, 3, 2, field_bytes(1, desc))
    rd.frame()
    invoke(sock, 4, 5, b"")
    rid = 5
    for kind, body in commands(rd):
        if kind == 6:
            print("setup", flush=True)
        elif kind == 1:
            inst = dict(fields(body))[1]
            print("started", flush=True)
            if ack != "never":
                time.sleep(int(ack) / 1000)
                invoke(sock, rid, 8, field_varint(1, inst), drop_reply=True)
                rid += 1
                print("acked", flush=True)
        elif kind == 2:
            print("stopped", flush=True)
            return


def main():
    path, ds_name = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 4 and sys.argv[3] == "--start-ack":
        try:
            slow_starter(path, ds_name, sys.argv[4])
        except SystemExit:
            print("closed", flush=True)
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    rd = Reader(sock)
    sock.sendall(frame(1, field_bytes(3, field_bytes(1, b"ProducerPort"))))
    rd.frame()
    init = field_varint(1, 4096) + field_varint(2, 64 * 1024) + field_bytes(3, b"hostile") + field_varint(4, 1)
    invoke(sock, 2, 1, init)
    rd.frame()
    invoke(sock, 3, 2, field_bytes(1, field_bytes(1, ds_name.encode())))
    rd.frame()
    # An unknown method id: an error reply, the connection stays.
    invoke(sock, 4, 99, b"")
    reply = rd.frame()
    assert 6 in reply, reply
    invoke(sock, 5, 5, b"")
    target = None
    while target is None:
        f = rd.frame()
        reply = dict(fields(f[6]))
        cmd = dict(fields(reply[3]))
        if 1 in cmd:  # start_data_source
            start = dict(fields(cmd[1]))
            target = dict(fields(start[2]))[2]
    assert rd.fd is not None, "no shared memory fd"
    size = os.fstat(rd.fd).st_size
    shm = mmap.mmap(rd.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    page = 4096
    csize = (page - 8) & ~3
    print("started", flush=True)

    good = pb.TracePacket()
    good.for_testing.counter = 7777
    good.timestamp = 1
    forged = pb.TracePacket()
    forged.for_testing.counter = 6666
    forged.trusted_uid = 0
    complete = (1 << 28) | 3  # layout 1, chunk 0 complete

    def put(p, data):
        shm[p * page:p * page + 4] = struct.pack("<I", complete)
        shm[p * page + 8:p * page + 8 + len(data)] = data

    # Page 0: a good packet, a forged one, then a length past the end.
    put(0, chunk(0, 1, 0, [frag(good.SerializeToString()), frag(forged.SerializeToString()),
                           bytes([0xFF, 0xFF, 0xFF, 0x07]) + b"x"], csize))
    # Page 1: a fragment length over 4 bytes.
    put(1, chunk(1, 1, 0, [b"\x80\x80\x80\x80\x01"], csize))
    # Page 2: a reserved layout.
    shm[2 * page:2 * page + 4] = struct.pack("<I", (7 << 28) | 3)
    # Page 3: a chunk the producer may not write (buffer 77).
    put(3, chunk(2, 2, 0, [frag(good.SerializeToString())], csize))
    moves = b""
    for p, buf in [(0, target), (1, target), (2, target), (3, 77), (999, target), (0, target)]:
        moves += field_bytes(1, field_varint(1, p) + field_varint(2, 0) + field_varint(3, buf))
    # A patch for a chunk that does not exist, and one at an offset far out.
    patch = field_bytes(4, field_varint(1, 1 << 30) + field_bytes(2, b"\0\0\0\0"))
    moves += field_bytes(2, field_varint(1, target) + field_varint(2, 1) + field_varint(3, 12345) + patch)
    invoke(sock, 6, 4, moves)
    rd.frame()
    # Then garbage: a frame that claims 4 GiB.
    sock.sendall(struct.pack("<I", 0xFFFFFFFF) + b"garbage")
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass
    print("done", flush=True)


main()
