"""The worker child process on the CPU backend: both protocols, detectors, failure modes."""

import contextlib
import json
import os
import random
import shutil
import sys
import time

import pytest

from l1bench.job import stamped
from l1bench.pool.runner import JobFailed, run_worker
from l1bench.results import stage_result
from l1bench.timing import TIMING_VERSION, harness
from l1bench.worker import torch_hooks

PAPER = {
    "seed": 42,
    "correctness_trials": 3,
    "atol": 0.01,
    "rtol": 0.01,
    "warmup": 1,
    "outer_trials": 2,
    "inner_trials": 3,
    "early_stop_below": None,
}
STRICT = {
    "rse_target": 0.05, "min_reps": 5, "max_reps": 20, "budget_s": 3, "sync_mismatch": 1.5, "l2_factor": 1.5, "seed": 42
}
DETECTORS = {
    "n_calls": 2, "precision_factor": 10, "precision_floor": 1e-6, "speedup_ceiling": 10, "seed": 42, "atol": 0.01,
    "rtol": 0.01,
}


def run(tasks, tmp_path, tid, kind, timeout=60, **extra):
    job = {
        "kind": kind,
        "backend": "cpu",
        "tid": tid,
        "task_dir": str(tasks / tid),
        "ext_dir": str(tmp_path / "ext" / tid),
        "params": dict(PAPER),
        "lock_dir": str(tmp_path),
    } | extra
    return stamped(job, run_worker(job, timeout, tmp_path / f"{tid}.log"))  # as the job stamps it


def write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def test_check_with_detectors_passes_honest_task(tasks, tmp_path):
    build = run(tasks, tmp_path, "L1_T001", "build")
    assert build["status"] == "ok"
    res = run(tasks, tmp_path, "L1_T001", "check", build_result=write(tmp_path, "b.json", build), detectors=DETECTORS)
    assert res["status"] == "pass"
    assert res["flags"] == []
    assert len(res["min_tolerance"]) == res["trials_passed"] == PAPER["correctness_trials"]
    assert all(0 <= t <= PAPER["atol"] for t in res["min_tolerance"])
    assert res["provenance"]["device"] == "cpu"
    assert res["snippet_sha256"]["custom"]
    assert "gpu_memory" not in res  # CPU: no allocator peaks to record


def test_a_steps_gpu_memory_is_the_allocators_peaks_in_mib():
    """Read from the allocator's counters only where CUDA runs; never starts it."""
    from types import SimpleNamespace

    from l1bench.worker.entry import gpu_memory

    calls = []
    cuda = SimpleNamespace(is_initialized=lambda: True,
                           max_memory_allocated=lambda d: calls.append(d) or 3 * 2**30,
                           max_memory_reserved=lambda d: 4.5 * 2**30)
    assert gpu_memory("cuda:1", SimpleNamespace(cuda=cuda)) == {"max_allocated_mib": 3072.0, "max_reserved_mib": 4608.0}
    assert calls == ["cuda:1"]
    assert gpu_memory("cpu", SimpleNamespace(cuda=cuda)) is None
    idle = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: False))
    assert gpu_memory("cuda:0", idle) is None


def test_time_paper_and_strict(tasks, tmp_path):
    check = write(tmp_path, "c.json", {"kind": "check", "status": "pass", "reason": ""})
    paper = run(tasks, tmp_path, "L1_T001", "time", check_result=check, mode="default", protocol="paper")
    assert paper["status"] == "ok" and paper["score"] > 0  # no timing assertions in tests
    assert [len(r) for r in paper["ref_ms"]] == [3, 3] and paper["n_timings"] == 6
    # the pairs' order is the seed's draw (the published harness draws it unseeded, anew each
    # run): the same in every run, recorded per pair (docs/protocols.md, the order of a pair)
    rng = random.Random(PAPER["seed"])
    drawn = [[rng.random() < 0.5 for _ in range(3)] for _ in range(2)]
    assert paper["host_timing"]["retimed_pairs"] or paper["host_timing"]["ref_first"] == drawn
    strict = run(
        tasks, tmp_path, "L1_T001", "time", check_result=check, mode="default", protocol="strict", strict=STRICT
    )
    assert strict["status"] == "ok" and strict["score"] > 0
    assert strict["strict_params"] == STRICT  # what it was timed with, beside the paper's params
    st = strict["strict"]
    assert st["ci95"][0] <= st["speedup_median"] <= st["ci95"][1]
    assert 5 <= st["n"] <= 20


