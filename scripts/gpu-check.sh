#!/usr/bin/env bash
# The real-GPU check of kinetrace (issues 3 and 5, "On a real GPU").
#
#   scripts/gpu-check.sh build       here, with cargo: builds gpu/ (the cudarc workload) in release and
#                                    stages it, the kinetrace CLI and preload shim (if built:
#                                    target/release/kinetrace, target/release/libkinetrace.so) and the
#                                    Python checker into target/gpu-check/ (< 64 MiB). Set
#                                    GPU_CHECK_BUILD_CLI=1 to build the CLI and the shim first;
#                                    GPU_CHECK_BUILD_BURN=1 to build and stage examples/burn with
#                                    burn-cuda (`--features cuda`, fusion off; no nvcc needed: NVRTC
#                                    and the CUDA headers are found at run time, in PyTorch's wheels).
#                                    GPU_CHECK_BUILD_CANDLE=1 also builds examples/candle with its
#                                    `cuda` feature (release; nvcc from the pinned PyPI wheels in
#                                    target/nvcc-venv, CUDA_COMPUTE_CAP=90 for the H200) and stages
#                                    it: `run` then trains it on the GPU and checks that every kernel
#                                    carries the External id of the range that launched it.
#   scripts/gpu-check.sh run [DIR]   there, on an NVIDIA machine with CUDA and PyTorch (no cargo):
#                                    runs the staged workload, checks its trace, runs the same work
#                                    and a training loop under torch.profiler (and under
#                                    `kinetrace record` when the staged CLI has it; then a one-rank
#                                    NCCL job with DDP under `record --record-shapes --with-stack
#                                    --profile-memory`: torch's record_param_comms args, NCCL
#                                    kernels labelled with them, distributedInfo with the NCCL
#                                    version, the CUDA caching allocator's [memory] events with
#                                    Total Reserved, kernels reaching a job line through their op's
#                                    python_function frames), prints one summary
#                                    table; output and logs in DIR (default ./gpu-check-out-TIME).
#                                    With the staged CLI it also runs a bf16 matmul of known size
#                                    (8192³) under torch.profiler through `kinetrace analyze --only
#                                    efficiency`: the FLOPs must be the known count, the achieved
#                                    TFLOP/s within 10% of CUDA events' timing, the device in the
#                                    peaks table and the roofline fraction plausible (0.25-1.05).
#                                    Exit 0 all checks passed, 1 a check failed, 2 no GPU/driver or
#                                    nothing staged. Finishes in under 8 minutes.
#   scripts/gpu-check.sh rocm [DIR]  there, on an AMD machine with ROCm and ROCm PyTorch (issue 11):
#                                    the training loop under torch.profiler and under
#                                    `kinetrace record` with the staged shim as rocprofiler-sdk tool
#                                    (ROCP_TOOL_LIBRARIES), compared, with the ROCm trace checks.
#                                    Needs GPU_CHECK_BUILD_CLI=1 at build. Same exit codes. PREPARED
#                                    ONLY: never run, no AMD GPU has been available to the project.
#
# The staged folder is self-contained: copy target/gpu-check/ to the GPU machine and run
# `gpu-check/gpu-check.sh run` there (or run this script from the repository, which finds it).
set -euo pipefail
# The shim is built beside the binary here: no embedded copy (crates/cli/build.rs).
export KINETRACE_EMBED_SHIM="${KINETRACE_EMBED_SHIM:-0}"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MAX_STAGE_BYTES=$((64 * 1024 * 1024))

