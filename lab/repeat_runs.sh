#!/usr/bin/env bash
# Run the same workflow invocation several times on one GPU node, each into a results tree of
# its own, to measure run-to-run spread (two runs as a user runs them, c1 and c2, and one job
# at a time, s1): one bounded lab/device_run.sh run per label, one after another on one node.
# The first run builds the extensions; every later run reuses them (l1lab retime prepare
# --stages build --ext-from: hard links, so nothing builds twice) and does its own checks and
# timing, as a user's run does. Then the first run's scores against each later run's
# (l1lab spread repeat --targets, default mode, paper protocol: the run-to-run targets met or
# not) go to OUT/SPREAD-<first>-<run>.md, and their headline lines to the output.
#   usage: lab/repeat_runs.sh OUT NAME LABEL:BUDGET_S[:serial]... -- SNAKEMAKE_ARGS...
#   e.g.   lab/repeat_runs.sh "$OUT" spread c1:305 c2:220 -- \
#              --configfile lab/runs/h100_isolation.yaml --config release_dir=.release
# Run LABEL writes results/NAME-LABEL/<device> and OUT/LABEL/results.tgz (take it back with
# `python -m l1lab take OUT/LABEL/results.tgz results/NAME-LABEL/<device> DEST --runs RUNS`). ":serial"
# runs one GPU job at a time (GPU_JOBS=1: the one-at-a-time reference run). results_dir= is
# appended to the arguments' --config (added where they have none), so they must not end in an
# option that takes values of its own after --config. Environment: as device_run.sh (DRAIN_S,
# GPU_JOBS, ...), plus WHEELHOUSE (default .whl), and FIRST_TREE: the first run's
# tree from an earlier run of this script (e.g. results/spread-c1/h100, its results.tgz extracted into the working
# tree, its build/ext still on this machine): then every run named here reuses its builds and is
# compared with it (a later one-job-at-a-time run, when one bounded run cannot hold all three).
set -uo pipefail
usage="usage: lab/repeat_runs.sh OUT NAME LABEL:BUDGET_S[:serial]... -- SNAKEMAKE_ARGS..."
out=${1:?$usage}
name=${2:?$usage}
shift 2
runs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    if [[ $1 == -* ]]; then
        echo "repeat_runs.sh: '$1' comes before '--': the Snakemake arguments follow it ($usage)" >&2
        exit 2
    fi
    if ! [[ $1 =~ ^[A-Za-z0-9_.-]+:[0-9]+(:serial)?$ ]]; then
        echo "repeat_runs.sh: run '$1' is not LABEL:BUDGET_S[:serial] (e.g. c1:305, s1:400:serial)" >&2
        exit 2
    fi
    runs+=("$1")
    shift
done
[ "${1:-}" = "--" ] || { echo "$usage" >&2; exit 2; }
shift
[ ${#runs[@]} -ge 1 ] || { echo "repeat_runs.sh: no run named ($usage)" >&2; exit 2; }
args=("$@")
# results_dir= must land inside --config: after its last occurrence, no other option may follow.
last=-1
for i in "${!args[@]}"; do [ "${args[$i]}" = "--config" ] && last=$i; done
if [ "$last" -lt 0 ]; then
    args+=(--config)
else
    for ((i = last + 1; i < ${#args[@]}; i++)); do
        case ${args[$i]} in -*)
            echo "repeat_runs.sh: option ${args[$i]} follows --config; put --config last (results_dir= is added to it)" >&2
            exit 2 ;;
        esac
    done
fi
for a in "${args[@]}"; do
    case $a in results_dir=*) echo "repeat_runs.sh: results_dir= is set per run (results/$name-LABEL); leave it out" >&2; exit 2 ;; esac
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
use_package() {  # the l1bench package for this shell: device_run.sh's install, else install it
    local site=${L1_SITE:-/tmp/l1bench-site}
    [ -n "${L1_TAKEN:-}" ] && return 0
    if [ -d "$site/l1bench" ]; then
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    else
        . "$here/../scripts/offline_install.sh" "${WHEELHOUSE:-.whl}" || exit 1
    fi
    L1_TAKEN=1
    export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"  # the lab tools (l1lab)
}
first= first_tree=
spread_runs=("${runs[@]:1}")
if [ -n "${FIRST_TREE:-}" ]; then  # the first run is an earlier one's: every run named here follows it
    first_tree=${FIRST_TREE%/}
    # On a node that stayed up, the earlier run's results are in .devstate (device_run.sh packs
    # them there and unpacks them as it starts): unpack them now, before the tree is read.
    [ -f .devstate/results.tgz ] && tar xzf .devstate/results.tgz --keep-newer-files 2>/dev/null
    if ! [ -d "$first_tree/build" ]; then
        echo "repeat_runs.sh: FIRST_TREE=$first_tree has no build/ folder (extract the earlier run's results.tgz into the working tree first)" >&2
        exit 2
    fi
    # A lent node's working tree follows the caller's at every run: only ignored paths
    # (build/ext/, .devstate/) stay, so a tree the node wrote loses its build and check results
    # unless .devstate has them (above) or the caller extracted the tree so that it travels.
    # Then prepare would copy nothing and every run would build again, silently unlike the first.
    if ! compgen -G "$first_tree/check/*.json" >/dev/null || ! compgen -G "$first_tree/build/*.json" >/dev/null; then
        echo "repeat_runs.sh: FIRST_TREE=$first_tree has no build or check results (build/*.json, check/*.json), here or in .devstate/results.tgz: extract the earlier run's results.tgz into the working tree so that it travels" >&2
        exit 2
    fi
    if ! [ -d "$first_tree/build/ext" ]; then
        echo "repeat_runs.sh: FIRST_TREE=$first_tree has no built extensions (build/ext/): they stay only on the machine that built them; on a fresh machine run the first run again" >&2
        exit 2
    fi
    first=$(basename "$(dirname "$first_tree")")
    first=${first#"$name"-}
    spread_runs=("${runs[@]}")
fi
for run in "${runs[@]}"; do
    IFS=: read -r label budget serial <<<"$run"
    if [ -n "$first" ]; then
        this_tree=results/$name-$label/$(basename "$first_tree")  # the same device folder
        # The package is on PYTHONPATH only inside device_run.sh's own shell: here too.
        use_package
        python3 -m l1lab retime prepare "$first_tree" "$this_tree" --stages build --ext-from "$first_tree"
    fi
    echo "== run $label: ${budget} s${serial:+, one GPU job at a time} -> results/$name-$label"
    if [ -n "$serial" ]; then
        GPU_JOBS=1 bash "$here/device_run.sh" "$budget" "$out/$label" "${args[@]}" "results_dir=results/$name-$label"
    else
        bash "$here/device_run.sh" "$budget" "$out/$label" "${args[@]}" "results_dir=results/$name-$label"
    fi
    if [ -z "$first" ]; then
        first=$label first_tree=$(cat "$out/$label/tree" 2>/dev/null)  # what device_run.sh wrote
        [ -n "$first_tree" ] || { echo "repeat_runs.sh: run $label wrote no results tree under results/$name-$label" >&2; exit 1; }
    fi
done
use_package
for run in "${spread_runs[@]}"; do
    label=${run%%:*}
    report="$out/SPREAD-$first-$label.md"
    python3 -m l1lab spread repeat "$first_tree" "results/$name-$label/$(basename "$first_tree")" --targets \
        --out "$report" &&
        grep -E '^\* (measured on|all [0-9]+:|within ±|timed calls stalled|the run-to-run targets)' "$report" |
        sed "s/^/$first vs $label: /"
done
