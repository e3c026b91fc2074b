"""Progress of a long run, with an estimate of the time left from its finished jobs' durations.

:class:`Progress` is a logging handler on Snakemake's logger, added at ``onstart``. At most once
every ``every_s`` seconds, after a job finishes, it prints one line::

    progress: 412 of 1,293 jobs done in 9 min; about 18 min left (from the finished jobs: check 14 s, time 9 s each)

The estimate: the remaining jobs of each rule at that rule's mean duration so far, divided by
how many jobs the run has been running at once.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter, defaultdict

#: Snakemake's logger, which its scheduler logs job events to (snakemake.logging).
SNAKEMAKE_LOGGER = "snakemake.logging"


def minutes(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2 h 05 min``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def time_left(remaining: Counter, durations: dict[str, list[float]], elapsed: float) -> float | None:
    """Seconds left for ``remaining`` ({rule: jobs not finished}) from the finished jobs'
    ``durations`` ({rule: [seconds]}) after ``elapsed`` seconds; None before any job finished."""
    done = [d for ds in durations.values() for d in ds]
    if not done or elapsed <= 0:
        return None
    overall = sum(done) / len(done)
    work = sum(
        n * (sum(durations[r]) / len(durations[r]) if durations.get(r) else overall) for r, n in remaining.items()
    )
    in_flight = max(sum(done) / elapsed, 1.0)  # jobs running at once, on average
    return work / in_flight


class Progress(logging.Handler):
    """Prints the progress line (module docstring); ``rules``: {Snakemake job id: rule name} of
    the jobs the run executes."""

    def __init__(self, rules: dict[int, str], every_s: float = 60.0, stream=None, clock=time.monotonic):
        super().__init__(level=logging.INFO)
        self.rules, self.every_s, self.clock = dict(rules), every_s, clock
        self.stream = stream
        self.t0 = self.last = clock()
        self.started: dict[int, float] = {}
        self.durations: dict[str, list[float]] = defaultdict(list)
        self.finished: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        event = str(getattr(record, "event", ""))
        now = self.clock()
        if event == "job_started":
            for job in getattr(record, "jobs", []):
                self.started[job] = now  # a retry starts its clock again
        elif event == "job_finished":
            job = getattr(record, "job_id", None)
            if job in self.rules and job in self.started and job not in self.finished:
                self.finished.add(job)
                self.durations[self.rules[job]].append(now - self.started[job])
        elif event == "progress" and now - self.last >= self.every_s and len(self.finished) < len(self.rules):
            self.last = now
            print(self.line(now), file=self.stream or sys.stderr, flush=True)

    def line(self, now: float) -> str:
        remaining = Counter(rule for job, rule in self.rules.items() if job not in self.finished)
        elapsed = now - self.t0
        left = time_left(remaining, self.durations, elapsed)
        done, total = len(self.finished), len(self.rules)
        text = f"progress: {done:,} of {total:,} jobs done in {minutes(elapsed)}"
        if left is None:
            return text
        means = ", ".join(
            f"{rule.removesuffix('_task')} {minutes(sum(ds) / len(ds))}" for rule, ds in sorted(self.durations.items())
        )
        return f"{text}; about {minutes(left)} left (from the finished jobs: {means} each)"


def start(planned_jobs, every_s: float = 60.0) -> Progress:
    """Attach a :class:`Progress` for ``planned_jobs`` ([(job id, rule name)]) to Snakemake's logger."""
    handler = Progress(dict(planned_jobs), every_s)
    logging.getLogger(SNAKEMAKE_LOGGER).addHandler(handler)
    return handler


def stop(handler: Progress | None) -> None:
    """Detach it (before the run's last line)."""
    if handler is not None:
        logging.getLogger(SNAKEMAKE_LOGGER).removeHandler(handler)
