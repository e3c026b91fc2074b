"""Timing design 5 (opt-in ``timing.shared_sections``): the GPU lock's shared and exclusive
modes (several shared holders at once, none beside an exclusive one, writer preference, only
the exclusive holder pinned) and the worker's use of them (CPU only)."""

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import MarkerProcess, script_module

from l1bench import gpulock, plan, timingcpus
from l1bench.worker import entry, protocols, sections, stages

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock semantics")

ROOT = Path(__file__).resolve().parents[1]
SETTLE_S = 0.4  # how long a taker that should be blocked is given to (wrongly) get the lock

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from l1bench import gpulock
    lock_dir, mode, name = sys.argv[1], sys.argv[2], sys.argv[3]
    mode = None if mode == "plain" else mode
    d = Path(lock_dir)
    with gpulock.device_lock("cpu", lock_dir, {}, mode=mode):
        (d / f"{name}.held").touch()
        while not (d / f"{name}.release").exists():
            time.sleep(0.005)
    (d / f"{name}.done").touch()
    """
)


class Holder(MarkerProcess):
    """A process that takes the CPU device's lock in ``mode`` and holds it until released."""

    def __init__(self, tmp_path, mode, name):
        super().__init__(tmp_path, name, HOLDER, mode or "plain")

    def held(self) -> bool:
        return self.has("held")

    def wait_held(self, timeout=10.0) -> bool:
        return self.wait("held", timeout)

    def stays_blocked(self) -> bool:
        time.sleep(SETTLE_S)
        return not self.held()

    def release(self) -> None:
        self.touch_release()
        self.proc.wait(10)


@pytest.fixture
def holders(tmp_path):
    made = []

    def make(mode, name):
        h = Holder(tmp_path, mode, name)
        made.append(h)
        return h

    yield make
    for h in made:
        h.kill()


def test_two_processes_hold_the_lock_shared_at_once(holders):
    a = holders(gpulock.SHARED, "a")
    assert a.wait_held()
    b = holders(gpulock.SHARED, "b")
    assert b.wait_held(5) and not (a.dir / "a.done").exists()  # both hold it now
    a.release()
    b.release()


def test_no_more_shared_sections_at_once_than_the_gpu_has_slots(holders, monkeypatch):
    """L1BENCH_SHARED_SLOTS=2: a third shared taker waits until one of two holders lets go."""
    monkeypatch.setenv(gpulock.SHARED_SLOTS_ENV, "2")
    a, b = holders(gpulock.SHARED, "a"), holders(gpulock.SHARED, "b")
    assert a.wait_held() and b.wait_held()
    c = holders(gpulock.SHARED, "c")
    assert c.stays_blocked()
    b.release()
    assert c.wait_held() and a.held()
    a.release()
    c.release()


def test_shared_slots_in_one_process(tmp_path, monkeypatch):
    """The slots bound shared sections only (an exclusive one takes none); a full set refuses
    try_enter, a released or paused section gives its slot back; a bad value is one clear error."""
    monkeypatch.setenv(gpulock.SHARED_SLOTS_ENV, "1")
    stats = {}
    first = gpulock.device_lock("cpu", tmp_path, stats, mode=gpulock.SHARED)
    with first:
        assert stats["shared_slots"] == 1
        assert not gpulock.device_lock("cpu", tmp_path, {}, mode=gpulock.SHARED).try_enter()
        with first.paused():  # a paused section holds no slot
            second = gpulock.device_lock("cpu", tmp_path, {}, mode=gpulock.SHARED)
            assert second.try_enter()
            second.__exit__(None, None, None)
    with gpulock.device_lock("cpu", tmp_path, {}, mode=gpulock.EXCLUSIVE):
        pass
    again = gpulock.device_lock("cpu", tmp_path, {}, mode=gpulock.SHARED)
    assert again.try_enter()  # the slot came back at release
    again.__exit__(None, None, None)
    monkeypatch.setenv(gpulock.SHARED_SLOTS_ENV, "0")
    with pytest.raises(ValueError, match="L1BENCH_SHARED_SLOTS='0'"):
        gpulock.shared_slots()
    monkeypatch.delenv(gpulock.SHARED_SLOTS_ENV)
    assert gpulock.shared_slots() == gpulock.DEFAULT_SHARED_SLOTS


