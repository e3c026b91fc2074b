#!/usr/bin/env bash
# The published harness beside the workflow on one bare GPU node, in one bounded call:
#   lab/published_harness/gpu_run.sh OUT_DIR [N_TASKS] [BLOCK]
# From the repository's root, with the upstream repository copied to .release/ (release file,
# eval/eval_cuda.py) and the wheelhouse in .whl/ (scripts/build_wheelhouse.py), both gitignored
# and carried to the node. No network: installs offline (scripts/offline_install.sh: snakemake's
# closure and this tree's l1bench), then lab/published_harness/sidebyside.py runs the first
# N_TASKS (default 41) of the slice (config/slices/h100_slice41.yaml, the ten tasks of issue 40
# first) in blocks of BLOCK (default 6): per block the published harness (one process per task,
# the file unmodified) and the workflow (default profile), then both again, into fresh trees
# results/sbs-pub1, -wf1, -pub2, -wf2; the first harness alternates between blocks. A block
# starts only when its estimate fits before the deadline (BUDGET_S, default 540, minus PACK_S,
# default 30, from the start), so whatever finished is packed. Then the side-by-side page of what
# was measured, and OUT_DIR gets 4 files: sbs.tgz (the four trees without builds or task
# folders, the logs), SIDE_BY_SIDE.md, timeline.tsv (each segment's start, end, tasks) and
# gpu_run.log.
# Environment: MODES (default "default"; e.g. default,cuda_graph,cudnn), KEEP=1 (continue the
# trees already in the working tree, e.g. unpacked from an earlier call's sbs.tgz, instead of
# starting fresh ones), TASKS (a YAML file or ids instead of the slice; with KEEP=1 and no TASKS, the
# list recorded in PREFIX-tasks.txt by the call that started the trees), BUDGET_S, PACK_S,
# TASK_TIMEOUT (seconds per task in the published harness, default 240), PREFIX (results/sbs),
# WF_CONFIG (one more --config entry for the workflow, e.g. 'paper={outer_trials: 3}',
# to measure a candidate cause; give such a run a PREFIX of its own), PUB_CPUS (pin the published
# harness's processes, e.g. to the CPU the workflow times on: the highest one; default: unpinned, as a
# user runs it), PIN_CPUS (a third arm: the published harness again, pinned to these CPUs, into trees
# PREFIX-pin1/-pin2; the three-way page THREE_WAY.md), INSTALL=0 (snakemake
# and l1bench already importable), DEVICE/RELEASE_DIR/HARNESS (another release, e.g. the CPU demo),
# PASSES (default "1,2": each block runs both passes; "1 2": every block's first pass, then every
# block's second, so that a deadline leaves every task measured once before any twice),
# PREBUILD (the published harness's extensions are built first, this many at a time, default 14,
# into PREFIX-ext/<tid>, each task's TORCH_EXTENSIONS_DIR; 0: each built by the harness's first run).
# CAUSES (a YAML file of measured causes for the page's cause column, e.g. causes-v8.yaml; default none).
set -uo pipefail
t0=$(date +%s)
out=${1:?usage: lab/published_harness/gpu_run.sh OUT_DIR [N_TASKS] [BLOCK]}
n=${2:-41}
block=${3:-6}
budget=${BUDGET_S:-540}
pack=${PACK_S:-30}
prefix=${PREFIX:-results/sbs}
MODES=${MODES:-default}
here=lab/published_harness
mkdir -p "$out" logs/sbs
# Both harnesses read the release folder: the workflow parses the baselines of every mode, the
# published harness its eval file. A missing one stops here, before any GPU time is spent on an
# arm that cannot run (2026-12-07: a copy without more_baselines/ ended the workflow's arm in 3 s).
rdir=${RELEASE_DIR:-.release}
for f in "optimized_cuda_code/${DEVICE:-h100}.json" more_baselines/cuda_graph.json more_baselines/cudnn.json \
    "${HARNESS:-eval/eval_cuda.py}"; do
    [ -f "$f" ] || [ -f "$rdir/$f" ] || { echo "gpu_run.sh: $rdir/$f: not found (copy the upstream repository's" \
        "optimized_cuda_code/, more_baselines/ and eval/ there)" >&2; exit 2; }
