"""One task and mode through CUDA-L1's published ``eval/eval_cuda.py``, unmodified, in this process.

Run by :mod:`run` as ``python child.py JOB.json`` in a process of its own. The harness file is
imported as it is; what it does is recorded from the outside, by wrapping functions it calls
(each wrapper returns exactly what the wrapped function returns, and raises what it raises):

* ``torch.utils.cpp_extension.load_inline`` / ``load``: every call, its extension name, build
  folder, flags, whether it returned or raised and the compiler's first error line;
* the module's ``execute_model_with_timeout``, ``validate_no_lazy_evaluation`` and
  ``check_kernel_correctness``: each step's outcome;
* the module's ``eval_kernel_against_ref``: each outer trial's score and elapsed time;
* ``torch.cuda.Event.elapsed_time`` when called from ``eval_kernel_against_ref``, and the
  module's ``random.choice`` (a proxy delegating to the same global generator): each timed
  call's milliseconds and which model ran first, so the reference's and the custom model's
  times of every pair are known.

Every record is appended to the job's events file (JSON lines, flushed at once), so a child
that dies part-way leaves what it saw. Uses only the standard library and torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import threading
import time
import traceback

_LOCK = threading.Lock()
_EVENTS = None


def emit(kind: str, **fields) -> None:
    """Append one event (a JSON line) to the events file and flush it."""
    line = json.dumps({"event": kind, "t": round(time.time(), 3), **fields}, default=repr)
    with _LOCK:
        _EVENTS.write(line + "\n")
        _EVENTS.flush()


def first_error_line(text: str, limit: int = 300) -> str:
    """The compiler's first ``error`` line of a failed build, else the text's first line."""
    text = str(text)
    for line in text.splitlines():
        if re.search(r"\berror\b", line, re.IGNORECASE) and "Error building extension" not in line:
            return " ".join(line.split())[:limit]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " ".join((lines[0] if lines else "").split())[:limit]


def load_harness(path: str):
    """The harness file imported as module ``eval_cuda`` (no change to its text)."""
    spec = importlib.util.spec_from_file_location("eval_cuda", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["eval_cuda"] = mod
    spec.loader.exec_module(mod)
    return mod


def wrap_extension_builds(cpp_extension) -> None:
    """Record every ``load_inline``/``load`` call (name, build folder, flags, outcome)."""
    for fname in ("load_inline", "load"):
        real = getattr(cpp_extension, fname)

        def call(*args, _real=real, _fname=fname, **kwargs):
            name = kwargs.get("name", args[0] if args else "?")
            info = {
                "fn": _fname,
                "name": str(name),
                "build_directory": kwargs.get("build_directory"),
                "extensions_dir": os.environ.get("TORCH_EXTENSIONS_DIR"),
                "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"),
                "flags": {k: kwargs.get(k) for k in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                                                      "extra_include_paths", "functions", "with_cuda")
                          if k in kwargs},
            }
            t0 = time.time()
            try:
                out = _real(*args, **kwargs)
            except BaseException as err:
                emit("extension", ok=False, seconds=round(time.time() - t0, 3), error=first_error_line(err),
                     exception=type(err).__name__, **info)
                raise
            emit("extension", ok=True, seconds=round(time.time() - t0, 3), **info)
            return out

        call.__wrapped__ = real
        setattr(cpp_extension, fname, call)


class RecordingRandom:
    """Stands in for the harness module's ``random``: every attribute is the real module's;
    ``choice`` calls the real ``random.choice`` (same global generator, same draws) and, when
    the caller is ``eval_kernel_against_ref``, records the draw (reference first or not)."""

    def __init__(self, real, code, sink: list):
        self._real, self._code, self._sink = real, code, sink

    def __getattr__(self, name):
        return getattr(self._real, name)

    def choice(self, seq):
        value = self._real.choice(seq)
        if sys._getframe(1).f_code is self._code:
            self._sink.append(value)
        return value


def install_recorders(harness, torch) -> None:
    """Wrap, from the outside, the functions of the harness whose outcomes are recorded."""
    from torch.utils import cpp_extension

    wrap_extension_builds(cpp_extension)
    trial_code = harness.eval_kernel_against_ref.__code__
    choices: list = []
    elapsed: list = []
    harness.random = RecordingRandom(harness.random, trial_code, choices)

    real_elapsed = torch.cuda.Event.elapsed_time

    def elapsed_time(self, end_event):
        ms = real_elapsed(self, end_event)
        if sys._getframe(1).f_code is trial_code:
            elapsed.append(ms)
        return ms

    elapsed_time.__wrapped__ = real_elapsed
    torch.cuda.Event.elapsed_time = elapsed_time

    real_trial = harness.eval_kernel_against_ref
    counter = {"n": 0}

    def eval_kernel_against_ref(*args, **kwargs):
        choices.clear()
        elapsed.clear()
        index = counter["n"]
        counter["n"] += 1
        t0 = time.time()
        try:
            score, total, message = real_trial(*args, **kwargs)
        except BaseException as err:
            emit("trial", index=index, seed=kwargs.get("seed_num"), raised=short(err),
                 wall_s=round(time.time() - t0, 3))
            raise
        ref_ms, custom_ms = split_pairs(choices, elapsed)
        emit("trial", index=index, seed=kwargs.get("seed_num"), score=score, total_elapsed_s=total, message=message,
             ref_ms=ref_ms, custom_ms=custom_ms, ref_first=list(choices[: len(ref_ms)]),
             wall_s=round(time.time() - t0, 3))
        return score, total, message

    harness.eval_kernel_against_ref = eval_kernel_against_ref

    real_exec = harness.execute_model_with_timeout

    def execute_model_with_timeout(*args, **kwargs):
        caller = sys._getframe(1).f_code.co_name
        out = real_exec(*args, **kwargs)
        ok, error, seconds = out
        emit("execute", caller=caller, ok=ok, error=error, seconds=seconds)
        return out

    harness.execute_model_with_timeout = execute_model_with_timeout

    real_lazy = harness.validate_no_lazy_evaluation

    def validate_no_lazy_evaluation(*args, **kwargs):
        out = real_lazy(*args, **kwargs)
        emit("lazy", ok=out[0], error=out[1])
        return out

    harness.validate_no_lazy_evaluation = validate_no_lazy_evaluation

    real_correct = harness.check_kernel_correctness

    def check_kernel_correctness(*args, **kwargs):
        out = real_correct(*args, **kwargs)
        emit("correctness", ok=out[0], error=out[1], metadata=out[2])
        return out

    harness.check_kernel_correctness = check_kernel_correctness


def split_pairs(choices: list, elapsed: list) -> tuple[list, list]:
    """Per timed pair (reference first or not, two elapsed times in call order): the
    reference's and the custom model's milliseconds."""
    ref_ms, custom_ms = [], []
    for i, ref_first in enumerate(choices):
        if 2 * i + 1 >= len(elapsed):
            break
        first, second = elapsed[2 * i], elapsed[2 * i + 1]
        ref_ms.append(first if ref_first else second)
        custom_ms.append(second if ref_first else first)
    return ref_ms, custom_ms


def short(err, limit: int = 300) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:limit]


def environment(torch) -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "host": os.uname().nodename,
           "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
           "cpu_count": os.cpu_count()}
    try:
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except Exception as err:  # noqa: BLE001 - a broken CUDA context: say so, keep the record
        env["gpu_error"] = short(err)
    return env


def build_only(job: dict) -> int:
    """Run the custom code once, as the harness's first step does (its inline extensions built into
    ``TORCH_EXTENSIONS_DIR``), and record the builds; nothing is timed."""
    import torch.utils.cpp_extension

    wrap_extension_builds(torch.utils.cpp_extension)
    try:
        exec(compile(job["custom_src"], "custom", "exec"), {})
        emit("built", ok=True)
    except BaseException as err:  # noqa: BLE001 - recorded; the harness meets it again
        emit("built", ok=False, error=short(err))
    return 0


def main(argv: list[str]) -> int:
    global _EVENTS
    job = json.loads(open(argv[1], encoding="utf-8").read())
    _EVENTS = open(job["events_path"], "a", encoding="utf-8")
    if job.get("build_only"):
        return build_only(job)
    if job.get("cpus"):
        os.sched_setaffinity(0, job["cpus"])
    emit("start", pid=os.getpid(), tid=job["tid"], mode=job["mode"], setup=job["setup"])
    harness = load_harness(job["harness"])
    import torch

    install_recorders(harness, torch)
    emit("imported", harness=job["harness"])
    try:
        out = harness.eval_pipeline(
            warmup_src=job["warmup_src"],
            original_model_src=job["original_src"],
            custom_model_src=job["custom_src"],
            num_correct_trials=job["num_correct_trials"],
            num_perf_trials=job["num_perf_trials"],
            global_n_trials=job["global_n_trials"],
            gpu_index=job["gpu_index"],
            verbose=False,
            log_path=job["log_path"],
            max_time=1800,
            original_eval_setup=job["setup"],
        )
    except BaseException as err:  # noqa: BLE001 - the harness raised: its exception is the record
        emit("raised", error=short(err), traceback=traceback.format_exc()[-4000:])
        emit("end", environment=environment(torch))
        return 0
    emit("returned", value=out)
    emit("end", environment=environment(torch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
