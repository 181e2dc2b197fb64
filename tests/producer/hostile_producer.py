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
import mmap
import os
import socket
import struct
import sys
import time

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from producer_ipc import (COMMIT_DATA, GET_ASYNC_COMMAND, NOTIFY_DATA_SOURCE_STARTED, Closed,
                          Frames, field_bytes, field_varint, fields, handshake, invoke)


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


def slow_starter(path, ds_name, ack):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    rd = Frames(sock)
    # Descriptor: will_notify_on_start, and an id.
    handshake(rd, b"slow_starter", ds_name.encode(), init_extra=field_varint(4, 1),
              ds_extra=field_varint(3, 1) + field_varint(7, 42))
    sock.sendall(invoke(4, GET_ASYNC_COMMAND, b""))
    rid = 5
    for kind, body in rd.commands(4):
        if kind == 6:
            print("setup", flush=True)
        elif kind == 1:
            inst = dict(fields(body))[1]
            print("started", flush=True)
            if ack != "never":
                time.sleep(int(ack) / 1000)
                sock.sendall(invoke(rid, NOTIFY_DATA_SOURCE_STARTED, field_varint(1, inst), drop_reply=True))
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
        except Closed:
            print("closed", flush=True)
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    rd = Frames(sock)
    handshake(rd, b"hostile", ds_name.encode(), page_bytes=4096, smb_bytes=64 * 1024,
              init_extra=field_varint(4, 1))
    # An unknown method id: an error reply, the connection stays.
    sock.sendall(invoke(4, 99, b""))
    reply = rd.reply(4)
    assert 6 in reply, reply
    sock.sendall(invoke(5, GET_ASYNC_COMMAND, b""))
    target = None
    for kind, body in rd.commands(5):
        if kind == 1:  # start_data_source
            start = dict(fields(body))
            target = dict(fields(start[2]))[2]
            break
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
    sock.sendall(invoke(6, COMMIT_DATA, moves))
    rd.reply(6)
    # Then garbage: a frame that claims 4 GiB.
    sock.sendall(struct.pack("<I", 0xFFFFFFFF) + b"garbage")
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass
    print("done", flush=True)


main()
