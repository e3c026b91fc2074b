"""Keeping timed sections clean: the host's accounting of timed calls, re-timing disturbed
pairs, nothing of a job on the GPU or the timing CPU outside its lock (CPU only)."""

import os
import random
import threading
import time

import pytest

from l1bench import snippet
from l1bench.gpu import gpulock, gpus, sections, timingcpus
from l1bench.timing import harness, hostclock
from l1bench.worker import entry, torch_hooks


def delta(wall_us, run_us, wait_us, nvcsw=0, nivcsw=0):
    return hostclock.Delta(wall_us * 1000, run_us * 1000, None if wait_us is None else wait_us * 1000, nvcsw, nivcsw)


def test_delta_says_when_the_thread_was_kept_from_running():
    clean = delta(30, 29, 0)
    assert not clean.disturbed() and clean.disturbed_ns == 1000  # a microsecond: noise
    preempted = delta(4130, 30, 4100, nivcsw=1)
    assert preempted.disturbed() and preempted.disturbed_ns == 4_100_000
    stolen = delta(4130, 30, 0)  # neither running nor waiting, never slept: the hypervisor
    assert stolen.lost_ns == 4_100_000 and stolen.disturbed()
    slept = delta(4130, 30, 0, nvcsw=1)  # the timed code itself slept (a blocking wait)
    assert not slept.disturbed()


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux only")
def test_thread_clock_sees_its_own_thread():
    with hostclock.ThreadClock() as clock:
        assert clock.available
        before = clock.sample()
        x = 0
        for i in range(200_000):
            x += i
        d = clock.delta(before, clock.sample())
    assert d.wall_ns > 0 and 0 < d.run_ns <= d.wall_ns * 1.05 and d.wait_ns is not None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity")
def test_thread_clock_sees_a_preemption():
    """Two busy threads on one CPU: the one that is timed waits for the CPU, and says so."""
    cpu = min(os.sched_getaffinity(0))
    stop = threading.Event()

    def hog():
        os.sched_setaffinity(0, {cpu})
        while not stop.is_set():
            pass

    before_mask = os.sched_getaffinity(0)
    t = threading.Thread(target=hog, daemon=True)
    t.start()
    try:
        os.sched_setaffinity(0, {cpu})
        with hostclock.ThreadClock() as clock:
            before = clock.sample()
            x = 0
            for i in range(3_000_000):  # long enough to be preempted by the hog (ticks of <= 10 ms)
                x += i
            d = clock.delta(before, clock.sample())
    finally:
        stop.set()
        t.join()
        os.sched_setaffinity(0, before_mask)
    assert d.wait_ns > 1_000_000 and d.disturbed() and d.nivcsw > 0


class FakeClock:
    """A ThreadClock whose samples say the host disturbed the calls numbered in ``bad``."""

    def __init__(self, bad=()):
        self.bad, self.n, self.t = set(bad), 0, 0

    def sample(self):
        self.t += 1
        return self.t

    def delta(self, before, after):
        self.n += 1
        return delta(4130, 30, 4100, nivcsw=1) if self.n in self.bad else delta(30, 29, 0)


def pairs(clock, n=4, seed=42):
    calls = []
    base = lambda *x: calls.append("ref")  # noqa: E731
    custom = lambda *x: calls.append("custom")  # noqa: E731
    ledger = hostclock.Ledger()
    ref, cus = harness.timed_pairs(base, custom, lambda: (), n, random.Random(seed), "cpu", [], ledger, 0, clock)
    return ref, cus, calls, ledger


def test_undisturbed_pairs_are_exactly_the_harness_pairs():
    ref, cus, calls, ledger = pairs(FakeClock())
    rng = random.Random(42)
    expected = []
    for _ in range(4):
        expected += ["ref", "custom"] if rng.random() < 0.5 else ["custom", "ref"]
    assert calls == expected and len(ref) == len(cus) == 4
    assert ledger.summary()["retimed_pairs"] == 0 and ledger.summary()["calls"] == 8
    # the result records who ran first in each pair (the first call of a pair is the slower one)
    assert ledger.summary()["ref_first"] == [[calls[i] == "ref" for i in range(0, 8, 2)]]