@pytest.mark.parametrize("exclusive_mode", [gpulock.EXCLUSIVE, None])
def test_an_exclusive_section_excludes_shared_ones_both_ways(holders, exclusive_mode):
    """Exclusive (gated, or design 4's plain lock of another run on the same GPU) and shared
    sections never overlap, whichever came first."""
    x = holders(exclusive_mode, "x")
    assert x.wait_held()
    s = holders(gpulock.SHARED, "s")
    assert s.stays_blocked()  # exclusive held: no shared taker gets in
    x.release()
    assert s.wait_held()
    y = holders(exclusive_mode, "y")
    assert y.stays_blocked()  # shared held: no exclusive taker gets in
    s.release()
    assert y.wait_held()
    y.release()


def test_a_waiting_exclusive_taker_keeps_new_shared_takers_out(holders):
    """Writer preference: with a shared section held and an exclusive taker waiting, a new
    shared taker waits behind the exclusive one (a plain reader/writer flock would let it in,
    and a stream of them would starve the exclusive taker)."""
    s1 = holders(gpulock.SHARED, "s1")
    assert s1.wait_held()
    x = holders(gpulock.EXCLUSIVE, "x")
    assert x.stays_blocked()
    s2 = holders(gpulock.SHARED, "s2")
    assert s2.stays_blocked()  # only a shared section is held, yet it waits: x is queued
    s1.release()
    assert x.wait_held() and not s2.held()
    assert s2.stays_blocked()
    x.release()
    assert s2.wait_held()
    s2.release()


def test_only_the_exclusive_holder_runs_on_the_timing_cpu(tmp_path, monkeypatch):
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    monkeypatch.setenv(timingcpus.TIMING_CPU_ENV, str(cpu))
    with gpulock.device_lock("cpu", tmp_path, {}, mode=gpulock.SHARED) as lock:
        assert os.sched_getaffinity(0) == before and lock._restore is None
    with gpulock.device_lock("cpu", tmp_path, {}, mode=gpulock.EXCLUSIVE):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before
    with gpulock.device_lock("cpu", tmp_path, {}):  # design 4's lock: pinned, as always
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before


def test_a_shared_release_moves_threads_off_the_timing_cpu(monkeypatch, tmp_path):
    masks = {0: set(range(15)), 101: set(range(15))}
    monkeypatch.setattr(os, "sched_getaffinity", lambda tid: set(masks[tid]))
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: masks.__setitem__(tid, set(cpus)))
    monkeypatch.setattr(os, "listdir", lambda path: ["101"] if path == "/proc/self/task" else [])
    monkeypatch.setenv(timingcpus.TIMING_CPU_ENV, "15")
    with gpulock.device_lock("cpu", tmp_path, {}, mode=gpulock.SHARED):
        assert masks[0] == set(range(15))  # not pinned
        masks[101] = {15}  # a thread that got onto the timing CPU anyway
    assert masks[101] == set(range(15))


