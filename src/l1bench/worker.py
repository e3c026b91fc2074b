"""Child process that builds, checks or times one task.

Run as ``python -m l1bench.worker JOB.json RESULT.json``. This is the only place
where snippet code executes. Exit codes:

* 0 — a result was written (whatever its status: a compile error or a wrong
  output is a *result*);
* 3 — the run broke (CUDA fault, out of memory): no result, the job must fail
  and be retried;
* anything else, or a signal — a crash: no result.

The paper protocol follows CUDA-L1's ``eval/eval_cuda.py`` at the pinned commit
(our own code): correctness trials seeded like the harness, 3 warm-up calls,
``outer_trials`` × ``inner_trials`` timed pairs in random order with CUDA events,
waiting on the custom model's own streams when its source mentions
``cuda.Stream``; score = mean over outer trials of mean(ref ms)/mean(custom ms).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path

from l1bench import gpulock, hostclock, provenance
from l1bench.io import atomic_write_text
from l1bench.release import BASELINE_SNIPPET
from l1bench.results import UPSTREAM, Flag, NoWorker, Status, TaskResult, no_worker_needed
from l1bench.snippet import (
    InfraError,
    SnippetError,
    build_model,
    classify_exception,
    flatten_outputs,
    load_custom,
    load_reference,
    make_inputs,
    set_seed,
    sha256_text,
    short,
    to_device,
)

EXIT_INFRA = 3
NO_CODE_REASON = "the release carries no custom code for this task"

COMPILE_MODES = {"torch_compile": "default", "torch_compile_reduce_overhead": "reduce-overhead"}
#: Modes timed against their own baseline snippet (split names it after the mode); GPU only.
BASELINE_MODES = tuple(BASELINE_SNIPPET)


# --------------------------------------------------------------------------- helpers


def read_snippets(task_dir: Path) -> dict:
    meta = json.loads((task_dir / "meta.json").read_text())
    out = {}
    for name, info in meta.get("snippets", {}).items():
        out[name] = (task_dir / info["file"]).read_text()
    return meta, out


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def find_model_streams(model) -> list:
    """CUDA streams held as attributes of a model (as the published harness looks for them)."""
    import torch

    streams = []
    for name in dir(model):
        try:
            val = getattr(model, name)
        except Exception:  # noqa: BLE001 - properties of untrusted models may raise anything
            continue
        vals = val if isinstance(val, (list, tuple)) else val.values() if isinstance(val, dict) else [val]
        streams.extend(v for v in vals if isinstance(v, torch.cuda.Stream))
    return streams


def time_call(fn, inputs, device: str, wait_streams=(), clock=None) -> tuple[float, object]:
    """(milliseconds of one call, what the host did while launching it).

    CUDA events on the current stream (a host timer on CPU). With a
    :class:`~l1bench.hostclock.ThreadClock` the launching thread's accounting is sampled just
    before the start event and just after the end event is enqueued: the host part of the
    timed window (what happens after that cannot lengthen the events). Else the second item is
    None.
    """
    before = clock.sample() if clock is not None else None
    if device.startswith("cuda"):
        import torch

        stream = torch.cuda.current_stream(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn(*inputs)
        for s in wait_streams:
            stream.wait_stream(s)
        end.record(stream)
        launch = clock.delta(before, clock.sample()) if clock is not None else None
        torch.cuda.synchronize(device)
        return start.elapsed_time(end), launch
    t0 = time.perf_counter()
    fn(*inputs)
    ms = (time.perf_counter() - t0) * 1e3
    return ms, clock.delta(before, clock.sample()) if clock is not None else None


#: Environment switch: time a pair again when the host kept its launching thread from running
#: (``hostclock``), up to ``inner_trials`` extra pairs per outer trial ("0": keep every pair).
RETIME_ENV = "L1BENCH_RETIME_DISTURBED"


def retime_budget(n: int) -> int:
    """Extra pairs an outer trial of ``n`` pairs may time to replace disturbed ones."""
    return n if os.environ.get(RETIME_ENV, "1") != "0" else 0


def timed_pairs(base, custom, make_inputs_fn, n: int, rng, device: str, streams, ledger, trial: int, clock,
                reset=None):
    """The harness's ``n`` timed (reference, custom) pairs of one outer trial, in random order,
    on fresh inputs: (reference ms, custom ms).

    A pair during whose launch the host kept the timing thread from running (preempted,
    stolen: :meth:`hostclock.Delta.disturbed`) measured the host, not the code: it is recorded
    in ``ledger`` and timed again on fresh inputs, up to :func:`retime_budget` times per trial.

    The first pair of a trial is special: the allocator was emptied before the trial, so its
    calls allocate device memory, a call into the driver that waits for other processes' calls
    into it (their CUDA start, frees, exits). A first pair that stalled while launching
    (:func:`first_pair_slowed_in_driver`) is timed again after ``reset`` (empty the allocator,
    one warm-up call: the state the harness's first pair has), and so is a disturbed first pair.
    Without disturbances the calls and the random draws are exactly the harness's.
    """
    ref_ms: list = []
    cus_ms: list = []
    budget, pair = retime_budget(n), 0
    first: dict = {}
    while len(ref_ms) < n:
        if not ref_ms and pair > 0 and reset is not None:
            reset()  # the first pair again, in the first pair's state
        got, launches = _time_pair(base, custom, make_inputs_fn, rng, device, streams, clock)
        disturbed = False
        for who in got:
            disturbed = ledger.record(launches[who], trial, pair, who, got[who]) or disturbed
        if disturbed and budget > 0:
            budget -= 1
            ledger.mark_retimed(trial, pair)
        else:
            if not ref_ms:
                first = {"pair": pair, "launches": launches}
            ref_ms.append(got["ref"])
            cus_ms.append(got["custom"])
        pair += 1
    if reset is not None and budget > 0 and first and first_pair_slowed_in_driver(
        ref_ms, cus_ms, first["launches"]
    ):
        ledger.mark_retimed(trial, first["pair"])
        reset()
        got, launches = _time_pair(base, custom, make_inputs_fn, rng, device, streams, clock)
        for who in got:
            ledger.record(launches[who], trial, pair, who, got[who])
        ref_ms[0], cus_ms[0] = got["ref"], got["custom"]
    return ref_ms, cus_ms


def _time_pair(base, custom, make_inputs_fn, rng, device: str, streams, clock) -> tuple[dict, dict]:
    """One timed (reference, custom) pair in the harness's random order, on fresh inputs:
    ({side: ms}, {side: launch Delta})."""
    inputs = make_inputs_fn()
    order = ("ref", "custom") if rng.random() < 0.5 else ("custom", "ref")
    got, launches = {}, {}
    for who in order:
        if who == "ref":
            got[who], launches[who] = time_call(base, inputs, device, (), clock)
        else:
            with guarded("timed call", Status.RUNTIME_ERROR):
                got[who], launches[who] = time_call(custom, inputs, device, streams, clock)
    del inputs
    return got, launches


def first_pair_slowed_in_driver(ref_ms: list, cus_ms: list, launches: dict) -> bool:
    """Whether a call of the trial's first pair stalled (:func:`l1bench.stalls.stalled` against
    the median of the trial's other pairs on its side) while its launch, on the host, took at
    least half of the extra time: it waited in the driver (allocating), not on the GPU. A first
    call that is slower because it allocates, but not stalled, is the harness's measurement and
    is kept."""
    from l1bench.stalls import stalled

    if len(ref_ms) < 3:
        return False
    for who, values in (("ref", ref_ms), ("custom", cus_ms)):
        median = statistics.median(values[1:])
        launch = launches.get(who)
        if launch is None or not stalled([values[0]], median)[0]:
            continue
        if launch.wall_ns >= 0.5 * (values[0] - median) * 1e6:
            return True
    return False


def lazy_problems(outputs, device: str) -> list[str]:
    """The paper protocol's laziness check: plain tensors on the device with real storage.

    Its result is the check's ``lazy`` status and reason. :func:`l1bench.detectors.check_lazy`
    is the detectors' variant (a ``LAZY`` flag): it skips non-tensor outputs, compares devices
    by index, accepts empty tensors without storage and words its reasons differently; the two
    stay apart because their texts and verdicts are recorded in results."""
    import torch

    problems = []
    many = len(outputs) > 1
    for i, out in enumerate(outputs):
        label = f"output[{i}]" if many else "output"
        if not isinstance(out, torch.Tensor):
            problems.append(f"{label} is not a tensor: {type(out).__name__}")
            continue
        if type(out).__name__ not in ("Tensor", "Parameter"):
            problems.append(f"{label} is {type(out).__name__}, not a plain torch.Tensor")
            continue
        if out.device != torch.device(device):
            problems.append(f"{label} on {out.device}, expected {device}")
            continue
        try:
            if out.untyped_storage().size() == 0:
                problems.append(f"{label} has no allocated storage")
            elif out.data_ptr() == 0:
                problems.append(f"{label} has a null data pointer")
        except Exception as err:  # noqa: BLE001
            problems.append(f"{label} storage not accessible: {short(err, 120)}")
    return problems


def compare_outputs(ref_out, cus_out, atol: float, rtol: float) -> tuple[bool, str, float]:
    """(ok, reason, max_abs_diff) comparing two model outputs like the harness (shape + allclose).

    Mixed dtypes and non-tensor outputs fail, as in the harness. :func:`l1bench.detectors.compare_outputs`
    is the detectors' variant: it casts the custom output to the reference's dtype and device,
    compares non-tensor outputs by equality and words its reasons differently (both are
    recorded in results, so the two stay apart)."""
    import torch

    refs, cuss = flatten_outputs(ref_out), flatten_outputs(cus_out)
    if len(refs) != len(cuss):
        return False, f"{len(cuss)} outputs, expected {len(refs)}", float("nan")
    worst = 0.0
    for r, c in zip(refs, cuss, strict=False):
        if not isinstance(c, torch.Tensor) or not isinstance(r, torch.Tensor):
            return False, "output is not a tensor", float("nan")
        if r.shape != c.shape:
            return False, f"shape {tuple(c.shape)}, expected {tuple(r.shape)}", float("nan")
        if r.dtype != c.dtype:  # torch.allclose, as the harness calls it, rejects mixed dtypes
            return False, f"dtype {c.dtype}, expected {r.dtype}", float("nan")
        diff = (r.double() - c.double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        if not torch.allclose(r, c, atol=atol, rtol=rtol):
            return False, f"values differ (max abs diff {worst:.3g}, atol={atol}, rtol={rtol})", worst
    return True, "", worst


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


def construct(cls, init_inputs, seed):
    """``cls(*init_inputs)`` under ``seed``, left where its ``__init__`` put it (the CPU for
    plain layers), as the harness builds models before moving them."""
    import torch

    with torch.no_grad():
        set_seed(seed)
        return cls(*init_inputs)


def move(model, device: str):
    return model.to(device) if hasattr(model, "to") else model


def cuda_initialized() -> bool:
    import torch

    return bool(torch.cuda.is_initialized())


class CudaBarred(RuntimeError):
    """Raised where code tries to initialise CUDA while :func:`cuda_barred` is active."""


@contextlib.contextmanager
def cuda_barred():
    """Bar CUDA's (lazy) initialisation in this process for the body: every path into the GPU
    through torch (tensor creation or moves, streams, ``current_device``) initialises CUDA
    first, and raises :class:`CudaBarred` there instead, before any GPU work runs."""
    import torch

    real = torch.cuda._lazy_init

    def barred():
        if torch.cuda.is_initialized():
            return real()
        raise CudaBarred("CUDA initialisation is barred outside the GPU lock")

    torch.cuda._lazy_init = barred
    try:
        yield
    finally:
        torch.cuda._lazy_init = real


class CustomBuilder:
    """Builds ``ModelNew`` for a seed, keeping CPU work out of the device lock when it is safe.

    A custom ``__init__`` can be expensive CPU work (weight initialisation of a VGG, an
    inline extension build that fails and is retried by every instance), or it can run GPU
    code (streams, CUDA graphs, ``.cuda()`` tensors). :meth:`probe` constructs one instance
    on the CPU *before this process has touched CUDA*, with CUDA's initialisation barred
    (:func:`cuda_barred`): an ``__init__`` that reaches for the GPU stops there, before any of
    its GPU work could run outside the lock. If it completes, ``__init__`` is CPU-only and
    every later instance is constructed outside the lock (:meth:`prepare`) and only moved
    inside it (:meth:`finish`), which is exactly ``ModelNew(*init_inputs).to(device)`` as the
    harness does. Otherwise (or on the CPU backend, or if the probe raises) instances are built
    inside the lock.
    """

    def __init__(self, cls, init_inputs, device: str):
        self.cls, self.init_inputs, self.device = cls, init_inputs, device
        self.cpu_safe = False
        self.probe_note = "not probed"

    def probe(self, seed: int) -> None:
        if not self.device.startswith("cuda"):
            self.probe_note = "cpu backend"
            return
        if cuda_initialized():
            self.probe_note = "CUDA initialised before the probe: constructed inside the lock"
            return
        from l1bench import detectors

        state = detectors.snapshot_global_state()
        try:
            with cuda_barred():
                construct(self.cls, self.init_inputs, seed)
        except CudaBarred:
            self.probe_note = "__init__ uses CUDA: constructed inside the lock"
            return
        except Exception as err:  # noqa: BLE001 - not a verdict: decided inside the lock
            if isinstance(err.__cause__ or err.__context__, CudaBarred) or CudaBarred.__name__ in str(err):
                self.probe_note = "__init__ uses CUDA: constructed inside the lock"
            else:
                self.probe_note = f"CPU construction raised ({short(err, 80)}): constructed inside the lock"
            return
        finally:
            # The probe is ours, not the protocol's: flags its __init__ sets (cudnn.benchmark,
            # TF32) must not reach the reference's warm-up or torch.compile before the
            # protocol constructs ModelNew itself.
            detectors.restore_global_state(state)
        if cuda_initialized():
            self.probe_note = "__init__ initialises CUDA: constructed inside the lock"
            return
        self.cpu_safe = True
        self.probe_note = "__init__ is CPU-only: constructed outside the lock"

    def prepare(self, seed: int, init_inputs=None):
        """Outside the lock: the CPU-constructed instance, or None when it must be built inside."""
        if not self.cpu_safe:
            return None
        with guarded("constructing ModelNew", Status.RUNTIME_ERROR):
            return construct(self.cls, self.init_inputs if init_inputs is None else init_inputs, seed)

    def finish(self, prepared, seed: int, init_inputs=None):
        """Inside the lock: the instance on the device (moved, or constructed and moved)."""
        import torch

        with guarded("constructing ModelNew", Status.RUNTIME_ERROR), torch.no_grad():
            if prepared is not None:
                return move(prepared, self.device)
            args = self.init_inputs if init_inputs is None else init_inputs
            return build_model(self.cls, args, seed, self.device)


@contextlib.contextmanager
def phase(stats: dict, name: str):
    """Accumulate the wall time of a step into ``stats["phases"][name]`` (seconds)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        phases = stats.setdefault("phases", {})
        phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - t0, 4)


