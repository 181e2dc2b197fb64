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
# protoc (grpcio-tools ships one), for the custom-field tests: an independent
# compiler of users' .proto files and writer of descriptor sets.
if ! python3 -c 'import grpc_tools.protoc' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check grpcio-tools
fi
# pandas, for Perfetto's BatchTraceProcessor in the fleet test (scripts/fleet_query.py).
if ! python3 -c 'import pandas' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check pandas
fi
# fusepy, for the file system whose fdatasync fails (tests/fixtures/failing_sync_fs.py;
# it needs libfuse2, which .ci/run installs).
if ! python3 -c 'import fuse' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check fusepy
fi
# zstd for the oracle's reading of compressed traces.
if ! python3 -c 'import zstandard' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check zstandard
fi

# Perfetto's trace processor, the third oracle, is not part of the repository:
# $RECORDER_TRACE_PROCESSOR names its wrapper (CI points it at Perfetto's
# prebuilt tools). The wrapper installs its one runtime library (Debian
# libprotobuf32) on a fresh machine when run as root: run it once here, before
# the tests run it in parallel. Without it the tests that use it say why they
# skip (a failure under RECORDER_REQUIRE_PEERS=1, as in CI), and so do the
# tests of Perfetto's own test configs ($RECORDER_PERFETTO_TEST_CONFIGS).
tp=${RECORDER_TRACE_PROCESSOR:-}
if [ -n "$tp" ] && [ -x "$tp" ] && ! "$tp" --version >/dev/null; then
  echo "warning: $tp does not run here (as root it installs libprotobuf32)" >&2
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