CHEAT_WHEN_TIMED = """
import sys as _sys

_honest_forward = ModelNew.forward


def _forward(self, *args):
    frame = _sys._getframe(1)
    while frame is not None:  # under strict timing's timer: a wrong answer
        if frame.f_code.co_name == "time" and frame.f_code.co_filename.endswith("strictcalls.py"):
            return _honest_forward(self, *args) * 0
        frame = frame.f_back
    return _honest_forward(self, *args)


ModelNew.forward = _forward
"""


def test_strict_timing_with_checked_outputs_fails_a_model_wrong_only_when_timed(tasks, tmp_path):
    """A custom model that is right everywhere but under strict timing's timer: ok and scored
    without ``verify_outputs``; incorrect, unscored and flagged with it."""
    shutil.copytree(tasks / "L1_T001", tmp_path / "cheat" / "L1_T001")
    custom = tmp_path / "cheat" / "L1_T001" / "custom.py"
    custom.write_text(custom.read_text() + CHEAT_WHEN_TIMED)
    check = write(tmp_path, "c.json", {"kind": "check", "status": "pass", "reason": ""})
    job = {"check_result": check, "mode": "default", "protocol": "strict", "task_dir": str(custom.parent)}
    unchecked = run(tasks, tmp_path, "L1_T001", "time", **job, strict=STRICT)
    assert unchecked["status"] == "ok" and unchecked["score"] > 0 and "verified" not in unchecked["strict"]
    checked = run(tasks, tmp_path, "L1_T001", "time", **job, strict=STRICT | {"verify_outputs": 2})
    assert checked["status"] == "incorrect" and checked["score"] is None
    assert checked["reason"].startswith("strict timing: timed repetition")
    assert [f["flag"] for f in checked["flags"]] == ["TIMED_OUTPUT_MISMATCH"]


def test_negative_check_is_carried_into_time(tasks, tmp_path):
    check = write(tmp_path, "c.json", {"kind": "check", "status": "incorrect", "reason": "trial 1: values differ"})
    res = run(tasks, tmp_path, "L1_T003", "time", check_result=check, mode="default", protocol="paper")
    assert res["status"] == "incorrect" and res["score"] is None
    assert res["reason"].startswith("check: trial 1")


def test_crash_and_timeout_fail_the_job(tasks, tmp_path):
    build = write(tmp_path, "b.json", {"kind": "build", "status": "ok", "reason": ""})
    with pytest.raises(JobFailed, match="SIGKILL"):
        run(tasks, tmp_path, "L1_T006", "check", build_result=build)
    job = {
        "kind": "check",
        "backend": "cpu",
        "tid": "L1_T005",
        "task_dir": str(tasks / "L1_T005"),
        "ext_dir": str(tmp_path / "ext5"),
        "params": dict(PAPER),
        "build_result": build,
        "lock_dir": str(tmp_path),
    }
    with pytest.raises(JobFailed, match="timed out"):
        run_worker(job, 8, tmp_path / "hang.log")


@pytest.mark.skipif(sys.platform != "linux", reason="flock semantics")
def test_lock_wait_is_not_counted(tmp_path):
    import time

    from l1bench.gpu.gpulock import device_lock, waited_seconds

    status = tmp_path / "s.json"
    stats = {}
    import os

    os.environ["L1BENCH_LOCK_STATUS"] = str(status)
    try:
        with device_lock("cpu", tmp_path, stats):
            time.sleep(0.05)
    finally:
        del os.environ["L1BENCH_LOCK_STATUS"]
    assert stats["lock_held_s"] >= 0.04
    assert waited_seconds(status) == pytest.approx(stats["lock_wait_s"], abs=1e-6)


