"""The worker's three stages: :func:`do_build` (CPU), :func:`do_check` and :func:`do_time`.

:func:`do_time` does what both timing protocols share (loading, the baseline and the probe of
``ModelNew``, the first section's reference warm-up, torch.compile's first call) and hands the
timed sections to the protocol of ``job["protocol"]`` (:mod:`l1bench.timing.protocols`).
"""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

from l1bench import provenance
from l1bench.gpu.sections import exclusive, phase
from l1bench.results import NO_CODE_REASON, Status, carried_forward, stage_result
from l1bench.snippet import (
    SnippetError,
    flatten_outputs,
    guarded,
    load_custom,
    load_reference,
    make_inputs,
    set_seed,
    short,
    to_device,
)
from l1bench.timing.harness import (
    BASELINE_MODES,
    CustomBuilder,
    construct,
    correctness_trials,
    lazy_problems,
    move,
    run_reference_warmup,
    synchronize,
)
from l1bench.timing.protocols import TimingSetup, protocol_for
from l1bench.worker.torch_hooks import (
    COMPILE_MODES,
    compiled_graphs,
    prepare_compile,
    release_lock_during_dynamo_compiles,
    wrap_baseline,
)

# --------------------------------------------------------------------------- build


def do_build(job: dict, meta: dict, snippets: dict) -> dict:
    """Compile the custom code's inline extensions into the task's extension folder (CPU)."""
    if "custom" not in snippets:
        return stage_result(Status.NO_CODE, NO_CODE_REASON)
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
    return stage_result(Status.OK, construct_note, build_s=round(time.perf_counter() - t0, 3), extensions=built)


# --------------------------------------------------------------------------- check


def do_check(job: dict, meta: dict, snippets: dict) -> dict:
    """Load, laziness and correctness on the device, as the paper protocol does."""
    prev = carried_forward(job)
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

    def run_detectors(ref):
        """The detectors' flags (their details into ``details``), inside a section."""
        from l1bench import detectors

        # The check's reference: built under the same seed and init inputs as the detectors
        # would build it, and only ever called in eval mode (no running statistics changed).
        with phase(stats, "detectors"):
            det = detectors.run_detectors(
                Model, ModelNew, get_inputs, get_init_inputs, torch.device(device), job["detectors"], ref_model=ref
            )
        details["detectors"] = det.get("details", {})
        return det.get("flags", [])

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
            inputs = make_inputs(get_inputs, device)
            with guarded("first call of ModelNew", Status.RUNTIME_ERROR):
                out = custom(*inputs)
                synchronize(device)
            problems = lazy_problems(flatten_outputs(out), device)
        if problems:
            return stage_result(Status.LAZY, "; ".join(problems), **stats)
        # The harness checks correctness on a fresh instance (state from the first call is dropped).
        del out, custom
        with phase(stats, "correctness"):
            custom = builder.finish(second, seed)
            del second
            ok, why, passed, worst = correctness_trials(ref, custom, get_inputs, device, p, tolerances := [])
        trials = {"trials_passed": passed, "min_tolerance": tolerances}  # l1bench.mintolerance
        if not ok:
            return stage_result(Status.INCORRECT, why, **trials, **stats)
        details["max_abs_diff"] = worst
        flags = []
        if job.get("detectors"):
            del custom
            flags = run_detectors(ref)
    return stage_result(Status.PASS, "", **trials, flags=flags, details=details, **stats)


# --------------------------------------------------------------------------- time


def baseline_source(mode: str, snippets: dict) -> str | None:
    return snippets.get(mode) if mode in BASELINE_MODES else snippets["ref"]


def do_time(job: dict, meta: dict, snippets: dict) -> dict:
    """Time the custom model against one baseline mode: the set-up both protocols share, with CPU work
    (loading, constructing models, torch.compile code generation) outside the device lock; the timed
    sections are the protocol's (:func:`l1bench.timing.protocols.protocol_for`).
    """
    mode, device, p = job["mode"], job["device"], job["params"]
    refused = _time_refused(job, snippets)
    if refused is not None:
        return refused
    base_src = baseline_source(mode, snippets)
    models = _time_models(mode, base_src, snippets)
    if isinstance(models, dict):  # the baseline did not load
        return stage_result(Status.BASELINE_ERROR, models["reason"])
    Base, Ref, get_inputs, get_init_inputs, ModelNew = models
    wait_for_streams = "cuda.Stream" in snippets["custom"] and device.startswith("cuda")
    stats: dict = {}
    rng = random.Random(p["seed"])

    def baseline_on_cpu(seed):
        """(baseline constructed under ``seed``, init inputs), before any device work."""
        set_seed(seed)
        init_inputs = to_device(get_init_inputs(), device)
        with guarded(f"constructing the {mode} baseline", Status.BASELINE_ERROR):
            return construct(Base, init_inputs, seed), init_inputs

    def reference_on_cpu(seed):
        """The reference constructed under ``seed`` (the harness's per-trial warm-up model)."""
        set_seed(seed)
        return construct(Ref, to_device(get_init_inputs(), device), seed)

    def on_device(base_cpu, custom_cpu, seed, init_inputs):
        """Inside the lock: the baseline moved (and wrapped), ModelNew moved or constructed."""
        base = wrap_baseline(move(base_cpu, device), mode)
        return base, builder.finish(custom_cpu, seed, init_inputs)

    set_seed(p["seed"])
    builder = CustomBuilder(ModelNew, to_device(get_init_inputs(), device), device)
    builder.probe(p["seed"])  # first: before this process touches CUDA
    stats["construct"] = builder.probe_note
    set_seed(p["seed"])
    gpu_section = first_section_warms_up(job, stats, construct(Ref, to_device(get_init_inputs(), device), p["seed"]),
                                         get_inputs)
    clocks, read_clocks = clock_reader(device)
    setup = TimingSetup(
        mode=mode,
        device=device,
        params=p,
        stats=stats,
        builder=builder,
        get_inputs=get_inputs,
        rng=rng,
        wait_for_streams=wait_for_streams,
        baseline_on_cpu=baseline_on_cpu,
        reference_on_cpu=reference_on_cpu,
        on_device=on_device,
        gpu_section=gpu_section,
        clocks=clocks,
        read_clocks=read_clocks,
        strict=job.get("strict"),
        compiled_graphs=compiled_graphs if mode in COMPILE_MODES else None,
    )
    t_setup = time.perf_counter()
    if mode in COMPILE_MODES:
        compile_reference(setup)
    stats["precompile_s"] = round(time.perf_counter() - t_setup, 3)
    return protocol_for(job["protocol"]).time(setup)


