"""The worker's results and exit codes: the one place a build, check or time result is made.

:func:`result` (fields defined by :class:`l1bench.results.TaskResult`), the negative earlier
stage carried forward (:func:`upstream_status`), exceptions of snippet code turned into a status
(:func:`guarded`), and the constants the parent (``pool/runner.py``, ``scripts/run_task.py``) shares.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from l1bench.results import UPSTREAM, NoWorker, TaskResult, no_worker_needed
from l1bench.snippet import InfraError, SnippetError, classify_exception, short

EXIT_INFRA = 3
NO_CODE_REASON = "the release carries no custom code for this task"


@contextlib.contextmanager
def guarded(during: str, default_status: str):
    """Turn exceptions from snippet code into SnippetError / InfraError."""
    try:
        yield
    except (SnippetError, InfraError):
        raise
    except Exception as err:
        raise classify_exception(err, default_status, during) from err


def result(job: dict, status: str, reason: str = "", **extra) -> dict:
    """The result dict of ``job``: its fields are defined by :class:`l1bench.results.TaskResult`
    (``reason`` shortened to one line)."""
    return TaskResult.for_job(job, status, short(reason) if reason else "", **extra).to_dict()


def upstream_status(job: dict) -> dict | None:
    """If the earlier stage's result (build for a check, check for a time job) is negative,
    carry it forward (:func:`l1bench.results.no_worker_needed`, ``UPSTREAM``)."""
    if job["kind"] not in UPSTREAM:
        return None
    stage, _ = UPSTREAM[job["kind"]]
    key = f"{stage}_result"
    path = job.get(key)
    if not path:
        return None
    prev = json.loads(Path(path).read_text())
    if no_worker_needed(job["kind"], upstream_status=prev["status"]) is not NoWorker.UPSTREAM:
        return None
    label = prev.get("kind", key)
    return result(job, prev["status"], f"{label}: {prev.get('reason', '')}".rstrip(": "))
