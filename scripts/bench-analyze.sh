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
# one rank of ~35 MB of JSON, gzipped (level 6, as Python's gzip module writes): the case where
# inflating dominates. HTA's peak RSS is GNU time's: the largest single
# process of the run (HTA forks one parser process per rank, up to the CPU count, so the sum over its
# processes is higher than shown). kinetrace is one process. Needs python3 and /usr/bin/time.
set -euo pipefail

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

# generate DIR RANKS BYTES_PER_RANK GZIP(0|1)
generate() {
    local dir="$1"
    [[ -f "$dir/.complete" ]] && return 0
    echo "bench-analyze: generating $dir ($2 ranks, ~$(($3 / 1000000)) MB each)" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    python3 - "$traces/nccl_parser_config/nccl_data.json.gz" "$dir" "$2" "$3" "$4" <<'EOF'
import gzip, json, random, re, sys

src, out = sys.argv[1], sys.argv[2]
ranks, per_rank, gz = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
trace = json.load(gzip.open(src))
events = trace.pop("traceEvents")
meta_events = [e for e in events if e.get("ph") == "M"]
body = [e for e in events if e.get("ph") != "M"]
ts = [e["ts"] for e in body if isinstance(e.get("ts"), (int, float))]
span = max(e["ts"] + e.get("dur", 0) for e in body if isinstance(e.get("ts"), (int, float))) - min(ts) + 1000.0
max_corr = max((e.get("args", {}).get("correlation", 0) for e in body if isinstance(e.get("args", {}).get("correlation", 0), int)), default=0) + 1
max_ext = max((e.get("args", {}).get("External id", 0) for e in body if isinstance(e.get("args", {}).get("External id", 0), int)), default=0) + 1
max_id = max((e["id"] for e in body if isinstance(e.get("id"), int)), default=0) + 1
step_re = re.compile(r"^ProfilerStep#(\d+)$")
one_copy = sum(len(json.dumps(e)) + 2 for e in body)
copies = max(1, -(-per_rank // one_copy))

def shifted(e, j, rank, rng):
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = round(e["ts"] + j * span, 3)
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + j * max_id
    m = step_re.match(e.get("name", ""))
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + j * 100}"
    if "args" in e:
        a = dict(e["args"])
        if isinstance(a.get("correlation"), int) and a["correlation"] > 0:
            a["correlation"] += j * max_corr
        if isinstance(a.get("External id"), int) and a["External id"] > 0:
            a["External id"] += j * max_ext
        e["args"] = a
    if e.get("cat") == "kernel" and isinstance(e.get("dur"), (int, float)):
        e["dur"] = round(e["dur"] * (1.0 + 0.03 * rank + rng.uniform(-0.02, 0.02)), 3)
    return e

for rank in range(ranks):
    rng = random.Random(rank)
    head = dict(trace)
    head["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": ranks}
    name = f"{out}/rank{rank}.pt.trace.json"
    with (gzip.open(name + ".gz", "wt", compresslevel=6) if gz else open(name, "w")) as f:
        f.write("{\n")
        for k, v in head.items():
            f.write(f"  {json.dumps(k)}: {json.dumps(v)},\n")
        f.write('  "traceEvents": [\n')
        first = True
        for e in meta_events:
            f.write(("" if first else ",\n") + json.dumps(e))
            first = False
        for j in range(copies):
            for e in body:
                f.write(("" if first else ",\n") + json.dumps(shifted(e, j, rank, rng)))
                first = False
        f.write("\n  ]\n}\n")
print(f"{copies} copies of {len(body)} events per rank", file=sys.stderr)
EOF
    touch "$dir/.complete"
}

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