def test_correctness_trials_as_the_harness():
    import torch

    from l1bench.timing.harness import compare_outputs, correctness_trials

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    class Wrong(torch.nn.Module):
        def forward(self, x):
            return x * 2.1

    class Half(torch.nn.Module):
        def forward(self, x):
            return (x * 2).half()

    def inputs():
        return [torch.randn(8, 8)]

    p = dict(PAPER)
    assert correctness_trials(Double(), Double(), inputs, "cpu", p)[:3] == (True, "", 3)
    tolerances = []
    ok, why, passed, worst = correctness_trials(Double(), Wrong(), inputs, "cpu", p, tolerances)
    assert not ok and why.startswith("trial 1: values differ") and passed == 0 and worst > 0
    assert len(tolerances) == 1 and 0.01 < tolerances[0] < 0.1  # |0.1 x| / (1 + |2.1 x|) < 1/21
    ok, why, _, _ = correctness_trials(Double(), Half(), inputs, "cpu", p, tolerances := [])
    assert not ok and "dtype" in why  # torch.allclose rejects mixed dtypes in the harness too
    assert tolerances == [None]  # no tolerance passes: JSON null
    assert not compare_outputs(torch.zeros(2), torch.zeros(3), 0.01, 0.01)[0]


def _fake_cuda(monkeypatch):
    """A CUDA 'device' on the CPU: moves are no-ops, CUDA initialisation is a flag (replaced in
    the module whose CustomBuilder looks them up)."""
    from l1bench.timing import harness

    state = {"init": False}
    monkeypatch.setattr(harness, "cuda_initialized", lambda: state["init"])
    monkeypatch.setattr(harness, "move", lambda model, device: model)
    return state


