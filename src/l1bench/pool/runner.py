"""Parent side of a worker run: start the child, enforce the timeout, collect the result.

Runs inside a Snakemake job. Snippet code never executes here: it runs in the
child started by :func:`run_worker`, in its own process group, killed whole on
timeout, when this process dies (``l1bench.lifeline``'s guard leads the group) and when the
Snakemake process that started the job is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from l1bench import lifeline
from l1bench.gpu.gpulock import STATUS_ENV, held_seconds, waited_seconds
from l1bench.worker import EXIT_INFRA


class JobFailed(RuntimeError):
    """The run broke (timeout, crash, CUDA fault): no result; Snakemake retries the job.

    ``kind`` says how: ``timeout``, ``section_timeout``, ``infra`` (the worker reported a CUDA
    fault or out of memory), ``crash`` (any other exit without a result).
    """

    def __init__(self, message: str, kind: str = "crash"):
        super().__init__(message)
        self.kind = kind


class JobStopped(RuntimeError):
    """The job was stopped from outside (its Snakemake process is gone): no result, and not an
    attempt of the task (nothing about the task broke)."""


class WorkflowGone(subprocess.TimeoutExpired):
    """The Snakemake process that started this job no longer runs."""


def worker_env(extra: dict | None = None) -> dict:
    """The worker's environment: this process's (the installed l1bench package is found as it is
    here), unbuffered, with ``extra`` on top."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({k: str(v) for k, v in (extra or {}).items() if v is not None})
    return env


class SectionTimeout(subprocess.TimeoutExpired):
    """The child held the device lock longer than one GPU section may take."""


def scratch_prefix() -> str:
    """A job script's scratch folder in the temp folder: ``l1bench-<pid>-…``, so that one left by
    a killed job script (its process gone) is told from one in use."""
    return f"l1bench-{os.getpid()}-"


#: This process's scratch folders in use (:func:`scratch_folder`), removed by a stop signal.
_SCRATCH: set[str] = set()


@contextmanager
def scratch_folder() -> Iterator[str]:
    """A job script's scratch folder (:func:`scratch_prefix`), removed when the block ends, or
    when a stop signal ends the job script (:func:`remove_scratch_on_stop`)."""
    with tempfile.TemporaryDirectory(prefix=scratch_prefix()) as tmp:
        _SCRATCH.add(tmp)
        try:
            yield tmp
        finally:
            _SCRATCH.discard(tmp)


def remove_scratch_on_stop(signals=(signal.SIGTERM, signal.SIGHUP)) -> None:
    """Make a stop signal (a cluster's cancel or requeue, a terminal closing) remove this job
    script's scratch folders before it ends the process by that signal, as it would have without
    the handler: no result, the worker ended by its guard. Signals with a handler already are
    left as they are. Call from the main thread."""

    def handler(signum, frame):
        for path in list(_SCRATCH):
            shutil.rmtree(path, ignore_errors=True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in signals:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, handler)


