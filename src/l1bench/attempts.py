"""Broken attempts of a job (timeout, crash, CUDA fault), and when to stop retrying.

Each broken attempt is appended to a ledger beside the results (``<results>/<device>/attempts/
<the result's path below it>``); once it holds ``max_attempts`` counted entries the job gets a
terminal result (``crashed`` or ``timeout``) instead of being retried in every run. An attempt
that ran out of GPU memory beside other jobs, or found the disk full, is recorded but not
counted (:func:`counted`). A later success moves the ledger into its result
(``failed_attempts``). Deleting the result *and* its ledger retries from scratch.
"""

from __future__ import annotations

import errno
import json
import re
from datetime import datetime, timezone
from pathlib import Path

from l1bench.io import atomic_write_json
from l1bench.results import Status
from l1bench.timing.strict import MEMORY_SHORT

#: Terminal status by the kind of breakage (runner.JobFailed.kind).
STATUS_BY_KIND = {"timeout": Status.TIMEOUT, "section_timeout": Status.TIMEOUT}
DEFAULT_STATUS = Status.CRASHED
ATTEMPTS_DIR = "attempts"


def ledger_path(results_root: str | Path, output: str | Path) -> Path:
    """The ledger of ``output`` (a result file below ``results_root``, i.e. results/<device>)."""
    root = Path(results_root)
    return root / ATTEMPTS_DIR / Path(output).relative_to(root)


def load(path: str | Path) -> list[dict]:
    """The attempts recorded so far ([] without a ledger; an unreadable ledger counts as none)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    return list(data.get("attempts", [])) if isinstance(data, dict) else []


def record(path: str | Path, error: str, kind: str, detail: str = "", when: str | None = None, **extra) -> list[dict]:
    """Append one broken attempt to the ledger; returns all attempts so far."""
    attempts = load(path)
    entry = {"when": when or datetime.now(timezone.utc).isoformat(timespec="seconds"), "kind": kind, "error": error}
    if detail:
        entry["detail"] = detail
    attempts.append(entry | extra)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"about": __doc__.split("\n\n")[0].strip(), "attempts": attempts})
    return attempts


#: Environment variable: the run's ``gpu`` job slots (Snakemake's resource), which the workflow
#: sets for its jobs; a job that took fewer shared the GPU with other jobs.
GPU_SLOTS_ENV = "L1BENCH_GPU_SLOTS"
#: torch's out-of-memory errors, and a strict step whose input pool gave out (strict.MEMORY_SHORT)
_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|" + re.escape(MEMORY_SHORT))


def out_of_memory(log_text: str) -> bool:
    """Whether an attempt's job log says the GPU ran out of memory (torch's error, not the
    generic "CUDA fault or out of memory" of an infrastructure failure)."""
    return bool(_OOM.search(log_text))


def _slot_counts(job_slots, run_slots) -> tuple[int, int] | None:
    """(job's, run's) GPU job slots as numbers, None where either is unknown."""
    try:
        return int(job_slots), int(run_slots)
    except (TypeError, ValueError):
        return None


def gpu_shared(job_slots, run_slots) -> bool:
    """Whether a job that took ``job_slots`` of the run's ``run_slots`` GPU job slots may have
    had other GPU jobs beside it (unknown slots: not shared, as under SLURM, where each job is
    an allocation of its own)."""
    slots = _slot_counts(job_slots, run_slots)
    return slots is not None and slots[0] < slots[1]


def takes_every_slot(job_slots, run_slots) -> bool:
    """Whether a job took all of several GPU job slots (the retry of an attempt that ran out of
    memory beside other jobs): it asks the run's idle task workers to leave too
    (:func:`l1bench.pool.client.gpu_alone`)."""
    slots = _slot_counts(job_slots, run_slots)
    return slots is not None and slots[1] > 1 and slots[0] >= slots[1]


def _out_beside_others(attempt: dict) -> bool:
    return bool(attempt.get("out_of_memory") and attempt.get("gpu_shared"))


#: A full disk in a job's log: the C library's message (Python's OSError errno 28 says it too).
_DISK_FULL = re.compile(r"No space left on device|\bENOSPC\b|\[Errno 28\]")
#: How a full disk is named, in the ledger's errors and the end-of-run hint.
DISK_FULL = "disk full (ENOSPC: No space left on device)"


def disk_full(log_text: str) -> bool:
    """Whether an attempt's job log says the disk was full (ENOSPC): an infrastructure failure,
    not the task's, so not counted (:func:`counted`)."""
    return bool(_DISK_FULL.search(log_text))