def test_the_recorded_order_follows_the_pairs_kept(monkeypatch):
    """A re-timed pair's order is the replacement's: ref_first lines up with ref_ms."""
    _, _, calls, ledger = pairs(FakeClock(bad={3}))  # the second pair is disturbed and drawn again
    kept = [calls[i] == "ref" for i in (0, 4, 6, 8)]  # pairs 1, 3, 4, 5 (calls 3-4 were pair 2)
    assert ledger.summary()["ref_first"] == [kept]
    # the first pair timed again after the trial: its replacement's order stands first
    ref, cus, calls, resets, summary = first_pair_run(monkeypatch, {1: 9.0}, {1: 8.5})
    assert summary["ref_first"] == [[calls[10] == "ref"] + [calls[i] == "ref" for i in (2, 4, 6, 8)]]


def test_a_disturbed_pair_is_timed_again():
    ref, cus, calls, ledger = pairs(FakeClock(bad={3}))  # the first call of the second pair
    assert len(ref) == len(cus) == 4 and len(calls) == 10  # one pair more
    summary = ledger.summary()
    assert summary["retimed_pairs"] == 1 and summary["disturbed_calls"] == 1
    assert (0, 1) in ledger.retimed


def test_re_timing_is_bounded():
    ref, cus, calls, ledger = pairs(FakeClock(bad=set(range(1, 100))), n=3)
    assert len(ref) == 3 and len(calls) == 12  # 3 extra pairs at most, then every pair is kept
    assert ledger.summary()["retimed_pairs"] == 3


def test_a_side_is_host_bound_when_its_launch_is_most_of_its_timed_call():
    """Shares from host_timing.launch_median_us (µs) over the median timed call (ms, every
    trial's calls); a result without launches says nothing (None), one bound by the GPU []."""
    res = {"ref_ms": [[1.0, 1.0], [1.2, 0.9]], "custom_ms": [[0.05, 0.05, 0.06]],
           "host_timing": {"launch_median_us": {"ref": 100, "custom": 48}}}
    assert hostclock.launch_shares(res) == {"ref": pytest.approx(0.1), "custom": pytest.approx(0.96)}
    assert hostclock.host_bound_sides(res) == ["custom"]
    assert hostclock.host_bound_sides(res, share=0.05) == ["ref", "custom"]
    assert hostclock.host_bound_sides({**res, "custom_ms": [[1.0]]}) == []
    no_custom = {"launch_median_us": {"ref": 100, "custom": None}}
    assert hostclock.host_bound_sides({**res, "host_timing": no_custom}) is None
    assert hostclock.host_bound_sides({k: v for k, v in res.items() if k != "host_timing"}) is None
    assert hostclock.host_bound_sides({**res, "ref_ms": []}) is None


def test_releasing_the_lock_moves_threads_started_in_the_section_off_the_timing_cpu(monkeypatch, tmp_path):
    masks = {0: set(range(16)), 101: set(range(16))}
    monkeypatch.setattr(os, "sched_getaffinity", lambda tid: set(masks[tid]))
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: masks.__setitem__(tid, set(cpus)))
    monkeypatch.setattr(os, "listdir", lambda path: ["101", "102"] if path == "/proc/self/task" else [])
    monkeypatch.setenv(timingcpus.TIMING_CPU_ENV, "15")
    masks[0] = set(range(15))
    with gpulock.device_lock("cpu", tmp_path):
        assert masks[0] == {15}
        masks[102] = {15}  # a thread started inside the section inherits the timing CPU
    # every thread that may run on the timing CPU is moved off it, the new one included
    assert masks[0] == masks[101] == masks[102] == set(range(15))
    assert timingcpus.unpin_threads(15, set(range(15))) == 0  # nothing left there
    # ... and, on request, inside the section: all but the calling thread
    import threading

    me = threading.get_native_id()
    masks[me] = set(range(16))
    monkeypatch.setattr(os, "listdir", lambda path: ["101", "102", str(me)] if path == "/proc/self/task" else [])
    with gpulock.device_lock("cpu", tmp_path) as lock:
        masks[101] = {15}  # a driver thread started by the pinned thread
        assert lock.move_other_threads_off() == 1 and masks[101] == set(range(15))


