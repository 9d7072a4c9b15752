#!/usr/bin/env bash
# Times HolisticTraceAnalysis 0.5.0 (import, load, its four analyses) and `kinetrace analyze` side by
# side on the same trace directories: whole process, wall clock and peak RSS from /usr/bin/time -v.
#
#   scripts/bench-analyze.sh            # ../shared/traces/trace_filter, a generated 8-rank ≥200 MB dir
#                                       # and a generated single gzipped 35 MB rank
#   scripts/bench-analyze.sh DIR...     # other directories
#
# The generated directory (target/bench-analyze/big8, made once) holds 8 plain-JSON ranks of ~26 MB:
# the real nccl_parser_config trace (float µs relative to baseTimeNanoseconds, NCCL kernels, 10
# ProfilerSteps) repeated end to end with shifted timestamps, renumbered correlations / External ids /
# steps, and per-rank perturbed kernel durations. target/bench-analyze/one35gz is the same recipe for
# one rank of ~35 MB of JSON, gzipped (level 6, as Python's gzip module writes): one large gzipped
# rank, where kinetrace cannot spread files over cores and inflating is on its critical path. HTA's peak RSS is GNU time's: the largest single
# process of the run (HTA forks one parser process per rank, up to the CPU count, so the sum over its
# processes is higher than shown). kinetrace is one process. Needs python3 and /usr/bin/time.
set -euo pipefail
# The shim is built beside the binary here: no embedded copy (crates/cli/build.rs).
export KINETRACE_EMBED_SHIM="${KINETRACE_EMBED_SHIM:-0}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
traces="$root/../shared/traces"
out="$root/target/bench-analyze"
mkdir -p "$out"

[[ -x /usr/bin/time ]] || { echo "bench-analyze: needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 1; }
[[ -d "$traces" ]] || { echo "bench-analyze: the reference traces are missing: expected $traces" >&2; exit 1; }

echo "bench-analyze: building kinetrace (release)" >&2
cargo build --quiet --release -p kinetrace-cli
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
kinetrace="$target_dir/release/kinetrace"
venv="$(scripts/compat-venv.sh)"

# shellcheck source=scripts/lib/bench-traces.sh
. "$root/scripts/lib/bench-traces.sh"

hta_script='
import sys, warnings
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
ranks = a.t.get_ranks()
a.get_temporal_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
a.get_idle_time_breakdown(ranks=ranks, visualize=False, show_idle_interval_stats=True)
a.get_gpu_kernel_breakdown(visualize=False)
'

# Prints "<wall seconds> <peak RSS KiB>" for a command (its output discarded).
measure() {
    local log="$out/time.log"
    /usr/bin/time -v -o "$log" "$@" >/dev/null 2>"$out/stderr.log" || {
        echo "bench-analyze: failed: $*" >&2
        tail -5 "$out/stderr.log" >&2
        exit 1
    }
    python3 - "$log" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
wall = re.search(r"Elapsed \(wall clock\) time .*: (.+)", t).group(1).strip()
secs = 0.0
for part in wall.split(":"):
    secs = secs * 60 + float(part)
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1))
print(f"{secs:.3f} {rss}")
EOF
}

if [[ $# -gt 0 ]]; then
    dirs=("$@")
else
    generate "$out/big8" 8 26000000 0
    generate "$out/one35gz" 1 34000000 1
    dirs=("$traces/trace_filter" "$out/big8" "$out/one35gz")
fi

printf '\n%-28s %9s %5s | %9s %10s | %9s %10s | %8s %9s\n' \
    "directory" "size" "ranks" "HTA wall" "HTA RSS" "kt wall" "kt RSS" "speedup" "RSS ratio"
for dir in "${dirs[@]}"; do
    size_mb="$(du -sbL "$dir" | awk '{printf "%.1f MB", $1/1e6}')"
    nfiles="$(find -L "$dir" -maxdepth 1 -type f \( -name '*.json' -o -name '*.gz' \) | wc -l)"
    read -r hta_s hta_kb < <(measure "$venv/bin/python" -c "$hta_script" "$dir")
    best_s=""; best_kb=""
    for _ in 1 2 3; do
        read -r s kb < <(measure "$kinetrace" analyze --json --quiet "$dir")
        if [[ -z "$best_s" ]] || python3 -c "import sys; sys.exit(0 if $s < $best_s else 1)"; then
            best_s="$s"; best_kb="$kb"
        fi
    done
    python3 - "$(basename "$dir")" "$size_mb" "$nfiles" "$hta_s" "$hta_kb" "$best_s" "$best_kb" <<'EOF'
import sys
name, size, n, hs, hk, ks, kk = sys.argv[1:]
hs, hk, ks, kk = float(hs), int(hk), float(ks), int(kk)
print(f"{name:<28} {size:>9} {n:>5} | {hs:8.2f}s {hk/1024:7.0f} MiB | {ks:8.3f}s {kk/1024:7.0f} MiB | "
      f"{hs/ks:7.1f}x {kk/hk:9.3f}")
EOF
done
echo
echo "(HTA: python + import hta + TraceAnalysis(trace_dir) + the four analyses; kinetrace: analyze --json, best of 3;"
echo " $(nproc) CPUs; peak RSS from /usr/bin/time -v)"
