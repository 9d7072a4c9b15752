#!/usr/bin/env bash
# The whole test suite: formatting, lints, every Rust test, then the compatibility tests that load
# kinetrace's traces in the real consumers (HolisticTraceAnalysis 0.5.0, torch-tb-profiler 0.4.3).
# Sets up what it needs (a Python venv under target/) on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "CUPTI wheels (real libcupti and headers for the layout and loading tests)"
bash scripts/cupti-wheels.sh

step "cargo test"
cargo test --workspace --locked

step "GPU check script self-test (the trace checker run on GPU machines)"
python3 gpu/check/gpu_check.py selftest

step "compatibility tests (HTA, torch-tb-profiler)"
bash scripts/compat-tests.sh
