#!/usr/bin/env bash
# Times `kinetrace doctor` and `kinetrace diff` against HolisticTraceAnalysis 0.5.0 reading the same
# directory: whole process, wall clock and peak RSS from /usr/bin/time -v.
#
#   scripts/bench-doctor-diff.sh          # a generated 8-rank, 346 MB directory (target/bench-analyze/big8x40)
#   scripts/bench-doctor-diff.sh DIR
#
# HTA has no doctor; its nearest work is what a user runs to look for problems: TraceAnalysis(DIR)
# and its four analyses (as scripts/bench-analyze.sh times it). For diff, HTA's
# TraceDiff.compare_traces(LabeledTrace(DIR), LabeledTrace(DIR)) on all ranks and iterations (it
# parses the directory twice, as kinetrace does). kinetrace: best of 3 runs each. HTA: one run (its
# peak RSS is the largest single process; it forks one parser per rank up to the CPU count).
set -euo pipefail
# The shim is built beside the binary here: no embedded copy (crates/cli/build.rs).
export KINETRACE_EMBED_SHIM="${KINETRACE_EMBED_SHIM:-0}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
traces="$root/../shared/traces"
out="$root/target/bench-analyze"
mkdir -p "$out"
[[ -x /usr/bin/time ]] || { echo "bench-doctor-diff: needs GNU time at /usr/bin/time" >&2; exit 1; }
if [[ $# -eq 0 ]]; then
    # shellcheck source=scripts/lib/bench-traces.sh
    . "$root/scripts/lib/bench-traces.sh"
    generate "$out/big8x40" 8 40000000 0
    dir="$out/big8x40"
elif [[ $# -eq 1 && -d "$1" ]]; then
    dir="$1"
else
    echo "usage: scripts/bench-doctor-diff.sh [DIR]" >&2
    exit 2
fi
cargo build --quiet --release -p kinetrace-cli
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
kinetrace="$target_dir/release/kinetrace"
venv="$(scripts/compat-venv.sh)"

hta_doctor='
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
hta_diff='
import sys, warnings
warnings.filterwarnings("ignore")
from hta.trace_diff import LabeledTrace, TraceDiff
c = LabeledTrace(label="base", trace_dir=sys.argv[1])
t = LabeledTrace(label="new", trace_dir=sys.argv[1])
TraceDiff.compare_traces(c, t, control_rank=c.t.get_ranks(), test_rank=t.t.get_ranks(),
                         control_iteration=c.iterations(), test_iteration=t.iterations())
'

# Prints "<wall seconds> <peak RSS KiB>" for a command (its output discarded).
measure() {
    local log="$out/time.log"
    /usr/bin/time -v -o "$log" "$@" >/dev/null 2>"$out/stderr.log" || {
        echo "bench-doctor-diff: failed: $*" >&2
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

best() {
    local best_s="" best_kb="" s kb
    for _ in 1 2 3; do
        read -r s kb < <(measure "$@")
        if [[ -z "$best_s" ]] || python3 -c "import sys; sys.exit(0 if $s < $best_s else 1)"; then
            best_s="$s"; best_kb="$kb"
        fi
    done
    echo "$best_s $best_kb"
}

size_mb="$(du -sbL "$dir" | awk '{printf "%.1f MB", $1/1e6}')"
echo "bench-doctor-diff: $dir ($size_mb), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
read -r hd_s hd_kb < <(measure "$venv/bin/python" -c "$hta_doctor" "$dir")
read -r kd_s kd_kb < <(best "$kinetrace" doctor --json "$dir")
read -r hf_s hf_kb < <(measure "$venv/bin/python" -c "$hta_diff" "$dir")
read -r kf_s kf_kb < <(best "$kinetrace" diff --json --quiet "$dir" "$dir")
python3 - "$size_mb" "$hd_s" "$hd_kb" "$kd_s" "$kd_kb" "$hf_s" "$hf_kb" "$kf_s" "$kf_kb" <<'EOF'
import sys
size = sys.argv[1]
v = [float(x) for x in sys.argv[2:]]
for what, (hs, hk, ks, kk) in (("doctor vs TraceAnalysis + 4 analyses", v[0:4]), ("diff vs TraceDiff.compare_traces", v[4:8])):
    print(f"{what:<40} {size:>9} | HTA {hs:8.2f}s {hk/1024:7.0f} MiB | kinetrace {ks:7.3f}s {kk/1024:6.0f} MiB | {hs/ks:6.1f}x")
EOF
echo "(load average after: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs)"