def open_device(device: str, stats: dict) -> None:
    """Start CUDA on ``device``, inside the GPU lock: the driver (cuInit), the context and the
    cuBLAS handle. They run no kernel, but they are calls into the GPU's resource manager,
    which serialises every process's calls: made outside the lock, they delayed the device
    allocations in other jobs' timed calls (the first timed pair of an outer trial allocates
    its outputs). Inside the lock the thread runs on the timing CPU: ~0.1 s. A no-op once
    CUDA is running."""
    import torch

    if not device.startswith("cuda") or "cuda_started" in stats:
        return
    if torch.cuda.is_initialized():  # by the snippets' own code (at import, in __init__)
        stats["cuda_started"] = "before the first GPU section"
        return
    stats["cuda_started"] = "inside the GPU lock"
    with phase(stats, "cuda_init (locked)"):
        index = int(device.split(":")[1]) if ":" in device else 0
        try:
            torch.cuda.set_device(index)
            torch.empty(1, device=device)
        except Exception as err:  # no usable device: the run broke, not the task
            raise InfraError(f"CUDA could not start on {device}: {short(err, 200)}") from err
        try:
            torch.cuda.current_blas_handle()
        except Exception:  # noqa: BLE001 - only a warm-up
            pass
        # the driver's threads, started from this (pinned) thread, leave the timing CPU now:
        # they would otherwise compete with it through the section's timed calls
        lock = gpulock.DeviceLock.current
        stats["driver_threads_moved"] = lock.move_other_threads_off() if lock is not None else 0