def test_the_device_is_synchronised_before_the_lock_is_paused(tmp_path):
    events = []
    lock = gpulock.device_lock("cpu", tmp_path, {}, before_pause=lambda: events.append("sync"))
    with lock:
        with gpulock.DeviceLock.pause_current():
            events.append("paused" if gpulock.DeviceLock.current is None else "held")
        assert gpulock.DeviceLock.current is lock
    assert events == ["sync", "paused"]
    with lock:  # timed calls never let go of the lock
        with gpulock.DeviceLock.no_pause(), gpulock.DeviceLock.pause_current():
            assert gpulock.DeviceLock.current is lock


def test_dynamo_compiles_let_go_of_the_lock_and_kernels_keep_it(tmp_path):
    """Inside a section, a compiled model's tracing and code generation run with the lock
    released; its graphs and the eager code between them (a graph break) run with it held."""
    import torch

    assert torch_hooks.release_lock_during_dynamo_compiles()
    seen = []

    @torch._dynamo.disable
    def eager(y):  # code dynamo does not compile: it runs eagerly between two graphs
        seen.append(gpulock.DeviceLock.current is not None)
        return y + 1

    class Broken(torch.nn.Module):
        def forward(self, x):
            return eager(torch.tanh(x)) * 2

    model = torch_hooks.wrap_baseline(Broken(), "torch_compile")
    stats = {}
    with gpulock.device_lock("cpu", tmp_path, stats) as lock:
        out = model(torch.randn(5))
        assert gpulock.DeviceLock.current is lock
    assert stats["lock_paused_n"] >= 1 and seen and all(seen) and out.shape == (5,)
    n = stats["lock_paused_n"]
    with gpulock.device_lock("cpu", tmp_path, stats):
        model(torch.randn(5))  # compiled already: nothing released
    assert stats["lock_paused_n"] == n


def test_the_worker_picks_its_gpu_without_starting_cuda(monkeypatch):
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    monkeypatch.setattr(timingcpus, "reserve_timing_cpus", lambda n, i: None)
    job = {"backend": "cuda", "tid": "L1_T001", "mode": "default"}
    assert entry.pick_device(job) == "cuda:0" and job["gpu_ids"] == ["2", "5"]
    assert not torch.cuda.is_initialized()  # placed at the first section, where CUDA starts
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(snippet.InfraError):
        entry.pick_device({"backend": "cuda", "tid": "L1_T001"})


