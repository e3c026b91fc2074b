"""The timing protocols: :func:`l1bench.worker.stages.do_time` prepares a time job once and hands a
:class:`TimingSetup` to the protocol of ``job["protocol"]`` (:func:`protocol_for`):
:class:`PaperProtocol` (the published harness's measurement) or :class:`StrictProtocol`
(:func:`l1bench.timing.strict.time_strict`).
"""

from __future__ import annotations

import random
import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from l1bench.gpu import gpulock
from l1bench.gpu.sections import phase
from l1bench.results import Status, stage_result
from l1bench.snippet import InfraError, guarded, make_inputs
from l1bench.timing import hostclock
from l1bench.timing.harness import (
    BASELINE_MODES,
    CustomBuilder,
    HeldInputs,
    correctness_trials,
    driver_allocations,
    find_model_streams,
    move,
    renew_first_pair,
    synchronize,
    timed_pairs,
    warm_up,
)


@dataclass(frozen=True)
class TimingSetup:
    """What :func:`~l1bench.worker.stages.do_time` prepared for a protocol: the mode, the device, the
    protocol parameters the result records as ``params`` (the paper protocol's: seed, warm-up,
    trials, tolerances; the strict protocol uses its seed, warm-up and tolerances) and the strict
    protocol's own (``strict``, recorded as ``strict_params``), ``stats`` (the step's, filled on
    and returned in what it found) and do_time's callables: ``baseline_on_cpu(seed)``,
    ``reference_on_cpu(seed)``, ``on_device(base_cpu, custom_cpu, seed, init_inputs)`` (inside a
    section), ``gpu_section(keep_cache=False)``, ``read_clocks("before" | "after")`` and, for a
    torch.compile mode, ``compiled_graphs()`` (None for the eager modes).
    """

    mode: str
    device: str
    params: dict
    stats: dict
    builder: CustomBuilder
    get_inputs: Callable
    rng: random.Random
    wait_for_streams: bool
    baseline_on_cpu: Callable
    reference_on_cpu: Callable
    on_device: Callable
    gpu_section: Callable
    clocks: dict
    read_clocks: Callable
    strict: dict | None = None
    compiled_graphs: Callable[[], int] | None = None


class TimingProtocol(ABC):
    """One way to time a prepared task."""

    #: The value of ``job["protocol"]`` that selects it.
    name: str

    @abstractmethod
    def time(self, setup: TimingSetup) -> dict:
        """Run the timed GPU sections (through ``setup.gpu_section()``) and return what they found
        (:func:`l1bench.results.stage_result`)."""


class PaperProtocol(TimingProtocol):
    """The published harness's protocol: a mode with its own baseline snippet is first checked against
    it; then per outer trial, in one GPU section, the warm-up calls and ``inner_trials`` timed pairs;
    the trials stop early below ``early_stop_below``. Score: mean over trials of
    mean(ref ms)/mean(custom ms).
    """

    name = "paper"

    def time(self, setup: TimingSetup) -> dict:
        mode, p, stats = setup.mode, setup.params, setup.stats
        if mode in BASELINE_MODES:
            wrong = self.against_baseline(setup)
            if wrong is not None:
                return wrong
        timings: dict = {"ref_ms": [], "custom_ms": [], "trial_scores": []}
        clock, ledger = hostclock.ThreadClock(), hostclock.Ledger()
        for outer in range(p["outer_trials"]):
            ref_ms, cus_ms = self.trial(setup, outer, clock, ledger)
            trial_score = statistics.fmean(ref_ms) / statistics.fmean(cus_ms)
            timings["ref_ms"].append([round(v, 5) for v in ref_ms])
            timings["custom_ms"].append([round(v, 5) for v in cus_ms])
            timings["trial_scores"].append(trial_score)
            if p.get("early_stop_below") is not None and trial_score < p["early_stop_below"]:
                break
        clock.close()
        if setup.compiled_graphs is not None:
            stats["compiled_graphs"] = setup.compiled_graphs()
        scores = timings["trial_scores"]
        stopped = len(scores) < p["outer_trials"]
        return stage_result(
            Status.OK,
            f"stopped after {len(scores)} outer trials (score < {p['early_stop_below']})" if stopped else "",
            score=statistics.fmean(scores),
            score_std=statistics.pstdev(scores) if len(scores) > 1 else 0.0,
            n_timings=sum(len(r) for r in timings["ref_ms"]),
            ref_ms_mean=statistics.fmean(v for r in timings["ref_ms"] for v in r),
            custom_ms_mean=statistics.fmean(v for r in timings["custom_ms"] for v in r),
            clocks_before=setup.clocks["before"],
            clocks_after=setup.clocks["after"],
            host_timing=ledger.summary(),
            **timings,
            **stats,
        )

    @staticmethod
    def against_baseline(setup: TimingSetup) -> dict | None:
        """The harness checks the custom model against the mode's own baseline, not the
        reference: the ``incorrect`` result when it differs, else None."""
        mode, p, stats = setup.mode, setup.params, setup.stats
        base_cpu, init_inputs = setup.baseline_on_cpu(p["seed"])
        custom_cpu = setup.builder.prepare(p["seed"], init_inputs)
        with setup.gpu_section(keep_cache=True), phase(stats, "baseline correctness"):
            base, custom = setup.on_device(base_cpu, custom_cpu, p["seed"], init_inputs)
            with guarded(f"correctness against the {mode} baseline", Status.BASELINE_ERROR):
                ok, why, _, _ = correctness_trials(base, custom, setup.get_inputs, setup.device, p)
            del base, custom, base_cpu, custom_cpu
        if ok:
            return None
        return stage_result(Status.INCORRECT, f"against the {mode} baseline: {why}", **stats)

    @staticmethod
    def trial(setup: TimingSetup, outer: int, clock, ledger) -> tuple[list, list]:
        """Outer trial ``outer`` (seed + trial), in one GPU section, in the harness's order
        (``eval_kernel_against_ref``): its warm-up reference moved and called on inputs held
        until the first timed pair's, both models placed (with the custom model's streams), the
        warm-up calls on inputs of their own, the timed pairs; (reference ms, custom ms)."""
        device, p, stats, get_inputs = setup.device, setup.params, setup.stats, setup.get_inputs
        seed = p["seed"] + outer
        warm_cpu = setup.reference_on_cpu(seed)
        base_cpu, init_inputs = setup.baseline_on_cpu(seed)
        custom_cpu = setup.builder.prepare(seed, init_inputs)
        # the cache kept from trial to trial: the harness's blocks outlive its trials (its
        # empty_cache runs before the trial's tensors are let go of, eval_cuda.py 1027)
        with setup.gpu_section(keep_cache=True):
            setup.read_clocks("before")
            with phase(stats, "models to device"):
                warm_model = move(warm_cpu, device)
                held = HeldInputs(get_inputs, device)
                with guarded("the reference's warm-up run", Status.BASELINE_ERROR):
                    warm_model(*held.current)
                    synchronize(device)
                base, custom = setup.on_device(base_cpu, custom_cpu, seed, init_inputs)
                streams = find_model_streams(custom) if setup.wait_for_streams else []
            warm_inputs = make_inputs(get_inputs, device)
            placed = (base, custom, streams, warm_inputs, held)
            ref_ms, cus_ms = PaperProtocol.timed(setup, placed, outer, clock, ledger)
            setup.read_clocks("after")
            del warm_model, warm_cpu, base, custom, base_cpu, custom_cpu, warm_inputs, held, placed
        return ref_ms, cus_ms

    @staticmethod
    def timed(setup: TimingSetup, placed: tuple, outer: int, clock, ledger) -> tuple[list, list]:
        """A trial's warm-up calls and timed pairs, inside its section; ``placed``: (baseline,
        custom model, the custom model's streams, the warm-up inputs, the :class:`HeldInputs`
        each timed pair draws from)."""
        device, p, stats = setup.device, setup.params, setup.stats
        base, custom, streams, warm_inputs, held = placed
        with phase(stats, "warm-up calls"):
            held.warm_output = warm_up(base, custom, warm_inputs, p["warmup"], device)
        with phase(stats, "timed pairs"), gpulock.DeviceLock.no_pause(), driver_allocations(stats, device):
            return timed_pairs(
                base,
                custom,
                held.draw,
                p["inner_trials"],
                setup.rng,
                device,
                streams,
                ledger,
                outer,
                clock,
                # called inside timed_pairs, in this call
                reset=lambda: renew_first_pair(base, custom, warm_inputs, held, device),
            )


