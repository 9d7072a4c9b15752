# shellcheck shell=bash
# Generated benchmark trace directories, for scripts/bench-analyze.sh and scripts/bench-doctor-diff.sh.
# Sourced; needs $traces (the shared reference traces) and python3.
#
# The recipe: the real nccl_parser_config trace (float µs relative to baseTimeNanoseconds, NCCL
# kernels, 10 ProfilerSteps) repeated end to end with shifted timestamps, renumbered correlations /
# External ids / steps, and per-rank perturbed kernel durations, until each rank holds at least the
# given number of bytes (whole copies of ~8.6 MB). Made once per directory (a .complete stamp).

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
