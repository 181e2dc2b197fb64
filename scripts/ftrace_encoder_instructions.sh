#!/usr/bin/env bash
# Instructions per event of the ftrace encoder on the captured ping-pong pages
# (criterion group ftrace_sched), counted by callgrind: a figure that does not
# move with the machine's load, for A/B of two builds of the bench binary.
#
#   cargo bench --bench ftrace --no-run
#   scripts/ftrace_encoder_instructions.sh target/release/deps/ftrace-<hash> [OTHER_BIN...]
#
# The cost is encode_pages' inclusive count over the timed iterations alone
# (criterion's Bencher::iter calls), divided by the iterations and by the
# events of the pages (the bench prints that count).
set -euo pipefail
command -v valgrind >/dev/null || apt-get install -y valgrind >/dev/null
for bin in "$@"; do
  for bench in encode_compact encode_typed; do
    out=$(mktemp)
    log=$(valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --bench "ftrace_sched/$bench\$" \
      --profile-time 2 2>&1)
    events=$(grep -E "ftrace_sched/$bench: [0-9]+ events" <<<"$log" | head -1 | awk '{print $2}')
    # Run from elsewhere: in the repository it reads the sources and names
    # the bench's frames otherwise.
    line=$(cd / && callgrind_annotate --tree=caller "$out" 2>/dev/null |
      grep -B8 -E '^ *[0-9,]+ \([ 0-9.]+%\)  \*  .*BundleEncoder::encode_pages \[' |
      grep -E '<.*Bencher.*::iter \(' | head -1 || true)
    total=$(awk '{gsub(",", "", $1); print $1}' <<<"$line")
    iters=$(grep -o '([0-9,]*x)' <<<"$line" | tr -d '(),x')
    rm -f "$out"
    echo "$bin $bench: $((total / iters / events)) instructions/event"
  done
done