@contextlib.contextmanager
def exclusive(device: str, job: dict, stats: dict):
    """The device lock, under no_grad; the device is synchronised and cached device memory
    handed back before release.

    Kernels are launched asynchronously: without the synchronisation, work launched at the end
    of a section (a warm-up, eager code before a recompilation) could still be running when
    the next job's timed calls start; for the same reason the device is synchronised before the
    lock is paused for CPU work inside a section (a compile, an extension build). Up to one
    worker per core waits for the lock at once: memory a waiting worker's caching allocator
    still holds from its last section is memory the lock holder cannot have.
    """
    import torch

    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else None
    with contextlib.ExitStack() as held:
        if device.startswith("cuda") and "lock_device" not in job:
            held.push(claim_gpu(job, stats, sync).__exit__)  # placed: any free GPU
        else:
            held.enter_context(gpulock.device_lock(job.get("lock_device", device), job.get("lock_dir"), stats, sync))
        held.enter_context(torch.no_grad())
        open_device(device, stats)
        # No garbage collection inside a section: a full collection over torch's own objects
        # (milliseconds) would otherwise land in a timed call now and then.
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if collecting:
                gc.enable()
            if device.startswith("cuda"):
                try:
                    torch.cuda.synchronize(device)
                finally:
                    torch.cuda.empty_cache()


def run_reference_warmup(model_cpu, get_inputs, device: str, p: dict) -> None:
    """The harness first runs a fresh reference once in the process (its ``warmup_src``).

    Besides warming caches this initialises cuBLAS/cuDNN handles, without which a
    baseline that captures a CUDA graph on its first call fails the capture.
    """
    import torch

    with torch.no_grad(), guarded("the reference's warm-up run", Status.BASELINE_ERROR):
        model = move(model_cpu, device)
        model(*make_inputs(get_inputs, device, p["inputs_on_device"]))
        synchronize(device)
    del model


