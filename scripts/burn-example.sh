#!/usr/bin/env bash
# examples/burn, in its own workspace (burn 0.22.1 + kinetrace-burn; the main workspace never builds
# burn or cubecl): cargo fmt --check, then one dev build of the tests with clippy -D warnings on the
# workspace's own crates, then the tests (the example trains under the profiler; the adapter's
# pairing tests). Target dir: target/examples-burn. Prints the example binary's path last.
#
# Clippy runs as the build's RUSTC_WORKSPACE_WRAPPER (what `cargo clippy` itself sets up) so the
# dependencies are compiled once: a separate `cargo clippy` re-checks all of burn (measured 6 min
# on 2 cores, vs seconds this way).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/examples/burn"
export CARGO_TARGET_DIR="$root/target/examples-burn"

cargo fmt --all -- --check

clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
[[ -x "$clippy_driver" ]] || { echo "burn-example.sh: clippy-driver not found at $clippy_driver (rustup component add clippy)" >&2; exit 1; }
RUSTC_WORKSPACE_WRAPPER="$clippy_driver" \
    CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" \
    cargo test --locked --workspace --no-run
# The same flags, so the test run reuses that build.
RUSTC_WORKSPACE_WRAPPER="$clippy_driver" \
    CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" \
    cargo test --locked --workspace

echo "$CARGO_TARGET_DIR/debug/kinetrace-burn-example"