usage() {
    sed -n '2,40p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

die() {
    echo "gpu-check: $*" >&2
    exit 2
}

# The staged folder: this script's own folder when it is the staged copy, else the repository's.
stage_dir() {
    if [[ -x "$here/bin/kinetrace-gpu-workload" ]]; then
        echo "$here"
    else
        echo "$(cd "$here/.." && pwd)/target/gpu-check"
    fi
}

cmd_build() {
    command -v cargo > /dev/null || die "cargo not found: build on a machine with a Rust toolchain, then copy target/gpu-check/"
    local root stage
    root=$(cd "$here/.." && pwd)
    stage="$root/target/gpu-check"
    echo "gpu-check: building gpu/ (release)"
    cargo build --release --manifest-path "$root/gpu/Cargo.toml"
    if [[ "${GPU_CHECK_BUILD_CLI:-0}" == 1 ]]; then
        echo "gpu-check: building the kinetrace CLI and preload shim (release)"
        (cd "$root" && cargo build --release -p kinetrace-cli -p kinetrace-preload)
    fi
    if [[ "${GPU_CHECK_BUILD_CANDLE:-0}" == 1 ]]; then
        build_candle_cuda "$root"
    fi
    rm -rf "$stage"
    mkdir -p "$stage/bin" "$stage/check" "$stage/kernels"
    install -m 755 "$root/gpu/target/release/kinetrace-gpu-workload" "$stage/bin/"
    local f
    for f in kinetrace libkinetrace.so; do
        if [[ -f "$root/target/release/$f" ]]; then
            install -m 755 "$root/target/release/$f" "$stage/bin/"
            # Release builds keep line tables (profile.release debug = 1): strip to stay small.
            if command -v strip > /dev/null; then
                strip --strip-debug "$stage/bin/$f" 2> /dev/null || true
            fi
            echo "gpu-check: staged target/release/$f"
        else
            echo "gpu-check: target/release/$f not built: not staged (GPU_CHECK_BUILD_CLI=1 builds it)"
        fi
    done
    if [[ "${GPU_CHECK_BUILD_BURN:-0}" == 1 ]]; then
        # Release, its own workspace and target dir. Without nvcc, cudarc (burn-cuda loads libcuda
        # and NVRTC dynamically) uses its latest bindings (13.x, like the GPU machine's PyTorch
        # wheels); set CUDARC_CUDA_VERSION (e.g. 12080) for an older driver.
        # Needs the network at build time: cubecl-cuda 0.11.3 depends on cubecl-llvm, whose
        # tracel-llvm-bundler build script downloads an LLVM 23.1.0-4 bundle from
        # github.com/tracel-ai/tracel-llvm releases (cached in the user's cache dir, `tracel/`).
        echo "gpu-check: building examples/burn with burn-cuda (release)"
        (cd "$root/examples/burn" && cargo build --release --locked --features cuda \
            --target-dir "$root/target/examples-burn-cuda") \
            || die "examples/burn --features cuda did not build (offline? its LLVM bundle is downloaded at build time)"
        install -m 755 "$root/target/examples-burn-cuda/release/kinetrace-burn-example" "$stage/bin/kinetrace-burn-example-cuda"
        if command -v strip > /dev/null; then
            strip --strip-debug "$stage/bin/kinetrace-burn-example-cuda" 2> /dev/null || true
        fi
        echo "gpu-check: staged examples/burn (burn-cuda) as bin/kinetrace-burn-example-cuda"
    fi
    local candle_bin="$root/examples/candle/target-cuda/release/kinetrace-candle-example"
    if [[ "${GPU_CHECK_BUILD_CANDLE:-0}" == 1 ]]; then
        # 54 MB (PTX text and the MoE kernels' SASS): gzipped to ~14 MB to fit the 64 MiB stage;
        # the checker unpacks it into its output folder.
        local tmp_bin="$stage/bin/kinetrace-candle-example"
        install -m 755 "$candle_bin" "$tmp_bin"
        if command -v strip > /dev/null; then
            strip --strip-debug "$tmp_bin" 2> /dev/null || true
        fi
        gzip -6 -f "$tmp_bin"
        echo "gpu-check: staged the candle example (cuda, gzipped: $(du -h "$tmp_bin.gz" | cut -f1))"
    fi
    install -m 644 "$root/gpu/check/gpu_check.py" "$root/gpu/check/efficiency_check.py" \
        "$root/gpu/check/nccl_check.py" "$stage/check/"
    install -m 644 "$root/gpu/kernels/kernels.cu" "$root/gpu/kernels/kernels.ptx" "$stage/kernels/"
    install -m 755 "$root/scripts/gpu-check.sh" "$stage/gpu-check.sh"
    {
        echo "staged: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "commit: $(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo unknown)$(git -C "$root" diff --quiet 2> /dev/null || echo ' (dirty)')"
        (cd "$stage" && find . -type f ! -name MANIFEST -printf '%s\t%p\n' | sort -k2)
    } > "$stage/MANIFEST"
    if command -v python3 > /dev/null; then
        python3 "$stage/check/gpu_check.py" selftest --out "$root/target/gpu-check-selftest" > /dev/null \
            || die "the checker's self-test failed: python3 $stage/check/gpu_check.py selftest"
        echo "gpu-check: checker self-test passed"
        # The efficiency check (a matmul of known size against the roofline, issue 24) on
        # synthesised traces of the matmul: right ones pass, wrong ones fail.
        if [[ -x "$stage/bin/kinetrace" ]]; then
            python3 "$stage/check/efficiency_check.py" selftest --cli "$stage/bin/kinetrace" \
                --out "$root/target/gpu-check-selftest/efficiency" > /dev/null \
                || die "the efficiency check's self-test failed: python3 $stage/check/efficiency_check.py selftest --cli $stage/bin/kinetrace"
            echo "gpu-check: efficiency check self-test passed"
        fi
        # The staged workload on kinetrace's simulated GPU, its trace through the checker: the whole
        # workload -> trace -> checks path, without a GPU.
        local sim="$root/target/gpu-check-simulate"
        rm -rf "$sim"
        mkdir -p "$sim"
        "$stage/bin/kinetrace-gpu-workload" --simulate --iterations 5 --out "$sim" > "$sim/workload.json" 2> /dev/null \
            || die "the staged workload failed in --simulate mode"
        python3 "$stage/check/gpu_check.py" check-trace "$(ls "$sim"/*.pt.trace.json)" --expect-json "$sim/workload.json" \
            > "$sim/check.txt" 2>&1 || die "the simulated workload's trace failed the checks: see $sim/check.txt"
        echo "gpu-check: simulated workload trace passed the checks ($(tail -1 "$sim/check.txt"))"
    fi
    local bytes
    bytes=$(du -sb "$stage" | cut -f1)
    if ((bytes > MAX_STAGE_BYTES)); then
        die "staged folder is $bytes bytes, over the 64 MiB limit"
    fi
    echo "gpu-check: staged $stage ($bytes bytes, $(du -sh "$stage" | cut -f1))"
    cat "$stage/MANIFEST"
}

# candle's CUDA build (examples/candle --features cuda) here, without a CUDA toolkit or driver:
# - nvcc, NVVM and the headers from PyPI, all pinned to CUDA 13.0 (nvcc alone would pull the newest
#   NVVM): the oldest CUDA 13, so the PTX candle-kernels builds
#   loads on any CUDA 13 driver; cudarc is told the version (CUDARC_CUDA_VERSION=13000).
# - candle-core turns on cudarc's `dynamic-linking`, so the binary links against libcuda, libcublas,
#   libcublasLt, libcurand and libnvrtc (and candle-kernels' MoE objects against libcudart, which the
#   runtime wheel has). No driver is here and the libraries are large wheels, so it links against stubs: one shared object per library with the real soname, defining every function
#   cudarc's bindings declare. At run time the GPU machine's driver (libcuda.so.1) and its PyTorch
#   wheels (nvidia/cu13/lib: libcublas.so.13 & co) provide the real ones.
# Keep the pins in sync with docs/frameworks.md.
NVCC_WHEELS=("nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm~=13.0.0" "nvidia-cuda-runtime~=13.0.0" "nvidia-cuda-crt~=13.0.0" "nvidia-cuda-cccl~=13.0.0")
STUBS=("cu:libcuda.so.1:cuda" "cublasLt:libcublasLt.so.13:cublasLt" "cublas:libcublas.so.13:cublas"
    "curand:libcurand.so.10:curand" "nvrtc:libnvrtc.so.13:nvrtc")

build_candle_cuda() {
    local root=$1 venv="$1/target/nvcc-venv"
    local cuda="$venv/cuda" stubs="$venv/stubs"
    command -v cc > /dev/null || die "cc not found: the candle CUDA build links against stub libraries built with cc"
    if [[ ! -x "$cuda/bin/nvcc" ]]; then
        echo "gpu-check: installing nvcc from PyPI (${NVCC_WHEELS[*]}) into $venv"
        python3 -m venv "$venv" || die "python3 -m venv failed: the candle CUDA build needs nvcc from PyPI"
        "$venv/bin/pip" install --quiet "${NVCC_WHEELS[@]}" || die "pip could not install ${NVCC_WHEELS[*]}"
        # One CUDA root as cudaforge and cudarc expect it: bin/nvcc, nvvm/, include/ from the wheels
        # (CUDA 13 wheels share nvidia/cu13/; older layouts have a folder per package).
        local nv d
        nv=$(echo "$venv"/lib/python3*/site-packages/nvidia)
        rm -rf "$cuda" && mkdir -p "$cuda/include"
        for d in "$nv"/*/; do
            if [[ -x "$d/bin/nvcc" ]]; then
                ln -sfn "$d/bin" "$cuda/bin"
                ln -sfn "$d/nvvm" "$cuda/nvvm"
            fi
            if [[ -d "$d/include" ]]; then
                cp -rs "$d/include/." "$cuda/include/"
            fi
        done
        [[ -x "$cuda/bin/nvcc" ]] || die "no nvcc in the installed wheels under $nv"
    fi
    # The stubs, from the function names in cudarc's bindings (extra names are harmless).
    local cudarc
    cudarc=$(cargo metadata --locked --format-version 1 --manifest-path "$root/examples/candle/Cargo.toml" \
        --features cuda | python3 -c 'import json, sys
m = json.load(sys.stdin)
print(next(p["manifest_path"] for p in m["packages"] if p["name"] == "cudarc").rsplit("/", 1)[0])') \
        || die "cargo metadata could not locate cudarc's sources"
    rm -rf "$stubs" && mkdir -p "$stubs"
    local spec prefix soname link names
    for spec in "${STUBS[@]}"; do
        IFS=: read -r prefix soname link <<< "$spec"
        names=$(grep -rhoE "fn ${prefix}[A-Za-z0-9_]*\(" "$cudarc/src" | sed 's/^fn //; s/($//' | sort -u)
        if [[ $prefix == cublas ]]; then
            names=$(grep -v '^cublasLt' <<< "$names")
        elif [[ $prefix == cu ]]; then
            names=$(grep -E '^cu[A-Z]' <<< "$names")
        fi
        [[ -n $names ]] || die "no ${prefix}* functions found in $cudarc/src"
        sed 's/.*/void &(void) {}/' <<< "$names" > "$stubs/$link.c"
        cc -shared -fPIC -Wl,-soname,"$soname" -o "$stubs/lib$link.so" "$stubs/$link.c" \
            || die "building the $soname stub failed"
    done
    # candle-kernels' static MoE kernels link the CUDA runtime: the real one from the runtime wheel
    # (soname libcudart.so.13; the GPU machine's PyTorch wheels have it).
    local cudart
    cudart=$(ls "$venv"/lib/python3*/site-packages/nvidia/*/lib/libcudart.so.* 2> /dev/null | head -1)
    [[ -n $cudart ]] || die "no libcudart.so.* in the nvidia-cuda-runtime wheel under $venv"
    ln -sfn "$cudart" "$stubs/libcudart.so"
    echo "gpu-check: building examples/candle --features cuda (release; CUDA_COMPUTE_CAP=90, $("$cuda/bin/nvcc" --version | tail -1))"
    PATH="$cuda/bin:$PATH" CUDA_HOME="$cuda" CUDA_PATH="$cuda" NVCC="$cuda/bin/nvcc" CUDA_COMPUTE_CAP=90 \
        CUDARC_CUDA_VERSION=13000 CARGO_TARGET_DIR="$root/examples/candle/target-cuda" \
        RUSTFLAGS="-L native=$stubs" \
        cargo build --release --locked --features cuda --manifest-path "$root/examples/candle/Cargo.toml" \
        || die "the candle CUDA build failed (see above)"
}

# Is there a usable NVIDIA driver with a device? One clear line if not.
gpu_present() {
    local why="" rc=0
    python3 - << 'EOF' 2> /dev/null || rc=$?
import ctypes, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError:
    sys.exit(1)
if cuda.cuInit(0) != 0:
    sys.exit(2)
n = ctypes.c_int(0)
if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
    sys.exit(3)
EOF
    if ((rc != 0)); then
        case $rc in
            1) why="libcuda.so.1 cannot be loaded" ;;
            2) why="cuInit failed" ;;
            3) why="the driver reports no device" ;;
            *) why="the driver probe failed" ;;
        esac
        if ! command -v nvidia-smi > /dev/null; then
            why="$why; nvidia-smi not found"
        fi
        echo "$why"
        return 1
    fi
    return 0
}

cmd_run() {
    local out=${1:-"gpu-check-out-$(date +%Y%m%d-%H%M%S)"}
    command -v python3 > /dev/null || die "python3 not found"
    local stage why
    stage=$(stage_dir)
    if [[ ! -x "$stage/bin/kinetrace-gpu-workload" ]]; then
        die "nothing staged in $stage: run 'scripts/gpu-check.sh build' on a machine with cargo first"
    fi
    if ! why=$(gpu_present); then
        echo "gpu-check: no NVIDIA GPU / driver found ($why); nothing was run" >&2
        exit 2
    fi
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2> /dev/null \
            | sed 's/^/gpu-check: GPU: /' || true
    fi
    echo "gpu-check: staged from $(head -2 "$stage/MANIFEST" 2> /dev/null | tr '\n' ' ')"
    echo "gpu-check: output in $out"
    # 470 s for everything (under 8 minutes); the checker budgets its children within it.
    local rc=0
    GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-450} timeout --kill-after=10 470 \
        python3 "$stage/check/gpu_check.py" all --stage "$stage" --out "$out" 2>&1 | tee "$out/summary.txt" || rc=${PIPESTATUS[0]}
    if ((rc == 124 || rc == 137)); then
        echo "gpu-check: FAILED: the check ran past 470 s and was stopped (partial output in $out)" | tee -a "$out/summary.txt"
        exit 1
    fi
    exit "$rc"
}

# Is there a usable AMD GPU (the KFD device and an agent rocminfo reports as a GPU)? One clear line
# if not.
amd_gpu_present() {
    if [[ ! -e /dev/kfd ]]; then
        echo "/dev/kfd is absent (no amdgpu kernel driver)"
        return 1
    fi
    if command -v rocminfo > /dev/null; then
        if ! rocminfo 2> /dev/null | grep -q 'Device Type:[[:space:]]*GPU'; then
            echo "rocminfo lists no GPU agent"
            return 1
        fi
    fi
    return 0
}

cmd_rocm() {
    local out=${1:-"gpu-check-rocm-out-$(date +%Y%m%d-%H%M%S)"}
    command -v python3 > /dev/null || die "python3 not found"
    local stage why
    stage=$(stage_dir)
    if [[ ! -x "$stage/bin/kinetrace" || ! -f "$stage/bin/libkinetrace.so" ]]; then
        die "no kinetrace CLI and shim staged in $stage: run 'GPU_CHECK_BUILD_CLI=1 scripts/gpu-check.sh build' first"
    fi
    if ! why=$(amd_gpu_present); then
        echo "gpu-check: no AMD GPU / ROCm driver found ($why); nothing was run" >&2
        exit 2
    fi
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    if command -v rocm-smi > /dev/null; then
        rocm-smi --showproductname 2> /dev/null | grep -i 'card series' | sed 's/^/gpu-check: GPU: /' || true
    fi
    echo "gpu-check: staged from $(head -2 "$stage/MANIFEST" 2> /dev/null | tr '\n' ' ')"
    echo "gpu-check: output in $out"
    local rc=0
    GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-450} timeout --kill-after=10 470 \
        python3 "$stage/check/gpu_check.py" rocm --stage "$stage" --out "$out" 2>&1 | tee "$out/summary.txt" || rc=${PIPESTATUS[0]}
    if ((rc == 124 || rc == 137)); then
        echo "gpu-check: FAILED: the check ran past 470 s and was stopped (partial output in $out)" | tee -a "$out/summary.txt"
        exit 1
    fi
    exit "$rc"
}

case "${1:-}" in
    rocm)
        shift
        cmd_rocm "$@"
        ;;
    build)
        shift
        cmd_build "$@"
        ;;
    run)
        shift
        cmd_run "$@"
        ;;
    -h | --help | help)
        usage
        ;;
    *)
        usage >&2
        exit 2
        ;;
esac