def run_worker(
    job: dict, timeout: float, log_path, env: dict | None = None, section_timeout: float | None = None
) -> dict:
    """Run one job in a child process and return what its stage found (plain data: the job stamps
    it, :func:`l1bench.job.stamped`).

    Raises :class:`JobFailed` on timeout (time waiting for the device lock does not count), on
    holding the lock longer than ``section_timeout`` at a stretch, on a crash and on an
    infrastructure failure reported by the worker; :class:`JobStopped` once the workflow that
    started this job is gone. If this process dies, the child dies with it.
    """
    with scratch_folder() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        lock_status = Path(tmp) / "lock-status.json"
        # Snippets may write build folders relative to the working directory: give them
        # a scratch folder (the task's extension folder), never the repository.
        scratch = Path(job.get("ext_dir") or tmp).resolve()
        scratch.mkdir(parents=True, exist_ok=True)
        job = absolute_paths(job)
        job_path.write_text(json.dumps(job))
        env = dict(env or {}) | {STATUS_ENV: str(lock_status)}
        cmd = [sys.executable, "-m", "l1bench.worker", str(job_path), str(out_path)]
        t0 = time.monotonic()
        with open(log_path, "a") as log:
            log.write(f"$ {' '.join(cmd)}  (timeout {timeout:.0f} s)\n")
            log.flush()
            proc = subprocess.Popen(
                lifeline.guarded(cmd),
                cwd=scratch,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=worker_env(env),
                start_new_session=True,
            )
            try:
                rc = _wait(
                    proc, timeout, lock_status, t0, section_timeout=section_timeout, workflow=lifeline.workflow_token()
                )
            except subprocess.TimeoutExpired as err:  # WorkflowGone, SectionTimeout or the timeout
                _kill_group(proc)
                if isinstance(err, WorkflowGone):
                    log.write(
                        "stopped: the Snakemake process that started this job is gone (no result, not an attempt)\n"
                    )
                raise job_error(job["tid"], type(err), timeout, section_timeout, device_word(job)) from None
            finally:
                _kill_group(proc)  # leave no stray grandchildren (compile workers, threads)
            log.write(f"worker exit {rc} after {time.monotonic() - t0:.1f} s\n")
        if rc == EXIT_INFRA:
            raise JobFailed(f"{job['tid']}: infrastructure failure (CUDA fault or out of memory), see log", "infra")
        if rc != 0:
            raise JobFailed(f"{job['tid']}: worker crashed ({exit_text(rc)}), see log")
        if not out_path.exists():
            raise JobFailed(f"{job['tid']}: worker exited 0 without a result")
        return json.loads(out_path.read_text())


PATH_KEYS = ("task_dir", "ext_dir", "build_result", "check_result", "lock_dir")


def exit_text(rc: int) -> str:
    """A worker's return code as a crash names it: ``signal SIGKILL`` for -9 (Popen's way of
    saying a signal ended it), else ``exit code N``. Shared with the task worker's job side."""
    return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"


def absolute_paths(job: dict) -> dict:
    """The job with its file paths made absolute (the child runs in another directory)."""
    return job | {k: str(Path(job[k]).resolve()) for k in PATH_KEYS if job.get(k)}


def overdue(lock_status, t0: float, timeout: float, section_timeout=None, workflow: str | None = None):
    """Why a running worker must be stopped now, as the exception class to raise:
    :class:`WorkflowGone`, :class:`SectionTimeout` or ``subprocess.TimeoutExpired`` (busy longer
    than ``timeout`` since ``t0``, not counting lock waits); None while it may go on."""
    if not lifeline.alive(workflow):
        return WorkflowGone
    if section_timeout and held_seconds(lock_status) > section_timeout:
        return SectionTimeout
    if time.monotonic() - t0 - waited_seconds(lock_status) > timeout:
        return subprocess.TimeoutExpired
    return None


def device_word(job: dict) -> str:
    """The device a job's messages name: the CPU for the demo's backend, else its GPU."""
    return "CPU" if job.get("backend") == "cpu" else "GPU"


def job_error(tid: str, why, timeout: float, section_timeout=None, device="GPU") -> JobStopped | JobFailed:
    """The exception that ends a job stopped for ``why`` (an :func:`overdue` class); ``device``:
    :func:`device_word` of the job, whose lock it held."""
    if why is WorkflowGone:
        return JobStopped(f"{tid}: stopped, the workflow that started it is gone")
    if why is SectionTimeout:
        return JobFailed(f"{tid}: held the {device} lock for more than {section_timeout:.0f} s", "section_timeout")
    return JobFailed(f"{tid}: timed out after {timeout:.0f} s (not counting lock waits)", "timeout")


def _wait(
    proc: subprocess.Popen,
    timeout: float,
    lock_status: Path,
    t0: float,
    poll: float = 0.5,
    section_timeout=None,
    workflow: str | None = None,
) -> int:
    """Wait for the child; raises what :func:`overdue` names."""
    while True:
        try:
            return proc.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            why = overdue(lock_status, t0, timeout, section_timeout, workflow)
            if why is not None:
                raise why(proc.args, section_timeout if why is SectionTimeout else timeout) from None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
