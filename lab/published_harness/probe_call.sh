#!/usr/bin/env bash
# One bounded GPU call: where a timed pair's inputs come from (input_draws.py, pure torch, on
# PROBE_TASKS), then the published harness beside the workflow on TASKS (gpu_run.sh, both
# passes). From the repository's root on a bare GPU node, .release/ and .whl/ carried:
#   PROBE_TASKS=L1_T012,L2_T001 TASKS=L1_T019 lab/published_harness/probe_call.sh OUT [PROBE_S] [SBS_S]
set -uo pipefail
out=${1:?usage: probe_call.sh OUT [PROBE_S] [SBS_S]}
mkdir -p "$out"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/probe.log"
timeout "${2:-200}" python3 lab/published_harness/input_draws.py --release .release/optimized_cuda_code/h100.json \
    --tasks "${PROBE_TASKS:?}" --repeats "${REPEATS:-2}" --out "$out/draws.json" \
    ${STRATEGIES:+--strategies "$STRATEGIES"} >>"$out/probe.log" 2>&1
echo "probe exit $?" >>"$out/probe.log"
if [ -n "${TASKS:-}" ]; then
    BUDGET_S=${3:-360} PUB_CPUS=${PUB_CPUS:-15} bash lab/published_harness/gpu_run.sh "$out/sbs" 99 99
fi
