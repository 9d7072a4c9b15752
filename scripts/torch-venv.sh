#!/usr/bin/env bash
# Creates (idempotently) the Python environment the real-PyTorch test runs its training job in
# (tests/preload/test_torch_record.py): PyTorch from PyPI, pinned, in target/torch-venv. Prints the
# venv's path on stdout (progress goes to stderr).
#
#   scripts/torch-venv.sh             # create or reuse
#   PYTHON=python3.11 scripts/torch-venv.sh
#   TORCH_VENV=/some/dir scripts/torch-venv.sh
#
# Needs only python3 (3.10+; tested with 3.11) with pip, and PyPI. The default (CUDA) torch wheel is
# what users run, and it brings the real CUPTI 13.x library (nvidia-cuda-cupti) the test wants
# loaded; the job itself runs on the CPU (no driver needed). Measured on the 2-core development
# machine with an empty pip cache: 119 s, ~3.0 GB downloaded (torch 539 MB plus 28 dependencies:
# the nvidia-* CUDA 13 libraries, triton, sympy, ...), 5.3 GB installed. Re-runs with the same pins
# only check a stamp file (well under 1 s).
#
# Pins: torch==2.15.0 (CUDA 13.2 build, CUPTI 13.2), numpy==2.3.5 (torch warns at import without
# numpy), pytest==8.4.2 (the compat venv's).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TORCH_VENV:-$root/target/torch-venv}"
python="${PYTHON:-python3}"

pins=(
    "torch==2.15.0"
    "numpy==2.3.5"
    "pytest==8.4.2"
)
stamp_text="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ${pins[*]}"
stamp="$venv/.kinetrace-torch-stamp"

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$stamp_text" ]]; then
    echo "$venv"
    exit 0
fi

log() { echo "torch-venv: $*" >&2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

start=$(date +%s)
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
log "creating $venv with $("$python" --version 2>&1)"
if ! "$python" -m venv "$venv" >&2 2>/dev/null; then
    # Debian/Ubuntu without python3-venv (no ensurepip): virtualenv from PyPI, as compat-venv.sh does.
    rm -rf "$venv"
    log "python3 -m venv failed; falling back to virtualenv"
    tools="$(dirname "$venv")/torch-venv-tools"
    rm -rf "$tools"
    "$python" -m pip install --quiet --target "$tools" virtualenv >&2
    PYTHONPATH="$tools" "$python" -m virtualenv --quiet "$venv" >&2
    rm -rf "$tools"
fi
log "installing ${pins[*]} (about 3 GB of wheels)"
# --no-cache-dir: the wheels are ~3 GB; a second copy in the pip cache would double the disk used.
"$venv/bin/python" -m pip install --quiet --no-cache-dir "${pins[@]}" >&2
# Fail now, not in the middle of the tests, if the import is broken.
"$venv/bin/python" -c 'import torch, numpy, pytest; torch.nn.Linear(2, 2)(torch.zeros(1, 2))' >&2
echo "$stamp_text" >"$stamp"
log "ready in $(($(date +%s) - start)) s"
echo "$venv"
