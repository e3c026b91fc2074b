"""What the workflow says before and after a run: one line for bad input, the GPU guard, the
end-of-run hint. Used by the run's plan (l1bench.runplan) and its hooks (l1bench.hooks).

* :func:`config_error` — a config that fails the schema, as one line naming the key.
* :func:`release_dir_problem` — a ``release_dir`` that does not exist or lacks the release file.
* :func:`gpu_jobs` — which planned check/time jobs need a GPU (the guard at ``onstart``).
* :func:`failure_hint` — after a failed or stopped run: what failed and why, what to do next.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from l1bench import attempts
from l1bench.results import STAGES, UPSTREAM, no_worker_needed

RELEASE_LAYOUT = "a release folder holds optimized_cuda_code/ and more_baselines/ as in the upstream repository"
#: The same for ``device=demo``: a folder like the embedded demo release.
DEMO_LAYOUT = "a demo release folder holds optimized_cuda_code/demo.json, as config/demo does"


# --------------------------------------------------------------------------- config


def config_error(config: dict, schema_file: str | Path) -> str | None:
    """The schema's most relevant complaint about ``config`` as one line ("config KEY: ..."),
    None when it validates. (Snakemake's own message adds the schema fragment, 8-10 lines.)"""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_file).read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    err = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if err is None:
        return None
    where = ".".join(str(p) for p in err.absolute_path)
    hint = err.schema.get("description") if err.validator == "pattern" else None  # what a pattern stands for
    message = f"{err.instance!r} is not {hint}" if hint else err.message
    return f"config {where}: {message}" if where else f"config: {message}"


def release_dir_problem(release_dir: str | Path, release_file: str) -> str | None:
    """Why ``release_dir`` cannot be the release (one line naming the path), else None.

    Checked whatever results are on disk: a typo must not pass as "nothing to be done".
    The baseline files are checked with the release's checksums (l1bench.runplan).
    """
    root, layout = Path(release_dir), DEMO_LAYOUT if release_file.endswith("/demo.json") else RELEASE_LAYOUT
    if not root.is_dir():
        return f"release_dir={release_dir}: no such folder ({layout})"
    if not (root / release_file).is_file():
        return f"release_dir={release_dir}: {root / release_file} not found ({layout})"
    return None


def results_dir_problem(results_dir: str, results: str | Path) -> str | None:
    """Why the results tree ``results`` (below ``results_dir``) cannot be made: a file stands where a
    folder of its path must be (Snakemake would end in a traceback); else None."""
    found = next(p for p in (Path(results), *Path(results).parents) if p.exists())
    return f"results_dir={results_dir}: {found} is a file, not a folder" if found.is_file() else None


# --------------------------------------------------------------------------- the GPU guard


def _status(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def decided_without_gpu(path, res, no_code_tids=(), max_attempts: int = 0, pending=frozenset()) -> bool:
    """Whether the check/time result ``path`` is decided without a GPU (l1bench.job):
    the task has no custom code, the job already broke ``max_attempts`` times (l1bench.attempts),
    or its build (for a check) or check (for a time job) is negative
    (:func:`l1bench.results.no_worker_needed`). An earlier result that is itself still to be
    made in this run (in ``pending``) decides nothing yet."""
    path, res = Path(path), Path(res)
    tid = path.stem
    kind = path.relative_to(res).parts[0]
    stage, _ = UPSTREAM[kind]
    upstream = res / stage / f"{tid}.json"
    why = no_worker_needed(
        kind,
        has_code=tid not in no_code_tids,
        upstream_status=lambda: None if str(upstream) in pending else _status(upstream),
        given_up=lambda: attempts.given_up(attempts.load(attempts.ledger_path(res, path)), max_attempts),
    )
    return why is not None


def gpu_jobs(outputs, res, no_code_tids=(), max_attempts: int = 0, pending=frozenset()) -> list[str]:
    """Of the check/time results a run is about to make, those whose job needs a GPU."""
    pending = {str(p) for p in pending}
    return [str(p) for p in outputs if not decided_without_gpu(p, res, no_code_tids, max_attempts, pending)]


def gpus_are_local(local_exec: bool, is_demo: bool, aggregate_only: bool) -> bool:
    """Whether this Snakemake process's host is where the run's GPU jobs time: not with a
    cluster executor (SLURM: the GPUs are on the nodes it sends jobs to), not for the CPU demo
    or a table rebuild. Decides the GPU guard and the timing-CPU reservation."""
    return bool(local_exec) and not is_demo and not aggregate_only


def no_gpu_message(device: str, needed: list[str]) -> str:
    """The guard's one line."""
    first = needed[0] + (f" and {len(needed) - 1} more" if len(needed) > 1 else "")
    return (
        f"device={device} needs a CUDA GPU for {len(needed)} check/time job{'s' * (len(needed) != 1)} "
        f"({first}), and none is visible; nothing was run. Run the CPU demo instead "
        "(snakemake --cores 2 --config device=demo) or tabulate the results on disk "
        f"(snakemake --cores 1 --config device={device} aggregate_only=true)"
    )


# --------------------------------------------------------------------------- after the run

#: Set by :func:`note_stop_signals`'s handlers: the signal that stopped the run, if one did.
STOPPED_BY: list[str] = []


def note_stop_signals(signals=(signal.SIGTERM, signal.SIGINT)) -> None:
    """Remember when the run is stopped by a signal (the end-of-run hint then says so instead
    of blaming the tasks); the handlers Snakemake installed still run."""
    for sig in signals:
        before = signal.getsignal(sig)

        def handler(signum, frame, before=before):
            STOPPED_BY.append(signal.Signals(signum).name)
            if callable(before):
                before(signum, frame)
            elif before == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        signal.signal(sig, handler)


#: Why a job of each rule fails, as the hint says it: a stage's broke (on the GPU also by a CUDA
#: fault or out of memory), a download failed.
WHY = {s.rule: f"broke (timeout, crash{', CUDA fault, out of memory' * s.gpu})" for s in STAGES} | {
    "fetch_release_file": "download failed (no network?)"
}


#: What the job (l1bench.job) logs when it does not start a job because the run is draining (the end of a
#: time budget, lab/device_run.sh): not a failure of the task.
DRAINED_MARK = "not started: the run is draining"


def failed_jobs(log_texts) -> dict[str, dict]:
    """{output: {rule, log, error, drained}} of the jobs that failed, from Snakemake logs,
    sorted by output; ``error`` is the job's reason from the job log (timeout, signal...)
    when shown; ``drained``: the job was not started because the run was draining."""
    out: dict[str, dict] = {}
    for text in log_texts:
        for block in attempts.failed_jobs_in_snakemake_log(text):
            log_text = block.get("log_text", "")
            error = attempts.log_error(log_text)[0].removesuffix(", see log")
            job = out.setdefault(
                block["output"], {"rule": block["rule"], "log": block.get("log"), "error": "", "drained": False}
            )
            if not error and attempts.disk_full(log_text):
                error = attempts.DISK_FULL
            job["error"] = error or job["error"]
            job["drained"] = DRAINED_MARK in log_text and not error
    return dict(sorted(out.items()))


def disk_full_note(path: str | Path, low: int | None = None) -> str | None:
    """One line when the disk holding ``path`` (or its nearest existing parent) is full or nearly,
    else None: the jobs that broke may have broken for that (ENOSPC), not for their task."""
    free = attempts.disk_low(path, low)
    if free is None:
        return None
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return (f"The disk holding {path} is full ({free / 2**20:.0f} MiB free): jobs fail with {attempts.DISK_FULL}, "
            "not counted as attempts; free disk space, then rerun.")


def failure_hint(device: str, failed: dict[str, dict], stopped_by: str | None = None, max_attempts: int = 0,
                 shown: int = 5, logs: str | None = None, disk: str | None = None) -> str:
    """What to print when a run ends without success: stopped by a signal, or which jobs failed
    and why (``disk``: :func:`disk_full_note`'s line, first), then how to go on."""
    retry = f"snakemake --config device={device}"
    lines = [disk] if disk else []
    if stopped_by:
        how = (
            "the jobs that were running were stopped" if stopped_by == "SIGINT"
            else "the jobs that were running were let finish"
        )
        lines.append(f"Stopped by {stopped_by}: {how}; every finished result is kept.")
        lines.append(f"  continue where it stopped:            {retry}")
    else:
        drained = {o: j for o, j in failed.items() if j.get("drained")}
        failed = {o: j for o, j in failed.items() if not j.get("drained")}
        n = len(failed)
        if n or not drained:
            lines.append(f"{n or 'Some'} job{'s' * (n != 1)} failed; every other result is kept.")
        if drained:
            d = len(drained)
            lines.append(
                f"{d} job{'s' * (d != 1)} not started: the run was draining (the end of its time budget); "
                "not counted as attempts."
            )
        for output, job in list(failed.items())[:shown]:
            why = job.get("error") or WHY.get(job["rule"], "failed")
            log = f", log {job['log']}" if job.get("log") else ""
            lines.append(f"  {job['rule']} {output}: {why}{log}")
        if n > shown:
            lines.append(f"  ... and {n - shown} more ({logs or f'logs/{device}'}/)")
        if any(job["rule"] == "fetch_release_file" for job in failed.values()):
            lines.append(
                "  without network: copy the release (optimized_cuda_code/, more_baselines/) to a folder and "
                f"run {retry} release_dir=FOLDER"
            )
        evaluation = [j for j in failed.values() if j["rule"] in {s.rule for s in STAGES}]
        if evaluation and max_attempts:
            lines.append(
                f"  a job that broke {max_attempts} times gets a terminal crashed/timeout result "
                "(a full disk, out of GPU memory beside other jobs: not counted)"
            )
        lines.append(f"  retry only what failed or is missing:  {retry}")
    lines.append(f"  tables from the results so far:       {retry} aggregate_only=true")
    return "\n".join(lines)