def renew_allocator(base, custom, warm_inputs, device: str) -> None:
    """The state before a trial's first timed pair, again: the allocator emptied (as at the
    start of the section) and one warm-up call of both models."""
    import torch

    synchronize(device)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    warm_up(base, custom, warm_inputs, 1, device)


def warm_up(base, custom, inputs, n: int, device: str) -> None:
    """The harness's warm-up: ``n`` calls of both models on one input set, synchronised."""
    with guarded("warm-up", Status.RUNTIME_ERROR):
        for _ in range(n):
            base(*inputs)
            custom(*inputs)
            synchronize(device)


def correctness_trials(original, custom, get_inputs, device: str, p: dict) -> tuple:
    """The harness's correctness check: (ok, reason, trials passed, max abs diff).

    Trial seeds are drawn from ``torch.manual_seed(seed)`` as the harness draws them; each
    trial seeds, draws inputs, runs both models in eval mode and compares shape and
    ``allclose(atol, rtol)``.
    """
    import torch

    torch.manual_seed(p["seed"])
    seeds = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(p["correctness_trials"])]
    worst = 0.0
    for i, ts in enumerate(seeds):
        set_seed(ts)
        inputs = make_inputs(get_inputs, device, p["inputs_on_device"])
        set_seed(ts)
        original.eval()
        ref_out = original(*inputs)
        synchronize(device)
        set_seed(ts)
        with guarded(f"correctness trial {i + 1}", Status.RUNTIME_ERROR):
            custom.eval()
            cus_out = custom(*inputs)
            synchronize(device)
        ok, why, diff = compare_outputs(ref_out, cus_out, p["atol"], p["rtol"])
        worst = max(worst, diff) if diff == diff else worst
        if not ok:
            return False, f"trial {i + 1}: {why}", i, worst
    return True, "", len(seeds), worst


# --------------------------------------------------------------------------- build


def do_build(job: dict, meta: dict, snippets: dict) -> dict:
    """Compile the custom code's inline extensions into the task's extension folder (CPU)."""
    if "custom" not in snippets:
        return result(job, Status.NO_CODE, NO_CODE_REASON)
    t0 = time.perf_counter()
    with guarded("building custom code", Status.LOAD_ERROR):
        model_new = load_custom(snippets["custom"])
    construct_note = ""
    if job["params"].get("construct_on_cpu", True):
        # Some snippets call load_inline in __init__: constructing on the CPU builds them now.
        try:
            _, _, get_init_inputs = load_reference(snippets["ref"])
            set_seed(job["params"]["seed"])
            model_new(*get_init_inputs())
        except Exception as err:  # noqa: BLE001 - not a verdict: the GPU check decides
            construct_note = f"construction on CPU failed (checked again on the device): {short(err, 160)}"
    ext_dir = Path(job["ext_dir"])
    built = []
    if ext_dir.is_dir():
        built = sorted(p.name for p in ext_dir.iterdir() if p.is_dir() and p.name != "failed-builds")
    return result(
        job,
        Status.OK,
        construct_note,
        build_s=round(time.perf_counter() - t0, 3),
        extensions=built,
    )


# --------------------------------------------------------------------------- check


def do_check(job: dict, meta: dict, snippets: dict) -> dict:
    """Load, laziness and correctness on the device, as the paper protocol does."""
    prev = upstream_status(job)
    if prev:
        return prev
    p, device = job["params"], job["device"]
    import torch

    Model, get_inputs, get_init_inputs = load_reference(snippets["ref"])
    with guarded("loading custom code", Status.LOAD_ERROR):
        ModelNew = load_custom(snippets["custom"])
    stats: dict = {}
    details: dict = {}
    seed = p["seed"]
    set_seed(seed)
    init_inputs = to_device(get_init_inputs(), device)
    builder = CustomBuilder(ModelNew, init_inputs, device)
    builder.probe(seed)  # first: before this process touches CUDA
    details["construct"] = builder.probe_note
    ref_cpu = construct(Model, init_inputs, seed)  # CPU work: outside the lock
    # The harness warms up with a separate instance: constructed afresh, not deep-copied (a
    # deep copy shares what closures capture: minGPT's `self.mlpf = lambda x: m.c_proj(...)`
    # would still call the original's layers, left on the CPU).
    warm_cpu = construct(Model, init_inputs, seed)
    first, second = builder.prepare(seed), builder.prepare(seed)
    with exclusive(device, job, stats):
        with phase(stats, "reference warm-up"):
            run_reference_warmup(warm_cpu, get_inputs, device, p)
            del warm_cpu
        with phase(stats, "models to device"):
            ref = move(ref_cpu, device)
            custom = builder.finish(first, seed)
            del first
        # Laziness (the harness runs it on seed-42 inputs before correctness).
        with phase(stats, "laziness"):
            set_seed(seed)
            inputs = make_inputs(get_inputs, device, p["inputs_on_device"])
            with guarded("first call of ModelNew", Status.RUNTIME_ERROR):
                out = custom(*inputs)
                synchronize(device)
            problems = lazy_problems(flatten_outputs(out), device)
        if problems:
            return result(job, Status.LAZY, "; ".join(problems), **stats)
        # The harness checks correctness on a fresh instance (state from the first call is dropped).
        del out, custom
        with phase(stats, "correctness"):
            custom = builder.finish(second, seed)
            del second
            ok, why, passed, worst = correctness_trials(ref, custom, get_inputs, device, p)
        if not ok:
            return result(job, Status.INCORRECT, why, trials_passed=passed, **stats)
        details["max_abs_diff"] = worst
        flags = []
        if job.get("detectors"):
            from l1bench import detectors

            del custom
            # The check's reference: built under the same seed and init inputs as the detectors
            # would build it, and only ever called in eval mode (no running statistics changed).
            with phase(stats, "detectors"):
                det = detectors.run_detectors(
                    Model, ModelNew, get_inputs, get_init_inputs, torch.device(device), job["detectors"], ref_model=ref
                )
            flags = det.get("flags", [])
            details["detectors"] = det.get("details", {})
    return result(job, Status.PASS, "", trials_passed=passed, flags=flags, details=details, **stats)


# --------------------------------------------------------------------------- time


def baseline_source(mode: str, snippets: dict) -> str | None:
    return snippets.get(mode) if mode in BASELINE_MODES else snippets["ref"]