def _time_refused(job: dict, snippets: dict) -> dict | None:
    """The result of a time job that times nothing: its check's negative status carried
    forward, a baseline mode on the CPU, or no baseline code for the mode; else None."""
    mode = job["mode"]
    prev = carried_forward(job)
    if prev:
        return prev
    if mode in BASELINE_MODES and job["device"] == "cpu":
        return stage_result(Status.UNSUPPORTED, f"{mode} baselines need a CUDA GPU")
    if baseline_source(mode, snippets) is None:
        return stage_result(Status.NO_BASELINE, f"the release has no {mode} baseline code for this task")
    return None


def first_section_warms_up(job: dict, stats: dict, warm_model, get_inputs):
    """The time job's GPU sections (a context-manager factory): the device lock; the first
    section also runs the harness's reference warm-up on ``warm_model``."""
    device, p = job["device"], job["params"]
    pending = {"warmup": warm_model}

    @contextlib.contextmanager
    def gpu_section(keep_cache: bool = False):
        with exclusive(device, job, stats, keep_cache):
            if pending["warmup"] is not None:
                with phase(stats, "reference warm-up"):
                    run_reference_warmup(pending["warmup"], get_inputs, device, p)
                pending["warmup"] = None
            yield

    return gpu_section


def clock_reader(device: str):
    """SM/memory clocks around the timing, read inside the sections (in-process NVML calls are
    resource-manager calls too): ``(clocks, read_clocks)``; ``read_clocks("before")`` at the start
    of the first timed section, ``read_clocks("after")`` at the end of each."""
    clocks = {"before": None, "after": None}

    def read_clocks(when: str) -> None:
        if when == "after" or clocks["before"] is None:
            clocks[when] = provenance.clocks(device)

    return clocks, read_clocks


def _time_models(mode: str, base_src: str, snippets: dict):
    """(baseline class, reference class, get_inputs, get_init_inputs, ModelNew) of a time job, or
    ``{"reason": ...}`` when the mode's baseline does not load. ModelNew failing to load raises
    as :func:`l1bench.snippet.guarded` says (``load_error``)."""
    import torch  # noqa: F401 - imported where it always was: before the snippets load

    try:
        Base, _, _ = load_reference(base_src, label=mode)
    except SnippetError as err:
        return {"reason": err.reason}
    except Exception as err:  # noqa: BLE001
        return {"reason": f"loading {mode} baseline: {short(err)}"}
    Ref, get_inputs, get_init_inputs = load_reference(snippets["ref"])
    with guarded("loading custom code", Status.LOAD_ERROR):
        ModelNew = load_custom(snippets["custom"])
    return Base, Ref, get_inputs, get_init_inputs, ModelNew


def compile_reference(setup: TimingSetup) -> None:
    """A torch.compile mode's set-up: the harness's reference warm-up, then the first (compiling)
    call of the compiled reference inside a GPU section: tracing and code generation let go of
    the lock (release_lock_during_dynamo_compiles), every kernel runs with it. The compiled code
    is reused by every outer trial's model."""
    mode, device, p, stats = setup.mode, setup.device, setup.params, setup.stats
    stats["dynamo_compiles_unlocked"] = release_lock_during_dynamo_compiles()
    base_cpu, _ = setup.baseline_on_cpu(p["seed"])
    # imports and torch.compile's wrapper before the lock, not in the section (CPU only)
    stats["compile_prepared_s"] = prepare_compile(mode)
    with setup.gpu_section(), phase(stats, "compile (tracing and code generation unlocked)"), guarded(
        f"compiling the reference ({mode})", Status.BASELINE_ERROR
    ):
        inputs = make_inputs(setup.get_inputs, device)
        base = wrap_baseline(move(base_cpu, device), mode)
        base(*inputs)
        del base, base_cpu, inputs