def test_custom_builder_constructs_cpu_only_models_outside_the_lock(monkeypatch):
    import torch


    state = _fake_cuda(monkeypatch)
    made = []

    class CpuOnly(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            made.append(n)
            self.lin = torch.nn.Linear(n, n)

    b = harness.CustomBuilder(CpuOnly, [4], "cuda:0")
    b.probe(42)
    assert b.cpu_safe and "outside the lock" in b.probe_note
    prepared = b.prepare(43, [4])
    assert isinstance(prepared, CpuOnly)
    # finish only moves the prepared instance: no construction inside the lock
    n_before = len(made)
    assert b.finish(prepared, 43, [4]) is prepared and len(made) == n_before
    # same weights as constructing under the seed, as the harness does
    torch.manual_seed(43)
    assert torch.equal(CpuOnly(4).lin.weight, prepared.lin.weight)
    assert not state["init"]


def test_custom_builder_keeps_gpu_init_inside_the_lock(monkeypatch):
    import torch


    state = _fake_cuda(monkeypatch)

    class TouchesCuda(torch.nn.Module):
        def __init__(self):
            super().__init__()
            state["init"] = True  # as torch.cuda.Stream() or .cuda() in __init__ would
            torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark

    flag = torch.backends.cudnn.benchmark
    b = harness.CustomBuilder(TouchesCuda, [], "cuda:0")
    b.probe(42)
    assert not b.cpu_safe and "initialises CUDA" in b.probe_note
    assert torch.backends.cudnn.benchmark == flag  # the probe's global side effects are undone
    assert b.prepare(42) is None
    assert isinstance(b.finish(None, 42), TouchesCuda)  # built inside the lock
    torch.backends.cudnn.benchmark = flag

    # CUDA already initialised before the probe: no evidence, so stay inside the lock
    class Plain(torch.nn.Module):
        pass

    b = harness.CustomBuilder(Plain, [], "cuda:0")
    b.probe(42)
    assert not b.cpu_safe and "before the probe" in b.probe_note

    # a constructor that reaches for the GPU stops there: nothing of it runs outside the lock
    state["init"] = False

    class MakesCudaTensors(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.buf = torch.zeros(3, device="cuda")

    real_init = torch.cuda._lazy_init
    b = harness.CustomBuilder(MakesCudaTensors, [], "cuda:0")
    b.probe(42)
    assert not b.cpu_safe and "uses CUDA" in b.probe_note
    assert torch.cuda._lazy_init is real_init and not torch.cuda.is_initialized()

    # a constructor that raises on the CPU is decided inside the lock, not by the probe

    class Raises(torch.nn.Module):
        def __init__(self):
            raise RuntimeError("needs a GPU")

    b = harness.CustomBuilder(Raises, [], "cuda:0")
    b.probe(42)
    assert not b.cpu_safe and "raised" in b.probe_note
    with pytest.raises(Exception, match="needs a GPU"):
        b.finish(None, 42)

    # the CPU backend never probes
    b = harness.CustomBuilder(Plain, [], "cpu")
    b.probe(42)
    assert not b.cpu_safe and b.prepare(42) is None


def test_core_plan_reserves_one_timing_cpu_per_device():
    from l1bench.gpu.timingcpus import core_plan

    alone = lambda cpu: {cpu}  # noqa: E731 - no SMT
    timing, rest = core_plan(range(16), 1, siblings=alone)
    assert timing == [15] and rest == set(range(15))
    # SMT: CPU 15 shares its core with CPU 7, which is left idle too
    pairs = lambda cpu: {cpu % 8, cpu % 8 + 8}  # noqa: E731
    timing, rest = core_plan(range(16), 1, siblings=pairs)
    assert timing == [15] and rest == set(range(16)) - {7, 15}
    timing, rest = core_plan(range(16), 2, siblings=pairs)
    assert timing == [15, 14] and rest == set(range(16)) - {6, 7, 14, 15}
    assert core_plan(range(4), 2, siblings=lambda c: {c % 2, c % 2 + 2})[0] == [3, 2]  # too small to idle siblings
    timing, rest = core_plan(range(128), 8, siblings=alone)
    assert timing == list(range(127, 119, -1)) and not set(timing) & rest and len(rest) == 120
    assert core_plan(range(2), 1) == ([], {0, 1})  # a CI box: nothing reserved
    assert core_plan(range(8), 5) == ([], set(range(8)))  # fewer than two CPUs per device
    assert core_plan([3, 1, 2, 0], 0) == ([], {0, 1, 2, 3})


class FakeAffinity:
    """os.sched_getaffinity / sched_setaffinity of a 16-CPU machine, per thread id."""

    def __init__(self, monkeypatch, cpus=range(16), tids=(101, 102)):
        import os

        from l1bench.gpu import timingcpus

        monkeypatch.setattr(timingcpus, "thread_siblings", lambda cpu: {cpu})  # no SMT
        self.masks = {0: set(cpus)} | {t: set(cpus) for t in tids}
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(self.masks[pid]))
        monkeypatch.setattr(os, "sched_setaffinity", self.set)
        monkeypatch.setattr(os, "listdir", lambda path: [str(t) for t in tids] if path == "/proc/self/task" else [])

    def set(self, pid, cpus):
        self.masks[pid] = set(cpus)


def test_the_workflow_keeps_every_process_off_the_timing_cpu(monkeypatch):
    from l1bench.gpu import timingcpus

    monkeypatch.delenv(timingcpus.RESERVED_ENV, raising=False)
    monkeypatch.delenv(timingcpus.TIMING_CPU_ENV, raising=False)
    aff = FakeAffinity(monkeypatch)
    assert timingcpus.keep_workflow_off_timing_cpus(1) == [15]
    assert aff.masks[101] == aff.masks[102] == set(range(15))  # every thread, so every child
    assert timingcpus.reserved_plan(range(16)) == ([15], set(range(15)))
    assert timingcpus.keep_workflow_off_timing_cpus(1) == [15]  # once: not CPU 14 next time
    # a process that inherited the plan but not the mask (reset by a launcher) gets the mask back
    aff.masks.update({0: set(range(16)), 101: set(range(16)), 102: set(range(16))})
    assert timingcpus.keep_workflow_off_timing_cpus(1) == [15]
    assert aff.masks[101] == aff.masks[102] == set(range(15))
    # a worker started by it takes the workflow's plan, not one from its own (smaller) mask
    aff.masks[0] = set(range(15))
    assert timingcpus.reserve_timing_cpus(1, 0) == 15 and aff.masks[0] == set(range(15))
    assert os.environ[timingcpus.TIMING_CPU_ENV] == "15"
    monkeypatch.setenv(timingcpus.RESERVED_ENV, "")
    monkeypatch.delenv(timingcpus.TIMING_CPU_ENV)
    aff.masks[0] = set(range(15))  # without the plan the worker would reserve CPU 14
    assert timingcpus.reserve_timing_cpus(1, 0) == 14


def test_no_timing_cpu_on_a_small_machine_or_without_gpus(monkeypatch):
    from l1bench.gpu import timingcpus

    monkeypatch.delenv(timingcpus.RESERVED_ENV, raising=False)
    aff = FakeAffinity(monkeypatch, cpus=range(2))
    assert timingcpus.keep_workflow_off_timing_cpus(1) == [] and aff.masks[101] == {0, 1}
    FakeAffinity(monkeypatch)
    assert timingcpus.keep_workflow_off_timing_cpus(0) == []
    assert timingcpus.RESERVED_ENV not in os.environ


def test_visible_gpu_count_without_starting_cuda(monkeypatch):
    import shutil

    from l1bench.gpu import gpus

    for visible, n in (("0,1", 2), ("", 0), ("-1", 0), ("GPU-3f2a", 1)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert gpus.visible_gpu_count() == n, visible
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert gpus.visible_gpu_count() == 0


def test_lock_holder_runs_on_the_timing_cpu(tmp_path, monkeypatch):
    import os

    from l1bench.gpu import gpulock, timingcpus

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    monkeypatch.setenv(timingcpus.TIMING_CPU_ENV, str(cpu))
    with gpulock.device_lock("cpu", tmp_path):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before


def test_no_code_result_needs_no_worker(tmp_path):
    import json

    from l1bench.job import without_worker

    task = tmp_path / "L1_T007"
    task.mkdir()
    meta = {"snippets": {"ref": {"file": "ref.py", "sha256": "ab"}}}
    (task / "meta.json").write_text(json.dumps(meta))
    job = {"kind": "time", "tid": "L1_T007", "mode": "cudnn", "protocol": "paper", "task_dir": str(task)}
    res = without_worker(job, [], 0)
    assert res["status"] == "no_code" and res["mode"] == "cudnn" and res["score"] is None
    assert res["flags"] == [] and res["provenance"]["worker"] is False
    meta["snippets"]["custom"] = {"file": "custom.py", "sha256": "cd"}
    (task / "meta.json").write_text(json.dumps(meta))
    (task / "check.json").write_text(json.dumps({"kind": "check", "status": "pass", "reason": ""}))
    assert without_worker(job | {"check_result": str(task / "check.json")}, [], 0) is None


def test_a_failed_check_is_carried_forward_without_a_worker(tmp_path):
    from l1bench.job import without_worker

    (tmp_path / "meta.json").write_text(json.dumps({"snippets": {"custom": {"file": "custom.py", "sha256": "b"}}}))
    check = tmp_path / "check.json"
    check.write_text(json.dumps({"kind": "check", "status": "incorrect", "reason": "trial 1: values differ"}))
    job = {"kind": "time", "tid": "L3_T043", "mode": "cudnn", "protocol": "strict", "check_result": str(check),
           "task_dir": str(tmp_path)}
    res = without_worker(job, [], 0)
    assert res["status"] == "incorrect" and res["reason"] == "check: trial 1: values differ"
    assert res["mode"] == "cudnn" and res["provenance"]["worker"] is False
    check.write_text(json.dumps({"kind": "check", "status": "pass", "reason": ""}))
    assert without_worker(job, [], 0) is None  # a passed check: the worker times it


def test_holding_the_lock_too_long_is_cut_short(tmp_path):
    import subprocess
    import time

    from l1bench.pool import runner

    status = tmp_path / "status.json"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        status.write_text(json.dumps({"waited_s": 0, "waiting_since": None, "holding_since": time.time() - 100}))
        t0 = time.monotonic()
        with pytest.raises(runner.SectionTimeout):
            runner._wait(proc, 600, status, t0, poll=0.1, section_timeout=50)
        assert time.monotonic() - t0 < 5
        status.write_text(json.dumps({"waited_s": 0, "waiting_since": None, "holding_since": None}))
        with pytest.raises(subprocess.TimeoutExpired) as err:  # not holding: only the job timeout applies
            runner._wait(proc, 0.3, status, time.monotonic(), poll=0.1, section_timeout=50)
        assert not isinstance(err.value, runner.SectionTimeout)
    finally:
        proc.kill()
        proc.wait()


def test_a_section_timeout_names_the_device_the_job_ran_on():
    from l1bench.pool import runner

    for backend, device in (("cpu", "CPU"), ("cuda", "GPU")):
        err = runner.job_error("L1_T005", runner.SectionTimeout, 90, 10, runner.device_word({"backend": backend}))
        assert str(err) == f"L1_T005: held the {device} lock for more than 10 s"


def test_compile_backend_releases_the_lock_while_generating_code(tmp_path):
    """The first call of a compiled model runs inside the GPU section, but its code
    generation lets go of the lock (and the compiled model computes what eager does)."""
    import torch

    from l1bench.gpu import gpulock

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    stats = {}
    with gpulock.device_lock("cpu", tmp_path, stats) as lock:
        assert gpulock.DeviceLock.current is lock
        compiled = torch_hooks.wrap_baseline(model, "torch_compile")
        out = compiled(x)
        assert gpulock.DeviceLock.current is lock  # taken back after code generation
    assert gpulock.DeviceLock.current is None
    assert stats["lock_paused_n"] >= 1 and stats["lock_held_s"] >= 0
    assert torch.allclose(out, model(x))
    # a rebuilt model (the next outer trial) reuses the compiled code: no new pause
    again = torch_hooks.wrap_baseline(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), "torch_compile")
    n = stats["lock_paused_n"]
    with gpulock.device_lock("cpu", tmp_path, stats):
        again(x)
    assert stats["lock_paused_n"] == n


def test_failed_extension_builds_are_not_retried(monkeypatch):
    from torch.utils import cpp_extension


    calls = []

    def failing_build(name, cpp_sources, **kwargs):
        calls.append(name)
        raise RuntimeError("Error building extension 'x'")

    def ok_build(*args, **kwargs):
        calls.append("ok")
        return "module"

    monkeypatch.setattr(cpp_extension, "load_inline", failing_build)
    monkeypatch.setattr(cpp_extension, "load", ok_build)
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILDS", {})
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILD_NAMES", {})
    torch_hooks.remember_failed_extension_builds()
    for _ in range(3):
        with pytest.raises(RuntimeError, match="Error building"):
            cpp_extension.load_inline("x", "int f();", verbose=False)
    assert calls == ["x"]  # built once, the same failure re-raised after
    with pytest.raises(RuntimeError):
        cpp_extension.load_inline("y", "int g();")  # other sources: built again
    assert calls == ["x", "y"]
    assert cpp_extension.load("z") == cpp_extension.load("z") == "module" and calls.count("ok") == 2
    torch_hooks.remember_failed_extension_builds()  # idempotent: not wrapped twice
    assert cpp_extension.load_inline.__wrapped__ is failing_build


def test_a_build_lock_left_by_a_killed_process_is_cleared_and_loads_take_turns(tmp_path, monkeypatch):
    """torch's build lock file outlives a killed builder (later loads would wait forever); the
    flock beside it does not, so its holder may remove the stale file."""
    import subprocess
    import textwrap

    from torch.utils import cpp_extension


    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "ext_a").mkdir()
    (tmp_path / "ext_a/lock").write_text("")  # a builder was killed here
    seen = []

    def build(name, cpp_sources, **kwargs):
        seen.append((name, (tmp_path / name / "lock").exists()))
        return "module"

    monkeypatch.setattr(cpp_extension, "load_inline", build)
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILDS", {})
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILD_NAMES", {})
    torch_hooks.remember_failed_extension_builds()
    assert cpp_extension.load_inline(name="ext_a", cpp_sources="int f();") == "module"
    assert seen == [("ext_a", False)]  # the stale lock was gone when torch looked
    # a live holder (another process loading the same extension) is waited for, and its
    # lock file is not touched while it holds the flock
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, pathlib, sys, time
        fh = open({str(tmp_path / ".ext_a.flock")!r}, "a+")
        fcntl.flock(fh, fcntl.LOCK_EX)
        pathlib.Path({str(tmp_path / "ext_a/lock")!r}).write_text("")
        print("held", flush=True)
        time.sleep(1.0)
        pathlib.Path({str(tmp_path / "ext_a/lock")!r}).unlink()
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    with torch_hooks.exclusive_extension_build("ext_a"):
        waited = time.monotonic() - t0
        assert not (tmp_path / "ext_a/lock").exists()
    holder.wait(10)
    assert waited > 0.3  # it took its turn after the holder, not during