#: Free space below which a disk counts as full (a job that broke then broke for it).
DISK_LOW_BYTES = 64 * 2**20


def disk_low(path: str | Path, low: int | None = None) -> int | None:
    """The free bytes of the disk holding ``path`` (or its nearest existing parent) when under
    ``low`` (default :data:`DISK_LOW_BYTES`), else None."""
    import shutil

    low = DISK_LOW_BYTES if low is None else low
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    free = shutil.disk_usage(path).free
    return free if free < low else None


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` is an OSError for a full disk (errno 28, ENOSPC)."""
    return isinstance(err, OSError) and err.errno == errno.ENOSPC


def disk_full_error(error: str) -> str:
    """A broken attempt's error (``"TID: what happened"``) with the full disk named first."""
    tid, sep, rest = error.partition(": ")
    return f"{tid}: {DISK_FULL}; {rest}" if sep else f"{DISK_FULL}; {error}"


def record_broken(ledger: str | Path, error: str, kind: str, log_text: str, results_root: str | Path,
                  gpu_slots: tuple = (None, None)) -> list[dict]:
    """Record a broken attempt (``error``, ``kind``: runner.JobFailed's) in ``ledger`` with the
    last error line of ``log_text`` (this attempt's lines of the job log), marking a full disk
    (the log says so, or the disk of ``results_root`` is low) or running out of GPU memory beside
    other jobs (``gpu_slots``: the job's and the run's), neither counted. Returns every attempt so far."""
    extra = {}
    if disk_full(log_text) or disk_low(results_root) is not None:
        error, kind, extra = disk_full_error(error), "disk_full", {"disk_full": True}
    elif out_of_memory(log_text):
        extra = {"out_of_memory": True, "gpu_slots": gpu_slots[0], "gpu_shared": gpu_shared(*gpu_slots)}
    return record(ledger, error, kind, last_error_line(log_text), **extra)


def not_counted(attempt: dict) -> str:
    """Why a broken attempt does not count towards max_attempts, for the job's FAILED line ('' if it does)."""
    if attempt.get("disk_full"):
        return "; the disk is full: not counted, free disk space and rerun"
    if ran_out_sharing([attempt]):
        return "; out of GPU memory beside other jobs: not counted, the retry takes the GPU alone"
    return ""


def infrastructure(attempt: dict) -> bool:
    """Whether an attempt failed for the machine, not the task: it ran out of GPU memory beside
    other jobs, or found the disk full."""
    return _out_beside_others(attempt) or bool(attempt.get("disk_full"))


def ran_out_sharing(attempts: list[dict]) -> bool:
    """Whether an attempt ran out of GPU memory while other jobs shared the GPU: not counted,
    and the retry runs with the GPU to itself (:func:`l1bench.plan.gpu_slots`)."""
    return any(map(_out_beside_others, attempts))


def counted(attempts: list[dict]) -> list[dict]:
    """The attempts that count towards giving up: all but infrastructure failures
    (:func:`infrastructure`)."""
    return [a for a in attempts if not infrastructure(a)]


def given_up(attempts: list[dict], max_attempts: int) -> bool:
    """Whether a job with these broken attempts gets a terminal result (0 = retry forever)."""
    return max_attempts > 0 and len(counted(attempts)) >= max_attempts


def in_run_retries(max_attempts: int) -> int | None:
    """How often Snakemake retries a build, check or time job within one run (the rules'
    ``retries``): ``max_attempts``, so a job that breaks every time gets its terminal result in
    the run that first tries it. None for ``max_attempts`` 0 (retry forever, across runs)."""
    return max_attempts if max_attempts > 0 else None


def terminal_status(attempts: list[dict]) -> Status:
    kinds = {STATUS_BY_KIND.get(a.get("kind"), DEFAULT_STATUS) for a in attempts}
    return Status.TIMEOUT if kinds == {Status.TIMEOUT} else DEFAULT_STATUS


def terminal_reason(attempts: list[dict]) -> str:
    """One line: how often and when it broke, and the last attempt's error."""
    last = attempts[-1]
    span = attempts[0]["when"] if len(attempts) == 1 else f"{attempts[0]['when']} .. {last['when']}"
    detail = f": {last['detail']}" if last.get("detail") else ""
    oom = sum(map(_out_beside_others, attempts))
    disk = sum(bool(a.get("disk_full")) and not _out_beside_others(a) for a in attempts)
    notes = ((oom, "out of GPU memory beside other jobs"), (disk, "disk full"))
    also = "".join(f", {n} more {why}" for n, why in notes if n)
    return f"broke in all {len(counted(attempts))} attempts{also} ({span}); last: {last['error']}{detail}"


#: Lines of a worker log that say where it broke (the worker's own report, a Python exception).
_ERROR_LINE = re.compile(r"(infrastructure failure|Error|error:|Exception|Killed|Timeout)")
_NOISE = re.compile(r"^(\d{4}-\d\d-\d\d[ T]|\$ |worker exit |\s*File \"|\s*\^+\s*$|Traceback )")


def last_error_line(log_text: str, limit: int = 300) -> str:
    """The last line of the latest attempt in a job log that names an error ('' if none)."""
    run = log_text.rsplit("\n$ ", 1)[-1]
    for line in reversed(run.splitlines()):
        line = line.strip()
        if line and not _NOISE.match(line) and _ERROR_LINE.search(line):
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


#: The job's line for a broken attempt (l1bench.job): "FAILED (no result written; ...): <error>".
_FAILED = re.compile(r"FAILED \(no result written[^)]*\): (.+)$")


def log_error(text: str) -> tuple[str, str]:
    """(the job's FAILED message, the worker's last error line) of a job log, '' where absent."""
    failed = [m.group(1) for m in map(_FAILED.search, text.splitlines()) if m]
    return (failed[-1].strip() if failed else ""), last_error_line(text)


# Snakemake's log: with show-failed-logs, the job log follows an error block between two rules of "=".
_FIELD = re.compile(r"^\s+(output|log): (.+)$")
_RULE = "=" * 20


def failed_jobs_in_snakemake_log(text: str) -> list[dict]:
    """Every ``Error in rule`` block of a Snakemake log, in order: {rule, output, log, log_text};
    ``log_text`` is the job log Snakemake prints after the block (``show-failed-logs``), ''
    when it did not (l1bench.preflight.failed_jobs)."""
    out, block, state = [], None, None
    for line in text.splitlines():
        if state in ("logfile", "logtext"):
            if line.startswith(_RULE):
                state = "logtext" if state == "logfile" else None
                block = block if state else None
            elif state == "logtext":
                block["log_text"] += line + "\n"
            continue
        if line.startswith("Error in rule "):
            block = {"rule": line[len("Error in rule ") :].rstrip(":"), "log_text": ""}
            out.append(block)
            continue
        if block is None:
            continue
        f = _FIELD.match(line)
        if f and f.group(1) not in block:
            block[f.group(1)] = f.group(2).split(",")[0].split(" (")[0].strip()
        elif line.startswith("Logfile ") and line.rstrip().endswith(":"):
            state = "logfile"
        elif not line.startswith((" ", "\t")):
            block = None
    return [b for b in out if "output" in b]
