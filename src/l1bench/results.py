"""What a result is: its statuses (:class:`Status`), the stages that make results
(:class:`Stage`, :data:`STAGES`), flags (:class:`Flag`), the agreement threshold
(:data:`AGREEMENT`), its fields (:class:`TaskResult`, the JSON a build, check or time job writes),
which jobs need no worker (:func:`no_worker_needed`) and the results tree a tool reads (:func:`results_tree`).

``Status`` and ``Flag`` are ``str`` enums: a member equals, hashes and formats as its value, so
results compare with plain strings from JSON or pandas.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


class _StrEnum(str, Enum):
    """A ``str`` enum whose members are their values wherever text is made of them (``str``,
    f-strings, ``%s``) and in sets and dicts (hash); ``enum.StrEnum`` is Python 3.11+."""

    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__


class Status(_StrEnum):
    """Every status a build, check or time result can have (its ``status`` field)."""

    #: build: the custom code's extensions built (or there was nothing to build); time: scored.
    OK = "ok"
    #: check: loads, is not lazy and matches the reference in every correctness trial.
    PASS = "pass"
    #: The release has no custom code for the task (l1bench.worker.NO_CODE_REASON).
    NO_CODE = "no_code"
    #: An extension or the custom code does not compile (l1bench.snippet.classify_exception).
    COMPILE_ERROR = "compile_error"
    #: Loading (executing) the custom code raised.
    LOAD_ERROR = "load_error"
    #: The custom code defines no ``ModelNew`` class.
    MISSING_MODEL_NEW = "missing_model_new"
    #: The custom output is not a plain tensor on the device with real storage (worker.lazy_problems).
    LAZY = "lazy"
    #: The custom output differs from the reference (or, for cuda_graph/cudnn, the mode's baseline).
    INCORRECT = "incorrect"
    #: Constructing or calling ModelNew raised.
    RUNTIME_ERROR = "runtime_error"
    #: The mode's baseline (or the reference compiled for a compile mode) failed to load, build or run.
    BASELINE_ERROR = "baseline_error"
    #: The release has no baseline code for the mode (cuda_graph, cudnn).
    NO_BASELINE = "no_baseline"
    #: The mode cannot run on this backend (cuda_graph/cudnn baselines on the CPU demo).
    UNSUPPORTED = "unsupported"
    #: The worker broke in every attempt (l1bench.attempts: crash, CUDA fault, out of memory).
    CRASHED = "crashed"
    #: Every attempt ran past its time limit (l1bench.attempts).
    TIMEOUT = "timeout"


#: Statuses meaning "ran and failed" (the custom code or the baseline, or broke in every attempt).
FAILED_STATUSES = frozenset(
    {
        Status.COMPILE_ERROR,
        Status.LOAD_ERROR,
        Status.MISSING_MODEL_NEW,
        Status.LAZY,
        Status.INCORRECT,
        Status.RUNTIME_ERROR,
        Status.BASELINE_ERROR,
        Status.CRASHED,
        Status.TIMEOUT,
    }
)
#: Statuses meaning "not attempted, by design".
NOT_RUN_STATUSES = frozenset({Status.NO_CODE, Status.NO_BASELINE, Status.UNSUPPORTED})
#: Statuses l1bench.attempts gives a job that broke ``max_attempts`` times.
BROKEN_STATUSES = frozenset({Status.CRASHED, Status.TIMEOUT})


@dataclass(frozen=True)
class Stage:
    """A stage whose jobs make a task's results (``<results>/<kind>/``), by the rule
    ``<kind>_task``: one record each in :data:`STAGES`, from which every list of stages, rules
    and earlier stages derives."""

    kind: str
    #: the earlier stage whose result a job reads, and that result's good status; a job whose
    #: earlier result has another status carries it forward (:func:`no_worker_needed`)
    upstream: str | None = None
    passed: Status | None = None
    #: whether its jobs run on the GPU (the GPU guard's; how the failure hint says they broke)
    gpu: bool = False

    @property
    def rule(self) -> str:
        return f"{self.kind}_task"


#: The stages, in the order a task goes through them.
STAGES = (
    Stage("build"),
    Stage("check", upstream="build", passed=Status.OK, gpu=True),
    Stage("time", upstream="check", passed=Status.PASS, gpu=True),
)
STAGE = {s.kind: s for s in STAGES}
#: The earlier stage a check or time job depends on, and that stage's good status.
UPSTREAM = {s.kind: (s.upstream, s.passed) for s in STAGES if s.upstream}


class Flag(_StrEnum):
    """Every flag name ("review this result", not a verdict): ``{"flag": NAME, "reason": ...}`` in
    a result's ``flags``; in the tables, ``;``-separated in the ``flags`` column."""

    #: Output is not a plain tensor (subclass), is on the wrong device or has no storage (detectors).
    LAZY = "LAZY"
    #: An output shares memory with an input (the model returned or overwrote its input).
    ALIAS_INPUT = "ALIAS_INPUT"
    #: Two calls on distinct inputs return outputs in the same memory (persistent buffer).
    SAME_STORAGE = "SAME_STORAGE"
    #: The model changed the contents of its inputs.
    INPUT_MUTATION = "INPUT_MUTATION"
    #: Correct at first, later returns the result for earlier inputs (cached on identity/address).
    CACHED_OUTPUT = "CACHED_OUTPUT"
    #: The custom output disagrees with the reference (and is not a stale earlier result).
    OUTPUT_MISMATCH = "OUTPUT_MISMATCH"
    #: Work continues after the call returns (new Python threads, output changes later).
    BACKGROUND_WORK = "BACKGROUND_WORK"
    #: Global torch backend settings changed by constructing or calling the custom model.
    GLOBAL_STATE = "GLOBAL_STATE"
    #: Custom output much less accurate (vs. a float64 reference) than the float32 reference.
    PRECISION_DOWNGRADE = "PRECISION_DOWNGRADE"
    #: Custom output dtype differs from the reference output dtype.
    DTYPE_CHANGED = "DTYPE_CHANGED"
    #: Reference output is constant or ignores its inputs: speedups on this task mean nothing.
    DEGENERATE_TASK = "DEGENERATE_TASK"
    #: Speedup above the configured ceiling: review by hand (aggregate.add_ceiling_flags).
    SPEEDUP_CEILING = "SPEEDUP_CEILING"
    #: The custom model raised while being checked (construction or a call).
    DETECTOR_ERROR = "DETECTOR_ERROR"
    #: (strict timing) host-synchronised time far above the current-stream event time.
    EVENT_SYNC_MISMATCH = "EVENT_SYNC_MISMATCH"
    #: (strict timing) speedup depends on data left in L2 between calls.
    L2_RESIDENT = "L2_RESIDENT"
    #: (strict timing, ``verify_outputs``) a timed call's output differs from the reference's: ``incorrect``.
    TIMED_OUTPUT_MISMATCH = "TIMED_OUTPUT_MISMATCH"
    #: The custom code's own C++/CUDA extension does not compile; it ran on its fallback.
    EXTENSION_BUILD_FAILED = "EXTENSION_BUILD_FAILED"
    #: (tables only) the custom code times itself and may pick its code path from it (l1bench.codescan).
    SELF_TIMED = "SELF_TIMED"
    #: (tables only, paper default mode) the score moved by more than 15 % in two or more pairs of
    #: repeated runs on one GPU model (config/curation/<device>/run_spread.json).
    RUN_SPREAD = "RUN_SPREAD"
    #: (paper protocol, tables only) timed calls stalled by the host change the score (l1bench.timing.stalls).
    TIMING_OUTLIER = "TIMING_OUTLIER"
    #: (paper protocol, tables only) a side's timed calls are host-bound: its median launch is most
    #: of its median timed call (l1bench.timing.hostclock.host_bound_sides).
    HOST_BOUND = "HOST_BOUND"


