#!/usr/bin/env bash
# Builds the Debian package target/debian/recorder_VERSION_ARCH.deb with
# cargo-deb (installed if missing): /usr/bin/recorder, the man pages and the
# bash/zsh/fish completions made from the binary's own clap definitions, the
# recorder-serve systemd unit (from contrib/, run from /usr/bin) and a
# postinst that creates the `recorder` system user. Prints the .deb's path as
# its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

# A pinned cargo-deb, so every build packs alike.
CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
  cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION" >&2
fi

target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet >&2
bin=$target/release/recorder

# What cargo-deb packs beside the binary (Cargo.toml [package.metadata.deb]).
assets=target/debian-assets
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
"$bin" man-pages "$assets/man" >/dev/null
"$bin" completions bash >"$assets/completions/recorder.bash"
"$bin" completions zsh >"$assets/completions/_recorder"
"$bin" completions fish >"$assets/completions/recorder.fish"
sed 's|/usr/local/bin/recorder|/usr/bin/recorder|' contrib/recorder-serve.service \
  >"$assets/recorder-serve.service"
grep -q '^ExecStart=/usr/bin/recorder ' "$assets/recorder-serve.service"

# cargo-deb prints the package's path last.
cargo deb --no-build --strip --quiet | tail -n 1
