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
# machine with an empty pip cache: 128 s, torch 539 MB plus 27 dependencies (the nvidia-* CUDA 13
# libraries, sympy, ...; not triton, below) installed one big wheel at a time: 4.4 GB installed,
# 4.5 GB of disk at the peak (one `pip install` of all of them installed 5.3 GB and held every
# downloaded wheel, ~3.0 GB, in pip's temporary directory until the end). Re-runs with the same pins
# only check a stamp file (well under 1 s).
#
# Pins: torch==2.15.0 (CUDA 13.2 build, CUPTI 13.2), numpy==2.3.5 (torch warns at import without
# numpy), pytest==8.4.2 (the compat venv's).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/venv.sh
. "$root/scripts/lib/venv.sh"

# --no-cache-dir: the wheels are ~3 GB; a second copy in the pip cache would double the disk used.
# VENV_ALONE: torch and each CUDA library wheel installed in a pip run of its own, so the peak is
# the venv plus one wheel, not plus all of them (scripts/lib/venv.sh). VENV_SKIP: triton (~1 GB
# installed) is torch.compile's GPU code generator; these tests run torch eagerly on the CPU, and
# torch imports it only when compiling.
VENV_ALONE='torch|nvidia-.*' VENV_SKIP='triton' \
make_venv torch-venv "${TORCH_VENV:-$root/target/torch-venv}" \
    'import torch, numpy, pytest; torch.nn.Linear(2, 2)(torch.zeros(1, 2))' \
    --no-cache-dir \
    -- \
    "torch==2.15.0" \
    "numpy==2.3.5" \
    "pytest==8.4.2"
