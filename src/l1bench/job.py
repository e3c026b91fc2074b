"""The job of build_task, check_task and time_task: from its rule's values to its result file.

``scripts/run_task.py`` reads the rule's values into a :class:`JobSpec` and calls :func:`main`.
A worker child (:mod:`l1bench.worker`) runs the snippet code; this process prepares the job,
checks the snippets against the plan, decides what needs no worker, enforces the timeout, stamps
what the stage found as the job's result (:func:`stamped`: the only place a result is stamped,
the layers below return plain data) and writes it atomically, with what the plan compares later
(:mod:`l1bench.staleness`). A negative verdict is a result; a timeout, crash or CUDA fault fails
the job and is recorded in its attempts ledger (:mod:`l1bench.attempts`), until the
``max_attempts``-th counted attempt writes a terminal ``crashed``/``timeout`` result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from l1bench import attempts
from l1bench.io import atomic_write_json
from l1bench.log import setup_logging
from l1bench.plan import serves_task_worker
from l1bench.pool import client, runner
from l1bench.preflight import DRAINED_MARK
from l1bench.provenance import now_iso
from l1bench.release import SNIPPET_FILES
from l1bench.results import (
    NO_CODE_REASON,
    UPSTREAM,
    NoWorker,
    Status,
    TaskResult,
    builds_extensions,
    carried_forward,
    no_worker_needed,
    stage_result,
)
from l1bench.snippet import short

#: A file whose existence tells new jobs not to start (lab/device_run.sh creates it shortly
#: before its time budget ends, so jobs already running can finish instead of being killed).
DRAIN_ENV = "L1BENCH_DRAIN_FILE"
#: The measuring code a result's ``workflow_code`` names, below the package.
MEASURING_CODE = ("worker/", "timing/", "gpu/", "pool/", "snippet.py", "detectors/")


@dataclass(frozen=True)
class JobSpec:
    """A build, check or time job as its rule gives it (``scripts/run_task.py`` reads these from
    the Snakemake object): plain values."""

    rule: str
    kind: str  # build, check or time
    tid: str
    output: str  # the result file
    log: str  # the job log; the worker appends to it
    results: Path  # results/<device> of the run
    backend: str  # cuda, or cpu (the demo)
    protocol_params: Mapping
    ext_dir: str
    timeout: float
    max_attempts: int  # config max_attempts (0: retry forever)
    upstream: str | None = None  # the earlier stage's result: a check's build, a time job's check
    mode: str | None = None
    protocol: str | None = None
    strict: Mapping | None = None
    section_timeout: float | None = None
    snippets: Mapping | None = None  # {snippet: sha256} the plan expects (None: the task's meta.json)
    settings: Mapping | None = None  # recorded as the result's ``settings`` (None: not recorded)
    gpu_slots: int | None = None  # the job's ``gpu`` resource (None: it takes none)


def code_fingerprint() -> dict:
    """sha256 (first 12 hex) of the measuring code (the l1bench package this job imports), so
    results say which version made them."""
    package = Path(__file__).parent

    def digest(path: Path) -> str:
        if path.is_dir():  # a package (worker, timing, gpu, pool, detectors): its modules in name order
            h = hashlib.sha256()
            for module in sorted(path.glob("*.py")):
                h.update(module.name.encode() + b"\0" + module.read_bytes())
            return h.hexdigest()[:12]
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12]

    return {n: digest(package / n) for n in MEASURING_CODE if (package / n).exists()}


def lock_dir(spec: JobSpec) -> str | None:
    """Where the worker's device lock lives: for the CPU backend (the demo) inside this results
    directory, so that other runs and the tests never wait for it; None for GPUs, whose locks are
    machine-wide, one per GPU."""
    return str(spec.results / "tmp") if spec.backend == "cpu" else None


def worker_job(spec: JobSpec) -> dict:
    """The job the worker runs: the task, the stage and its parameters."""
    p = spec.protocol_params
    job = {
        "kind": spec.kind,
        "backend": spec.backend,
        "tid": spec.tid,
        # the task folder by its place, not from the inputs: a job whose result exists takes
        # no meta.json input while the release is still to be split (rules/common.smk, evaluation_inputs)
        "task_dir": str(spec.results / "tasks" / spec.tid),
        "ext_dir": spec.ext_dir,
        "params": dict(p.get("paper", {})),
    }
    if lock_dir(spec):
        job["lock_dir"] = lock_dir(spec)
    if spec.kind == "build":
        job["params"] = dict(p["build"]) | {"seed": 42}
    if spec.kind == "check":
        job["build_result"] = spec.upstream
        job["detectors"] = p.get("detectors")
    if spec.kind == "time":
        job["check_result"] = spec.upstream
        job["mode"] = spec.mode
        job["protocol"] = spec.protocol
        job["strict"] = spec.strict
    return job


def worker_env(spec: JobSpec) -> dict:
    """The worker's environment besides this process's."""
    # Many workers run at once: each keeps to a couple of CPU threads (model construction,
    # inductor) instead of one per core, so they do not thrash each other.
    env = {"TORCHINDUCTOR_COMPILE_THREADS": 1, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", 2)}
    if spec.kind == "build":
        build = spec.protocol_params["build"]
        env["MAX_JOBS"] = build["max_jobs"]
        if build["cuda_arch_list"]:
            env["TORCH_CUDA_ARCH_LIST"] = build["cuda_arch_list"]
    return env


def snippets_to_run(task_dir: str | Path, expected: Mapping | None) -> dict:
    """{snippet: sha256} of the task folder's snippets, checked against those the plan expects
    (``expected``; None: the task's meta.json): a snippet that differs ends the job with one
    line, so no code runs under another hash than its result records."""
    folder = Path(task_dir)
    if expected is None:
        expected = {k: v["sha256"] for k, v in json.loads((folder / "meta.json").read_text())["snippets"].items()}
    for name, sha in expected.items():
        path = folder / SNIPPET_FILES[name]
        found = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"
        if found != sha:
            logging.error("%s: sha256 %s, the release's is %s", path, found[:12], sha[:12])
            sys.exit(f"{path}: differs from the release (edited by hand?): run again to re-split it")
    return dict(expected)


def upstream_sha256(spec: JobSpec) -> str | None:
    """sha256 of the earlier stage's result this job reads (build for a check, check for a
    time job), recorded so that a later change of it makes this result stale."""
    if spec.kind not in UPSTREAM:
        return None
    return hashlib.sha256(Path(spec.upstream).read_bytes()).hexdigest()


def custom_builds_extensions(job: dict) -> bool | None:
    """Whether the task's custom code compiles a C++/CUDA extension (None: no custom file)."""
    custom = Path(job["task_dir"]) / SNIPPET_FILES["custom"]
    return builds_extensions(custom.read_text()) if custom.exists() else None