_BACKENDS: dict = {}
#: Graphs compiled by this process's compile backend (1 per graph; more means recompilation).
_COMPILED_GRAPHS = [0]


def compile_backend(mode: str):
    """The torch.compile backend of a compile mode: inductor exactly as ``torch.compile(mode=...)``
    builds it, counting the graphs it compiles (recorded on the result: more than one graph per
    model means recompilation) and letting go of the GPU lock while it generates code (where
    :func:`release_lock_during_dynamo_compiles` could not already do so for the whole compile).
    One instance per mode and process, so every rebuilt model of the outer trials reuses the
    compiled code. None (use the plain ``mode=`` string) if this torch lacks the wrapper class.
    """
    if mode not in _BACKENDS:
        import torch

        base = getattr(torch, "_TorchCompileInductorWrapper", None)
        if base is None:
            _BACKENDS[mode] = None
        else:

            class LockingInductor(base):
                __name__ = "inductor"  # what torch.compile's backend wrapper reports it as

                def __call__(self, model_, inputs_, **kwargs):
                    _COMPILED_GRAPHS[0] += 1  # every (re)compilation: recorded on the result
                    with gpulock.DeviceLock.pause_current():
                        return super().__call__(model_, inputs_, **kwargs)

            _BACKENDS[mode] = LockingInductor(mode, None, None)  # as torch.compile(mode=mode)
    return _BACKENDS[mode]


def release_lock_during_dynamo_compiles() -> bool:
    """Hand the GPU lock back while torch.compile traces and compiles a frame (CPU work).

    Every call of a compiled model runs inside a GPU section, so every kernel it launches (its
    graphs, and eager code between graphs where the model breaks the graph) holds the lock.
    The first call of each outer trial's rebuilt model recompiles (dynamo guards on the module
    instance): its tracing and code generation (seconds of CPU) run with the lock released,
    after the device has been synchronised (:meth:`gpulock.DeviceLock.paused`), and the lock
    is taken back before the compiled code runs. A cache hit compiles nothing and keeps the
    lock. False where this torch has no ``torch._dynamo.convert_frame._compile`` (then only
    code generation lets go of the lock, in :func:`compile_backend`).
    """
    try:
        from torch._dynamo import convert_frame
    except ImportError:
        return False
    compile_frame = getattr(convert_frame, "_compile", None)
    if compile_frame is None:
        return False
    if hasattr(compile_frame, "__wrapped__"):
        return True

    def unlocked(*args, **kwargs):
        with gpulock.DeviceLock.pause_current():
            return compile_frame(*args, **kwargs)

    unlocked.__wrapped__ = compile_frame
    convert_frame._compile = unlocked
    return True


def wrap_baseline(model, mode: str):
    if mode in COMPILE_MODES:
        import torch

        backend = compile_backend(COMPILE_MODES[mode])
        if backend is None:
            return torch.compile(model, mode=COMPILE_MODES[mode])
        return torch.compile(model, backend=backend)
    return model


