#!/usr/bin/env python3
"""A producer that writes its shared memory as the SDK does and whose commit
of a finished chunk comes late: after a scrape that finds that chunk
complete and the next one already holding the end of a packet begun in it.

usage: late_commit_producer.py SOCKET DATA_SOURCE

One trace writer (id 1), SMB scraping enabled, flushes acknowledged with
no chunk moved. Packets are TracePackets with for_testing.counter 1, 2, 3:

1. chunk 0 (page 0) being written: packet 1, and the empty fragment the SDK
   counts ahead; the first flush's scrape reads packet 1;
2. at the second flush: chunk 0 complete with packet 2 and the start of
   packet 3, chunk 1 (page 1) being written with the end of packet 3 and
   the empty fragment; the flush is acknowledged without moving chunk 0, so
   its scrape finds both;
3. at the third flush: chunk 0 is moved, with the acknowledgement.

Prints `started`, then `done` once the move is sent. The test then stops
the session: the stop's scrape reads chunk 1 again. Every packet must be in
the trace once, in order, with no loss marked.
"""
import mmap
import os
import socket
import struct
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from producer_ipc import (COMMIT_DATA, GET_ASYNC_COMMAND, Frames, field_bytes, field_varint,
                          fields, handshake, invoke)

REGISTER_TRACE_WRITER = 6
PAGE = 4096
BEING_WRITTEN, COMPLETE = 1, 3
FIRST_CONTINUES, LAST_CONTINUES = 1, 2
WRITER = 1


def frag(payload):
    """A fragment: its size in the SDK's 4-byte form, then the bytes."""
    n = len(payload)
    return bytes([(n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, ((n >> 14) & 0x7F) | 0x80,
                  (n >> 21) & 0x7F]) + payload


def packet(counter):
    p = pb.TracePacket()
    p.for_testing.counter = counter
    p.for_testing.str = "late commit " * 4
    return p.SerializeToString()


def main():
    path, ds_name = sys.argv[1], sys.argv[2]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    rd = Frames(sock)
    handshake(rd, b"late_commit", ds_name.encode(), page_bytes=PAGE, smb_bytes=16 * PAGE,
              init_extra=field_varint(4, 1))
    sock.sendall(invoke(4, GET_ASYNC_COMMAND, b""))
    commands = rd.commands(4)
    target = None
    for kind, body in commands:
        if kind == 1:  # start_data_source: its config's target_buffer
            target = dict(fields(dict(fields(body))[2]))[2]
            break
    sock.sendall(invoke(5, REGISTER_TRACE_WRITER, field_varint(1, WRITER) + field_varint(2, target)))
    rd.reply(5)
    shm = mmap.mmap(rd.fd, os.fstat(rd.fd).st_size, mmap.MAP_SHARED,
                    mmap.PROT_READ | mmap.PROT_WRITE)

    def put(page, state, chunk_id, flags, frags):
        body = b"".join(frags)
        header = struct.pack("<IHH", chunk_id, WRITER, (len(frags) & 0x3FF) | (flags << 10))
        at = page * PAGE
        shm[at + 8:at + 8 + len(header) + len(body)] = header + body
        shm[at:at + 4] = struct.pack("<I", (1 << 28) | state)  # layout 1: one chunk

    p1, p2, p3 = packet(1), packet(2), packet(3)
    put(0, BEING_WRITTEN, 0, 0, [frag(p1), b"\0"])
    print("started", flush=True)
    rid = 10
    flushes = 0
    for kind, body in commands:
        if kind != 5:  # flush
            continue
        flush_id = dict(fields(body)).get(2, 0)
        flushes += 1
        commit = field_varint(3, flush_id)
        if flushes == 2:
            put(1, BEING_WRITTEN, 1, FIRST_CONTINUES, [frag(p3[20:]), b"\0"])
            put(0, COMPLETE, 0, LAST_CONTINUES, [frag(p1), frag(p2), frag(p3[:20])])
        elif flushes == 3:
            move = field_varint(1, 0) + field_varint(2, 0) + field_varint(3, target)
            commit = field_bytes(1, move) + commit
        sock.sendall(invoke(rid, COMMIT_DATA, commit, drop_reply=True))
        rid += 1
        if flushes == 3:
            print("done", flush=True)
            break
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass


main()