done
log=logs/sbs/gpu_run.log
trees=("$prefix-pub1" "$prefix-wf1" "$prefix-pub2" "$prefix-wf2")
[ -n "${PIN_CPUS:-}" ] && trees+=("$prefix-pin1" "$prefix-pin2")
wflogs=("logs/${prefix#results/}-wf1" "logs/${prefix#results/}-wf2")
{
    echo "gpu_run.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), $n tasks, blocks of $block, budget $budget s"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
    if [ "${KEEP:-0}" != 1 ]; then
        rm -rf "${trees[@]}" "${wflogs[@]}" "$prefix-tasks.txt"
        rm -f logs/sbs/timeline.tsv logs/sbs/*-block*.log
    fi
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv,noheader,nounits -l 1 >logs/sbs/gpu-samples.csv 2>/dev/null &
    sampler=$!
    if [ "${INSTALL:-1}" = 1 ]; then
        . scripts/offline_install.sh .whl || { kill "$sampler"; exit 1; }
    fi
    echo "installed after $(($(date +%s) - t0)) s"
    for passes in ${PASSES:-1,2}; do
        python3 $here/sidebyside.py --deadline $((t0 + budget - pack)) --n "$n" --block "$block" \
            --prefix "$prefix" --modes "$MODES" --task-timeout "${TASK_TIMEOUT:-240}" --passes "$passes" \
            --device "${DEVICE:-h100}" --release-dir "${RELEASE_DIR:-.release}" ${HARNESS:+--harness "$HARNESS"} \
            ${TASKS:+--tasks "$TASKS"} ${WF_CONFIG:+--wf-config "$WF_CONFIG"} \
            ${PUB_CPUS:+--pub-cpus "$PUB_CPUS"} ${PIN_CPUS:+--pinned-cpus "$PIN_CPUS"} --ext-dir "$prefix-ext" --prebuild "${PREBUILD:-14}"
    done
    echo "blocks done after $(($(date +%s) - t0)) s"
    kill "$sampler" 2>/dev/null
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    for mode in ${MODES//,/ }; do
        page="$out/SIDE_BY_SIDE.md"
        [ "$mode" = default ] || page="$out/SIDE_BY_SIDE-$mode.md"
        pubs=() wfs=()  # the passes that ran (a deadline can leave the second pass unrun)
        for t in "$prefix-pub1" "$prefix-pub2"; do [ -d "$t" ] && pubs+=("$t"); done
        for t in "$prefix-wf1" "$prefix-wf2"; do [ -d "$t" ] && wfs+=("$t"); done
        python3 $here/compare.py --published "${pubs[@]}" --workflow "${wfs[@]}" \
            --mode "$mode" ${CAUSES:+--causes "$CAUSES"} --out "$page" \
            --title "The published harness beside the workflow: $mode mode, $gpu, $(date -u +%Y-%m-%d)" ||
            echo "compare failed for $mode (the trees are in sbs.tgz)"
        if [ -n "${PIN_CPUS:-}" ]; then
            python3 $here/threeway.py --unpinned "$prefix"-pub{1,2} --pinned "$prefix"-pin{1,2} \
                --workflow "$prefix"-wf{1,2} --mode "$mode" --out "$out/THREE_WAY-$mode.md" \
                --line "* $gpu, $(date -u +%Y-%m-%d); b pinned to CPU $PIN_CPUS" ||
                echo "threeway failed for $mode (the trees are in sbs.tgz)"
        fi
    done
    have=()
    for p in "${trees[@]}" "$prefix-tasks.txt" "${wflogs[@]}" logs/sbs "$prefix-ext/_jobs"; do [ -e "$p" ] && have+=("$p"); done
    tar czf "$out/sbs.tgz" --exclude='*/build/ext' --exclude='*/tasks' "${have[@]}"
    cp logs/sbs/timeline.tsv "$out/" 2>/dev/null
    echo "packed after $(($(date +%s) - t0)) s: $(du -h "$out/sbs.tgz" | cut -f1)"
} 2>&1 | tee -a "$log"
cp "$log" "$out/gpu_run.log"
