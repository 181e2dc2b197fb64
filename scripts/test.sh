#!/usr/bin/env bash
# Sets up what the tests need on a fresh machine, then runs every test:
# the library and integration tests (with the kernel parts: tracefs,
# io_uring, root), the benches once each in test mode, and the fuzz corpora.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Python oracle: Perfetto's own schema (perfetto_trace_pb2) and protobuf.
if ! python3 -c 'import perfetto.protos.perfetto.trace.perfetto_trace_pb2' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check perfetto protobuf
fi
# zstd for the oracle's reading of compressed traces.
if ! python3 -c 'import zstandard' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check zstandard
fi

# tracefs, for the ftrace tests (root only; the tests say why they skip otherwise).
if [ "$(id -u)" = 0 ] && [ ! -e /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi

# Unit, integration and doc tests; the benches run once each (criterion's test mode).
cargo test --all-targets
cargo test --doc

# The fuzz targets' oracles over their committed corpora (stable toolchain).
cargo test --manifest-path fuzz/Cargo.toml
