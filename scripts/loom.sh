#!/usr/bin/env bash
# Model-checks the per-thread ring (crates/core/src/ring.rs) with loom: every interleaving of one
# writer and one reader in the `ring::loom` tests, with loom's atomics swapped in by `--cfg loom`.
# Uses its own target directory so the flag does not invalidate the normal build.
#
#   scripts/loom.sh            # from anywhere
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
exec cargo test --locked --release -p kinetrace-core --lib --target-dir target/loom -- ring::loom