class StrictProtocol(TimingProtocol):
    """The strict protocol: one GPU section (models placed, warm-up calls, then
    :func:`l1bench.timing.strict.time_strict` with the global state snapshotted before ``ModelNew``
    was constructed); score = its median speedup, its flags the result's."""

    name = "strict"

    def time(self, setup: TimingSetup) -> dict:
        device, p, stats = setup.device, setup.params, setup.stats
        builder, get_inputs = setup.builder, setup.get_inputs
        baseline_on_cpu, on_device, gpu_section = setup.baseline_on_cpu, setup.on_device, setup.gpu_section
        read_clocks, clocks = setup.read_clocks, setup.clocks
        import torch

        from l1bench import detectors
        from l1bench.timing import strict

        # Snapshot before ModelNew is constructed: strict timing restores this state before
        # every reference call, so flags a custom __init__ sets cannot change the reference.
        global_state = detectors.snapshot_global_state()
        base_cpu, init_inputs = baseline_on_cpu(p["seed"])
        custom_cpu = builder.prepare(p["seed"], init_inputs)
        with gpu_section(), phase(stats, "strict"):
            read_clocks("before")
            base, custom = on_device(base_cpu, custom_cpu, p["seed"], init_inputs)
            warm_up(base, custom, make_inputs(get_inputs, device), p["warmup"], device)
            with guarded("strict timing", Status.RUNTIME_ERROR), gpulock.DeviceLock.no_pause():
                st = strict.time_strict(
                    base,
                    custom,
                    lambda: make_inputs(get_inputs, device),
                    torch.device(device),
                    # timed outputs, when checked (verify_outputs), with the check's tolerances
                    setup.strict | {"atol": p["atol"], "rtol": p["rtol"]},
                    global_state=global_state,
                )
            read_clocks("after")
        common = {
            "strict": st,
            # the strict protocol's own parameters (``params`` holds the paper protocol's)
            "strict_params": dict(setup.strict or {}),
            "flags": st.get("flags", []),
            "n_timings": st.get("n", 0),
            "clocks_before": clocks["before"],
            "clocks_after": clocks["after"],
        }
        nothing = strict.measured_nothing(st)
        if nothing:  # no pair timed (the input pool gave out): a broken attempt, retried, not a score
            raise InfraError(nothing)
        mismatch = (st.get("verified") or {}).get("mismatch")
        if mismatch:  # a timed call's output was wrong: what was timed is not the task, no score
            return stage_result(Status.INCORRECT, f"strict timing: {mismatch}", **common, **stats)
        return stage_result(Status.OK, "", score=st["speedup_median"], **common, **stats)


PAPER, STRICT = PaperProtocol(), StrictProtocol()


def protocol_for(name: str) -> TimingProtocol:
    """The protocol of ``job["protocol"]``: strict for ``"strict"``, else the paper protocol."""
    return STRICT if name == STRICT.name else PAPER
