#!/usr/bin/env bash
# The framework view's cost per PyTorch op, side by side with torch.profiler's, in one run:
# benches/torch_ops.py in every mode (see its docstring) with the torch venv's interpreter.
#
#   scripts/bench-torch-ops.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$(bash scripts/torch-venv.sh)"
py="$venv/bin/python"
cargo build --quiet --release -p kinetrace-cli -p kinetrace-preload
kt="$root/target/release/kinetrace"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "torch $("$py" -c 'import torch; print(torch.__version__)'), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
"$py" benches/torch_ops.py plain
"$py" benches/torch_ops.py torch.profiler
"$kt" record --on-demand --no-summary -o "$out/dormant" --log "$out/log" -- "$py" benches/torch_ops.py dormant
"$kt" record --no-summary -o "$out/inside" --log "$out/log" -- "$py" benches/torch_ops.py inside
"$kt" record --record-shapes --no-summary -o "$out/shapes" --log "$out/log" -- "$py" benches/torch_ops.py inside-shapes
