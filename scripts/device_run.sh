#!/usr/bin/env bash
# One bounded call on a GPU node that starts bare (e.g. a lent cloud GPU): install the carried
# wheelhouse (.whl, from scripts/build_wheelhouse.py), run the workflow for at most BUDGET_S
# seconds, then pack results and logs into OUT_DIR for the trip back. Whatever finished is kept:
# unpack results.tgz over the repository and run the same command again to continue.
#   usage: scripts/device_run.sh BUDGET_S OUT_DIR [snakemake arguments...]
#   e.g.   scripts/device_run.sh 500 "$OUT" --configfile config/slices/h100_slice41.yaml \
#              --config device=h100 release_dir=.release
set -uo pipefail
budget=${1:?usage: scripts/device_run.sh BUDGET_S OUT_DIR [snakemake args...]}
out=${2:?usage: scripts/device_run.sh BUDGET_S OUT_DIR [snakemake args...]}
shift 2
mkdir -p "$out"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
start=$(date +%s)
# SIGINT lets snakemake stop its jobs and remove their incomplete outputs cleanly.
timeout -s INT "$budget" bash scripts/offline_run.sh .whl --cores "$(nproc)" \
    --resources gpu="${GPU_JOBS:-12}" "$@" >"$out/snakemake.log" 2>&1
echo "snakemake exit $? after $(($(date +%s) - start)) s (124 = budget reached)"
tar czf "$out/results.tgz" --exclude='*/build/ext' --exclude='*/tasks' results \
    $(ls -d logs .snakemake/log 2>/dev/null)
python3 scripts/l1bench/stagetimes.py results || true
