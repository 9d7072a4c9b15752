#!/usr/bin/env bash
# The framework view's cost per PyTorch op and per training step, side by side with torch.profiler's
# (with and without record_shapes), in one run: benches/torch_ops.py's two workloads in every mode
# (see its docstring) with the torch venv's interpreter, through
# both routes PyTorch's ops can take into kinetrace (the compiled RecordFunction recorder, built
# first if it is not cached, and PyTorch's NVTX ranges), and through kinetrace.profile (the
# in-process API, the recorder route). Prints the load average before and after.
#
#   scripts/bench-torch-ops.sh
set -euo pipefail
# The shim is built beside the binary here: no embedded copy (crates/cli/build.rs).
export KINETRACE_EMBED_SHIM="${KINETRACE_EMBED_SHIM:-0}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$(bash scripts/torch-venv.sh)"
py="$venv/bin/python"
cargo build --quiet --release -p kinetrace-cli -p kinetrace-preload
kt="${CARGO_TARGET_DIR:-$root/target}/release/kinetrace"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# The recorder, as `kinetrace record` builds it before a Python command (timed here, not below).
PYTHONPATH="$root/python" "$py" -m kinetrace._ext build
echo "torch $("$py" -c 'import torch; print(torch.__version__)'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
mkdir -p "$out/pkg"
ln -s "$root/python/kinetrace" "$out/pkg/kinetrace"
for w in ops steps; do
    [ -n "${KT_STACKS:-}" ] && break
    echo "-- $w"
    "$py" benches/torch_ops.py plain $w
    "$py" benches/torch_ops.py torch.profiler $w
    "$py" benches/torch_ops.py torch.profiler-shapes $w
    "$kt" record --on-demand --no-summary -o "$out/dormant" --log "$out/log" -- "$py" benches/torch_ops.py dormant $w
    "$kt" record --no-summary -o "$out/inside" --log "$out/log" -- "$py" benches/torch_ops.py inside $w
    KINETRACE_TORCH_OPS_ROUTE=nvtx "$kt" record --no-summary -o "$out/inside-nvtx" --log "$out/log" -- "$py" benches/torch_ops.py inside-nvtx $w
    "$kt" record --record-shapes --no-summary -o "$out/shapes" --log "$out/log" -- "$py" benches/torch_ops.py inside-shapes $w
    KINETRACE_TORCH_OPS_ROUTE=nvtx "$kt" record --record-shapes --no-summary -o "$out/shapes-nvtx" --log "$out/log" -- "$py" benches/torch_ops.py inside-shapes-nvtx $w
    # kinetrace.profile: the package alone on PYTHONPATH (no sitecustomize), the release shim.
    KINETRACE_PRELOAD_PATH="${CARGO_TARGET_DIR:-$root/target}/release/libkinetrace.so" PYTHONPATH="$out/pkg" \
        "$py" benches/torch_ops.py kinetrace.profile $w 2>>"$out/log"
    KINETRACE_PRELOAD_PATH="${CARGO_TARGET_DIR:-$root/target}/release/libkinetrace.so" PYTHONPATH="$out/pkg" \
        "$py" benches/torch_ops.py kinetrace.profile-shapes $w 2>>"$out/log"
done
# with_stack and profile_memory, each against torch.profiler with the same switch (KT_STACKS=only:
# this part alone, with its baselines, and the rounds below).
for w in ops steps; do
    echo "-- $w: with_stack / profile_memory"
    if [ -n "${KT_STACKS:-}" ]; then
        "$py" benches/torch_ops.py plain $w
        "$py" benches/torch_ops.py torch.profiler $w
        "$kt" record --no-summary -o "$out/inside" --log "$out/log" -- "$py" benches/torch_ops.py inside $w
    fi
    "$py" benches/torch_ops.py torch.profiler-stack $w
    "$kt" record --with-stack --no-summary -o "$out/stack" --log "$out/log" -- "$py" benches/torch_ops.py inside-stack $w
    "$py" benches/torch_ops.py torch.profiler-memory $w
    "$kt" record --profile-memory --no-summary -o "$out/memory" --log "$out/log" -- "$py" benches/torch_ops.py inside-memory $w
done
# What with_stack and profile_memory add per training step, kinetrace's against torch.profiler's, with all modes in
# one process in shuffled rounds (benches/torch_rounds.py: per-process runs above move by
# more than that from run to run on a shared machine).
echo "-- steps: with_stack and profile_memory, in one process, in rounds"
KINETRACE_PRELOAD_PATH="${CARGO_TARGET_DIR:-$root/target}/release/libkinetrace.so" PYTHONPATH="$out/pkg" \
    "$py" benches/torch_rounds.py 2>>"$out/log"
# The same, with each profiler run as the guide's loop runs it (a schedule, on_trace_ready, the
# cycle's end timed in the step that ends it), and one allocator event at a time from C++.
echo "-- steps: the guide's cycle (wait=1, warmup=1, active=3), its end included"
TORCH_ROUNDS_CYCLE=1 KINETRACE_PRELOAD_PATH="${CARGO_TARGET_DIR:-$root/target}/release/libkinetrace.so" PYTHONPATH="$out/pkg" \
    "$py" benches/torch_rounds.py 30 3 2>>"$out/log"
echo "-- one allocator event (c10's CPU allocator called from C++)"
KINETRACE_PRELOAD_PATH="${CARGO_TARGET_DIR:-$root/target}/release/libkinetrace.so" PYTHONPATH="$out/pkg" \
    "$py" benches/alloc_events.py 60 500 2>>"$out/log"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "routes taken (kinetrace's log, in run order):"
grep -o 'PyTorch ops through [^(:]*' "$out/log" | sed 's/^/  /'
