"""Orchestration: :func:`run_detectors` builds both models, runs them on fresh inputs and
collects every detector's flags; failures of the custom model become DETECTOR_ERROR."""

from __future__ import annotations

import copy
import threading

from .. import snippet
from ..results import Flag
from .checks import (
    _foreign_threads,
    check_alias_input,
    check_degenerate,
    check_dtype,
    check_input_mutation,
    check_later_calls,
    check_lazy,
    check_new_threads,
    check_output_settled,
    check_precision,
    check_same_storage,
    settle,
    to_double,
)
from .flags import DEFAULTS, flag_names, make_flag
from .global_state import check_global_state, restore_global_state, snapshot_global_state
from .tensors import as_device, clone_values, compare_outputs, digest, digests, shares_memory, sync, tensors_of

# --------------------------------------------------------------------------- custom-model calls


def _call(model, inputs):
    return model(*inputs)


class CustomFailure(Exception):
    """The custom model raised during ``stage``."""

    def __init__(self, stage: str, err: BaseException):
        super().__init__(f"{stage}: {type(err).__name__}: {err}")
        self.stage = stage
        self.err = err


def _custom(stage: str, fn, *args):
    """Run custom-model code, turning its exceptions into :class:`CustomFailure`."""
    try:
        return fn(*args)
    except Exception as err:  # any failure of untrusted code
        raise CustomFailure(stage, err) from err


# --------------------------------------------------------------------------- orchestration


def _fresh(get_inputs, device, seed: int) -> list:
    snippet.set_seed(seed)
    return snippet.make_inputs(get_inputs, device)


def _reference_phase(ref_model, get_inputs, device, c) -> dict:
    """Generate every input set and the reference outputs (reference errors propagate)."""
    seed, n = int(c["seed"]), int(c["n_calls"])
    ph = {"A": _fresh(get_inputs, device, seed + 1)}
    ph["fresh"] = [_fresh(get_inputs, device, seed + 11 + k) for k in range(n)]
    ph["refill"] = _fresh(get_inputs, device, seed + 7)
    ph["ref_A"] = _call(ref_model, clone_values(ph["A"]))
    ph["ref_A_again"] = _call(ref_model, clone_values(ph["A"]))
    ph["ref_fresh"] = [_call(ref_model, clone_values(x)) for x in ph["fresh"]]
    ph["ref_refill"] = _call(ref_model, clone_values(ph["refill"]))
    sync(device)
    # A reference that disagrees with itself (random ops in forward) makes output checks moot.
    ph["deterministic"] = compare_outputs(ph["ref_A_again"], ph["ref_A"], float(c["atol"]), float(c["rtol"]))[0]
    # Does the reference itself alias its inputs or reuse its output memory?
    a_in = clone_values(ph["A"])
    a_out = _call(ref_model, a_in)
    b_out = _call(ref_model, clone_values(ph["fresh"][0])) if ph["fresh"] else None
    ph["ref_aliases"] = shares_memory(a_out, a_in)
    ph["ref_reuses"] = b_out is not None and shares_memory(a_out, b_out)
    ph["_hold"] = [a_in, a_out, b_out]
    # float64 reference for the precision check (skipped if it cannot run in float64)
    try:
        ref64_model = copy.deepcopy(ref_model).double()
        ph["ref64_A"] = _call(ref64_model, to_double(clone_values(ph["A"])))
        ph["ref64_error"] = None
    except Exception as err:  # noqa: BLE001 - reference not runnable in float64
        ph["ref64_A"], ph["ref64_error"] = None, snippet.short(f"{type(err).__name__}: {err}", 120)
    return ph


def _call_settled(stage: str, model, inputs, device, c):
    """Call the custom model and let late work finish (threads joined), so that
    later comparisons test caching rather than timing races."""
    threads = set(threading.enumerate())
    out = _custom(stage, _call, model, inputs)
    settle(device, _foreign_threads(threads), c["join_timeout_s"], 0.0)
    return out


