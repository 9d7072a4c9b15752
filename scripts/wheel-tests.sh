#!/usr/bin/env bash
# The wheel as a PyTorch user gets it: builds it (scripts/build-wheel.sh), then tests/wheel installs
# it into a fresh venv with no cargo on PATH (seeing the torch venv's packages) and checks
# `kinetrace record`, `import kinetrace`, kinetrace.profile against torch.profiler on the guide's
# training loop, and `auditwheel show`. Exits non-zero on any failure.
#
#   scripts/wheel-tests.sh [PYTEST_ARGS...]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

wheel="$(bash scripts/build-wheel.sh)"
export KINETRACE_WHEEL="$root/$wheel"
export KINETRACE_AUDITWHEEL="$root/target/wheel-tools/bin/auditwheel"
venv="$(scripts/compat-venv.sh)"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/wheel "$@"
