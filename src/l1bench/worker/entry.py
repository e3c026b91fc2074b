"""The worker's entry point: ``python -m l1bench.worker JOB.json RESULT.json`` runs :func:`main`.

:func:`run` reads the task's snippets, installs the extension-build hooks where the custom code
builds extensions, places the job (:func:`pick_device`: CPU for the demo, else whichever visible
GPU is free at the first section), runs the job's stage (``KINDS``) and adds what every result
carries: ``timing_version`` (:data:`l1bench.timing.TIMING_VERSION`), ``snippet_sha256``, ``params``, ``provenance``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from l1bench import provenance
from l1bench.gpu import gpus, timingcpus
from l1bench.io import atomic_write_text
from l1bench.results import NO_CODE_REASON, NoWorker, Status, builds_extensions, no_worker_needed, stage_result
from l1bench.snippet import InfraError, SnippetError, sha256_text
from l1bench.timing import TIMING_VERSION
from l1bench.worker import EXIT_INFRA
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


def gpu_memory(device: str, torch_mod=None) -> dict | None:
    """The caching allocator's peaks on ``device`` in this process since the last reset (a
    task worker resets them before each step, :meth:`l1bench.pool.state.TaskWorker.prepare`),
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
    if job["kind"] == "build":
        job["device"] = "cpu"
        if job["backend"] != "cpu":  # builds (nvcc) keep clear of the timing CPUs
            timingcpus.reserve_timing_cpus(gpus.visible_gpu_count(), None)
    else:
        job["device"] = pick_device(job)
    try:
        if no_worker_needed(job["kind"], has_code="custom" in snippets) is NoWorker.NO_CODE:
            res = stage_result(Status.NO_CODE, NO_CODE_REASON)
        else:
            res = KINDS[job["kind"]](job, meta, snippets)
    except SnippetError as err:
        res = stage_result(err.status, err.reason)
    note_extension_failures(res, job["kind"])
    if job["kind"] in ("check", "time"):
        res["timing_version"] = TIMING_VERSION
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