#: |measured/published − 1| within this counts as agreeing with the published score.
AGREEMENT = 0.15


@dataclass
class TaskResult:
    """One build, check or time result: the fields every result has, and the rest in ``extra``.

    Always: ``kind`` (build/check/time), ``tid`` (``L1_T001``), ``status`` and ``reason`` (one
    line, '' when there is nothing to say). ``mode`` and ``protocol``: time jobs (absent from the
    dict when unset). A time result always has ``score``, ``score_std`` and ``n_timings`` (None,
    None, 0 when unscored); check and time results always have ``flags``
    (``[{"flag": Flag, "reason": str}]``). ``extra`` holds every other field, in the order
    written: the worker's measurements (l1bench.worker) and l1bench.job's bookkeeping.
    """

    kind: str
    tid: str
    status: Status
    reason: str = ""
    mode: str | None = None
    protocol: str | None = None
    score: float | None = None
    score_std: float | None = None
    n_timings: int = 0
    flags: list = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    @classmethod
    def for_job(cls, job: dict, status: str, reason: str = "", **extra) -> TaskResult:
        """The result of ``job`` (its kind, tid, and mode and protocol when set); known fields in
        ``extra`` (score, flags, ...) fill their attributes, the others go to :attr:`extra`."""
        kind = job["kind"]
        known = {k: extra.pop(k) for k in list(extra) if k in cls.typed_fields(kind)}
        for key in ("mode", "protocol"):
            if job.get(key) and key not in known:
                known[key] = job[key]
        return cls(kind, job["tid"], Status(status), reason, extra=extra, **known)

    @staticmethod
    def typed_fields(kind: str) -> tuple[str, ...]:
        """The optional fields a result of ``kind`` holds as attributes (the rest: ``extra``)."""
        if kind == "time":
            return ("mode", "protocol", "score", "score_std", "n_timings", "flags")
        return ("mode", "protocol", "flags") if kind == "check" else ("mode", "protocol")

    def to_dict(self) -> dict:
        """The dict a job writes (its status a plain string; JSON holds every enum as its value)."""
        out: dict[str, Any] = {"kind": self.kind, "tid": self.tid, "status": self.status.value, "reason": self.reason}
        for key in ("mode", "protocol"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.kind == "time":  # every time result has the same keys, scored or not
            out.update(score=self.score, score_std=self.score_std, n_timings=self.n_timings)
        if self.kind in ("check", "time"):
            out["flags"] = self.flags
        out.update(self.extra)
        return out


def stage_result(status: str, reason: str = "", **fields) -> dict:
    """What a build, check or time stage found, as plain data: ``status`` (one of :class:`Status`),
    ``reason`` and the stage's fields. It names no job: the job stamps it where it entered
    (:func:`l1bench.job.stamped`, :meth:`TaskResult.for_job`), so no layer below needs the job."""
    return {"status": Status(status).value, "reason": reason, **fields}


# --------------------------------------------------------------------------- what needs a worker


#: What in custom code marks it as compiling a C++/CUDA extension (torch.utils.cpp_extension).
EXTENSION_MARKERS = ("cpp_extension", "load_inline")


def builds_extensions(source: str) -> bool:
    """Whether custom code can compile a C++/CUDA extension (torch.utils.cpp_extension): the
    ``builds_extensions`` fact of :func:`no_worker_needed`, and the workflow's build slots
    (``plan.extension_build_tids``)."""
    return any(m in source for m in EXTENSION_MARKERS)


class NoWorker(_StrEnum):
    """Why a job's result is decided without starting a worker (:func:`no_worker_needed`)."""

    #: The task has no custom code: a ``no_code`` result.
    NO_CODE = "no_code"
    #: A build whose custom code compiles no extension: ``ok``, nothing to build.
    NOTHING_TO_BUILD = "nothing_to_build"
    #: The earlier stage (build for a check, check for a time job) is negative: carried forward.
    UPSTREAM = "upstream"
    #: The job broke ``max_attempts`` times (l1bench.attempts): ``crashed`` or ``timeout``.
    GAVE_UP = "gave_up"


Fact = Callable[[], Any]


def _fact(value):
    return value() if callable(value) else value


def no_worker_needed(
    kind: str,
    has_code: bool | Fact = True,
    upstream_status: str | None | Fact = None,
    builds_extensions: bool | None | Fact = None,
    given_up: bool | Fact = False,
) -> NoWorker | None:
    """Why the ``kind`` job's result needs no worker, or None when it needs one.

    In this order: the task has no custom code (``has_code`` false); a build whose custom
    code compiles no extension (``builds_extensions`` False; None: not known, so not decided);
    a check or time job whose earlier stage has a negative ``upstream_status`` (None: no
    result yet, so not decided); a job that broke too often (``given_up``). Each fact may be
    given as a function of no arguments: it is called only when the decision needs it (a
    caller reads files only for what decides).

    The one decision behind the worker (``run``, :func:`carried_forward`), l1bench.job
    (the results it writes without starting the worker) and the workflow's GPU guard
    (l1bench.preflight.decided_without_gpu, called from l1bench.hooks).
    """
    if not _fact(has_code):
        return NoWorker.NO_CODE
    if kind == "build" and _fact(builds_extensions) is False:
        return NoWorker.NOTHING_TO_BUILD
    if kind in UPSTREAM:
        status = _fact(upstream_status)
        if status is not None and status != UPSTREAM[kind][1]:
            return NoWorker.UPSTREAM
    if _fact(given_up):
        return NoWorker.GAVE_UP
    return None


#: The reason of a result whose task has no custom code.
NO_CODE_REASON = "the release carries no custom code for this task"


def carried_forward(job: Mapping) -> dict | None:
    """When the earlier stage's result of a check or time job (its build, its check: the file
    ``job["<stage>_result"]``) is negative, that status carried forward (:func:`no_worker_needed`,
    ``UPSTREAM``) as :func:`stage_result`; else None."""
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
    return stage_result(prev["status"], f"{label}: {prev.get('reason', '')}".rstrip(": "))


def timing_version(result: Mapping) -> int | None:
    """The timing version (:data:`l1bench.timing.TIMING_VERSION`) a check or time result was made
    with: its ``timing_version``, or ``timing_design`` in results written before that field (the
    same numbers); None where it records neither."""
    value = result.get("timing_version", result.get("timing_design"))
    return None if value is None else int(value)


def results_tree(path: str) -> Path:
    """The ``results/<device>`` folder a tool is pointed at (its argparse type): a path that is no
    folder is an error, not a tree in which nothing was found."""
    if not Path(path).is_dir():
        import argparse

        raise argparse.ArgumentTypeError(f"{path}: no such results tree (a folder such as results/h100)")
    return Path(path)
