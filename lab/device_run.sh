#!/usr/bin/env bash
# One bounded run on a GPU node that starts bare (e.g. a lent cloud GPU): install the carried
# wheelhouse (.whl, from scripts/build_wheelhouse.py) and the l1bench package of this working
# tree (scripts/offline_install.sh), run the workflow for at most BUDGET_S
# seconds, then pack results and logs into OUT_DIR/results.tgz for the trip back. Whatever
# finished is kept: unpack results.tgz over the repository and run the same command again to
# continue. On a node that stays up between runs, results and built extensions also stay in
# place (.devstate/), so the same command simply continues.
# Run it from the repository's root.
#   usage: lab/device_run.sh BUDGET_S OUT_DIR [snakemake arguments...]
#   e.g.   lab/device_run.sh 540 "$OUT" --config device=h100 release_dir=.release
# While it runs, GPU utilisation/clocks and CPU load are sampled once a second into
# logs/samples/, so a run's idle GPU time and CPU saturation can be read afterwards
# (PYTHONPATH=lab python3 -m l1lab stagetimes results/<device> --samples logs/samples). OUT_DIR/tree
# names the results tree the run wrote.
set -uo pipefail
budget=${1:?usage: lab/device_run.sh BUDGET_S OUT_DIR [snakemake args...]}
out=${2:?usage: lab/device_run.sh BUDGET_S OUT_DIR [snakemake args...]}
lab=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
shift 2
mkdir -p "$out" logs/samples .devstate
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
# Results made by an earlier run on this node (newer than the checkout's copies win).
[ -f .devstate/results.tgz ] && tar xzf .devstate/results.tgz --keep-newer-files 2>/dev/null
stamp=$(date +%Y%m%dT%H%M%S)
# The samplers stay off the GPUs' timing CPUs (the highest ones, one per GPU; the workflow
# keeps itself and its jobs off them too: timingcpus.keep_workflow_off_timing_cpus).
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
off_timing=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 4 ] && [ "$ngpu" -ge 1 ] && [ "$(nproc)" -ge $((2 * ngpu)) ]; then
    off_timing=(taskset -c "0-$(($(nproc) - 1 - ngpu))")
fi
"${off_timing[@]}" nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm,clocks.mem,power.draw \
    --format=csv,noheader,nounits -l 1 >"logs/samples/gpu-$stamp.csv" 2>/dev/null &
gpu_sampler=$!
"${off_timing[@]}" bash -c 'while sleep 1; do echo "$(date +%s) $(head -1 /proc/stat)"; done' >"logs/samples/cpu-$stamp.txt" &
cpu_sampler=$!
# Every CPU's line too (the timing CPUs' interrupt, softirq and steal time during the run).
"${off_timing[@]}" bash -c 'while sleep 1; do t=$(date +%s); grep "^cpu[0-9]" /proc/stat | sed "s/^/$t /"; done' \
    >"logs/samples/cpus-$stamp.txt" &
cpus_sampler=$!
. scripts/offline_install.sh .whl || exit 1
python3 -m snakemake --unlock "$@" >/dev/null 2>&1
start=$(date +%s)
log="logs/snakemake-$stamp.log"
# DRAIN_S before the budget ends, new jobs stop starting (scripts/run_task.py) and running
# ones finish, instead of being killed at the end with their work lost.
export L1BENCH_DRAIN_FILE=$PWD/.devstate/drain
rm -f "$L1BENCH_DRAIN_FILE"
drain_at=$((budget - ${DRAIN_S:-80}))
# SIGINT lets snakemake stop its jobs and remove their incomplete outputs cleanly.
# Twice as many GPU job slots (gpu) as cores: evaluation jobs spend most of their life waiting
# for the GPU lock (no CPU), and the CPU-heavy kinds are capped on their own (builds, compile).
# GPU jobs and extension builds take no core (plan.evaluation_threads, build_threads): --cores
# (JOB_SLOTS) caps the short CPU jobs only.
ncpu=$(nproc)
# Compile-mode jobs at once: 3/4 of the CPUs (each spends ~15 CPU-s in code generation), and at
# most one per 10 GiB of the smallest GPU's memory. With 12 at once the 41-task slice's GPU
# memory peaked at 49-85 GB on an H200, and the compile-mode jobs of level-3 tasks set the
# peaks (2026-12-05): 12 on an H200, 7 on an 80 GB H100.
compile_jobs=$((3 * ncpu / 4))
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | sort -n | head -1)
if [[ $mem_mib =~ ^[0-9]+$ ]] && [ $((mem_mib / 10240)) -lt "$compile_jobs" ]; then
    compile_jobs=$((mem_mib / 10240))