def upstream_result_status(job: dict) -> str | None:
    """The status of the earlier stage's result of a check or time job (None: none named)."""
    if job["kind"] not in UPSTREAM:
        return None
    path = job.get(f"{UPSTREAM[job['kind']][0]}_result")
    return json.loads(Path(path).read_text())["status"] if path else None


def stamped(job: dict, found: Mapping) -> dict:
    """The result of ``job``: what its stage found (plain data, :func:`l1bench.results.stage_result`,
    from a worker or from this process) stamped with the job's kind, task, mode and protocol
    (:meth:`l1bench.results.TaskResult.for_job`), its reason one line."""
    fields = dict(found)
    status, reason = fields.pop("status"), fields.pop("reason", "")
    return TaskResult.for_job(job, status, short(reason) if reason else "", **fields).to_dict()


def without_worker(job: dict, broken: list, max_attempts: int) -> dict | None:
    """The result of a job decided in this process, without a worker (no interpreter, no CUDA
    context), else None: :func:`l1bench.results.no_worker_needed` decides, from the task's
    ``meta.json`` and custom code, the earlier stage's result and the ``broken`` attempts so far
    (each read only when the decision needs it). Its ``provenance`` says no worker ran."""
    why = no_worker_needed(
        job["kind"],
        has_code=lambda: "custom" in json.loads((Path(job["task_dir"]) / "meta.json").read_text()).get("snippets", {}),
        builds_extensions=lambda: custom_builds_extensions(job),
        upstream_status=lambda: upstream_result_status(job),
        given_up=lambda: attempts.given_up(broken, max_attempts),
    )
    if why is None:
        return None
    if why is NoWorker.GAVE_UP:
        found = stage_result(attempts.terminal_status(broken), attempts.terminal_reason(broken), failed_attempts=broken)
    elif why is NoWorker.NO_CODE:
        found = stage_result(Status.NO_CODE, NO_CODE_REASON)
    elif why is NoWorker.NOTHING_TO_BUILD:
        reason = "no C++/CUDA extension in the custom code: nothing to build"
        found = stage_result(Status.OK, reason, build_s=0.0, extensions=[])
    else:
        found = carried_forward(job)
    found["params"] = job.get("params", {})
    found["provenance"] = {"started": now_iso(), "finished": now_iso(), "wall_s": 0.0, "worker": False}
    return stamped(job, found)


def gpu_slots(spec: JobSpec) -> tuple:
    """(the job's, the run's) GPU job slots: the job's ``gpu`` resource, and the run's as the
    workflow exports it (attempts.GPU_SLOTS_ENV); None where unknown."""
    return spec.gpu_slots, os.environ.get(attempts.GPU_SLOTS_ENV)


def run_in_worker(spec: JobSpec, job: dict) -> dict:
    """The job's result from a worker: its task's worker for a check or an eager-mode time job
    (:func:`l1bench.plan.serves_task_worker`), else a worker of its own; JobFailed/JobStopped as
    :func:`l1bench.pool.runner.run_worker` raises them."""
    home = spec.results / "tmp" / "task-workers"
    if attempts.takes_every_slot(*gpu_slots(spec)):
        # a retry after running out of GPU memory beside other jobs: the idle task workers go too
        with client.gpu_alone(home, job.get("lock_dir")) as (held, waited):
            logging.info("this job takes every GPU slot: the run's idle task workers were asked to leave "
                         "(waited %.1f s; %d idle workers of other runs remain)", waited, held)
            return _in_a_worker(spec, job, home)
    return _in_a_worker(spec, job, home)