def do_time(job: dict, meta: dict, snippets: dict) -> dict:
    """Time the custom model against one baseline mode (paper or strict protocol).

    CPU work stays outside the device lock: interpreter start, loading extensions,
    constructing the reference/baseline models (weight initialisation of large models takes
    seconds) and torch.compile code generation. The lock is held per outer trial around
    moving the models to the device, constructing ModelNew (its __init__ may run GPU code),
    the warm-up calls and the timed pairs.
    """
    mode, device, p = job["mode"], job["device"], job["params"]
    prev = upstream_status(job)
    if prev:
        return prev
    if mode in BASELINE_MODES and device == "cpu":
        return result(job, Status.UNSUPPORTED, f"{mode} baselines need a CUDA GPU")
    base_src = baseline_source(mode, snippets)
    if base_src is None:
        return result(job, Status.NO_BASELINE, f"the release has no {mode} baseline code for this task")
    import torch

    try:
        Base, _, _ = load_reference(base_src, label=mode)
    except SnippetError as err:
        return result(job, Status.BASELINE_ERROR, err.reason)
    except Exception as err:  # noqa: BLE001
        return result(job, Status.BASELINE_ERROR, f"loading {mode} baseline: {short(err)}")
    Ref, get_inputs, get_init_inputs = load_reference(snippets["ref"])
    with guarded("loading custom code", Status.LOAD_ERROR):
        ModelNew = load_custom(snippets["custom"])
    wait_for_streams = "cuda.Stream" in snippets["custom"] and device.startswith("cuda")
    stats: dict = {}
    rng = random.Random(p["seed"])
    on_dev = p["inputs_on_device"]

    def baseline_on_cpu(seed):
        """(baseline constructed under ``seed``, init inputs), before any device work."""
        set_seed(seed)
        init_inputs = to_device(get_init_inputs(), device)
        with guarded(f"constructing the {mode} baseline", Status.BASELINE_ERROR):
            return construct(Base, init_inputs, seed), init_inputs

    def on_device(base_cpu, custom_cpu, seed, init_inputs):
        """Inside the lock: the baseline moved (and wrapped), ModelNew moved or constructed."""
        base = wrap_baseline(move(base_cpu, device), mode)
        return base, builder.finish(custom_cpu, seed, init_inputs)

    set_seed(p["seed"])
    builder = CustomBuilder(ModelNew, to_device(get_init_inputs(), device), device)
    builder.probe(p["seed"])  # first: before this process touches CUDA
    stats["construct"] = builder.probe_note
    set_seed(p["seed"])
    pending = {"warmup": construct(Ref, to_device(get_init_inputs(), device), p["seed"])}

    @contextlib.contextmanager
    def gpu_section():
        """The device lock; the first section also runs the harness's reference warm-up."""
        with exclusive(device, job, stats):
            if pending["warmup"] is not None:
                with phase(stats, "reference warm-up"):
                    run_reference_warmup(pending["warmup"], get_inputs, device, p)
                pending["warmup"] = None
            yield

    t_setup = time.perf_counter()
    if mode in COMPILE_MODES:
        # The harness's reference warm-up, then the first (compiling) call of the compiled
        # reference inside a GPU section: tracing and code generation let go of the lock
        # (release_lock_during_dynamo_compiles), every kernel runs with it. The compiled code
        # is reused by every outer trial's model.
        stats["dynamo_compiles_unlocked"] = release_lock_during_dynamo_compiles()
        base_cpu, _ = baseline_on_cpu(p["seed"])
        with gpu_section(), phase(stats, "compile (tracing and code generation unlocked)"), guarded(
            f"compiling the reference ({mode})", Status.BASELINE_ERROR
        ):
            inputs = make_inputs(get_inputs, device, on_dev)
            base = wrap_baseline(move(base_cpu, device), mode)
            base(*inputs)
            del base, base_cpu, inputs
    stats["precompile_s"] = round(time.perf_counter() - t_setup, 3)
    # SM/memory clocks around the timing, read inside the sections (in-process NVML calls are
    # resource-manager calls too): at the start of the first timed section, at the end of each
    clocks = {"before": None, "after": None}

    def read_clocks(when: str) -> None:
        if when == "after" or clocks["before"] is None:
            clocks[when] = provenance.clocks(device)

    if job["protocol"] == "strict":
        from l1bench import detectors, strict

        # Snapshot before ModelNew is constructed: strict timing restores this state before
        # every reference call, so flags a custom __init__ sets cannot change the reference.
        global_state = detectors.snapshot_global_state()
        base_cpu, init_inputs = baseline_on_cpu(p["seed"])
        custom_cpu = builder.prepare(p["seed"], init_inputs)
        with gpu_section(), phase(stats, "strict"):
            read_clocks("before")
            base, custom = on_device(base_cpu, custom_cpu, p["seed"], init_inputs)
            warm_up(base, custom, make_inputs(get_inputs, device, on_dev), p["warmup"], device)
            with guarded("strict timing", Status.RUNTIME_ERROR), gpulock.DeviceLock.no_pause():
                st = strict.time_strict(
                    base,
                    custom,
                    lambda: make_inputs(get_inputs, device, on_dev),
                    torch.device(device),
                    job["strict"],
                    global_state=global_state,
                )
            read_clocks("after")
        return result(
            job,
            Status.OK,
            "",
            score=st["speedup_median"],
            strict=st,
            flags=st.get("flags", []),
            n_timings=st.get("n", 0),
            clocks_before=clocks["before"],
            clocks_after=clocks["after"],
            **stats,
        )

    if mode in BASELINE_MODES:
        # The harness checks the custom model against this mode's baseline, not the reference.
        base_cpu, init_inputs = baseline_on_cpu(p["seed"])
        custom_cpu = builder.prepare(p["seed"], init_inputs)
        with gpu_section(), phase(stats, "baseline correctness"):
            base, custom = on_device(base_cpu, custom_cpu, p["seed"], init_inputs)
            with guarded(f"correctness against the {mode} baseline", Status.BASELINE_ERROR):
                ok, why, _, _ = correctness_trials(base, custom, get_inputs, device, p)
            del base, custom, base_cpu, custom_cpu
        if not ok:
            return result(job, Status.INCORRECT, f"against the {mode} baseline: {why}", **stats)

    def placed(base_cpu, custom_cpu, seed, init_inputs):
        """Inside the lock: both models on the device, the custom model's streams, and the
        warm-up inputs."""
        with phase(stats, "models to device"):
            base, custom = on_device(base_cpu, custom_cpu, seed, init_inputs)
            streams = find_model_streams(custom) if wait_for_streams else []
        return base, custom, streams, make_inputs(get_inputs, device, on_dev)

    timings: dict = {"ref_ms": [], "custom_ms": [], "trial_scores": []}
    clock, ledger = hostclock.ThreadClock(), hostclock.Ledger()
    for outer in range(p["outer_trials"]):
        seed = p["seed"] + outer
        base_cpu, init_inputs = baseline_on_cpu(seed)
        custom_cpu = builder.prepare(seed, init_inputs)
        with gpu_section():
            read_clocks("before")
            base, custom, streams, warm_inputs = placed(base_cpu, custom_cpu, seed, init_inputs)
            with phase(stats, "warm-up calls"):
                warm_up(base, custom, warm_inputs, p["warmup"], device)
            with phase(stats, "timed pairs"), gpulock.DeviceLock.no_pause():
                ref_ms, cus_ms = timed_pairs(
                    base,
                    custom,
                    lambda: make_inputs(get_inputs, device, on_dev),
                    p["inner_trials"],
                    rng,
                    device,
                    streams,
                    ledger,
                    outer,
                    clock,
                    # called inside timed_pairs, in this iteration (deleted below once it returns)
                    reset=lambda: renew_allocator(base, custom, warm_inputs, device),  # noqa: B023, F821
                )
            read_clocks("after")
            del base, custom, base_cpu, custom_cpu, warm_inputs
        trial_score = statistics.fmean(ref_ms) / statistics.fmean(cus_ms)
        timings["ref_ms"].append([round(v, 5) for v in ref_ms])
        timings["custom_ms"].append([round(v, 5) for v in cus_ms])
        timings["trial_scores"].append(trial_score)
        if p.get("early_stop_below") is not None and trial_score < p["early_stop_below"]:
            break
    clock.close()
    if mode in COMPILE_MODES:
        stats["compiled_graphs"] = _COMPILED_GRAPHS[0]
    scores = timings["trial_scores"]
    stopped = len(scores) < p["outer_trials"]
    return result(
        job,
        Status.OK,
        f"stopped after {len(scores)} outer trials (score < {p['early_stop_below']})" if stopped else "",
        score=statistics.fmean(scores),
        score_std=statistics.pstdev(scores) if len(scores) > 1 else 0.0,
        n_timings=sum(len(r) for r in timings["ref_ms"]),
        ref_ms_mean=statistics.fmean(v for r in timings["ref_ms"] for v in r),
        custom_ms_mean=statistics.fmean(v for r in timings["custom_ms"] for v in r),
        clocks_before=clocks["before"],
        clocks_after=clocks["after"],
        host_timing=ledger.summary(),
        **timings,
        **stats,
    )


# --------------------------------------------------------------------------- main

KINDS = {"build": do_build, "check": do_check, "time": do_time}


