#!/usr/bin/env bash
# Instructions per event of the ftrace encoder on the captured ping-pong pages
# (criterion group ftrace_sched), counted by callgrind: a figure that does not
# move with the machine's load, for A/B of two builds of the bench binary.
#
#   cargo bench --bench ftrace --no-run
#   scripts/ftrace_encoder_instructions.sh target/release/deps/ftrace-<hash> [OTHER_BIN...]
#
# Events are the page walker's steps (one per event, plus one per page run).
set -euo pipefail
command -v valgrind >/dev/null || apt-get install -y valgrind >/dev/null
for bin in "$@"; do
  for bench in encode_compact encode_typed; do
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --bench "ftrace_sched/$bench\$" \
      --profile-time 2 >/dev/null 2>&1
    total=$(callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
      grep -E 'BundleEncoder::encode_pages \[' | head -1 | awk '{gsub(",", "", $1); print $1}')
    events=$(callgrind_annotate --tree=calling "$out" 2>/dev/null |
      grep -E '>.*EventIter.*::(next|step) \(' | head -1 | grep -o '([0-9,]*x)' | tr -d '(),x')
    rm -f "$out"
    echo "$bin $bench: $((total / events)) instructions/event"
  done
done