def test_visible_gpus_from_the_drivers_proc_entries(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (tmp_path / bus).mkdir()
    assert gpus.visible_gpu_count(str(tmp_path)) == 2


def test_provenance_never_starts_cuda(monkeypatch):
    import torch

    from l1bench import provenance

    def starts_cuda(*a):
        raise AssertionError("asked the driver")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", starts_cuda)
    info = provenance.environment("cuda:0")  # CUDA not started: no GPU properties asked for
    assert info["gpu"] is None and not torch.cuda.is_initialized()


def test_a_result_names_the_host_cpu_it_was_timed_on(tmp_path):
    from l1bench import provenance

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9454 48-Core Processor\n")
    assert provenance.cpu_model(str(cpuinfo)) == "AMD EPYC 9454 48-Core Processor"
    assert "cpu_model" in provenance.environment("cpu")


def test_seeding_does_not_start_the_driver(monkeypatch):
    import torch

    from l1bench import snippet

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    snippet.set_seed(3)
    assert not asked and not torch.cuda.is_initialized()


def test_placement_takes_any_free_gpu_so_none_idles_while_jobs_wait(tmp_path):
    """Three GPUs, five jobs of uneven length: the first three get three different GPUs at
    once; the fourth waits only while all three are busy and takes whichever frees first."""
    gpus = [f"cuda:{i}" for i in range(3)]
    got, released = {}, {i: threading.Event() for i in range(5)}
    holding = []

    def job(n):
        index, lock = gpulock.claim_free_device(gpus, tmp_path, {}, poll_s=0.001)
        got[n] = index
        holding.append(n)
        released[n].wait(10)
        holding.remove(n)
        lock.__exit__(None, None, None)

    threads = [threading.Thread(target=job, args=(n,)) for n in range(5)]
    for t in threads[:3]:
        t.start()
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sorted(got.values()) == [0, 1, 2]  # three jobs, three GPUs: none shares while one idles
    threads[3].start()
    time.sleep(0.05)
    assert 3 not in got  # every GPU busy: it waits
    second = next(n for n, i in got.items() if i == 1)
    released[second].set()  # the GPU of index 1 frees first (not the one a hash would pick)
    while 3 not in got and time.monotonic() < deadline:
        time.sleep(0.001)
    assert got[3] == 1
    threads[4].start()
    for n in range(5):
        released[n].set()
    for t in threads:
        t.join(10)
    assert len(got) == 5 and not holding


def test_the_first_section_places_the_job_on_a_free_gpu_and_shows_it_only_that_one(tmp_path, monkeypatch):
    """Later sections lock ``job["lock_device"]``, the same GPU (its models are there)."""
    monkeypatch.setattr(timingcpus, "timing_cpu_of", lambda i: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # restored afterwards
    job = {"gpu_ids": ["0", "1"], "lock_dir": str(tmp_path)}
    with gpulock.device_lock("cuda:0", tmp_path):  # GPU 0 busy: the job is placed on GPU 1
        lock = sections.claim_gpu(job, {}, None)
    assert job["lock_device"] == "cuda:1" and os.environ.get("CUDA_VISIBLE_DEVICES") == "1"
    lock.__exit__(None, None, None)


def test_gpu_locks_are_named_after_the_physical_gpu(tmp_path):
    """Two runs naming one GPU differently (index or UUID) share its lock file."""
    for bus, uuid in (("0000:2a:00.0", "GPU-bbb"), ("0000:18:00.0", "GPU-aaa")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: NVIDIA H200\nGPU UUID: {uuid}\nBus Location: {bus}\n")
    assert gpus.physical_gpu_name("0", str(tmp_path)) == "GPU-aaa"  # PCI bus order
    assert gpus.physical_gpu_name("1", str(tmp_path)) == "GPU-bbb"
    assert gpus.physical_gpu_name("GPU-bbb", str(tmp_path)) == "GPU-bbb"
    assert gpus.physical_gpu_name("7", str(tmp_path)) == "7"  # not in /proc: as named


class ScriptedCalls:
    """harness.time_call replaced: call k (from 1) takes ``ms.get(k, 1.0)`` ms, and its launch
    took ``launch_ms.get(k, 0.03)`` ms on the host."""

    def __init__(self, ms, launch_ms=None):
        self.ms, self.launch_ms, self.n, self.log = ms, launch_ms or {}, 0, []

    def __call__(self, fn, inputs, device, wait_streams=(), clock=None):
        self.n += 1
        fn(*inputs)
        launch = self.launch_ms.get(self.n, 0.03)
        if isinstance(launch, tuple):  # ("wait", ms): preempted while launching
            wait_us = int(launch[1] * 1000)
            return self.ms.get(self.n, 1.0), delta(wait_us + 30, 30, wait_us, nivcsw=1)
        launch_us = int(launch * 1000)
        return self.ms.get(self.n, 1.0), delta(launch_us, launch_us, 0)


def first_pair_run(monkeypatch, ms, launch_ms=None, n=5):
    calls, resets = [], []
    scripted = ScriptedCalls(ms, launch_ms)
    monkeypatch.setattr(harness, "time_call", scripted)  # where timed_pairs looks it up
    ledger = hostclock.Ledger()
    ref, cus = harness.timed_pairs(
        lambda *x: calls.append("ref"), lambda *x: calls.append("custom"), lambda: (), n,
        random.Random(1), "cpu", [], ledger, 0, FakeClock(), reset=lambda: resets.append(len(calls)),
    )
    return ref, cus, calls, resets, ledger.summary()


def test_a_first_pair_that_waited_in_the_driver_is_timed_again_in_its_state(monkeypatch):
    # call 1 (first pair) took 9 ms, 8.5 of them launching: it waited in the driver
    ref, cus, calls, resets, summary = first_pair_run(monkeypatch, {1: 9.0}, {1: 8.5})
    assert len(calls) == 12 and resets == [10]  # reset after the 5 pairs, then one pair again
    assert ref == cus == [1.0] * 5 and summary["retimed_pairs"] == 1


def test_a_first_pair_slower_because_it_allocates_is_kept(monkeypatch):
    # the harness's first pair: 2.5x the others (allocation), not a stall: kept as measured
    ref, cus, calls, resets, summary = first_pair_run(monkeypatch, {1: 2.5, 2: 2.5}, {1: 1.4, 2: 1.4})
    assert len(calls) == 10 and resets == [] and 2.5 in ref and 2.5 in cus
    # stalled on the GPU (quick launch): not the driver; the stall stays and is counted as such
    ref, cus, calls, resets, summary = first_pair_run(monkeypatch, {1: 9.0})
    assert len(calls) == 10 and resets == [] and 9.0 in ref + cus


def test_a_disturbed_first_pair_is_timed_again_after_a_reset(monkeypatch):
    ref, cus, calls, resets, summary = first_pair_run(monkeypatch, {}, None, n=3)
    assert resets == [] and len(calls) == 6  # undisturbed: exactly the harness's calls
    # the first call's launch was preempted for 4 ms: that pair again, after a reset (so the
    # replacement allocates as the first pair does); a disturbed later pair needs none
    ref, cus, calls, resets, summary = first_pair_run(monkeypatch, {}, {1: ("wait", 4.0)}, n=3)
    assert resets == [2] and len(calls) == 8 and summary["retimed_pairs"] == 1
    ref, cus, calls, resets, summary = first_pair_run(monkeypatch, {}, {3: ("wait", 4.0)}, n=3)
    assert resets == [] and len(calls) == 8 and summary["retimed_pairs"] == 1


def test_the_ledger_records_each_sides_median_launch():
    ledger = hostclock.Ledger()
    for i in range(20):
        ledger.record(delta(200, 199, 0), 0, i, "ref", 5.0)  # device-bound
        ledger.record(delta(4900, 4890, 0), 0, i, "custom", 5.0)  # launch-bound
    assert ledger.summary()["launch_median_us"] == {"ref": 200, "custom": 4900}


def test_each_timed_pair_copies_its_inputs_once_the_ones_before_are_let_go_of(monkeypatch):
    """The published harness's ``inputs`` variable: the reference warm-up's inputs are held until
    the first timed pair has drawn its own on the host; each pair's device inputs are let go of
    after the next pair's host draw and before its copy to the device; the last warm-up output
    (the harness's ``_``) is held through the timed pairs."""
    import weakref

    class Inputs(list):
        pass

    log: list = []
    copies: list = []

    def get_inputs():
        log.append(("draw", [i for i, ref in enumerate(copies) if ref() is not None]))
        return ["host"]

    def to_device(values, device):
        log.append(("copy", [i for i, ref in enumerate(copies) if ref() is not None]))
        new = Inputs([len(copies)])
        copies.append(weakref.ref(new))
        return new

    monkeypatch.setattr(harness, "to_device", to_device)

    class Out:
        pass

    outputs: list = []

    def model(*_x):
        out = Out()
        outputs.append(weakref.ref(out))
        return out

    held = harness.HeldInputs(get_inputs, "cpu")  # the reference warm-up's inputs, copy 0
    held.warm_output = harness.warm_up(model, model, [], 3, "cpu")
    assert [o() is not None for o in outputs] == [False] * 5 + [True]  # only the last is held
    seen = []
    harness.timed_pairs(
        lambda *x: seen.append(x[0]), lambda *x: None, held.draw, 3, random.Random(1), "cpu", [],
        hostclock.Ledger(), 0, FakeClock(),
        reset=lambda: harness.renew_first_pair(model, model, [], held, "cpu"),
    )
    assert seen == [1, 2, 3]  # the timed calls ran on copies 1, 2, 3
    # each host draw while the copy before was held; each copy once that one was let go of
    assert log == [("draw", []), ("copy", []), ("draw", [0]), ("copy", []), ("draw", [1]), ("copy", []),
                   ("draw", [2]), ("copy", [])]
    assert [ref() is not None for ref in copies] == [False, False, False, True]  # the last is held
    assert outputs[5]() is held.warm_output  # the warm-up's last output, through the timed pairs
    harness.renew_first_pair(model, model, [], held, "cpu")
    assert copies[-1]() is held.current and len(copies) == 5  # the warm-up's inputs anew
    assert held.warm_output is outputs[-1]()  # and the one warm-up call's output held