def test_nothing_to_build_without_extensions(tmp_path):
    from l1bench.job import without_worker

    task = tmp_path / "L1_T001"
    task.mkdir()
    (task / "meta.json").write_text(json.dumps({"snippets": {"custom": {"file": "custom.py", "sha256": "b"}}}))
    job = {"kind": "build", "tid": "L1_T001", "task_dir": str(task)}
    (task / "custom.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    res = without_worker(job, [], 0)
    assert res["status"] == "ok" and res["extensions"] == [] and "nothing to build" in res["reason"]
    (task / "custom.py").write_text("from torch.utils.cpp_extension import load_inline\n")
    assert without_worker(job, [], 0) is None


def test_extension_builds_release_the_gpu_lock(monkeypatch):
    """nvcc (or waiting for another process's nvcc) never runs inside the GPU section."""
    from torch.utils import cpp_extension, file_baton

    from l1bench.gpu import gpulock

    events = []

    class FakeLock:
        @contextlib.contextmanager
        def paused(self):
            events.append("released")
            yield
            events.append("reacquired")

    def build(*args, **kwargs):
        events.append("nvcc")
        return "lib"

    monkeypatch.setattr(cpp_extension, "_write_ninja_file_and_build_library", build)
    monkeypatch.setattr(file_baton.FileBaton, "wait", lambda self: events.append("wait"))
    monkeypatch.setattr(gpulock.DeviceLock, "current", FakeLock())
    torch_hooks.release_lock_during_extension_builds()
    torch_hooks.release_lock_during_extension_builds()  # idempotent: not wrapped twice
    assert cpp_extension._write_ninja_file_and_build_library("x") == "lib"
    file_baton.FileBaton("/nonexistent/lock").wait()
    assert events == ["released", "nvcc", "reacquired", "released", "wait", "reacquired"]
    monkeypatch.setattr(gpulock.DeviceLock, "current", None)  # no lock held: nothing to release
    events.clear()
    cpp_extension._write_ninja_file_and_build_library("x")
    assert events == ["nvcc"]


def test_a_failed_extension_build_is_flagged_on_the_result(monkeypatch):
    """Custom code that catches its own build failure and falls back still gets a flag."""
    from torch.utils import cpp_extension


    monkeypatch.setattr(torch_hooks, "_FAILED_BUILDS", {})
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILD_NAMES", {})

    def failing_build(name, cpp_sources, **kwargs):
        raise RuntimeError(
            f"Error building extension '{name}': [1/2] g++ ...\n"
            "main.cpp:4:56: error: 'fused' was not declared in this scope\nninja: build stopped"
        )

    monkeypatch.setattr(cpp_extension, "load_inline", failing_build)
    assert "flags" not in torch_hooks.note_extension_failures(stage_result("pass"), "check")  # nothing failed yet
    torch_hooks.remember_failed_extension_builds()
    try:  # what a snippet with a fallback does
        cpp_extension.load_inline(name="fused_ext", cpp_sources="...")
    except RuntimeError:
        pass
    res = torch_hooks.note_extension_failures(stage_result("pass"), "check")
    assert res["extension_failures"] == [
        {"extension": "fused_ext", "error": "main.cpp:4:56: error: 'fused' was not declared in this scope"}
    ]
    assert [f["flag"] for f in res["flags"]] == ["EXTENSION_BUILD_FAILED"]
    assert "fused_ext" in res["flags"][0]["reason"] and "fallback" in res["flags"][0]["reason"]
    build = torch_hooks.note_extension_failures(stage_result("ok"), "build")
    assert "flags" not in build and build["extension_failures"][0]["extension"] == "fused_ext"


def test_warm_up_is_the_harness_call_sequence():

    calls = []
    base = lambda *a: calls.append("base")  # noqa: E731
    custom = lambda *a: calls.append("custom")  # noqa: E731
    harness.warm_up(base, custom, (), 3, "cpu")
    assert calls == ["base", "custom"] * 3


def test_compile_mode_calls_compiled_models_only_inside_sections(tasks, tmp_path):
    check = write(tmp_path, "c.json", {"kind": "check", "status": "pass", "reason": ""})
    # A cold inductor cache makes this job take about 45 s on an idle two-CPU machine, and more
    # beside the rest of the suite; the timeout is a safety net here, not what is tested.
    res = run(tasks, tmp_path, "L1_T001", "time", timeout=600, check_result=check, mode="torch_compile",
              protocol="paper")
    assert res["status"] == "ok" and [len(r) for r in res["ref_ms"]] == [3, 3]
    assert res["dynamo_compiles_unlocked"] is True
    assert "compile (tracing and code generation unlocked)" in res["phases"]
    assert not any("unlocked, graphs locked" in k for k in res["phases"])
    # the compile let go of the lock at least once; rebuilt models reuse the compiled graph
    assert res["lock_paused_n"] >= 1 and res["compiled_graphs"] == 1
    # torch.compile's imports and wrapper were made before the section (None: inside the lock)
    assert res["compile_prepared_s"] > 0
    host = res["host_timing"]
    assert res["timing_version"] == TIMING_VERSION and host["calls"] == 12 + 2 * host["retimed_pairs"]


def test_a_compile_error_is_remembered_across_processes(monkeypatch, tmp_path):
    """A snippet that names its extension after the process id fails once per task, not once
    per job: the compiler error is kept in the task's extension folder."""
    from torch.utils import cpp_extension


    calls = []

    def failing_build(name, cpp_sources, **kwargs):
        calls.append(name)
        raise RuntimeError(f"Error building extension '{name}': main.cpp:3:1: error: 'f' was not declared")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load_inline", failing_build)
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILDS", {})
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILD_NAMES", {})
    torch_hooks.remember_failed_extension_builds()
    with pytest.raises(RuntimeError, match="not declared"):
        cpp_extension.load_inline(name="ext_1111", cpp_sources="int f();")
    assert len(list((tmp_path / "failed-builds").glob("*.txt"))) == 1
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILDS", {})  # a new process of the same task
    with pytest.raises(RuntimeError, match="not declared"):
        cpp_extension.load_inline(name="ext_2222", cpp_sources="int f();")
    assert calls == ["ext_1111"]  # the compiler ran once
    assert torch_hooks.extension_build_failures()[0]["extension"] == "ext_2222"
    # a failure that is not a compiler error (killed, out of memory) is not kept on disk
    monkeypatch.setattr(torch_hooks, "_FAILED_BUILDS", {})

    def killed(name, cpp_sources, **kwargs):
        raise RuntimeError("Error building extension 'k': ninja: build stopped: interrupted by user")

    monkeypatch.setattr(cpp_extension, "load_inline", killed)
    torch_hooks.remember_failed_extension_builds()
    with pytest.raises(RuntimeError):
        cpp_extension.load_inline(name="k", cpp_sources="int h();")
    assert len(list((tmp_path / "failed-builds").glob("*.txt"))) == 1