def pick_device(job: dict) -> str:
    """``cpu`` for the demo; else ``cuda:0``: the GPU is placed at the job's first GPU section,
    where it takes whichever visible GPU is free (:func:`claim_gpu`), and CUDA then starts with
    only that GPU visible. Nothing here starts CUDA; the process keeps off every timing CPU."""
    if job["backend"] == "cpu":
        return "cpu"
    ids = gpulock.visible_gpu_ids()
    if not ids:
        raise InfraError("no CUDA device is visible to the worker")
    job["gpu_ids"] = ids
    gpulock.reserve_timing_cpus(len(ids), None)  # before CUDA starts its threads
    return "cuda:0"


def claim_gpu(job: dict, stats: dict, before_pause):
    """The job's first GPU section: the lock of whichever visible GPU is free first, held.

    CUDA then starts with only that GPU visible (``CUDA_VISIBLE_DEVICES``), so ``cuda:0`` is it
    and no context is made on the others. Where CUDA already runs (a snippet started it at
    import), every GPU is visible and ``cuda:0`` is the first one: that one is taken.
    """
    import torch

    ids = job.get("gpu_ids") or ["0"]
    order = [0] if torch.cuda.is_initialized() else list(range(len(ids)))
    i, lock = gpulock.claim_free_device(
        [f"cuda:{ids[k]}" for k in order],
        job.get("lock_dir"),
        stats,
        before_pause,
        [gpulock.timing_cpu_of(k) for k in order],
    )
    index = order[i]
    job["lock_device"] = lock.device
    stats["gpu_id"] = ids[index]
    if not torch.cuda.is_initialized() and len(ids) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[index]
    return lock


EXTENSION_MARKERS = ("cpp_extension", "load_inline")


def builds_extensions(source: str) -> bool:
    """Whether custom code can compile a C++/CUDA extension (torch.utils.cpp_extension)."""
    return any(m in source for m in EXTENSION_MARKERS)


#: Extension builds that failed in this process (key: sources and flags), and their names.
_FAILED_BUILDS: dict = {}
_FAILED_BUILD_NAMES: dict = {}
#: Flag of a check/time result whose custom code could not build its own extension: the code
#: ran (and was timed) without it, on whatever fallback it has.
EXTENSION_BUILD_FAILED = Flag.EXTENSION_BUILD_FAILED


def extension_build_failures() -> list[dict]:
    """The extension builds that failed in this process: name and the compiler's first error."""
    out = []
    for key, err in _FAILED_BUILDS.items():
        text = str(err)
        lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
        first = next((ln for ln in lines if "error:" in ln), lines[0] if lines else text)
        out.append({"extension": _FAILED_BUILD_NAMES.get(key, "?"), "error": short(first, 200)})
    return out


def note_extension_failures(res: dict) -> dict:
    """Record failed extension builds in a result; on a check or time result also as a flag."""
    failures = extension_build_failures()
    if not failures:
        return res
    res["extension_failures"] = failures
    if res.get("kind") in ("check", "time") and res.get("status") != Status.NO_CODE:
        names = ", ".join(sorted({f["extension"] for f in failures}))
        reason = (
            f"the custom code's extension {names} does not build ({failures[0]['error']}); what ran is its fallback"
        )
        flags = res.setdefault("flags", [])
        if not any(isinstance(f, dict) and f.get("flag") == EXTENSION_BUILD_FAILED for f in flags):
            flags.append({"flag": EXTENSION_BUILD_FAILED, "reason": short(reason, 200)})
    return res


def _build_key(args, kwargs) -> str | None:
    """A failing build's identity: its sources and flags, without the extension's name (some
    snippets name it after the process id, so every process would otherwise retry it)."""
    import hashlib

    kw = sorted((k, v) for k, v in kwargs.items() if k not in ("name", "verbose"))
    rest = args[1:] if args and "name" not in kwargs else args
    try:
        return hashlib.sha256(repr((rest, kw)).encode()).hexdigest()
    except Exception:  # noqa: BLE001 - unrepresentable arguments: no memory
        return None


def _is_compile_error(err: Exception) -> bool:
    """A deterministic failure: the compiler rejected the sources (not a kill or a timeout)."""
    text = str(err)
    return "Error building extension" in text and "error" in text.split("Error building extension", 1)[1].lower()


def _failed_builds_dir() -> Path | None:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root) / "failed-builds" if root else None