fi
[ "$compile_jobs" -ge 1 ] || compile_jobs=1
echo "compile-mode jobs at once: ${COMPILE_JOBS:-$compile_jobs} (GPU memory ${mem_mib:-unknown} MiB, $ncpu CPUs)"
touch .devstate/started  # the watchdog counts the results written after this
timeout -s INT -k 30 "$budget" python3 -m snakemake --cores "${JOB_SLOTS:-$((2 * ncpu))}" \
    --resources gpu="${GPU_JOBS:-$((2 * ncpu))}" builds="${BUILD_JOBS:-6}" \
    compile="${COMPILE_JOBS:-$compile_jobs}" "$@" >"$log" 2>&1 &
run=$!
# Watchdog: a run whose first WATCH_S seconds bring failures and no passing check is broken
# (bad environment, broken worker), and so is one with at least 10 failed jobs and fewer results
# written since it started than failed jobs (checks pass, but every time job breaks); stop it
# instead of spending the budget.
watch=${WATCH_S:-150}
while kill -0 "$run" 2>/dev/null; do
    sleep 5
    if [ $(($(date +%s) - start)) -ge "$drain_at" ] && [ ! -f "$L1BENCH_DRAIN_FILE" ]; then
        echo "draining at $(($(date +%s) - start)) s: no new jobs" && touch "$L1BENCH_DRAIN_FILE"
    fi
    if [ $(($(date +%s) - start)) -ge "$watch" ]; then
        failed=$(grep -c "^Error in rule" "$log")
        # results/<device>/check, or results/<run>/<device>/check for a results_dir of its own
        passed=$(grep -ls '"status": "pass"' results/*/check/*.json results/*/*/check/*.json 2>/dev/null | wc -l)
        written=$(find results -path '*/check/*.json' -newer .devstate/started 2>/dev/null | wc -l)
        written=$((written + $(find results -path '*/time/*/*/*.json' -newer .devstate/started 2>/dev/null | wc -l)))
        if [ "$passed" -eq 0 ] && [ "$failed" -ge 3 ]; then
            echo "watchdog: $failed failed jobs and no passing check after $watch s: stopping"
            kill -INT "$run" ; sleep 20
        elif [ "$failed" -ge 10 ] && [ "$written" -lt "$failed" ]; then
            echo "watchdog: $failed failed jobs and $written results written after $watch s: stopping"
            kill -INT "$run" ; sleep 20
        fi
        watch=999999
    fi
done
wait "$run"
echo "snakemake exit $? after $(($(date +%s) - start)) s (124 = budget reached)"
kill "$gpu_sampler" "$cpu_sampler" "$cpus_sampler" 2>/dev/null
tar czf .devstate/results.tgz --exclude='*/build/ext' --exclude='*/tasks' results logs
cp .devstate/results.tgz "$out/results.tgz"
tail -5 "logs/snakemake-$stamp.log"
# The results tree this run wrote: results_dir= and device= from the arguments, else the
# newest device folder under results_dir.
res=results dev=
for a in "$@"; do case $a in results_dir=*) res=${a#results_dir=} ;; device=*) dev=${a#device=} ;; esac; done
tree=${dev:+$res/$dev}
tree=${tree:-$(ls -td "$res"/*/ 2>/dev/null | head -1)}
[ -n "$tree" ] && echo "${tree%/}" >"$out/tree"  # for the caller (lab/repeat_runs.sh)
[ -n "$tree" ] && PYTHONPATH="$lab${PYTHONPATH:+:$PYTHONPATH}" python3 -m l1lab stagetimes "${tree%/}" --since "$(date -u -d "@$start" +%Y-%m-%dT%H:%M:%S)" \
    --samples logs/samples || true