def _custom_phase(custom_model, ph, device, c, base_state, flags, details) -> None:
    """Run the custom model through every detector (exceptions become CustomFailure)."""
    atol, rtol = float(c["atol"]), float(c["rtol"])
    A = ph["A"]
    hold = []

    # main call: late writes, threads, mutation, laziness, aliasing, dtype, precision
    before = digests(A)
    threads = set(threading.enumerate())
    out = _custom("call", _call, custom_model, A)
    at_return = [t.detach().clone() for t in tensors_of(out)]  # queued right after the return
    flags += check_new_threads(threads, "call")
    settle(device, _foreign_threads(threads), c["join_timeout_s"], c["settle_s"])
    flags += check_output_settled([digest(t) for t in at_return], digests(out))
    flags += check_input_mutation(before, digests(A))
    flags += check_lazy(out, device)
    flags += check_alias_input(out, A, ph["ref_aliases"])
    flags += check_dtype(out, ph["ref_A"])
    after_call = snapshot_global_state()
    flags += check_global_state(base_state, after_call, "calling the custom model")
    restore_global_state(base_state)

    compare_ok = ph["deterministic"]
    details["reference_deterministic"] = compare_ok
    main_ok, why = compare_outputs(out, ph["ref_A"], atol, rtol)
    details["first_call_matches"] = main_ok
    if compare_ok and not main_ok:
        flags.append(make_flag(Flag.OUTPUT_MISMATCH, f"first call disagrees with the reference: {why}"))
    if compare_ok and main_ok and ph["ref64_A"] is not None:
        pf, pd = check_precision(
            out, ph["ref_A"], ph["ref64_A"], float(c["precision_factor"]), float(c["precision_floor"])
        )
        flags += pf
        details["precision"] = pd
    else:
        details["precision"] = ph["ref64_error"] or "skipped"

    # Later calls: fresh tensors, then the first tensors refilled in place with new data.
    # A wrong output that equals the reference for *earlier* inputs is a stale (cached)
    # result; any other wrong output is a plain mismatch.
    earlier = [ph["ref_A"]]
    stale, wrong, fresh_ok = [], [], []

    def judge(label, out_k, ref_k):
        ok = compare_outputs(out_k, ref_k, atol, rtol)[0]
        if not ok:
            is_stale = any(compare_outputs(out_k, r, atol, rtol)[0] for r in earlier)
            (stale if is_stale else wrong).append(label)
        earlier.append(ref_k)
        return ok

    for k, (x, ref_x) in enumerate(zip(ph["fresh"], ph["ref_fresh"], strict=False)):
        out_x = _call_settled(f"fresh call {k + 1}", custom_model, x, device, c)
        hold.append(out_x)
        fresh_ok.append(judge(f"fresh call {k + 1}", out_x, ref_x))
    flags += check_same_storage(out, hold, ph["ref_reuses"])

    for dst, src in zip(A, ph["refill"], strict=False):
        if hasattr(dst, "copy_") and hasattr(src, "shape"):
            dst.copy_(src)
    out_refill = _call_settled("in-place refill call", custom_model, A, device, c)
    refill_ok = judge("same tensors refilled in place", out_refill, ph["ref_refill"])
    details["fresh_calls_match"] = fresh_ok
    details["refill_call_matches"] = refill_ok
    if compare_ok and main_ok:
        flags += check_later_calls(stale, wrong)

    flags += check_global_state(base_state, snapshot_global_state(), "later calls of the custom model")
    restore_global_state(base_state)
    del hold


def _eval(model) -> None:
    if hasattr(model, "eval"):
        model.eval()


def run_detectors(ref_cls, custom_cls, get_inputs, get_init_inputs, device, cfg=None, ref_model=None) -> dict:
    """Run every detector on one (reference, custom) pair; return ``{"flags", "details"}``.

    Models are built as :func:`l1bench.snippet.build_model` does; ``cfg`` keys: :data:`DEFAULTS`.
    ``ref_model``: an already built reference (same seed, init inputs and device). Reference
    failures propagate; a custom model's failure is a DETECTOR_ERROR flag that ends its checks,
    except infrastructure failures (CUDA faults, OOM), raised as :class:`l1bench.snippet.InfraError`.
    Global backend settings are restored before returning.
    """
    import torch

    c = dict(DEFAULTS)
    c.update(cfg or {})
    dev = as_device(device)
    flags, details = [], {}
    state0 = snapshot_global_state()
    with torch.no_grad():
        try:
            snippet.set_seed(int(c["seed"]))
            init_inputs = get_init_inputs()
            if ref_model is None:  # else: the caller's reference, built the same way (same seed)
                ref_model = snippet.build_model(ref_cls, init_inputs, int(c["seed"]), dev)
            # Eval mode, as the harness's correctness trials: in train mode BatchNorm normalises
            # with batch statistics and dropout is random, and a custom model that folds
            # BatchNorm into its kernel (inference semantics) would "disagree" with the reference.
            _eval(ref_model)
            ph = _reference_phase(ref_model, get_inputs, dev, c)
            refs = [ph["ref_A"], *ph["ref_fresh"]]
            ins = [digests(ph["A"]), *[digests(x) for x in ph["fresh"]]]
            flags += check_degenerate(refs, ins)
            base_state = snapshot_global_state()
            try:
                threads = set(threading.enumerate())
                custom_model = _custom(
                    "construct", snippet.build_model, custom_cls, init_inputs, int(c["seed"]), dev
                )
                flags += check_new_threads(threads, "construction")
                flags += check_global_state(base_state, snapshot_global_state(), "constructing the custom model")
                restore_global_state(base_state)
                _eval(custom_model)
                _custom_phase(custom_model, ph, dev, c, base_state, flags, details)
            except Exception as fail:  # noqa: BLE001 - custom code or its odd outputs broke a check
                cause = fail.err if isinstance(fail, CustomFailure) else fail
                stage = fail.stage if isinstance(fail, CustomFailure) else "checking outputs"
                err = snippet.classify_exception(cause, "detector_error", stage)
                if isinstance(err, snippet.InfraError):
                    raise err from cause
                flags.append(make_flag(Flag.DETECTOR_ERROR, f"{stage}: {type(cause).__name__}: {cause}"))
        finally:
            restore_global_state(state0)
    details["flag_names"] = flag_names(flags)
    return {"flags": flags, "details": details}
