"""Snakemake script of build_task, check_task and time_task: one worker child per job.

The child (l1bench.worker) runs the snippet code; this process prepares the job, enforces the
timeout and writes the result atomically. A negative verdict is a result; a timeout, crash or
CUDA fault fails the job and is recorded in its attempts ledger (l1bench.attempts), until the
``max_attempts``-th counted attempt writes a terminal ``crashed``/``timeout`` result.
"""

import logging
import os
import sys
from pathlib import Path

#: A file whose existence tells new jobs not to start (lab/device_run.sh creates it shortly
#: before its time budget ends, so jobs already running can finish instead of being killed).
DRAIN_ENV = "L1BENCH_DRAIN_FILE"


def code_fingerprint() -> dict:
    """sha256 (first 12 hex) of the measuring code (the l1bench package this job imports), so
    results say which version made them."""
    import hashlib

    import l1bench

    package = Path(l1bench.__file__).parent
    names = ("worker/", "timing/", "snippet.py", "detectors/", "gpus.py")

    def digest(path: Path) -> str:
        if path.is_dir():  # a package (worker, timing, detectors): its modules in name order
            h = hashlib.sha256()
            for module in sorted(path.glob("*.py")):
                h.update(module.name.encode() + b"\0" + module.read_bytes())
            return h.hexdigest()[:12]
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12]

    return {n: digest(package / n) for n in names if (package / n).exists()}


def results_root(smk) -> Path:
    """results/<device> of this run."""
    return Path(smk.config["results_dir"]) / str(smk.config["device"])


def lock_dir(smk) -> str | None:
    """Where the worker's device lock lives: for the CPU backend (the demo) inside this results
    directory, so that other runs and the tests never wait for it; None for GPUs, whose locks are
    machine-wide, one per GPU."""
    return str(results_root(smk) / "tmp") if smk.params.backend == "cpu" else None


def make_job(smk) -> dict:
    p = smk.params
    job = {
        "kind": p.kind,
        "backend": p.backend,
        "tid": smk.wildcards.tid,
        # the task folder by its place, not from the inputs: a job whose result exists takes
        # no meta.json input while the release is still to be split (common.smk, task_meta)
        "task_dir": str(results_root(smk) / "tasks" / smk.wildcards.tid),
        "ext_dir": p.ext_dir,
        "params": dict(p.protocol_params.get("paper", {})),
    }
    if lock_dir(smk):
        job["lock_dir"] = lock_dir(smk)
    if p.kind == "build":
        job["params"] = dict(p.protocol_params["build"]) | {"seed": 42}
    if p.kind == "check":
        job["build_result"] = smk.input.build
        job["detectors"] = p.protocol_params.get("detectors")
    if p.kind == "time":
        job["check_result"] = smk.input.check
        job["mode"] = smk.wildcards.mode
        job["protocol"] = smk.wildcards.protocol
        job["strict"] = p.strict
    return job


