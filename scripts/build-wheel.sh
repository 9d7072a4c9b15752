#!/usr/bin/env bash
# Builds the wheel for PyTorch users: target/wheels/kinetrace-VERSION-py3-none-manylinux_2_NN_ARCH.whl,
# holding the `kinetrace` command (crates/cli, built by maturin), the Python package `kinetrace`
# (python/kinetrace: kinetrace.profile, the step hook, the op recorder's source and builder) and the
# shim libkinetrace.so inside that package. Installing it needs no Rust, no compiler and no network:
#
#   bash scripts/build-wheel.sh
#   pip install target/wheels/kinetrace-*.whl
#   kinetrace record -- python train.py
#
# Needs cargo and python3 (with venv); maturin and auditwheel (pinned below) are installed from PyPI
# into target/wheel-tools once. Release builds are shared with the rest of the workspace (target/
# release); the binary and the shim are stripped of debug info in the wheel. Prints the wheel's path
# last, after `auditwheel show`'s verdict (the manylinux tag). docs/wheel.md has the details,
# aarch64 included.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

MATURIN_VERSION=1.16.0
AUDITWHEEL_VERSION=6.8.2
tools="$root/target/wheel-tools"
if ! "$tools/bin/maturin" --version 2>/dev/null | grep -qx "maturin $MATURIN_VERSION" ||
    ! "$tools/bin/auditwheel" --version 2>/dev/null | grep -q "auditwheel $AUDITWHEEL_VERSION "; then
    rm -rf "$tools"
    python3 -m venv "$tools"
    "$tools/bin/pip" install --quiet --disable-pip-version-check \
        "maturin==$MATURIN_VERSION" "auditwheel==$AUDITWHEEL_VERSION"
fi

# The wheel carries the shim in its package: the binary needs no embedded copy (crates/cli/build.rs).
export KINETRACE_EMBED_SHIM="${KINETRACE_EMBED_SHIM:-0}"
cargo build --quiet --release --locked -p kinetrace-preload

# Placed in the package for maturin to pack (git ignores it), removed again afterwards so that a
# source tree never holds a stale copy.
staged="$root/python/kinetrace/libkinetrace.so"
trap 'rm -f "$staged"' EXIT
if command -v strip >/dev/null; then
    strip --strip-debug -o "$staged" target/release/libkinetrace.so
else
    echo "build-wheel.sh: no strip (binutils): the shim keeps its debug info" >&2
    cp target/release/libkinetrace.so "$staged"
fi

mkdir -p target/wheels
rm -f target/wheels/kinetrace-*.whl
"$tools/bin/maturin" build --quiet --release --locked --strip --out target/wheels >&2
wheel="$(ls target/wheels/kinetrace-*.whl)"
"$tools/bin/auditwheel" show "$wheel" >&2
echo "$wheel"
