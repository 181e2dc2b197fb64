"""Perfetto's producer IPC, as much of it as the scripted test peers speak
(tests/producer/hostile_producer.py, tests/producer/late_commit_producer.py,
tests/attacker/hostile_peer.py):
messages encoded by hand from the field numbers, frames read back with the
descriptor that comes along (the shared memory), and the producer's
handshake (bind, initialize, register a data source)."""
import array
import socket
import struct

# ProducerPort methods, by the ids the service gives them in its bind reply
# (in declaration order).
INITIALIZE_CONNECTION = 1
REGISTER_DATA_SOURCE = 2
COMMIT_DATA = 4
GET_ASYNC_COMMAND = 5
NOTIFY_DATA_SOURCE_STARTED = 8


class Closed(OSError):
    """The service closed the connection."""


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


def read_varint(data, pos):
    r = sh = 0
    while True:
        b = data[pos]
        pos += 1
        r |= (b & 0x7F) << sh
        if not b & 0x80:
            return r, pos
        sh += 7


def fields(data):
    """(field number, value) of each field of a message: an int for a
    varint, bytes otherwise."""
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


def frame(request_id, body):
    """An IPC frame (request_id, then `body`), with its length prefix."""
    f = field_varint(2, request_id) + body
    return struct.pack("<I", len(f)) + f


def bind():
    """BindService of the producer port, as request 1."""
    return frame(1, field_bytes(3, field_bytes(1, b"ProducerPort")))


def invoke(request_id, method, args, drop_reply=False):
    """InvokeMethod of `method` with `args` (the request's fields)."""
    m = field_varint(1, 1) + field_varint(2, method) + field_bytes(3, args)
    if drop_reply:
        m += field_varint(4, 1)
    return frame(request_id, field_bytes(5, m))


def initialize(name, page_bytes=None, smb_bytes=None, extra=b""):
    """InitializeConnection as request 2: the producer's name, and the
    shared memory page and buffer sizes it asks for."""
    args = b""
    if page_bytes is not None:
        args += field_varint(1, page_bytes)
    if smb_bytes is not None:
        args += field_varint(2, smb_bytes)
    return invoke(2, INITIALIZE_CONNECTION, args + field_bytes(3, name) + extra)


def register(request_id, name, extra=b""):
    """RegisterDataSource of a descriptor named `name` (plus `extra`
    descriptor fields)."""
    return invoke(request_id, REGISTER_DATA_SOURCE, field_bytes(1, field_bytes(1, name) + extra))


class Frames:
    """Frames from the service on `sock`, and the last descriptor that came
    along."""

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
                raise Closed("the service closed the connection")
            self.buf += data

    def reply(self, request_id):
        """The next frame answering `request_id` (others skipped)."""
        while True:
            f = self.next()
            if f.get(2) == request_id:
                return f

    def commands(self, request_id):
        """The async commands (their field and body) answering
        GetAsyncCommand `request_id`."""
        while True:
            f = self.reply(request_id)
            if 6 not in f:
                continue
            reply = dict(fields(f[6]))
            if 3 not in reply:
                continue
            for k, v in fields(reply[3]):
                yield k, v


def handshake(frames, name, data_source, page_bytes=None, smb_bytes=None, init_extra=b"", ds_extra=b""):
    """Binds the producer port (request 1), initializes as `name` (2) and
    registers `data_source` (3) on `frames`' socket, each answered."""
    frames.sock.sendall(bind())
    frames.reply(1)
    frames.sock.sendall(initialize(name, page_bytes, smb_bytes, init_extra))
    frames.reply(2)
    frames.sock.sendall(register(3, data_source, ds_extra))
    frames.reply(3)
