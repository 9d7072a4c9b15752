#!/usr/bin/env bash
# Creates (idempotently) the Python environment the compatibility tests run in: the real trace
# consumers, pinned, in target/compat-venv. Prints the venv's path on stdout (progress goes to stderr).
#
#   scripts/compat-venv.sh            # create or reuse
#   PYTHON=python3.11 scripts/compat-venv.sh
#   COMPAT_VENV=/some/dir scripts/compat-venv.sh
#
# Needs only python3 (3.8+; tested with 3.11) with pip, and PyPI. A fresh install takes about a minute
# (59 s measured with an empty pip cache: HTA pulls in jupyterlab, torch-tb-profiler pulls in
# tensorboard, ~100 packages). Re-runs with the same pins only check a stamp file (well under 1 s).
#
# Pins:
# - holistictraceanalysis==0.5.0, torch-tb-profiler==0.4.3: the consumer versions the tests target.
# - pandas==2.3.3: HTA 0.5.0 breaks on pandas 3 (trace.py transform_correlation_to_index assigns
#   int64 row indices into a column pandas 3 keeps as int8 and raises "Invalid value ... for dtype
#   'int8'"). pandas 2.3.3 only warns (FutureWarning on downcasting in replace()).
# - numpy==2.3.5: a numpy pandas 2.3.3 supports.
# - pytest==8.4.2.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${COMPAT_VENV:-$root/target/compat-venv}"
python="${PYTHON:-python3}"

pins=(
    "holistictraceanalysis==0.5.0"
    "torch-tb-profiler==0.4.3"
    "pandas==2.3.3"
    "numpy==2.3.5"
    "pytest==8.4.2"
)
stamp_text="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ${pins[*]}"
stamp="$venv/.kinetrace-compat-stamp"

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$stamp_text" ]]; then
    echo "$venv"
    exit 0
fi

log() { echo "compat-venv: $*" >&2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

start=$(date +%s)
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
log "creating $venv with $("$python" --version 2>&1)"
if ! "$python" -m venv "$venv" >&2 2>/dev/null; then
    # Debian/Ubuntu without python3-venv (no ensurepip): use virtualenv from PyPI instead, installed
    # with --target (which an "externally managed" system Python still allows).
    rm -rf "$venv"
    log "python3 -m venv failed; falling back to virtualenv"
    tools="$(dirname "$venv")/compat-venv-tools"
    rm -rf "$tools"
    "$python" -m pip install --quiet --target "$tools" virtualenv >&2
    PYTHONPATH="$tools" "$python" -m virtualenv --quiet "$venv" >&2
    rm -rf "$tools"
fi
log "installing ${pins[*]}"
"$venv/bin/python" -m pip install --quiet "${pins[@]}" >&2
# Fail now, not in the middle of the tests, if an import is broken.
"$venv/bin/python" -c 'import hta.trace_analysis, torch_tb_profiler.profiler.data, torch_tb_profiler.profiler.run_generator, pytest' >&2
echo "$stamp_text" >"$stamp"
log "ready in $(($(date +%s) - start)) s"
echo "$venv"
