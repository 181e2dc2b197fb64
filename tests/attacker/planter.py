#!/usr/bin/env python3
"""A local user planting names in a directory a root session shares, for the
hardening tests. Run as an unprivileged user; prints "ready" once in place,
runs for SECONDS, then prints what it did as one JSON line and exits.

  segments DIR SECRET SECONDS   around the newest segment index in DIR
                                (NAME-NNNNNN.EXT files), keep planting
                                symbolic links to SECRET at every name of
                                the set that is free: segments, their
                                .partial, sidecars and temporary names, and
                                the names the budget has just deleted; try
                                to rename, remove or add to what root made
                                (links into the hook's own directory
                                included)
"""

import json
import os
import re
import sys
import time

SEGMENT = re.compile(r"^(.*)-(\d{6,})\.([A-Za-z0-9]+)(\.partial|\.json)?$")


def names(stem, ext, i):
    base = f"{stem}-{i:06d}.{ext}"
    return [base, base + ".partial", base + ".json", f".{base}.json.tmp", f".{base}.tmp"]


def segments(d, secret, seconds):
    stats = {"planted": 0, "refused": 0, "moved": 0, "passes": 0}
    end = time.time() + seconds
    print("ready", flush=True)
    while time.time() < end:
        stats["passes"] += 1
        try:
            entries = os.listdir(d)
        except OSError:
            time.sleep(0.01)
            continue
        newest, stem, ext = -1, "trace", "pftrace"
        for e in entries:
            m = SEGMENT.match(e)
            if not m or int(m.group(2)) <= newest:
                continue
            # The session's own files, not the ones planted here.
            try:
                if os.lstat(os.path.join(d, e)).st_uid == os.getuid():
                    continue
            except OSError:
                continue
            newest, stem, ext = int(m.group(2)), m.group(1), m.group(3)
        if newest < 0:
            time.sleep(0.002)
            continue
        present = set(entries)
        for i in range(max(0, newest - 6), newest + 3):
            for n in names(stem, ext, i):
                if n in present:
                    continue
                try:
                    os.symlink(secret, os.path.join(d, n))
                    stats["planted"] += 1
                except OSError:
                    stats["refused"] += 1
        # What root made is not ours to move, remove or add to.
        for e in entries:
            p = os.path.join(d, e)
            try:
                if os.lstat(p).st_uid == os.getuid():
                    continue
            except OSError:
                continue
            if e.startswith(".recorder-hook."):
                for n in names(stem, ext, newest - 1):
                    try:
                        os.symlink(secret, os.path.join(p, n))
                        stats["planted"] += 1
                    except OSError:
                        stats["refused"] += 1
                continue
            try:
                os.rename(p, p + ".moved")
                stats["moved"] += 1
            except OSError:
                stats["refused"] += 1
        time.sleep(0.001)
    print(json.dumps(stats), flush=True)


def main():
    mode = sys.argv[1]
    if mode == "segments":
        segments(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
