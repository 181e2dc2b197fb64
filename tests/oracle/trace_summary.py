#!/usr/bin/env python3
"""Independent decoder for recorder's traces: parses a trace file with the
`perfetto` PyPI package's perfetto_trace_pb2 (Perfetto's own schema, through
Google's protobuf runtime) and prints a JSON summary the Rust tests compare
with what they expect.

A torn last record (a crash mid-write) is allowed: the prefix of whole
records is decoded, and the torn byte count is reported.

zstd_compressed_packets are decompressed (Python's `zstandard` module) and
their packets summarised in place, as trace processor reads them.
"""
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


def read_varint(data, pos):
    result = shift = 0
    while True:
        if pos >= len(data):
            return None, pos
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def whole_records(data):
    """Length of the prefix made of whole `0x0a <len> <packet>` records."""
    pos = 0
    while pos < len(data):
        if data[pos] != 0x0A:
            raise SystemExit(f"corrupt: byte {pos} is 0x{data[pos]:02x}, not a packet tag")
        n, p = read_varint(data, pos + 1)
        if n is None or p + n > len(data):
            return pos
        pos = p + n
    return pos


def expand(packets, compressed):
    """The packets, with every zstd_compressed_packets one replaced by the
    packets it holds; `compressed` collects the compressed packets' sizes."""
    out = []
    for pkt in packets:
        if pkt.WhichOneof("data") == "zstd_compressed_packets":
            import zstandard

            compressed.append(len(pkt.SerializeToString()))
            inner = pb.Trace()
            inner.ParseFromString(
                zstandard.ZstdDecompressor().decompress(pkt.zstd_compressed_packets)
            )
            out.extend(inner.packet)
        else:
            out.append(pkt)
    return out


def main():
    data = open(sys.argv[1], "rb").read()
    whole = whole_records(data)
    trace = pb.Trace()
    trace.ParseFromString(data[:whole])
    compressed = []
    packets = expand(trace.packet, compressed)
    attributes = {}
    kinds = {}
    seqs = {}
    service_events = []
    stats = None
    flushes = None
    for pkt in packets:
        kind = pkt.WhichOneof("data") or "none"
        if kind == "trace_attributes":
            for a in pkt.trace_attributes.attribute:
                attributes[a.key] = a.string_value if a.HasField("string_value") else a.long_value
        kinds[kind] = kinds.get(kind, 0) + 1
        seq = pkt.trusted_packet_sequence_id
        s = seqs.setdefault(str(seq), {"packets": 0, "dropped_marks": 0, "counters": []})
        s["packets"] += 1
        if pkt.previous_packet_dropped:
            s["dropped_marks"] += 1
        if kind == "for_testing":
            s["counters"].append(pkt.for_testing.counter)
        if kind == "service_event":
            service_events.append(pkt.service_event.WhichOneof("event_type"))
        if kind == "trace_stats":
            stats = [
                {f.name: v for f, v in b.ListFields()} for b in pkt.trace_stats.buffer_stats
            ]
            flushes = {
                "requested": pkt.trace_stats.flushes_requested,
                "succeeded": pkt.trace_stats.flushes_succeeded,
                "failed": pkt.trace_stats.flushes_failed,
            }
        if kind == "synchronization_marker":
            s.setdefault("sync_markers", 0)
            s["sync_markers"] = s["sync_markers"] + 1
    out = {
        "bytes": len(data),
        "torn_bytes": len(data) - whole,
        "packets": len(packets),
        "compressed_packets": len(compressed),
        "largest_compressed_packet": max(compressed, default=0),
        "attributes": attributes,
        "kinds": kinds,
        "sequences": seqs,
        "service_events": service_events,
        "last_buffer_stats": stats,
        "last_flushes": flushes,
        "first_kinds": [p.WhichOneof("data") or "none" for p in packets[:12]],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
