"""The one line a successful run ends with: what was measured (the time results by status,
made in this run or kept from earlier ones), where the tables are, and what broke (how many
tasks, where their logs are, the command that retries them). l1bench.hooks prints it at
``onsuccess``; what a failed run ends with is :func:`l1bench.preflight.failure_hint`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from l1bench import failed
from l1bench.results import STAGES

#: Rules whose jobs make the results counted here: the stages'.
EVALUATION_RULES = tuple(s.rule for s in STAGES)


def made_results(planned) -> set[str]:
    """The result files of the build, check and time jobs in ``planned`` ([(rule, outputs)])."""
    return {out for rule, outputs in planned for out in outputs if rule in EVALUATION_RULES}


def by_status(paths) -> str:
    """``ok 12, incorrect 5, ...``: the statuses of ``paths``, most frequent first."""
    counts = Counter(failed.status(p) or "unreadable" for p in paths)
    return ", ".join(f"{status} {n}" for status, n in sorted(counts.items(), key=lambda x: (-x[1], x[0])))


def stage(path) -> str:
    """The stage of a result file results/<device>/<stage>/.../<TID>.json (build, check, time)."""
    parts = Path(path).parts
    return parts[max(i for i, part in enumerate(parts[:-1]) if part in failed.STAGES)]


def broken_tasks(paths) -> dict[str, tuple[str, str]]:
    """{task id: (its first stage that broke, that result's status)} among ``paths`` (result
    files), in task order."""
    first: dict[str, tuple[str, str]] = {}
    for path in sorted(paths, key=lambda p: failed.STAGES.index(stage(p))):
        status = failed.status(path)
        if status in failed.BROKEN_STATUSES:
            first.setdefault(Path(path).stem, (stage(path), status))
    return dict(sorted(first.items()))


def success_line(
    device: str, res: str, logs: str, selection, made, results_dir: str = "results", shown: int = 4
) -> str:
    """The line: ``selection`` are the run's build, check and time results (paths), ``made``
    those its jobs made (:func:`made_results`); the rest of the selection was kept."""
    selection = [p for p in selection if Path(p).exists()]
    times = [p for p in selection if stage(p) == "time"]
    new = sum(p in made for p in times)
    line = f"Done: {len(times)} time results ({new} made in this run, {len(times) - new} kept"
    line += f": {by_status(times)})" if times else ")"
    line += f"; tables in {res}/ (README.md, summary.md, per_task.md)"
    broken = broken_tasks(selection)
    if not broken:
        return line + "; nothing broke."
    named = ", ".join(f"{tid} {status}" for tid, (_, status) in list(broken.items())[:shown])
    more = f", {len(broken) - shown} more" if len(broken) > shown else ""
    stages = {stage for stage, _ in broken.values()}
    where = f"{logs}/{stages.pop()}_task/" if len(stages) == 1 else f"{logs}/"
    return (
        f"{line}; {len(broken)} task{'s' * (len(broken) != 1)} broke ({named}{more}; logs in {where}), "
        f"retry: {failed.retry_command(device, results_dir)}"
    )
