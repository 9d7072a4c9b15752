# shellcheck shell=bash
# Shared by scripts/compat-venv.sh and scripts/torch-venv.sh: creates (idempotently) a Python venv
# holding pinned packages. Source it, then call
#
#   make_venv NAME VENV_DIR CHECK_PYTHON_CODE PIP_ARG... -- PIN...
#
# NAME prefixes the progress lines; CHECK_PYTHON_CODE runs in the venv once installed, so a broken
# import fails here rather than in the middle of the tests; PIP_ARGs go to `pip install`. A re-run
# with the same Python version and pins only checks a stamp file. Prints the venv's path on stdout
# (progress goes to stderr). Needs only python3 with pip and PyPI; $PYTHON picks the interpreter.
#
# For big environments, VENV_ALONE (a regex of distribution names) switches to a resolve-then-install
# mode: pip resolves the pins once (--dry-run --report), then installs with --no-deps, each matching
# distribution in a pip run of its own and the rest together. A single `pip install --no-cache-dir`
# keeps every downloaded wheel in its temp dir until the end (~3 GB more disk at the peak for torch);
# this way at most one big wheel is on disk beside the venv. VENV_SKIP (a regex) names resolved
# distributions to leave out.

make_venv() {
    local name="$1" venv="$2" check="$3"
    shift 3
    local pip_args=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do pip_args+=("$1"); shift; done
    shift
    local pins=("$@")
    local python="${PYTHON:-python3}"
    local stamp_text stamp="$venv/.kinetrace-$name-stamp"
    stamp_text="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ${pins[*]}"

    if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$stamp_text" ]]; then
        echo "$venv"
        return 0
    fi

    log() { echo "$name: $*" >&2; }
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

    local start
    start=$(date +%s)
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    log "creating $venv with $("$python" --version 2>&1)"
    if ! "$python" -m venv "$venv" >&2 2>/dev/null; then
        # Debian/Ubuntu without python3-venv (no ensurepip): use virtualenv from PyPI instead,
        # installed with --target (which an "externally managed" system Python still allows).
        rm -rf "$venv"
        log "python3 -m venv failed; falling back to virtualenv"
        local tools
        tools="$(dirname "$venv")/$name-tools"
        rm -rf "$tools"
        "$python" -m pip install --quiet --target "$tools" virtualenv >&2
        PYTHONPATH="$tools" "$python" -m virtualenv --quiet "$venv" >&2
        rm -rf "$tools"
    fi
    log "installing ${pins[*]}"
    if [[ -n "${VENV_ALONE:-}" ]]; then
        install_one_by_one "$venv" "${pip_args[@]}" -- "${pins[@]}"
    else
        "$venv/bin/python" -m pip install --quiet "${pip_args[@]}" "${pins[@]}" >&2
    fi
    "$venv/bin/python" -c "$check" >&2
    echo "$stamp_text" >"$stamp"
    log "ready in $(($(date +%s) - start)) s"
    echo "$venv"
}

# install_one_by_one VENV PIP_ARG... -- PIN...  (see VENV_ALONE above)
install_one_by_one() {
    local venv="$1"
    shift
    local pip_args=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do pip_args+=("$1"); shift; done
    shift
    local report="$venv/.resolved.json"
    "$venv/bin/python" -m pip install --quiet --dry-run --ignore-installed --report "$report" \
        "${pip_args[@]}" "$@" >&2
    local groups
    # One line per pip run: the distributions VENV_ALONE matches one per line, the rest on the last.
    groups="$("$venv/bin/python" - "$report" "$VENV_ALONE" "${VENV_SKIP:-^$}" <<'EOF'
import json, re, sys
report, alone, skip = sys.argv[1], re.compile(sys.argv[2]), re.compile(sys.argv[3])
pins = [(i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in json.load(open(report))["install"]]
pins = [(n, v) for n, v in pins if not skip.fullmatch(n)]
for n, v in pins:
    if alone.fullmatch(n):
        print(f"{n}=={v}")
print(" ".join(f"{n}=={v}" for n, v in pins if not alone.fullmatch(n)))
EOF
)"
    rm -f "$report"
    local line
    while read -r line; do
        [[ -n "$line" ]] || continue
        # shellcheck disable=SC2086 # one line holds several pins, split on purpose
        "$venv/bin/python" -m pip install --quiet --no-deps "${pip_args[@]}" $line >&2
    done <<<"$groups"
}
