#!/usr/bin/env bash
# Compatibility tests with real trace consumers: HolisticTraceAnalysis 0.5.0 and torch-tb-profiler 0.4.3
# read traces kinetrace writes (tests/compat; a ROCm one from the fake rocprofiler-sdk too, a burn
# Learner run's from examples/burn, and one from the candle training loop in examples/candle), and
# Perfetto's schema (PyPI perfetto 0.59.1) decodes the .pftrace files `kinetrace convert` writes.
# Builds the example binaries that write them, sets up the
# pinned Python environment (scripts/compat-venv.sh) and runs pytest; exits non-zero on any failure.
#
#   scripts/compat-tests.sh [PYTEST_ARGS...]     # from anywhere; e.g. -k hta, -x
set -euo pipefail
# The shim is built beside the binary here: no embedded copy (crates/cli/build.rs).
export KINETRACE_EMBED_SHIM="${KINETRACE_EMBED_SHIM:-0}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cargo build --release --example hta_fixture --example demo
cargo build --release -p kinetrace-cli
cargo build --release -p kinetrace-rocm --example rocm_fixture
# examples/burn in its own workspace (dev profile, the build scripts/burn-example.sh made).
(cd examples/burn && cargo build --locked --target-dir "$root/target/examples-burn")
# The candle training loop (its own workspace; the dev build scripts/test.sh already made).
cargo build --locked --manifest-path examples/candle/Cargo.toml

target_dir="$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
export KINETRACE_HTA_FIXTURE="$target_dir/release/examples/hta_fixture"
export KINETRACE_DEMO="$target_dir/release/examples/demo"
export KINETRACE_BIN="$target_dir/release/kinetrace"
export KINETRACE_ROCM_FIXTURE="$target_dir/release/examples/rocm_fixture"
export KINETRACE_BURN_EXAMPLE="$root/target/examples-burn/debug/kinetrace-burn-example"
candle_target="$(cargo metadata --locked --format-version 1 --no-deps --manifest-path examples/candle/Cargo.toml |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
export KINETRACE_CANDLE="$candle_target/debug/kinetrace-candle-example"

venv="$(scripts/compat-venv.sh)"

# No .pytest_cache in the work tree.
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/compat tests/preload "$@"
