#!/usr/bin/env python3
"""One question across a fleet's segments with Perfetto's BatchTraceProcessor.

    recorder index /srv/store > index.jsonl
    python3 scripts/fleet_query.py /srv/store index.jsonl \\
        --from 2026-12-03T11:00:00Z --to 2026-12-03T11:05:00Z [--host web-1 --host web-2]

Picks the segments to open from the index (the sidecars: host and wall-clock
span; only rows whose copy checked `ok`), opens them all in parallel and
prints, per host, the longest time a thread waited runnable (state R or R+ in
trace processor's thread_state: needs sched_switch and sched_waking), with the
thread and the segment it was in. `--sql` asks another question instead: its
rows, one table for every segment, with the host, session and index beside.

Needs the PyPI packages `perfetto` and `pandas`, and a trace_processor_shell
(`--trace-processor`, or the one `perfetto` downloads when not given).
"""

import argparse
import atexit
import json
import os
import sys
import urllib.request

import pandas as pd
from perfetto.batch_trace_processor.api import (BatchTraceProcessor,
                                                BatchTraceProcessorConfig)
from perfetto.trace_processor.api import TraceProcessorConfig
from perfetto.trace_uri_resolver.resolver import TraceUriResolver

RUNNABLE_SQL = """
select ts.dur as wait_ns, ts.ts as ts, thread.tid as tid, thread.name as thread
from thread_state ts join thread using (utid)
where ts.state in ('R', 'R+') and ts.dur > 0
order by ts.dur desc limit 1
"""


class IndexRows(TraceUriResolver):
    """The picked index rows as traces, with their sidecar fields as metadata
    (BatchTraceProcessor adds them as columns of every result)."""

    PREFIX = "recorder-index"

    def __init__(self, store, rows):
        self.store = store
        self.rows = rows

    def resolve(self):
        return [
            TraceUriResolver.Result(
                trace=os.path.join(self.store, r["path"]),
                metadata={
                    "host": r["host"],
                    "session_uuid": r["session_uuid"],
                    "index": r["index"],
                    "path": r["path"],
                },
            )
            for r in self.rows
        ]


def wall_ns(text):
    """ns since the epoch from an ISO 8601 time (UTC unless it says) or a number."""
    if text.isdigit():
        return int(text)
    t = pd.Timestamp(text)
    if t.tzinfo is None:
        t = t.tz_localize("UTC")
    return int(t.value)


def pick(index, hosts, start, end):
    """Rows checked ok, of the hosts asked for, whose wall-clock span meets [start, end]."""
    df = index[index["status"] == "ok"]
    if hosts:
        df = df[df["host"].isin(hosts)]
    # Sidecars without wall-clock times never match a time window.
    if start is not None:
        df = df[(df["last_realtime_ns"] >= start).fillna(False)]
    if end is not None:
        df = df[(df["first_realtime_ns"] <= end).fillna(False)]
    return df.sort_values(["host", "session_uuid", "index"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", help="the store the index's paths are relative to")
    ap.add_argument("index", help="`recorder index STORE` output (JSON lines), or - for stdin")
    ap.add_argument("--host", action="append", default=[], help="only this host (repeatable)")
    ap.add_argument("--from", dest="start", help="only segments reaching this time (ISO 8601 or ns)")
    ap.add_argument("--to", dest="end", help="only segments starting by this time")
    ap.add_argument("--sql", help="ask this instead of the longest runnable wait")
    ap.add_argument("--trace-processor", help="trace_processor_shell to run")
    ap.add_argument("--json", action="store_true", help="print the answer as JSON")
    args = ap.parse_args()

    src = sys.stdin if args.index == "-" else args.index
    index = pd.read_json(src, lines=True, dtype={"first_realtime_ns": "Int64", "last_realtime_ns": "Int64"})
    start = wall_ns(args.start) if args.start else None
    end = wall_ns(args.end) if args.end else None
    picked = pick(index, args.host, start, end)
    if picked.empty:
        print("no segment of the index matches", file=sys.stderr)
        return 1

    tp = TraceProcessorConfig(bin_path=args.trace_processor)
    with BatchTraceProcessor(IndexRows(args.store, picked.to_dict("records")),
                             BatchTraceProcessorConfig(tp_config=tp)) as btp:
        if args.sql:
            df = btp.query_and_flatten(args.sql)
            print(df.to_json(orient="records") if args.json else df.to_string(index=False))
            return 0
        waits = btp.query_and_flatten(RUNNABLE_SQL)

    hosts = []
    for host, segs in picked.groupby("host"):
        mine = waits[waits["host"] == host]
        row = {"host": host, "segments": len(segs), "paths": sorted(segs["path"])}
        if not mine.empty:
            top = mine.loc[mine["wait_ns"].idxmax()]
            row.update(longest_runnable_ns=int(top["wait_ns"]), ts=int(top["ts"]),
                       tid=int(top["tid"]), thread=top["thread"], path=top["path"])
        hosts.append(row)
    if args.json:
        print(json.dumps({"hosts": hosts}))
        return 0
    print(f"{'host':<20} {'segments':>8} {'longest runnable':>16}  thread (tid)  in")
    for h in hosts:
        wait = f"{h['longest_runnable_ns'] / 1e6:.3f} ms" if "longest_runnable_ns" in h else "-"
        who = f"{h.get('thread')} ({h.get('tid')})" if "tid" in h else "-"
        print(f"{h['host']:<20} {h['segments']:>8} {wait:>16}  {who}  {h.get('path', '-')}")
    return 0


if __name__ == "__main__":
    # perfetto's TraceProcessor polls each shell's /status with
    # urlretrieve and no file name: the replies land in temporary files
    # urllib removes only when asked.
    atexit.register(urllib.request.urlcleanup)
    sys.exit(main())
