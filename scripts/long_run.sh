#!/usr/bin/env bash
# A long real-machine capture with configs/long_trace.cfg (root): samples the
# recorder's RSS and CPU once a minute and prints a Markdown table, then
# inspects the trace for loss. Not part of CI.
#   cargo build --release && sudo bash scripts/long_run.sh [MINUTES] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
# OUT_DIR: a directory on the disk under test ($RECORDER_BENCH_DIR, else a
# new temporary directory).
dir=${2:-${RECORDER_BENCH_DIR:-$(mktemp -d)}}
mkdir -p "$dir"
out="$dir/long_trace.pftrace"
bin=${RECORDER_BIN:-target/release/recorder}
tck=$(getconf CLK_TCK)
"$bin" --config configs/long_trace.cfg -o "$out" -q &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' EXIT
echo "| minute | RSS MiB | CPU s in that minute | file MiB |"
echo "|---|---|---|---|"
prev=0
for m in $(seq 1 "$minutes"); do
  sleep 60
  read -r ut st < <(awk '{print $14, $15}' "/proc/$pid/stat")
  cpu=$(( ut + st ))
  rss=$(awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status")
  size=$(( $(stat -c %s "$out") / 1048576 ))
  printf '| %d | %d | %.2f | %d |\n' "$m" "$rss" "$(echo "($cpu - $prev) / $tck" | bc -l)" "$size"
  prev=$cpu
done
kill -TERM $pid
wait $pid || true
trap - EXIT
"$bin" inspect "$out" | sed -n '1,60p'
