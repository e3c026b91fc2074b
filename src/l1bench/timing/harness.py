"""The published harness's primitives (CUDA-L1 ``eval/eval_cuda.py`` at the pinned commit): timing
calls and pairs, the laziness and correctness checks, the warm-ups, and constructing models on
the CPU with CUDA barred (:class:`CustomBuilder`). Callers run these inside a GPU section
(:mod:`l1bench.gpu.sections`).
"""

from __future__ import annotations

import contextlib
import statistics
import time

from l1bench import mintolerance
from l1bench.modes import MODES
from l1bench.results import Status
from l1bench.snippet import build_model, flatten_outputs, guarded, make_inputs, set_seed, short, to_device

#: Modes timed against their own baseline snippet (split names it after the mode); GPU only.
BASELINE_MODES = tuple(m.name for m in MODES if m.baseline)


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
    """(milliseconds of one call, what the host did while launching it): CUDA events on the current
    stream (a host timer on CPU); with a :class:`~l1bench.timing.hostclock.ThreadClock`, the
    launching thread's accounting from before the start event to after the end event is enqueued
    (else None).
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


def timed_pairs(base, custom, make_inputs_fn, n: int, rng, device: str, streams, ledger, trial: int, clock,
                reset=None):
    """The harness's ``n`` timed (reference, custom) pairs of one outer trial, in random order, on
    fresh inputs: (reference ms, custom ms).

    A pair whose launch the host disturbed (:meth:`hostclock.Delta.disturbed`) is recorded in
    ``ledger`` and timed again, up to ``n`` times per trial. A first pair (its calls allocate, a
    call into the driver) that stalled while launching (:func:`first_pair_slowed_in_driver`), or was
    disturbed, is timed again after ``reset`` (the first pair's state). Without disturbances the
    calls and random draws are exactly the harness's.
    """
    ref_ms: list = []
    cus_ms: list = []
    budget, pair = n, 0
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
            ledger.firsts.setdefault(trial, []).append(next(iter(got)) == "ref")  # got is in call order
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
        ledger.firsts[trial][0] = next(iter(got)) == "ref"
    return ref_ms, cus_ms


def _time_pair(base, custom, make_inputs_fn, rng, device: str, streams, clock) -> tuple[dict, dict]:
    """One timed (reference, custom) pair in the harness's random order, on fresh inputs:
    ({side: ms}, {side: launch Delta})."""
    inputs = make_inputs_fn()
    order = ("ref", "custom") if rng.random() < 0.5 else ("custom", "ref")
    if device.startswith("cuda"):
        find_model_streams(custom)  # the harness looks for them before every pair (host work, as it does)
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
    """Whether a call of the trial's first pair stalled (:func:`l1bench.timing.stalls.stalled` against
    the median of the trial's other pairs on its side) while its launch, on the host, took at
    least half of the extra time: it waited in the driver (allocating), not on the GPU. A first
    call that is slower because it allocates, but not stalled, is the harness's measurement and
    is kept."""
    from l1bench.timing.stalls import stalled

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
    """The paper protocol's laziness check: plain tensors on the device with real storage (the
    ``lazy`` status). :func:`l1bench.detectors.check_lazy` is the detectors' variant; both texts are
    recorded in results, so the two stay apart.
    """
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
    """(ok, reason, max_abs_diff) comparing two model outputs like the harness (shape + allclose; mixed
    dtypes and non-tensor outputs fail). :func:`l1bench.detectors.compare_outputs` is the detectors'
    variant (recorded in results too, so the two stay apart).
    """
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


#: Probe verdicts of this process (:meth:`CustomBuilder.probe`), by class: a task worker's later
#: steps (CUDA already running) take the verdict of the task's first step instead of
#: constructing every instance inside the lock.
_PROBED: dict[str, tuple[bool, str]] = {}


class CustomBuilder:
    """Builds ``ModelNew`` for a seed, keeping CPU work out of the device lock when it is safe.

    :meth:`probe` constructs one instance on the CPU before this process has touched CUDA, with
    CUDA's initialisation barred (:func:`cuda_barred`): if it completes, ``__init__`` is CPU-only and
    later instances are constructed outside the lock (:meth:`prepare`) and only moved inside it
    (:meth:`finish`), exactly ``ModelNew(*init_inputs).to(device)``. Otherwise they are built inside.
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
            earlier = _PROBED.get(self.key())
            if earlier is not None:  # a task worker's later step: the same class
                self.cpu_safe = earlier[0]
                self.probe_note = f"{earlier[1]} (probed in an earlier step of this process)"
                return
            self.probe_note = "CUDA initialised before the probe: constructed inside the lock"
            return
        self._probe(seed)
        _PROBED[self.key()] = (self.cpu_safe, self.probe_note)

    def key(self) -> str:
        """The class probed: its module (named after the snippet's hash) and name."""
        return f"{getattr(self.cls, '__module__', '?')}.{getattr(self.cls, '__qualname__', '?')}"

    def _probe(self, seed: int) -> None:
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


