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
# shellcheck source=scripts/lib/venv.sh
. "$root/scripts/lib/venv.sh"

make_venv compat-venv "${COMPAT_VENV:-$root/target/compat-venv}" \
    'import hta.trace_analysis, torch_tb_profiler.profiler.data, torch_tb_profiler.profiler.run_generator, pytest, perfetto.protos.perfetto.trace.perfetto_trace_pb2' \
    -- \
    "holistictraceanalysis==0.5.0" \
    "torch-tb-profiler==0.4.3" \
    "pandas==2.3.3" \
    "numpy==2.3.5" \
    "pytest==8.4.2" \
    "perfetto==0.59.1" \
    "protobuf==7.36.2"