def worker_env(smk) -> dict:
    # Many workers run at once: each keeps to a couple of CPU threads (model construction,
    # inductor) instead of one per core, so they do not thrash each other.
    env = {"TORCHINDUCTOR_COMPILE_THREADS": 1, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", 2)}
    if smk.params.kind == "build":
        build = smk.params.protocol_params["build"]
        env["MAX_JOBS"] = build["max_jobs"]
        if build["cuda_arch_list"]:
            env["TORCH_CUDA_ARCH_LIST"] = build["cuda_arch_list"]
    return env


def custom_builds_extensions(job: dict) -> bool | None:
    """Whether the task's custom code compiles a C++/CUDA extension (None: no custom file)."""
    from l1bench.release import SNIPPET_FILES
    from l1bench.results import builds_extensions

    custom = Path(job["task_dir"]) / SNIPPET_FILES["custom"]
    return builds_extensions(custom.read_text()) if custom.exists() else None


def upstream_result_status(job: dict) -> str | None:
    """The status of the earlier stage's result of a check or time job (None: none named)."""
    import json

    from l1bench.results import UPSTREAM

    if job["kind"] not in UPSTREAM:
        return None
    path = job.get(f"{UPSTREAM[job['kind']][0]}_result")
    return json.loads(Path(path).read_text())["status"] if path else None


def without_worker(job: dict, attempts: list, max_attempts: int) -> dict | None:
    """The result of a job decided in this process, without a worker (no interpreter, no CUDA
    context), else None: :func:`l1bench.results.no_worker_needed` decides, from the task's
    ``meta.json`` and custom code, the earlier stage's result and the attempts ledger (each
    read only when the decision needs it). Its ``provenance`` says no worker ran."""
    import json

    from l1bench.attempts import given_up, terminal_reason, terminal_status
    from l1bench.provenance import now_iso
    from l1bench.results import NoWorker, Status, no_worker_needed
    from l1bench.worker.outcome import NO_CODE_REASON, result, upstream_status

    why = no_worker_needed(
        job["kind"],
        has_code=lambda: "custom" in json.loads((Path(job["task_dir"]) / "meta.json").read_text()).get("snippets", {}),
        builds_extensions=lambda: custom_builds_extensions(job),
        upstream_status=lambda: upstream_result_status(job),
        given_up=lambda: given_up(attempts, max_attempts),
    )
    if why is None:
        return None
    if why is NoWorker.GAVE_UP:
        res = result(job, terminal_status(attempts), terminal_reason(attempts), failed_attempts=attempts)
    elif why is NoWorker.NO_CODE:
        res = result(job, Status.NO_CODE, NO_CODE_REASON)
    elif why is NoWorker.NOTHING_TO_BUILD:
        reason = "no C++/CUDA extension in the custom code: nothing to build"
        res = result(job, Status.OK, reason, build_s=0.0, extensions=[])
    else:
        res = upstream_status(job)
    res["params"] = job.get("params", {})
    res["provenance"] = {"started": now_iso(), "finished": now_iso(), "wall_s": 0.0, "worker": False}
    return res


def ledger_file(smk) -> Path:
    """The attempts ledger of this job's result (results/<device>/attempts/...)."""
    from l1bench.attempts import ledger_path

    return ledger_path(results_root(smk), smk.output[0])


def gpu_slots(smk) -> tuple:
    """(the job's, the run's) GPU job slots: Snakemake's ``gpu`` resource of the job, and the
    run's as the workflow exports it (attempts.GPU_SLOTS_ENV); None where unknown."""
    from l1bench import attempts

    return getattr(smk.resources, "gpu", None), os.environ.get(attempts.GPU_SLOTS_ENV)


def run_job(smk, job: dict) -> dict:
    """The job's result from a worker: its task's worker for a check or an eager-mode time job
    (:func:`l1bench.plan.serves_task_worker`), else a worker of its own; JobFailed/JobStopped as
    :func:`l1bench.runner.run_worker` raises them."""
    from l1bench import attempts
    from l1bench.timing.taskworker import gpu_alone

    home = results_root(smk) / "tmp" / "task-workers"
    if attempts.takes_every_slot(*gpu_slots(smk)):
        # a retry after running out of GPU memory beside other jobs: the idle task workers go too
        with gpu_alone(home, job.get("lock_dir")) as (held, waited):
            logging.info("this job takes every GPU slot: the run's idle task workers were asked to leave "
                         "(waited %.1f s; %d idle workers of other runs remain)", waited, held)
            return _run_job(smk, job, home)
    return _run_job(smk, job, home)


def _run_job(smk, job: dict, home: Path) -> dict:
    from l1bench.plan import serves_task_worker
    from l1bench.runner import run_worker
    from l1bench.timing.taskworker import run_in_task_worker

    section_timeout = getattr(smk.params, "section_timeout", None)
    if serves_task_worker(job["kind"], job.get("mode")):
        return run_in_task_worker(
            job, smk.params.timeout, smk.log[0], home, worker_env(smk), section_timeout=section_timeout
        )
    return run_worker(job, smk.params.timeout, smk.log[0], worker_env(smk), section_timeout=section_timeout)


def record_failure(smk, err, log_start: int, ledger: Path) -> list:
    """Record the broken attempt ``err`` (runner.JobFailed) in the job's ledger, with this
    attempt's last error line (its job log from ``log_start``), marking a full disk or running out
    of GPU memory beside other jobs (not counted). Returns every attempt so far."""
    from l1bench import attempts

    with open(smk.log[0], "rb") as fh:  # this attempt's lines
        fh.seek(log_start)
        text = fh.read().decode(errors="replace")
    error, kind, extra = str(err), err.kind, {}
    if attempts.disk_full(text) or attempts.disk_low(results_root(smk)) is not None:
        error, kind, extra = attempts.disk_full_error(error), "disk_full", {"disk_full": True}
    elif attempts.out_of_memory(text):
        slots = gpu_slots(smk)
        extra = {"out_of_memory": True, "gpu_slots": slots[0], "gpu_shared": attempts.gpu_shared(*slots)}
    return attempts.record(ledger, error, kind, attempts.last_error_line(text), **extra)


def not_counted(attempt: dict) -> str:
    """Why a broken attempt does not count towards max_attempts, for the FAILED line ('' if it does)."""
    from l1bench import attempts

    if attempt.get("disk_full"):
        return "; the disk is full: not counted, free disk space and rerun"
    if attempts.ran_out_sharing([attempt]):
        return "; out of GPU memory beside other jobs: not counted, the retry takes the GPU alone"
    return ""


def name_a_full_disk(main, smk) -> None:
    """Run ``main(smk)``; a full disk (OSError ENOSPC) in this process (the result, the ledger,
    the log) ends the job with one line naming it, not a traceback: an infrastructure failure,
    not an attempt of the task."""
    from l1bench.attempts import DISK_FULL, is_disk_full

    try:
        main(smk)
    except OSError as err:
        if not is_disk_full(err):
            raise
        line = f"{smk.rule} {smk.output[0]}: {DISK_FULL} ({err.filename or 'writing'}); not counted as an attempt"
        try:
            with open(smk.log[0], "a") as log:
                log.write(f"FAILED (no result written; the disk is full: free disk space and rerun): {line}\n")
        except OSError:
            pass
        sys.exit(line)


def snippets_to_run(smk, job: dict) -> dict:
    """{snippet: sha256} of the task folder's snippets, checked against those the plan expects
    (params ``snippets``; None: the task's meta.json): a snippet that differs stops the job with
    one line, so no code runs under another hash than its result records."""
    import hashlib
    import json

    from l1bench.release import SNIPPET_FILES

    folder = Path(job["task_dir"])
    expected = getattr(smk.params, "snippets", None)
    if expected is None:
        expected = {k: v["sha256"] for k, v in json.loads((folder / "meta.json").read_text())["snippets"].items()}
    for name, sha in expected.items():
        path = folder / SNIPPET_FILES[name]
        found = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"
        if found != sha:
            logging.error("%s: sha256 %s, the release's is %s", path, found[:12], sha[:12])
            sys.exit(f"{path}: differs from the release (edited by hand?): run again to re-split it")
    return dict(expected)


def upstream_sha256(smk) -> str | None:
    """sha256 of the earlier stage's result this job reads (build for a check, check for a
    time job), recorded so that a later change of it makes this result stale."""
    import hashlib

    name = {"check": "build", "time": "check"}.get(smk.params.kind)
    if name is None:
        return None
    return hashlib.sha256(Path(getattr(smk.input, name)).read_bytes()).hexdigest()


def main(smk) -> None:
    from l1bench import attempts as attempts_mod
    from l1bench.io import atomic_write_json
    from l1bench.log import setup_logging
    from l1bench.preflight import DRAINED_MARK
    from l1bench.runner import JobFailed, JobStopped

    log_start = Path(smk.log[0]).stat().st_size if Path(smk.log[0]).exists() else 0  # this attempt's lines follow
    setup_logging(smk.log[0])  # appended to: the worker writes into the same log
    drain = os.environ.get(DRAIN_ENV)
    if drain and Path(drain).exists():
        logging.error("%s (%s exists); the next run does this job", DRAINED_MARK, drain)
        sys.exit(f"{smk.rule}: not started, the run is draining")
    job = make_job(smk)
    logging.info("job %s", job)
    snippets, upstream = snippets_to_run(smk, job), upstream_sha256(smk)
    # nothing to run: no worker (no interpreter, no CUDA context)
    ledger, max_attempts = ledger_file(smk), int(smk.config["max_attempts"])
    attempts = attempts_mod.load(ledger)
    res = without_worker(job, attempts, max_attempts)
    if res is None:
        try:
            res = run_job(smk, job)
        except JobStopped as err:
            logging.error("STOPPED (no result written, not counted as an attempt): %s", err)
            sys.exit(f"{smk.rule}: {err}")
        except JobFailed as err:
            attempts = record_failure(smk, err, log_start, ledger)
            res = without_worker(job, attempts, max_attempts)
            if res is None:
                logging.error(
                    "FAILED (no result written; retried, attempt %d of %s%s): %s",
                    len(attempts_mod.counted(attempts)),
                    max_attempts or "unlimited",
                    not_counted(attempts[-1]),
                    attempts[-1]["error"],
                )
                sys.exit(f"{smk.rule}: {attempts[-1]['error']}")
            logging.error("FAILED %d times: giving up, status %s", len(attempts), res["status"])
        else:
            if attempts:  # it broke before: say so in the result, which replaces the ledger
                res["failed_attempts"] = attempts
    res["release_fingerprint"] = smk.params.protocol_params["release"]
    # what l1bench.staleness compares with the plan of a later run
    res["snippet_sha256"] = snippets
    if upstream is not None:
        res["upstream_sha256"] = upstream
    if getattr(smk.params, "settings", None) is not None:
        res["settings"] = smk.params.settings
    res["workflow_code"] = code_fingerprint()
    atomic_write_json(smk.output[0], res)
    if attempts:  # recorded in the result now (failed_attempts)
        ledger.unlink(missing_ok=True)
    logging.info("status %s %s", res["status"], res.get("reason", ""))


if "snakemake" in globals():
    name_a_full_disk(main, snakemake)  # noqa: F821