def test_the_device_is_synchronised_before_a_shared_section_is_released(tmp_path, monkeypatch):
    """sections.shared on a (faked) CUDA device: synchronised and its cache emptied while the
    shared lock is still held; the device synchronised before a pause too; no GC inside."""
    import gc

    import torch

    events = []

    def now(what):
        lock = gpulock.DeviceLock.current
        events.append((what, None if lock is None else lock.mode))

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: now("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: now("empty"))
    job = {"shared_sections": True, "lock_device": "cuda:0", "lock_dir": str(tmp_path)}
    stats = {"cuda_started": "faked"}  # open_device: nothing to start
    with sections.shared("cuda:0", job, stats):
        assert gpulock.DeviceLock.current.mode == gpulock.SHARED and not gc.isenabled()
        with gpulock.DeviceLock.pause_current():
            now("paused")
        now("inside")
    assert events == [
        ("sync", gpulock.SHARED), ("paused", None), ("inside", gpulock.SHARED),
        ("sync", gpulock.SHARED), ("empty", gpulock.SHARED),
    ]
    assert gc.isenabled() and stats["lock_shared_s"] > 0 and "lock_held_s" not in stats
    # without the flag the same call is design 4's exclusive section (the plain lock)
    with sections.shared("cuda:0", {"lock_device": "cuda:0", "lock_dir": str(tmp_path)}, stats):
        assert gpulock.DeviceLock.current.mode is None


def test_lock_status_and_lock_time_in_both_modes(tmp_path, monkeypatch):
    """The runner's view (held_seconds, waited_seconds) covers shared sections too; lock_held_s,
    held_so_far and phases_locked count exclusive time only, shared time goes to lock_shared_s
    and phases_shared."""
    status = tmp_path / "status.json"
    monkeypatch.setenv(gpulock.STATUS_ENV, str(status))
    stats = {}
    with gpulock.device_lock("cpu", tmp_path, stats, mode=gpulock.SHARED):
        with sections.phase(stats, "shared step"):
            time.sleep(0.03)
            assert gpulock.held_seconds(status) > 0.02
            assert json.loads(status.read_text())["mode"] == gpulock.SHARED
            assert gpulock.DeviceLock.held_so_far(stats) == 0
            assert gpulock.DeviceLock.held_so_far(stats, shared=True) > 0.02
    assert gpulock.held_seconds(status) == 0
    with gpulock.device_lock("cpu", tmp_path, stats, mode=gpulock.EXCLUSIVE):
        with sections.phase(stats, "exclusive step"):
            time.sleep(0.03)
            assert gpulock.held_seconds(status) > 0.02
    assert stats["lock_shared_s"] >= 0.03 and stats["lock_held_s"] >= 0.03
    assert stats["phases_locked"]["shared step"] == 0 and stats["phases_shared"]["shared step"] >= 0.03
    assert stats["phases_locked"]["exclusive step"] >= 0.03 and "exclusive step" not in stats["phases_shared"]
    assert gpulock.waited_seconds(status) == pytest.approx(stats["lock_wait_s"], abs=1e-6)


def test_a_shared_section_is_placed_on_an_idle_gpu_first(tmp_path):
    gpus = ["cuda:0", "cuda:1"]
    with gpulock.device_lock("cuda:0", tmp_path, {}, mode=gpulock.SHARED):
        i, lock = gpulock.claim_free_device(gpus, tmp_path, {}, mode=gpulock.SHARED)
        assert i == 1 and lock.shared  # GPU 0 admits it too, but GPU 1 is idle
        j, other = gpulock.claim_free_device(gpus, tmp_path, {}, mode=gpulock.SHARED)
        assert j in (0, 1)  # none idle: any that admits a shared section
        other.__exit__(None, None, None)
        lock.__exit__(None, None, None)
    with gpulock.device_lock("cuda:0", tmp_path, {}, mode=gpulock.EXCLUSIVE):
        i, lock = gpulock.claim_free_device(gpus, tmp_path, {}, mode=gpulock.SHARED)
        assert i == 1
        lock.__exit__(None, None, None)


# --------------------------------------------------------------------------- the worker

PAPER = {
    "seed": 42, "correctness_trials": 3, "atol": 0.01, "rtol": 0.01, "warmup": 1, "outer_trials": 2,
    "inner_trials": 3, "early_stop_below": None, "inputs_on_device": True,
}
STRICT = {
    "rse_target": 0.05, "min_reps": 5, "max_reps": 20, "budget_s": 3, "sync_mismatch": 1.5, "l2_factor": 1.5, "seed": 42
}
DETECTORS = {
    "n_calls": 2, "precision_factor": 10, "precision_floor": 1e-6, "speedup_ceiling": 10, "seed": 42, "atol": 0.01,
    "rtol": 0.01,
}
# What design 4 records (main before shared sections, demo task L1_T001; strict results also
# their strict_params since 2026-12-05): the steps, in order
PHASES_4 = {
    "check": ["reference warm-up", "models to device", "laziness", "correctness"],
    "check_detectors": ["reference warm-up", "models to device", "laziness", "correctness", "detectors"],
    "paper": ["reference warm-up", "models to device", "warm-up calls", "timed pairs"],
    "strict": ["reference warm-up", "strict"],
}
KEYS_4 = {
    "check": [
        "details", "flags", "kind", "lock_held_s", "lock_wait_s", "params", "phases", "phases_locked", "provenance",
        "reason", "snippet_sha256", "status", "tid", "timing_design", "trials_passed",
    ],
    "paper": [
        "clocks_after", "clocks_before", "construct", "custom_ms", "custom_ms_mean", "flags", "host_timing", "kind",
        "lock_held_s", "lock_wait_s", "mode", "n_timings", "params", "phases", "phases_locked", "precompile_s",
        "protocol", "provenance", "reason", "ref_ms", "ref_ms_mean", "score", "score_std", "snippet_sha256",
        "status", "tid", "timing_design", "trial_scores",
    ],
    "strict": [
        "clocks_after", "clocks_before", "construct", "flags", "kind", "lock_held_s", "lock_wait_s", "mode",
        "n_timings", "params", "phases", "phases_locked", "precompile_s", "protocol", "provenance", "reason",
        "score", "score_std", "snippet_sha256", "status", "strict", "strict_params", "tid", "timing_design",
    ],
}
KEYS_4["check_detectors"] = KEYS_4["check"]


def demo_job(tasks, tmp_path, which, **extra):
    (tmp_path / "c.json").write_text(json.dumps({"kind": "check", "status": "pass", "reason": ""}))
    (tmp_path / "b.json").write_text(json.dumps({"kind": "build", "status": "ok", "reason": ""}))
    job = {
        "backend": "cpu", "tid": "L1_T001", "task_dir": str(tasks / "L1_T001"), "ext_dir": str(tmp_path / "ext"),
        "params": dict(PAPER), "lock_dir": str(tmp_path),
    }
    kinds = {
        "check": {"kind": "check", "build_result": str(tmp_path / "b.json")},
        "check_detectors": {"kind": "check", "build_result": str(tmp_path / "b.json"), "detectors": DETECTORS},
        "paper": {"kind": "time", "check_result": str(tmp_path / "c.json"), "mode": "default", "protocol": "paper"},
        "strict": {
            "kind": "time", "check_result": str(tmp_path / "c.json"), "mode": "default", "protocol": "strict",
            "strict": STRICT,
        },
    }
    return job | kinds[which] | extra


@pytest.fixture
def trace(monkeypatch):
    """(step, lock mode held as it starts) for every recorded step, and ("first section", mode)
    for the job's first section, where CUDA starts (open_device)."""
    seen = []
    real_phase, real_open = sections.phase, sections.open_device

    def phase(stats, name):
        lock = gpulock.DeviceLock.current
        seen.append((name, "none" if lock is None else lock.mode or "plain"))
        return real_phase(stats, name)

    def open_device(device, stats):
        if "traced_open" not in seen:
            lock = gpulock.DeviceLock.current
            seen.append(("first section", lock.mode or "plain"))
            seen.append("traced_open")
        return real_open(device, stats)

    for module in (sections, stages, protocols):
        monkeypatch.setattr(module, "phase", phase)
    monkeypatch.setattr(sections, "open_device", open_device)
    return seen


def modes_of(seen):
    out = {}
    for item in seen:
        if item != "traced_open":
            out.setdefault(item[0], set()).add(item[1])
    return out


@pytest.mark.parametrize("which", ["check", "check_detectors", "paper", "strict"])
def test_with_the_flag_off_results_are_design_4s(tasks, tmp_path, trace, which):
    res = entry.run(demo_job(tasks, tmp_path, which))
    assert res["status"] in ("ok", "pass") and res["timing_design"] == 4
    assert list(res["phases"]) == list(res["phases_locked"]) == PHASES_4[which]
    assert sorted(res) == KEYS_4[which]
    assert all(m == {"plain"} for m in modes_of(trace).values())


def test_with_the_flag_on_timed_pairs_are_exclusive_and_the_rest_shared(tasks, tmp_path, trace):
    res = entry.run(demo_job(tasks, tmp_path, "paper", shared_sections=True))
    assert res["status"] == "ok" and res["timing_design"] == 5 and res["n_timings"] == 6
    modes = modes_of(trace)
    assert modes["first section"] == {gpulock.SHARED}  # CUDA starts in a shared section
    for step in ("reference warm-up", "models to device"):
        assert modes[step] == {gpulock.SHARED}, step
    for step in ("warm-up calls", "timed pairs"):
        assert modes[step] == {gpulock.EXCLUSIVE}, step
    # per outer trial: models placed (shared), then warm-up and timed pairs in ONE exclusive section
    steps = [s for s in trace if s != "traced_open" and s[0] != "first section"]
    assert steps == [("reference warm-up", gpulock.SHARED)] + [
        ("models to device", gpulock.SHARED), ("warm-up calls", gpulock.EXCLUSIVE),
        ("timed pairs", gpulock.EXCLUSIVE),
    ] * 2
    assert set(res["phases_shared"]) == {"reference warm-up", "models to device"}
    assert res["phases_locked"]["reference warm-up"] == 0 and res["lock_shared_s"] > 0
    assert res["lock_held_s"] >= res["phases_locked"]["timed pairs"] > 0


def test_with_the_flag_on_the_check_is_shared_but_its_detectors(tasks, tmp_path, trace):
    res = entry.run(demo_job(tasks, tmp_path, "check_detectors", shared_sections=True))
    assert res["status"] == "pass" and res["timing_design"] == 5 and res["flags"] == []
    modes = modes_of(trace)
    assert modes["first section"] == {gpulock.SHARED}
    for step in ("reference warm-up", "models to device", "laziness", "correctness"):
        assert modes[step] == {gpulock.SHARED}, step
    assert modes["detectors"] == {gpulock.EXCLUSIVE}


def test_with_the_flag_on_strict_timing_is_exclusive(tasks, tmp_path, trace):
    res = entry.run(demo_job(tasks, tmp_path, "strict", shared_sections=True))
    assert res["status"] == "ok" and res["timing_design"] == 5
    modes = modes_of(trace)
    assert modes["models to device"] == {gpulock.SHARED} and modes["strict"] == {gpulock.EXCLUSIVE}


def test_the_flag_reaches_the_worker_only_when_on():
    """config timing.shared_sections: in the check and time params only when true (committed
    results keep their params hash), and from there on the worker's job."""
    import yaml

    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert cfg["timing"]["shared_sections"] is False
    for kind in ("build", "check", "time"):
        assert "timing" not in plan.evaluation_params(kind, "sha", cfg)
    on = cfg | {"timing": {"shared_sections": True}}
    assert "timing" not in plan.evaluation_params("build", "sha", on)
    run_task = script_module("run_task")
    for kind in ("check", "time"):
        params = plan.evaluation_params(kind, "sha", on)
        assert params["timing"] == {"shared_sections": True}
        smk = SimpleNamespace(
            params=SimpleNamespace(kind=kind, backend="cuda", ext_dir="e", protocol_params=params, strict=None),
            wildcards=SimpleNamespace(tid="L1_T001", mode="default", protocol="paper"),
            input=SimpleNamespace(build="b.json", check="c.json"),
            config={"results_dir": "results", "device": "h100"},
        )
        assert run_task.make_job(smk)["shared_sections"] is True
        smk.params.protocol_params = plan.evaluation_params(kind, "sha", cfg)
        assert "shared_sections" not in run_task.make_job(smk)


def test_the_flag_is_typed_from_the_command_line():
    cfg = {"timing": {"shared_sections": "true"}}
    plan.normalise_cli_values(cfg)
    assert cfg["timing"]["shared_sections"] is True
