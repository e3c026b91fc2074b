"""The worker's entry point: ``python -m l1bench.worker JOB.json RESULT.json`` runs :func:`main`.

:func:`run` reads the task's snippets, installs the extension-build hooks where the custom code
builds extensions, places the job (:func:`pick_device`: CPU for the demo, else whichever visible
GPU is free at the first section), runs the job's stage (``KINDS``) and adds what every result
carries: ``timing_design`` (``TIMING_DESIGN``), ``snippet_sha256``, ``params``, ``provenance``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from l1bench import gpulock, gpus, provenance, timingcpus
from l1bench.io import atomic_write_text
from l1bench.results import NoWorker, Status, builds_extensions, no_worker_needed
from l1bench.snippet import InfraError, SnippetError, sha256_text
from l1bench.worker import lockprofile
from l1bench.worker.outcome import EXIT_INFRA, NO_CODE_REASON, result
from l1bench.worker.stages import do_build, do_check, do_time
from l1bench.worker.torch_hooks import (
    note_extension_failures,
    release_lock_during_extension_builds,
    remember_failed_extension_builds,
)


def read_snippets(task_dir: Path) -> dict:
    meta = json.loads((task_dir / "meta.json").read_text())
    out = {}
    for name, info in meta.get("snippets", {}).items():
        out[name] = (task_dir / info["file"]).read_text()
    return meta, out


KINDS = {"build": do_build, "check": do_check, "time": do_time}


def pick_device(job: dict) -> str:
    """``cpu`` for the demo; else ``cuda:0``: the GPU is placed at the job's first GPU section,
    where it takes whichever visible GPU is free (:func:`claim_gpu`), and CUDA then starts with
    only that GPU visible. Nothing here starts CUDA; the process keeps off every timing CPU."""
    if job["backend"] == "cpu":
        return "cpu"
    ids = gpus.visible_gpu_ids()
    if not ids:
        raise InfraError("no CUDA device is visible to the worker")
    job["gpu_ids"] = ids
    timingcpus.reserve_timing_cpus(len(ids), None)  # before CUDA starts its threads
    return "cuda:0"


#: Version of how timed sections are kept clean, recorded on every check and time result
#: (results without it: version 1, before the timing-isolation work).
#: 2: kernels only inside the GPU lock (the probe bars CUDA, compile modes call compiled
#:    models only inside sections), the device synchronised before any pause of the lock,
#:    threads started in a section moved off the timing CPU at release, no garbage collection
#:    in sections, the host's accounting of every timed call recorded and disturbed pairs
#:    timed again (hostclock); results/isolation/design2.
#: 2 (second iteration, recorded as 2: worker.py sha256 prefix in ``workflow_code`` tells them
#:    apart): also every call into the GPU's resource manager inside the lock (CUDA started in
#:    the first section, clocks by in-process NVML inside sections, no nvidia-smi or driver
#:    start outside) and workers exiting with the lock held; results/isolation/{c1,c2}.
#: 3: the driver's threads moved off the timing CPU as soon as CUDA has started; workers exit
#:    without the lock again (scripts/bench_handover.py: the tear-down did not delay the next
#:    holder's first allocation less with it held).
#: 4: a trial's first pair (it allocates: the allocator is emptied between trials) that stalled
#:    in the driver, or was disturbed, is timed again after emptying the allocator again and one
#:    warm-up call (worker.first_pair_slowed_in_driver, renew_allocator); before, a disturbed
#:    first pair was replaced by a pair that did not allocate.
TIMING_DESIGN = 4
#: 5 (opt-in: config ``timing.shared_sections``, ``job["shared_sections"]``): design 4, but GPU
#:    work that is not timed (CUDA's start, the reference warm-up, correctness trials, placing
#:    models; the check stage but its detectors) holds the lock *shared* with other jobs' such
#:    work, unpinned; warm-up calls and timed pairs (the strict protocol's timing, the compile
#:    modes' first call, the detectors) hold it exclusive, with writer preference
#:    (:mod:`l1bench.gpulock`). Measured on an H200 and not adopted: no faster, runs agree less
#:    (docs/architecture.md, results/h100/RUN_NOTES.md session eight).
TIMING_DESIGN_SHARED = 5
#: 6 (opt-in: config ``timing.cuda_start_outside_lock``, ``job["cuda_start_outside_lock"]``):
#:    design 4, but CUDA's start (cuInit, context, first allocation, cuBLAS handle: ~0.25 s a
#:    job) runs before the job's first GPU section, outside the GPU lock, one job at a time per
#:    GPU (a start flock beside the lock), off the timing CPU
#:    (:func:`l1bench.worker.sections.start_cuda_outside_lock`). A timed section then runs beside
#:    at most one other process's CUDA start; design 4's re-timing of a first pair slowed in the
#:    driver is what catches a pair it delayed. With several GPUs visible CUDA still starts
#:    inside the lock. An alternative to design 5, not combinable with it. Not yet measured on a
#:    GPU (docs/architecture.md).
TIMING_DESIGN_CUDA_OUTSIDE = 6
#: 7 (the default since session nineteen: config ``timing.task_worker``, ``job["task_worker"]``;
#:    ``task_worker: false`` is design 4): design 4, but a task's check
#:    and its eager-mode time steps (default, cuda_graph, cudnn; paper and strict) are served one
#:    after another by one process per task (:mod:`l1bench.worker.serve`), so CUDA starts, and the
#:    GPU's first-use work is paid, once per task rather than once per step; torch's settings are
#:    put back after each step and the process retires after a step that patched torch. The
#:    compile modes keep a process per step. Measured on H200s and H100s: as clean as
#:    design 4, and the 41-task slice in 415 s against design 4's ~507 s of lock
#:    (docs/architecture.md, results/h100/RUN_NOTES.md sessions thirteen to nineteen).
TIMING_DESIGN_TASK_WORKER = 7


def timing_design(job: dict) -> int:
    """The timing design a check or time job runs under (its flags, as :func:`l1bench.plan.job_timing` set them)."""
    if job.get("shared_sections"):
        return TIMING_DESIGN_SHARED
    if job.get("cuda_start_outside_lock"):
        return TIMING_DESIGN_CUDA_OUTSIDE
    if job.get("task_worker"):
        return TIMING_DESIGN_TASK_WORKER
    return TIMING_DESIGN


def _system_isolation():
    text = os.environ.get(timingcpus.ISOLATED_ENV)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def gpu_memory(device: str, torch_mod=None) -> dict | None:
    """The caching allocator's peaks on ``device`` in this process since the last reset (a
    task worker resets them before each step, :meth:`l1bench.worker.serve.TaskWorker.prepare`),
    in MiB: what the step's tensors took at most, without the CUDA context. Host-side counters,
    no call into the driver; None where CUDA is not running (CPU, a step that never started it)."""
    if not device.startswith("cuda"):
        return None
    if torch_mod is None:
        import torch as torch_mod
    if not torch_mod.cuda.is_initialized():
        return None
    mib = 1024 * 1024
    return {
        "max_allocated_mib": round(torch_mod.cuda.max_memory_allocated(device) / mib, 1),
        "max_reserved_mib": round(torch_mod.cuda.max_memory_reserved(device) / mib, 1),
    }


def run(job: dict) -> dict:
    t0 = time.time()
    started = provenance.now_iso()
    if job.get("ext_dir"):
        Path(job["ext_dir"]).mkdir(parents=True, exist_ok=True)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(job["ext_dir"]).resolve())
    task_dir = Path(job["task_dir"])
    meta, snippets = read_snippets(task_dir)
    if builds_extensions(snippets.get("custom", "")):
        remember_failed_extension_builds()
        release_lock_during_extension_builds()
    sampler = None
    if job["kind"] == "build":
        job["device"] = "cpu"
        if job["backend"] != "cpu":  # builds (nvcc) keep clear of the timing CPUs
            timingcpus.reserve_timing_cpus(gpus.visible_gpu_count(), None)
    else:
        job["device"] = pick_device(job)
        # opt-in (L1BENCH_PROFILE_LOCKED): where the untimed steps' GPU-lock time goes; started
        # here, before any section, so its thread stays off the timing CPU
        sampler = lockprofile.start_if_asked(lambda: gpulock.DeviceLock.current is not None)
    try:
        if no_worker_needed(job["kind"], has_code="custom" in snippets) is NoWorker.NO_CODE:
            res = result(job, Status.NO_CODE, NO_CODE_REASON)
        else:
            res = KINDS[job["kind"]](job, meta, snippets)
    except SnippetError as err:
        res = result(job, err.status, err.reason)
    if sampler is not None and (profile := sampler.summary()):
        res["lock_profile"] = profile
    note_extension_failures(res)
    if job["kind"] in ("check", "time"):
        res["timing_design"] = timing_design(job)
        memory = gpu_memory(job["device"])
        if memory:
            res["gpu_memory"] = memory
    res["snippet_sha256"] = {k: sha256_text(v) for k, v in snippets.items()}
    res["params"] = job.get("params", {})
    res["provenance"] = provenance.environment(job["device"]) | {
        "started": started,
        "finished": provenance.now_iso(),
        "wall_s": round(time.time() - t0, 3),
        "timing_cpu": os.environ.get(timingcpus.TIMING_CPU_ENV) or None,
        # the machine-wide isolation of the timing CPUs, when the workflow made one (root)
        "system_isolation": _system_isolation(),
        # "workflow": every process of the run kept off the timing CPUs; "worker": only workers
        "timing_cpu_reserved_by": (
            ("workflow" if os.environ.get(timingcpus.RESERVED_ENV) else "worker")
            if os.environ.get(timingcpus.TIMING_CPU_ENV)
            else None
        ),
    }
    return res


def main(argv: list[str]) -> int:
    job_path, out_path = argv[1], argv[2]
    job = json.loads(Path(job_path).read_text())
    try:
        res = run(job)
    except InfraError as err:
        print(f"l1bench worker: infrastructure failure: {err}", file=sys.stderr)
        return EXIT_INFRA
    atomic_write_text(out_path, json.dumps(res, indent=1, sort_keys=True, default=str) + "\n")
    return 0
