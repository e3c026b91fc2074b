"""Timing design 6 (opt-in ``timing.cuda_start_outside_lock``): CUDA started before the job's
first GPU section, outside the GPU lock, inside a per-GPU start flock (one job at a time), off
the timing CPU; the flag's way from the config to the worker. CPU only: CUDA is faked."""

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import SNAKEMAKE, MarkerProcess, copy_workflow, script_module
from test_shared_sections import KEYS_4, PHASES_4, demo_job

from l1bench import gpulock, plan, timingcpus
from l1bench.snippet import InfraError
from l1bench.worker import entry, sections

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock semantics")

ROOT = Path(__file__).resolve().parents[1]
SETTLE_S = 0.4  # how long a process that should be blocked is given to (wrongly) get in
ON = {"cuda_start_outside_lock": True}


def held(path) -> bool:
    """Whether anybody (this process included, through another open file) holds the flock
    (a file nobody made: no; the probe makes none)."""
    if not Path(path).exists():
        return False
    with open(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def lock_files(lock_dir, device="cuda:0"):
    """(the GPU lock's file, the start flock's file) of ``device`` in ``lock_dir``."""
    gpu = gpulock.DeviceLock(device, lock_dir).path
    return gpu, gpu.with_suffix(".start")  # l1bench-gpu<name>.lock, l1bench-gpu<name>.start


@pytest.fixture
def fake_cuda(monkeypatch, tmp_path):
    """torch.cuda faked: every call into it is recorded as (call, GPU lock held, start flock
    held, this thread's CPUs); CUDA counts as started once ``set_device`` ran. ``fail``:
    ``set_device`` raises."""
    gpu_lock, start_lock = lock_files(tmp_path)
    state = SimpleNamespace(started=False, fail=False, calls=[])

    def record(call):
        state.calls.append((call, held(gpu_lock), held(start_lock), os.sched_getaffinity(0)))

    def set_device(index):
        record(f"set_device({index})")
        if state.fail:
            raise RuntimeError("no CUDA-capable device is detected")
        state.started = True

    real_empty = torch.empty

    def empty(*size, device=None, **kw):
        if str(device).startswith("cuda"):
            record("empty")
            return real_empty(*size, **kw)
        return real_empty(*size, device=device, **kw)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state.started)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "current_blas_handle", lambda: record("blas"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: record("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: record("empty_cache"))
    return state


@pytest.fixture
def timing_cpu(monkeypatch):
    """A timing CPU (one of this process's), exported as the lock's pinning does."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    monkeypatch.setenv(timingcpus.TIMING_CPU_ENV, str(max(cpus)))
    return max(cpus)


# --------------------------------------------------------------------------- the worker


def test_cuda_starts_before_the_gpu_lock_inside_the_start_lock(tmp_path, fake_cuda, timing_cpu, monkeypatch):
    """Flag on, one GPU: set_device, the first allocation, the cuBLAS handle and a synchronize
    run with the start flock held and the GPU lock free, unpinned; the driver's threads are
    moved off the timing CPU; the section then holds the GPU lock (pinned) without starting
    CUDA again."""
    gpu_lock, start_lock = lock_files(tmp_path)
    unpinned = []
    real_unpin = timingcpus.unpin_threads

    def unpin(cpu, restore, *args, **kw):
        unpinned.append((str(cpu), held(start_lock), held(gpu_lock)))
        return real_unpin(cpu, restore, *args, **kw)

    monkeypatch.setattr(timingcpus, "unpin_threads", unpin)
    before = os.sched_getaffinity(0)
    job = {"gpu_ids": ["0"], "lock_dir": str(tmp_path)} | ON
    stats = {}
    with sections.exclusive("cuda:0", job, stats):
        in_section = (held(gpu_lock), held(start_lock), os.sched_getaffinity(0))
    calls = [c[0] for c in fake_cuda.calls]
    assert calls == ["set_device(0)", "empty", "blas", "sync", "sync", "empty_cache"]
    for call, gpu_held, start_held, cpus in fake_cuda.calls[:4]:  # CUDA's start
        assert start_held and not gpu_held and cpus == before, call
    assert in_section == (True, False, {timing_cpu})  # the section: the GPU lock, pinned
    assert (str(timing_cpu), True, False) in unpinned  # driver threads: off the timing CPU
    assert stats["cuda_started"] == sections.STARTED_OUTSIDE == "outside the GPU lock"
    assert "cuda_init (start lock)" in stats["phases"] and "cuda_init (locked)" not in stats["phases"]
    assert stats["phases_locked"]["cuda_init (start lock)"] == 0  # no GPU-lock time
    assert 0 <= stats["start_lock_wait_s"] < 1 and stats["driver_threads_moved"] >= 0
    assert not held(start_lock) and not held(gpu_lock)
    # later sections: nothing starts again
    with sections.exclusive("cuda:0", job, stats):
        pass
    assert [c[0] for c in fake_cuda.calls].count("set_device(0)") == 1


def test_a_cuda_start_that_fails_is_an_infrastructure_failure(tmp_path, fake_cuda):
    gpu_lock, start_lock = lock_files(tmp_path)
    fake_cuda.fail = True
    job = {"gpu_ids": ["0"], "lock_dir": str(tmp_path)} | ON
    with pytest.raises(InfraError, match="CUDA could not start on cuda:0"):
        with sections.exclusive("cuda:0", job, {}):
            pytest.fail("the section must not run")
    assert [c[0] for c in fake_cuda.calls] == ["set_device(0)"]
    assert not held(start_lock) and "lock_device" not in job  # let go of; no GPU taken


def test_cuda_started_by_the_snippets_takes_no_start_lock(tmp_path, fake_cuda):
    _, start_lock = lock_files(tmp_path)
    fake_cuda.started = True  # a snippet's import or __init__ started it
    stats = {}
    with sections.exclusive("cuda:0", {"gpu_ids": ["0"], "lock_dir": str(tmp_path)} | ON, stats):
        pass
    assert stats["cuda_started"] == "before the first GPU section" and "phases" not in stats
    assert not start_lock.exists()


def test_with_several_gpus_cuda_starts_inside_the_lock(tmp_path, fake_cuda, timing_cpu, monkeypatch):
    """Which GPU a job gets is decided as it takes a GPU lock: with several visible, CUDA
    starts inside it as without the flag, and the result says why."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # claim_gpu sets it
    gpu_lock, start_lock = lock_files(tmp_path)
    stats = {}
    with sections.exclusive("cuda:0", {"gpu_ids": ["0", "1"], "lock_dir": str(tmp_path)} | ON, stats):
        pass
    set_device = fake_cuda.calls[0]
    assert set_device[:3] == ("set_device(0)", True, False) and set_device[3] == {timing_cpu}
    assert stats["cuda_started"] == sections.STARTED_INSIDE_SEVERAL == "inside the GPU lock (several GPUs)"
    assert list(stats["phases"]) == ["cuda_init (locked)"] and "start_lock_wait_s" not in stats
    assert stats["phases_locked"]["cuda_init (locked)"] > 0
    assert not start_lock.exists()
    with sections.exclusive("cuda:0", {"lock_device": "cuda:0", "lock_dir": str(tmp_path)} | ON, stats):
        pass
    assert stats["cuda_started"] == sections.STARTED_INSIDE_SEVERAL  # kept, not started again
    assert [c[0] for c in fake_cuda.calls].count("set_device(0)") == 1


#: What design 4's first GPU section records on a (faked) GPU: main before design 6
STATS_4 = ["cuda_started", "driver_threads_moved", "gpu_id", "lock_held_s", "lock_wait_s", "phases", "phases_locked"]


@pytest.mark.parametrize("job_flag", [{}, {"cuda_start_outside_lock": False}])
def test_with_the_flag_off_cuda_starts_inside_the_lock_as_before(tmp_path, fake_cuda, timing_cpu, job_flag):
    gpu_lock, start_lock = lock_files(tmp_path)
    stats = {}
    with sections.exclusive("cuda:0", {"gpu_ids": ["0"], "lock_dir": str(tmp_path)} | job_flag, stats):
        pass
    assert [c[0] for c in fake_cuda.calls] == ["set_device(0)", "empty", "blas", "sync", "empty_cache"]
    for call, gpu_held, start_held, cpus in fake_cuda.calls[:3]:
        assert gpu_held and not start_held and cpus == {timing_cpu}, call
    assert sorted(stats) == STATS_4 and stats["cuda_started"] == "inside the GPU lock"
    assert list(stats["phases"]) == list(stats["phases_locked"]) == ["cuda_init (locked)"]
    assert not start_lock.exists()


@pytest.mark.parametrize("which", ["check", "check_detectors", "paper", "strict"])
def test_with_the_flag_off_results_are_design_4s(tasks, tmp_path, which):
    """The CPU demo's results, flag off: as before (phases and keys of design 4); flag on,
    the same but timing_design 6 (on the CPU there is no CUDA to start)."""
    res = entry.run(demo_job(tasks, tmp_path, which))
    assert res["status"] in ("ok", "pass") and res["timing_design"] == 4
    assert list(res["phases"]) == list(res["phases_locked"]) == PHASES_4[which]
    assert sorted(res) == KEYS_4[which]
    on = entry.run(demo_job(tasks, tmp_path, which, **ON))
    assert on["status"] == res["status"] and on["timing_design"] == 6
    assert list(on["phases"]) == PHASES_4[which] and sorted(on) == KEYS_4[which]


# --------------------------------------------------------------------------- across processes

STARTER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import torch
    from l1bench.worker import sections
    d, name = Path(sys.argv[1]), sys.argv[2]
    started = []

    def set_device(index):  # CUDA's start: held until the test lets go
        (d / f"{name}.inside").touch()
        while not (d / f"{name}.release").exists():
            time.sleep(0.005)
        started.append(index)

    real_empty = torch.empty
    torch.cuda.is_initialized = lambda: bool(started)
    torch.cuda.set_device = set_device
    torch.empty = lambda *size, device=None, **kw: real_empty(*size, **kw)
    torch.cuda.current_blas_handle = lambda: None
    torch.cuda.synchronize = lambda device=None: None
    stats = {}
    job = {"cuda_start_outside_lock": True, "gpu_ids": ["0"], "lock_dir": str(d)}
    (d / f"{name}.ready").touch()
    sections.start_cuda_outside_lock("cuda:0", job, stats)
    (d / f"{name}.done").write_text(json.dumps(stats))
    """
)


class Starter(MarkerProcess):
    """A process starting (faked) CUDA on cuda:0 by design 6; its start lasts until released."""

    def __init__(self, tmp_path, name):
        super().__init__(tmp_path, name, STARTER)

    def stays_out(self) -> bool:
        assert self.wait("ready")
        time.sleep(SETTLE_S)
        return not self.has("inside")

    def release(self) -> None:
        """End its CUDA start (it lets go of the start flock; :meth:`stats` waits for its end)."""
        self.touch_release()

    def stats(self) -> dict:
        assert self.proc.wait(30) == 0
        return json.loads((self.dir / f"{self.name}.done").read_text())


@pytest.fixture
def starters(tmp_path):
    made = []

    def make(name):
        made.append(Starter(tmp_path, name))
        return made[-1]

    yield make
    for s in made:
        s.kill()


def test_one_process_at_a_time_starts_cuda_and_the_gpu_lock_is_independent(tmp_path, starters):
    """Two jobs' CUDA starts never overlap on one GPU; the GPU lock is neither taken by a start
    nor waited for by one (a job can time while another starts, and vice versa)."""
    a = starters("a")
    assert a.wait("inside")
    b = starters("b")
    assert b.stays_out()  # a is starting CUDA: b waits for the start flock
    gpu = gpulock.DeviceLock("cuda:0", tmp_path)
    assert gpu.try_enter()  # a's start does not hold the GPU lock
    a.release()
    assert b.wait("inside", 10)  # b starts while this process holds the GPU lock
    gpu.__exit__(None, None, None)
    b.release()
    stats_a, stats_b = a.stats(), b.stats()
    assert stats_a["cuda_started"] == stats_b["cuda_started"] == "outside the GPU lock"
    # b waited for a (at least the settling time; a for nobody), and its phase is its start only
    assert stats_a["start_lock_wait_s"] < SETTLE_S / 2 < stats_b["start_lock_wait_s"]
    assert stats_b["phases"]["cuda_init (start lock)"] < stats_b["start_lock_wait_s"]


def test_the_start_lock_is_per_gpu_and_named_like_its_gpu_lock(tmp_path):
    """One start flock per GPU, beside its GPU lock (``l1bench-gpu<name>.start``): holding
    GPU 0's keeps nobody from taking GPU 1's."""
    other = threading.Event()

    def start_on_gpu1():
        with gpulock.start_lock("cuda:1", tmp_path):
            assert held(lock_files(tmp_path, "cuda:1")[1])
            other.set()

    with gpulock.start_lock("cuda:0", tmp_path) as waited:
        assert waited < 1 and held(lock_files(tmp_path, "cuda:0")[1])
        thread = threading.Thread(target=start_on_gpu1, daemon=True)
        thread.start()
        got_it = other.wait(5)
    thread.join(10)
    assert got_it  # GPU 1's start lock was free while GPU 0's was held
    assert not held(lock_files(tmp_path, "cuda:0")[1]) and not held(lock_files(tmp_path, "cuda:1")[1])


def test_the_runner_sees_the_start_lock_as_it_sees_the_gpu_lock(tmp_path, monkeypatch):
    """Through the status file: waiting for another job's CUDA start is a wait (not counted
    against the timeout), holding the start lock is a held section (a hung start is cut
    short); the wait is in stats["lock_wait_s"], the file's running total."""
    status = tmp_path / "status.json"
    monkeypatch.setenv(gpulock.STATUS_ENV, str(status))
    path = lock_files(tmp_path)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    other = open(path, "a+")
    fcntl.flock(other, fcntl.LOCK_EX)  # another job is starting CUDA
    stats, seen = {"lock_wait_s": 1.0}, {}

    def start():
        with gpulock.start_lock("cuda:0", tmp_path, stats):
            seen["inside"] = json.loads(status.read_text())

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    time.sleep(SETTLE_S)
    waiting = json.loads(status.read_text())
    assert waiting["waiting_since"] and not waiting["holding_since"] and waiting["waited_s"] == 1.0
    assert gpulock.waited_seconds(status) >= 1.0 + SETTLE_S * 0.9 and gpulock.held_seconds(status) == 0
    other.close()  # the other start ends
    thread.join(10)
    assert seen["inside"]["holding_since"] and not seen["inside"]["waiting_since"]
    assert stats["lock_wait_s"] >= 1.0 + SETTLE_S * 0.9
    after = json.loads(status.read_text())
    assert after["holding_since"] is None and after["waited_s"] == stats["lock_wait_s"]


# --------------------------------------------------------------------------- config to worker


def test_the_flag_reaches_the_worker_only_when_on():
    """config timing.cuda_start_outside_lock: in the check and time params only when true, and
    from there on in the check and time jobs (never a build's)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert cfg["timing"]["cuda_start_outside_lock"] is False
    on = cfg | {"timing": {"shared_sections": False, "cuda_start_outside_lock": True}}
    run_task = script_module("run_task")
    for kind in ("build", "check", "time"):
        params = plan.evaluation_params(kind, "sha", on)
        if kind == "build":
            params = params | {"timing": {"cuda_start_outside_lock": True}}  # even if it were there
        smk = SimpleNamespace(
            params=SimpleNamespace(kind=kind, backend="cuda", ext_dir="e", protocol_params=params, strict=None),
            wildcards=SimpleNamespace(tid="L1_T001", mode="default", protocol="paper"),
            input=SimpleNamespace(build="b.json", check="c.json"),
            config={"results_dir": "results", "device": "h100"},
        )
        job = run_task.make_job(smk)
        assert job.get("cuda_start_outside_lock") is (None if kind == "build" else True), kind
        assert "shared_sections" not in job
        smk.params.protocol_params = plan.evaluation_params(kind, "sha", cfg)
        assert "cuda_start_outside_lock" not in run_task.make_job(smk)
    assert entry.timing_design(ON) == 6 and entry.timing_design({}) == 4


def test_the_workflow_stops_with_one_line_when_both_designs_are_on(tmp_path):
    """From the command line (strings "true"): one design plans, both stop the run with one line."""
    copy_workflow(tmp_path)

    def dry(timing):
        cmd = SNAKEMAKE + ["-n", "-q", "rules", "--config", "device=demo", f"timing={timing}"]
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    ok = dry("{cuda_start_outside_lock: true, task_worker: false}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    # design 7 is the default: design 6 alone names the flag to turn off
    alone = dry("{cuda_start_outside_lock: true}")
    assert alone.returncode != 0
    assert [ln for ln in (alone.stdout + alone.stderr).splitlines() if "cuda_start_outside_lock" in ln] == [
        "config timing: cuda_start_outside_lock and task_worker are alternative timing designs (6 and 7): "
        "turn on one of them (task_worker is on by default: set task_worker: false)"
    ]
    both = dry("{shared_sections: true, cuda_start_outside_lock: true, task_worker: false}")
    assert both.returncode != 0
    lines = [ln for ln in (both.stdout + both.stderr).splitlines() if "cuda_start_outside_lock" in ln]
    assert lines == [
        "config timing: shared_sections and cuda_start_outside_lock are alternative timing designs (5 and 6): "
        "turn on one of them"
    ]