def run_reference_warmup(model_cpu, get_inputs, device: str, p: dict) -> None:
    """The harness first runs a fresh reference once in the process (its ``warmup_src``).

    Besides warming caches this initialises cuBLAS/cuDNN handles, without which a
    baseline that captures a CUDA graph on its first call fails the capture.
    """
    import torch

    with torch.no_grad(), guarded("the reference's warm-up run", Status.BASELINE_ERROR):
        model = move(model_cpu, device)
        model(*make_inputs(get_inputs, device))
        synchronize(device)
    del model


@contextlib.contextmanager
def driver_allocations(stats: dict, device: str):
    """Count the caching allocator's calls into the driver (``cudaMalloc``) during the body into
    ``stats["driver_allocations"]``, one number per call (an outer trial's timed pairs): a
    timed call that allocates from the driver is slower than one that reuses a cached block."""
    if not device.startswith("cuda"):
        yield
        return
    import torch

    before = torch.cuda.memory_stats(device).get("num_device_alloc", 0)
    try:
        yield
    finally:
        after = torch.cuda.memory_stats(device).get("num_device_alloc", 0)
        stats.setdefault("driver_allocations", []).append(after - before)


class HeldInputs:
    """What the published harness holds on the device through an outer trial: its ``inputs``
    variable and its ``_``.

    ``inputs`` first holds the inputs of the trial's reference warm-up (``warmup_src``,
    eval_cuda.py 736-737). Each timed pair (:meth:`draw`) draws its inputs on the host
    (``inputs = get_inputs()``, which lets the device inputs before go) and only then copies
    them to the device (``inputs = [x.cuda() ...]``, eval_cuda.py 884-885), so the copies can
    take the blocks just let go of. ``_`` (:attr:`warm_output`) holds the last warm-up call's
    output, the custom model's, through the timed pairs (eval_cuda.py 862-865).
    """

    def __init__(self, get_inputs, device: str):
        self.get_inputs, self.device = get_inputs, device
        self.warm_output = None
        self.current = to_device(get_inputs(), device)

    def draw(self):
        host = self.get_inputs()
        self.current = None  # the device inputs before, let go of once the new ones are drawn
        self.current = to_device(host, self.device)
        return self.current


def renew_first_pair(base, custom, warm_inputs, held: HeldInputs, device: str) -> None:
    """The state before a trial's first timed pair, again: the reference warm-up's inputs held
    anew and one warm-up call of both models, its output held."""
    held.warm_output = None
    held.draw()
    held.warm_output = warm_up(base, custom, warm_inputs, 1, device)


def warm_up(base, custom, inputs, n: int, device: str):
    """The harness's warm-up: ``n`` calls of both models on one input set, synchronised; each
    output held until the next call's is made (the harness's ``_ = model(...)``). Returns the
    last one."""
    last = None
    with guarded("warm-up", Status.RUNTIME_ERROR):
        for _ in range(n):
            last = base(*inputs)
            last = custom(*inputs)
            synchronize(device)
    return last


def correctness_trials(original, custom, get_inputs, device: str, p: dict, tolerances=None) -> tuple:
    """The harness's correctness check: (ok, reason, trials passed, max abs diff). Trial seeds are drawn
    from ``torch.manual_seed(seed)`` as the harness draws them; each trial compares shape and
    ``allclose(atol, rtol)``. ``tolerances``, a list, receives each trial's smallest passing
    tolerance (:func:`l1bench.mintolerance.outputs_min_tolerance`, JSON form).
    """
    import torch

    torch.manual_seed(p["seed"])
    seeds = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(p["correctness_trials"])]
    worst = 0.0
    for i, ts in enumerate(seeds):
        set_seed(ts)
        inputs = make_inputs(get_inputs, device)
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
        if tolerances is not None:
            tolerances.append(mintolerance.to_json(mintolerance.outputs_min_tolerance(ref_out, cus_out)))
        worst = max(worst, diff) if diff == diff else worst
        if not ok:
            return False, f"trial {i + 1}: {why}", i, worst
    return True, "", len(seeds), worst
