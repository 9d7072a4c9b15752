#!/usr/bin/env bash
# Regenerates kernels.ptx from kernels.cu with the workload's own NVRTC path (no GPU, no nvcc):
#   pip install --target /tmp/nvrtc nvidia-cuda-nvrtc-cu12==12.9.86
#   NVRTC_LIB=/tmp/nvrtc/nvidia/cuda_nvrtc/lib gpu/kernels/regen.sh
# The PTX targets compute_80 with CUDA 12.9's NVRTC (PTX ISA 8.8), so every driver from 12.9 on,
# the CUDA 13 driver included, can JIT it for the device it runs on. With PTXAS set (e.g. the
# nvidia-cuda-nvcc-cu12 wheel's bin/ptxas) the result is also assembled for sm_90 as a check.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
cargo build --release --quiet
export LD_LIBRARY_PATH="${NVRTC_LIB:+$NVRTC_LIB:}${LD_LIBRARY_PATH:-}"
./target/release/kinetrace-gpu-workload --emit-ptx compute_80 > "$here/kernels.ptx.new"
mv "$here/kernels.ptx.new" "$here/kernels.ptx"
if [[ -n "${PTXAS:-}" ]]; then
    "$PTXAS" -arch=sm_90 "$here/kernels.ptx" -o /dev/null
    echo "ptxas: kernels.ptx assembles for sm_90"
fi
cargo build --release --quiet   # embed the new PTX
echo "wrote $here/kernels.ptx"
