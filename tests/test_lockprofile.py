"""The compile step's lock profile (opt-in sampled stacks) and the CPU work moved before it."""

import json
import subprocess
import sys
import threading
import time
import weakref

from l1bench.worker import lockprofile


def test_summarize_counts_a_function_once_per_sample_and_the_innermost_as_leaf():
    stacks = [
        ["m:leaf", "m:recur", "m:recur", "m:main"],
        ["m:other", "m:recur", "m:main"],
        ["l1bench.worker.lockprofile:_run", "m:main"],
    ]
    out = lockprofile.summarize(stacks, 0.01, skip=("l1bench.worker.lockprofile:",))
    assert out["samples"] == 3 and out["sampled_s"] == 0.03
    inclusive = dict(out["inclusive_s"])
    assert inclusive["m:main"] == 0.03 and inclusive["m:recur"] == 0.02  # not 0.03: counted once per sample
    assert "l1bench.worker.lockprofile:_run" not in inclusive
    assert dict(out["leaf_s"]) == {"m:leaf": 0.01, "m:other": 0.01, "m:main": 0.01}
    assert lockprofile.summarize(stacks, 0.01, top=1)["inclusive_s"] == [["m:main", 0.03]]


def _busy_in_the_lock(seconds):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def test_the_sampler_records_untimed_steps_with_the_lock_held_only():
    held = threading.Event()
    sampler = lockprofile.StepSampler(held.is_set, interval_s=0.002)
    _busy_in_the_lock(0.05)  # no step: nothing sampled
    with sampler.step("reference warm-up"):
        _busy_in_the_lock(0.05)  # a step, but the lock is not held
        held.set()
        _busy_in_the_lock(0.2)
        with sampler.step("models to device"):  # nested: the innermost step gets the samples
            _busy_in_the_lock(0.1)
    assert sampler._idle.is_set()  # blocked again once the step is left
    with sampler.step("timed pairs"), sampler.step("warm-up calls"):  # timed: never sampled
        _busy_in_the_lock(0.1)
    time.sleep(0.02)
    assert set(sampler.stacks) == {"reference warm-up", "models to device"}
    n = len(sampler.stacks["reference warm-up"])
    assert n >= 10 and len(sampler.stacks["models to device"]) >= 5
    summary = sampler.summary()
    inclusive = dict(summary["reference warm-up"]["inclusive_s"])
    assert inclusive[f"{__name__}:_busy_in_the_lock"] >= 0.5 * n * 0.002
    assert not any(name.startswith("l1bench.worker.lockprofile:") for name in inclusive)
    assert len(sampler.stacks["reference warm-up"]) == n  # nothing after the step ended


def test_the_sampler_is_opt_in(monkeypatch):
    monkeypatch.setattr(lockprofile, "ACTIVE", None)
    for value in ("", "0"):
        assert lockprofile.start_if_asked(lambda: True, env={lockprofile.PROFILE_ENV: value}) is None
    assert lockprofile.start_if_asked(lambda: True, env={}) is None
    assert lockprofile.ACTIVE is None
    with lockprofile.step("x"):  # without a sampler: a no-op
        pass
    env = {lockprofile.PROFILE_ENV: "1", lockprofile.INTERVAL_ENV: "0.001"}
    sampler = lockprofile.start_if_asked(lambda: True, env=env)
    assert sampler is lockprofile.ACTIVE and sampler.interval_s == 0.001
    assert lockprofile.start_if_asked(lambda: True, env=env) is sampler  # one per process


def test_prepare_compile_imports_before_the_section_without_starting_cuda():
    """In a fresh process: inductor's compile_fx is imported and a compile wrapper made, no CUDA."""
    code = (
        "import sys, json\n"
        "from l1bench.worker import torch_hooks\n"
        "before = 'torch._inductor.compile_fx' in sys.modules\n"
        "s = torch_hooks.prepare_compile('torch_compile')\n"
        "import torch\n"
        "print(json.dumps([before, 'torch._inductor.compile_fx' in sys.modules, s, torch.cuda.is_initialized()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    before, after, seconds, cuda = json.loads(out.stdout.strip().splitlines()[-1])
    assert (before, after, cuda) == (False, True, False)
    assert seconds > 0


def test_prepare_compile_leaves_errors_to_the_section(monkeypatch):
    from l1bench.worker import torch_hooks

    def broken(model, mode):
        raise RuntimeError("no inductor here")

    monkeypatch.setattr(torch_hooks, "wrap_baseline", broken)
    assert torch_hooks.prepare_compile("torch_compile") >= 0


def test_prepare_compile_does_nothing_inside_the_lock(tmp_path):
    from l1bench import gpulock
    from l1bench.worker import torch_hooks

    with gpulock.device_lock("cpu", tmp_path, {}):
        assert torch_hooks.prepare_compile("torch_compile") is None
    assert torch_hooks.prepare_compile("torch_compile") >= 0


class _Payload:
    pass


def _hold_a_local_for(seconds):
    payload = _Payload()
    _busy_in_the_lock(seconds)
    return weakref.ref(payload)


def test_the_sampler_keeps_no_frame_and_so_no_local_alive():
    """A sampled frame held between samples keeps its locals (tensors) alive after its
    function returned: CUDA graph trees then fail with "tensor(s) in the cudagraph pool not
    tracked as outputs" (the reduce-overhead mode with the profiler on, session nine). One
    sample at 0.2 s, inside the function; checked at 0.3 s, before the next one."""
    sampler = lockprofile.StepSampler(lambda: True, interval_s=0.2)
    with sampler.step("compile"):
        ref = _hold_a_local_for(0.3)
        alive = ref() is not None
        assert len(sampler.stacks["compile"]) == 1
    assert not alive