def _in_a_worker(spec: JobSpec, job: dict, home: Path) -> dict:
    env, section_timeout = worker_env(spec), spec.section_timeout
    if serves_task_worker(job["kind"], job.get("mode")):
        return client.run_in_task_worker(job, spec.timeout, spec.log, home, env, section_timeout=section_timeout)
    return runner.run_worker(job, spec.timeout, spec.log, env, section_timeout=section_timeout)


def attempt_log(log: str | Path, start: int) -> str:
    """This attempt's lines of the job log: from ``start`` (its size when the attempt began)."""
    with open(log, "rb") as fh:
        fh.seek(start)
        return fh.read().decode(errors="replace")


def result_of(spec: JobSpec, job: dict, ledger: Path, log_start: int) -> tuple[dict, list]:
    """(the job's result, its broken attempts so far): decided without a worker, else a worker's.
    A stopped job, or one that broke and is to be retried, ends with one line and no result."""
    broken = attempts.load(ledger)
    res = without_worker(job, broken, spec.max_attempts)
    if res is not None:  # nothing to run: no worker (no interpreter, no CUDA context)
        return res, broken
    try:
        res = stamped(job, run_in_worker(spec, job))
    except runner.JobStopped as err:
        logging.error("STOPPED (no result written, not counted as an attempt): %s", err)
        sys.exit(f"{spec.rule}: {err}")
    except runner.JobFailed as err:
        text = attempt_log(spec.log, log_start)
        broken = attempts.record_broken(ledger, str(err), err.kind, text, spec.results, gpu_slots(spec))
        res = without_worker(job, broken, spec.max_attempts)
        if res is None:
            logging.error(
                "FAILED (no result written; retried, attempt %d of %s%s): %s",
                len(attempts.counted(broken)),
                spec.max_attempts or "unlimited",
                attempts.not_counted(broken[-1]),
                broken[-1]["error"],
            )
            sys.exit(f"{spec.rule}: {broken[-1]['error']}")
        logging.error("FAILED %d times: giving up, status %s", len(broken), res["status"])
        return res, broken
    if broken:  # it broke before: say so in the result, which replaces the ledger
        res["failed_attempts"] = broken
    return res, broken


def run(spec: JobSpec) -> None:
    """Run the job to its result file, stamped with what a later plan compares (the release, the
    snippets' and the earlier stage's sha256, the settings) and the measuring code; or end it
    with one line and no result (the run is draining, a snippet differs, it broke)."""
    log_start = Path(spec.log).stat().st_size if Path(spec.log).exists() else 0  # this attempt's lines follow
    setup_logging(spec.log)  # appended to: the worker writes into the same log
    drain = os.environ.get(DRAIN_ENV)
    if drain and Path(drain).exists():
        logging.error("%s (%s exists); the next run does this job", DRAINED_MARK, drain)
        sys.exit(f"{spec.rule}: not started, the run is draining")
    job = worker_job(spec)
    logging.info("job %s", job)
    snippets, upstream = snippets_to_run(job["task_dir"], spec.snippets), upstream_sha256(spec)
    ledger = attempts.ledger_path(spec.results, spec.output)
    res, broken = result_of(spec, job, ledger, log_start)
    res["release_fingerprint"] = spec.protocol_params["release"]
    # what l1bench.staleness compares with the plan of a later run
    res["snippet_sha256"] = snippets
    if upstream is not None:
        res["upstream_sha256"] = upstream
    if spec.settings is not None:
        res["settings"] = spec.settings
    res["workflow_code"] = code_fingerprint()
    atomic_write_json(spec.output, res)
    if broken:  # recorded in the result now (failed_attempts)
        ledger.unlink(missing_ok=True)
    logging.info("status %s %s", res["status"], res.get("reason", ""))


def name_a_full_disk(main: Callable[[JobSpec], None], spec: JobSpec) -> None:
    """Run ``main(spec)``; a full disk (OSError ENOSPC) in this process (the result, the ledger,
    the log) ends the job with one line naming it, not a traceback: an infrastructure failure,
    not an attempt of the task."""
    try:
        main(spec)
    except OSError as err:
        if not attempts.is_disk_full(err):
            raise
        where = err.filename or "writing"
        line = f"{spec.rule} {spec.output}: {attempts.DISK_FULL} ({where}); not counted as an attempt"
        try:
            with open(spec.log, "a") as log:
                log.write(f"FAILED (no result written; the disk is full: free disk space and rerun): {line}\n")
        except OSError:
            pass
        sys.exit(line)


def main(spec: JobSpec) -> None:
    """The job script's entry: :func:`run`, a full disk named in one line; a stop signal leaves
    no scratch folder behind."""
    runner.remove_scratch_on_stop()
    name_a_full_disk(run, spec)
