#!/usr/bin/env python3
"""A consumer of `recorder serve`'s consumer socket that behaves as a hostile
local user would, for the service tests. Run as an unprivileged user. Every
mode prints one JSON line when it is done (and "ready" lines where a test
must wait for it), then holds its connections until killed, unless it says
otherwise.

  observe SOCKET CONFIG N        EnableTracing(CONFIG, a file of binary
                                 TraceConfig bytes), then N ObserveEvents
                                 (all data sources started) at once; counts
                                 the replies; then DisableTracing and waits
                                 for the EnableTracing reply: {"refused": r,
                                 "ended": true, "seconds": s}
  enable SOCKET CONFIG [--pipe]  EnableTracing(CONFIG); with --pipe, a pipe's
                                 write end rides along as the output (nobody
                                 ever reads it). Prints "ready", then the
                                 reply when one comes: {"error": "..."}
  attach SOCKET N KEYLEN         N Attach requests for a key of KEYLEN bytes:
                                 {"failed": f}
  connect SOCKET SECONDS         holds connections up to its uid's quota,
                                 then connects again and again for SECONDS
                                 (each one refused): {"attempts": a}
  producer SOCKET                on a producer socket: a producer whose name
                                 and SDK version hold newlines meant to
                                 forge log lines; exits once registered
"""

import json
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "producer"))
from producer_ipc import (  # noqa: E402
    Closed, Frames, field_bytes, field_varint, fields, frame, handshake,
)

# ConsumerPort methods, in declaration order (the ids the service gives).
ENABLE_TRACING = 1
DISABLE_TRACING = 2
ATTACH = 9
OBSERVE_EVENTS = 11
# ObservableEvents: all data sources started.
ALL_DATA_SOURCES_STARTED = 2


def bind(request_id=1):
    return frame(request_id, field_bytes(3, field_bytes(1, b"ConsumerPort")))


def invoke(request_id, method, args, service_id):
    m = field_varint(1, service_id) + field_varint(2, method) + field_bytes(3, args)
    return frame(request_id, field_bytes(5, m))


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    frames = Frames(s)
    s.sendall(bind())
    reply = dict(fields(frames.reply(1)[4]))
    return s, frames, reply.get(2, 1)


def reply_of(f):
    """(success, reply bytes) of an InvokeMethodReply frame."""
    r = dict(fields(f.get(6, b"")))
    return r.get(1, 0) == 1, r.get(3, b"")


def say(obj):
    print(json.dumps(obj), flush=True)


def hold():
    while True:
        time.sleep(3600)


def observe(path, config, n):
    s, frames, sid = connect(path)
    s.sendall(invoke(2, ENABLE_TRACING, field_bytes(1, config), sid))
    flood = b"".join(
        invoke(100 + i, OBSERVE_EVENTS, field_varint(1, ALL_DATA_SOURCES_STARTED), sid)
        for i in range(n)
    )
    s.sendall(flood)
    refused = 0
    answered = 0
    s.settimeout(30)
    # Refusals come at once; accepted watches wait for a start that never
    # comes. Count what arrives within a short quiet spell.
    s.settimeout(2)
    try:
        while True:
            f = frames.next()
            if f.get(2, 0) >= 100:
                answered += 1
                ok, _ = reply_of(f)
                refused += 0 if ok else 1
    except (socket.timeout, TimeoutError):
        pass
    s.settimeout(30)
    t0 = time.monotonic()
    s.sendall(invoke(3, DISABLE_TRACING, b"", sid))
    ended = False
    try:
        while True:
            f = frames.next()
            if f.get(2) == 2:
                ended = True
                break
    except (socket.timeout, TimeoutError, Closed):
        pass
    say({"answered": answered, "refused": refused, "ended": ended,
         "seconds": time.monotonic() - t0})
    hold()


def enable(path, config, pipe):
    s, frames, sid = connect(path)
    msg = invoke(2, ENABLE_TRACING, field_bytes(1, config), sid)
    if pipe:
        r, w = os.pipe()
        # A child holds the read end and never reads: the pipe outlives this
        # client (killed on its own by the test).
        if os.fork() == 0:
            s.close()
            os.close(w)
            hold()
        os.close(r)
        s.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", w))])
        os.close(w)
    else:
        s.sendall(msg)
    print("ready", flush=True)
    try:
        f = frames.reply(2)
        _, body = reply_of(f)
        r = dict(fields(body))
        err = r.get(3, b"").decode("utf-8", "replace")
        say({"error": err})
    except Closed:
        say({"error": None, "closed": True})
    hold()


def attach(path, n, keylen):
    s, frames, sid = connect(path)
    key = b"k" * keylen
    failed = 0
    for i in range(n):
        s.sendall(invoke(10 + i, ATTACH, field_bytes(1, key), sid))
        ok, _ = reply_of(frames.reply(10 + i))
        failed += 0 if ok else 1
    say({"failed": failed})
    hold()


def connect_flood(path, seconds):
    held = []
    attempts = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(path)
            attempts += 1
            if len(held) < 64:
                held.append(c)
            else:
                c.close()
        except OSError:
            attempts += 1
    say({"attempts": attempts})
    hold()


def producer(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    # InitializeConnectionRequest.sdk_version is field 8.
    sdk = field_bytes(8, b"sdk\nFORGED sdk line")
    handshake(Frames(s), b"app\nFORGED name line", b"ds\nFORGED data source line",
              init_extra=sdk)
    say({"registered": True})


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "observe":
        observe(path, open(sys.argv[3], "rb").read(), int(sys.argv[4]))
    elif mode == "enable":
        enable(path, open(sys.argv[3], "rb").read(), "--pipe" in sys.argv[4:])
    elif mode == "attach":
        attach(path, int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "connect":
        connect_flood(path, float(sys.argv[3]))
    elif mode == "producer":
        producer(path)
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
