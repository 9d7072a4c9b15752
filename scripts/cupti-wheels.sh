#!/usr/bin/env bash
# Downloads the pinned NVIDIA PyPI wheels the CUPTI tests and the binding generator use, and unpacks
# them under target/cupti-wheels/<package>-<version>/ (idempotent: present wheels are skipped).
#
#   scripts/cupti-wheels.sh            # all pinned wheels
#   KINETRACE_CUPTI_WHEELS=/some/dir scripts/cupti-wheels.sh
#
# Needs `pip` (or `python3 -m pip`) and `unzip` or python3. No GPU, no CUDA toolkit.
# The wheels are: libcupti 11.8 / 12.9 / 13.1 / 13.5 (headers + libcupti.so.*), and the CUDA 13.5
# runtime + crt headers (cuda.h, crt/host_defines.h) the CUPTI headers include.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${KINETRACE_CUPTI_WHEELS:-$ROOT/target/cupti-wheels}"

# package==version, one per line. Keep in sync with docs/cuda-support.md.
PINNED=(
  "nvidia-cuda-cupti-cu11==11.8.87"
  "nvidia-cuda-cupti-cu12==12.9.79"
  "nvidia-cuda-cupti==13.1.115"
  "nvidia-cuda-cupti==13.5.25"
  "nvidia-cuda-runtime==13.5.37"
  "nvidia-cuda-crt==13.5.37"
)

PIP=(pip)
command -v pip >/dev/null 2>&1 || PIP=(python3 -m pip)

mkdir -p "$DEST/.download"
for spec in "${PINNED[@]}"; do
  name="${spec%%==*}"
  version="${spec##*==}"
  dir="$DEST/$name-$version"
  if [ -f "$dir/.complete" ]; then
    continue
  fi
  rm -rf "$dir"
  tmp="$DEST/.download/$name-$version"
  rm -rf "$tmp" && mkdir -p "$tmp"
  "${PIP[@]}" download --quiet --no-deps --only-binary=:all: "$spec" -d "$tmp"
  whl="$(ls "$tmp"/*.whl | head -n1)"
  mkdir -p "$dir"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$whl" "$dir"
  # Keep only what the tests and the generator use: headers and libcupti itself.
  find "$dir" -type f \( -name 'libnvperf*' -o -name 'libcheckpoint*' -o -name 'libpcsampling*' \
    -o -name 'libcudart*' -o -name '*.a' \) -delete
  touch "$dir/.complete"
  rm -rf "$tmp"
  echo "cupti-wheels: $spec -> $dir"
done
echo "cupti-wheels: ready in $DEST"