@contextlib.contextmanager
def exclusive_extension_build(name: str, build_directory: str | None = None):
    """One process of this workflow at a time loads (and, where needed, builds) an extension,
    and a build lock left by a killed process is cleared.

    torch's own build lock (``FileBaton``: a ``lock`` file in the build folder) outlives a
    process killed while it builds (a drained or timed-out job), and every later load of that
    extension then waits for it forever: measured, a task's time jobs waited 140–260 s until
    the run's budget killed them. Here every load first takes an ``flock`` on a file beside the
    build folder, which the kernel releases when its holder dies; whoever holds it knows that a
    ``lock`` file it finds is stale and removes it. The GPU lock is handed back while waiting.
    """
    import fcntl

    root = Path(build_directory) if build_directory else (
        Path(os.environ["TORCH_EXTENSIONS_DIR"]) / name if os.environ.get("TORCH_EXTENSIONS_DIR") else None
    )
    if root is None:
        yield
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.flock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with gpulock.DeviceLock.pause_current():
                fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            stale = root / "lock"
            if stale.exists():
                stale.unlink(missing_ok=True)
                print(f"l1bench worker: removed a stale extension build lock (its process died): {stale}",
                      file=sys.stderr, flush=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def remember_failed_extension_builds() -> None:
    """Make a repeated ``load_inline``/``load`` call that failed before fail again at once.

    Some snippets build their extension lazily, in ``forward`` or ``__init__``, or under a
    per-process name, and fall back to PyTorch when the build fails; every new instance or
    process then retries the same failing build (10–60 s of compiler time each). The same
    sources and flags fail the same way, so the first failure is re-raised instead: within the
    process for any failure, and across the task's processes (a file in its extension folder,
    ``failed-builds/``) for compiler errors. Successful builds are cached by torch itself.
    """
    from torch.utils import cpp_extension

    def remembering(fn):
        def call(*args, **kwargs):
            failed = _FAILED_BUILDS  # looked up per call (tests replace it)
            key = _build_key(args, kwargs)
            name = str(kwargs.get("name") or (args[0] if args else "?"))
            if key in failed:
                raise failed[key]
            memo = _failed_builds_dir()
            if key is not None and memo is not None and (memo / f"{key}.txt").is_file():
                err = RuntimeError((memo / f"{key}.txt").read_text())
                failed[key], _FAILED_BUILD_NAMES[key] = err, name
                raise err
            try:
                with exclusive_extension_build(name, kwargs.get("build_directory")):
                    return fn(*args, **kwargs)
            except Exception as err:
                if key is not None:
                    failed[key], _FAILED_BUILD_NAMES[key] = err, name
                    if memo is not None and _is_compile_error(err):
                        memo.mkdir(parents=True, exist_ok=True)
                        atomic_write_text(memo / f"{key}.txt", str(err))
                raise

        call.__wrapped__ = fn
        return call

    for name in ("load_inline", "load"):
        if not hasattr(getattr(cpp_extension, name), "__wrapped__"):
            setattr(cpp_extension, name, remembering(getattr(cpp_extension, name)))


#: The steps of torch.utils.cpp_extension that run the compiler, or wait for another process
#: that runs it on the same extension.
_EXTENSION_BUILD_STEPS = ("_write_ninja_file_and_build_library", "_write_ninja_file_and_compile_objects")


def release_lock_during_extension_builds() -> None:
    """Hand the GPU lock back while an extension is compiled (or another process compiles it).

    Snippets that build in ``forward`` (or that name their extension after the process id, so
    it is rebuilt in every process) would otherwise run nvcc inside the GPU section: measured
    128 s of lock for one warm-up (L1_T010, reduce-overhead) while 30 jobs waited. A load
    that finds its extension built runs none of these steps and never releases the lock.
    """
    from torch.utils import cpp_extension, file_baton

    def pausing(fn):
        def call(*args, **kwargs):
            with gpulock.DeviceLock.pause_current():
                return fn(*args, **kwargs)

        call.__wrapped__ = fn
        return call

    for name in _EXTENSION_BUILD_STEPS:
        step = getattr(cpp_extension, name, None)
        if step is not None and not hasattr(step, "__wrapped__"):
            setattr(cpp_extension, name, pausing(step))
    wait = file_baton.FileBaton.wait
    if not hasattr(wait, "__wrapped__"):
        file_baton.FileBaton.wait = pausing(wait)


#: Version of how timed sections are kept clean, recorded on every check and time result
#: (results without it: version 1, before the timing-isolation work).
#: 2: kernels only inside the GPU lock (the probe bars CUDA, compile modes call compiled
#:    models only inside sections), the device synchronised before any pause of the lock,
#:    threads started in a section moved off the timing CPU at release, no garbage collection
#:    in sections, the host's accounting of every timed call recorded and disturbed pairs
#:    timed again (hostclock); results/isolation/design2.
#: 2 (second iteration, recorded as 2: worker.py sha256 prefix in ``workflow_code`` tells them
#:    apart): also every call into the GPU's resource manager inside the lock (CUDA started in
#:    the first section, clocks by in-process NVML inside sections, no nvidia-smi or driver
#:    start outside) and workers exiting with the lock held; results/isolation/{c1,c2}.
#: 3: the driver's threads moved off the timing CPU as soon as CUDA has started; workers exit
#:    without the lock again (scripts/bench_handover.py: the tear-down did not delay the next
#:    holder's first allocation less with it held).
#: 4: a trial's first pair (it allocates: the allocator is emptied between trials) that stalled
#:    in the driver, or was disturbed, is timed again after emptying the allocator again and one
#:    warm-up call (worker.first_pair_slowed_in_driver, renew_allocator); before, a disturbed
#:    first pair was replaced by a pair that did not allocate.
TIMING_DESIGN = 4


def _system_isolation():
    text = os.environ.get(gpulock.ISOLATED_ENV)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def run(job: dict) -> dict:
    t0 = time.time()
    started = provenance.now_iso()
    if job.get("ext_dir"):
        Path(job["ext_dir"]).mkdir(parents=True, exist_ok=True)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(job["ext_dir"]).resolve())
    task_dir = Path(job["task_dir"])
    meta, snippets = read_snippets(task_dir)
    if builds_extensions(snippets.get("custom", "")):
        remember_failed_extension_builds()
        release_lock_during_extension_builds()
    if job["kind"] == "build":
        job["device"] = "cpu"
        if job["backend"] != "cpu":  # builds (nvcc) keep clear of the timing CPUs
            gpulock.reserve_timing_cpus(gpulock.visible_gpu_count(), None)
    else:
        job["device"] = pick_device(job)
    try:
        if no_worker_needed(job["kind"], has_code="custom" in snippets) is NoWorker.NO_CODE:
            res = result(job, Status.NO_CODE, NO_CODE_REASON)
        else:
            res = KINDS[job["kind"]](job, meta, snippets)
    except SnippetError as err:
        res = result(job, err.status, err.reason)
    note_extension_failures(res)
    if job["kind"] in ("check", "time"):
        res["timing_design"] = TIMING_DESIGN
    res["snippet_sha256"] = {k: sha256_text(v) for k, v in snippets.items()}
    res["params"] = job.get("params", {})
    res["provenance"] = provenance.environment(job["device"]) | {
        "started": started,
        "finished": provenance.now_iso(),
        "wall_s": round(time.time() - t0, 3),
        "timing_cpu": os.environ.get(gpulock.TIMING_CPU_ENV) or None,
        # the machine-wide isolation of the timing CPUs, when the workflow made one (root)
        "system_isolation": _system_isolation(),
        # "workflow": every process of the run kept off the timing CPUs; "worker": only workers
        "timing_cpu_reserved_by": (
            ("workflow" if os.environ.get(gpulock.RESERVED_ENV) else "worker")
            if os.environ.get(gpulock.TIMING_CPU_ENV)
            else None
        ),
    }
    return res


def main(argv: list[str]) -> int:
    job_path, out_path = argv[1], argv[2]
    job = json.loads(Path(job_path).read_text())
    try:
        res = run(job)
    except InfraError as err:
        print(f"l1bench worker: infrastructure failure: {err}", file=sys.stderr)
        return EXIT_INFRA
    atomic_write_text(out_path, json.dumps(res, indent=1, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - anything unexpected is a crash: no result
        traceback.print_exc()
        sys.exit(1)
