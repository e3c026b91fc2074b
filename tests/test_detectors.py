"""Integrity layer (l1bench.detectors, l1bench.timing.strict) against the adversarial suite, on CPU."""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from l1bench import snippet
from l1bench.detectors.checks import ceiling_flag, check_degenerate, check_precision
from l1bench.detectors.flags import flag_names
from l1bench.detectors.global_state import (
    check_global_state,
    diff_global_state,
    restore_global_state,
    snapshot_global_state,
)
from l1bench.detectors.run import run_detectors
from l1bench.detectors.tensors import clone_values
from l1bench.results import Flag
from l1bench.timing import strict, strictcalls

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("adv_cases", ROOT / "tests" / "adversarial" / "cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)

CPU_CASES = [c for c in cases.CASES if not c.needs_cuda]


def _run(case, cfg=None):
    ref_cls, get_inputs, get_init_inputs = snippet.load_reference(case.ref_source, "ref")
    custom_cls = snippet.load_custom(case.custom_source, "custom")
    return run_detectors(ref_cls, custom_cls, get_inputs, get_init_inputs, "cpu", cfg)


def _names(result):
    return flag_names(result["flags"])


# --------------------------------------------------------------------------- adversarial suite


def test_case_index_is_consistent():
    names = [c.name for c in cases.CASES]
    assert len(names) == len(set(names))
    assert {c.expected_flag for c in cases.CASES} - {None} <= set(Flag)
    assert {"honest_matmul", "honest_elementwise", "honest_conv"} <= set(names)
    assert all(c.needs_cuda for c in cases.CASES if c.name.startswith(("side_stream", "stale_graph", "l2_")))


@pytest.mark.parametrize("case", [c for c in CPU_CASES if c.expected_flag and not c.timed], ids=lambda c: c.name)
def test_hack_is_caught(case):
    result = _run(case)
    assert case.expected_flag in _names(result), result["flags"]
    assert Flag.DETECTOR_ERROR not in _names(result), result["flags"]


@pytest.mark.parametrize("case", [c for c in CPU_CASES if c.timed], ids=lambda c: c.name)
def test_a_hack_honest_under_the_detectors_is_caught_by_checked_timed_outputs(case):
    assert _run(case)["flags"] == []  # the detectors see an honest model
    ref_cls, get_inputs, get_init_inputs = snippet.load_reference(case.ref_source, "ref")
    custom_cls = snippet.load_custom(case.custom_source, "custom")
    ref, custom = ref_cls(*get_init_inputs()), custom_cls(*get_init_inputs())
    cfg = {"min_reps": 4, "max_reps": 6, "budget_s": 5.0, "warmup": 1, "verify_outputs": 2}
    timed = strict.time_strict(ref, custom, lambda: snippet.make_inputs(get_inputs, "cpu"), "cpu", cfg)
    assert [f["flag"] for f in timed["flags"]] == [case.expected_flag]


@pytest.mark.parametrize("case", [c for c in CPU_CASES if c.expected_flag is None], ids=lambda c: c.name)
def test_honest_model_gets_no_flag(case):
    result = _run(case)
    assert result["flags"] == []
    assert result["details"]["first_call_matches"] is True
    assert all(result["details"]["fresh_calls_match"])


def test_run_detectors_restores_global_state():
    before = snapshot_global_state()
    result = _run(cases.get_case("global_flags"))
    assert Flag.GLOBAL_STATE in _names(result)
    assert snapshot_global_state() == before


# --------------------------------------------------------------------------- single detectors

REF_RELU = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(32, 16)]
def get_init_inputs():
    return []
"""


def _with_custom(custom_src, ref_src=REF_RELU):
    ref_cls, get_inputs, get_init_inputs = snippet.load_reference(ref_src, "ref")
    custom_cls = snippet.load_custom(custom_src, "custom")
    return run_detectors(ref_cls, custom_cls, get_inputs, get_init_inputs, "cpu", {})


def test_persistent_output_buffer_is_same_storage():
    src = """
import torch
import torch.nn as nn
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.buf = None
    def forward(self, x):
        if self.buf is None:
            self.buf = torch.empty_like(x)
        return self.buf.copy_(torch.relu(x))
"""
    assert _names(_with_custom(src)) == [Flag.SAME_STORAGE]


def test_custom_exceptions_become_detector_error():
    in_forward = """
import torch.nn as nn
class ModelNew(nn.Module):
    def forward(self, x):
        raise ValueError("boom")
"""
    in_init = """
import torch.nn as nn
class ModelNew(nn.Module):
    def __init__(self):
        raise RuntimeError("no")
"""
    for src in (in_forward, in_init):
        result = _with_custom(src)
        assert _names(result) == [Flag.DETECTOR_ERROR]


def test_wrong_output_is_mismatch_not_cache():
    src = """
import torch.nn as nn
class ModelNew(nn.Module):
    def forward(self, x):
        return x * 3.0
"""
    assert _names(_with_custom(src)) == [Flag.OUTPUT_MISMATCH]


def test_wrong_only_later_is_mismatch_not_cache():
    src = """
import torch
import torch.nn as nn
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        return torch.relu(x) if self.calls == 1 else torch.relu(x) + 1.0
"""
    assert _names(_with_custom(src)) == [Flag.OUTPUT_MISMATCH]


def test_input_independent_reference_is_degenerate():
    ref = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.arange(8.0) + x.sum() * 0
def get_inputs():
    return [torch.randn(4)]
def get_init_inputs():
    return []
"""
    custom = """
import torch
import torch.nn as nn
class ModelNew(nn.Module):
    def forward(self, x):
        return torch.arange(8.0)
"""
    assert Flag.DEGENERATE_TASK in _names(_with_custom(custom, ref))


def test_precision_check_tolerates_fp32_rounding():
    ref = torch.randn(300, dtype=torch.float64)
    r32 = ref.float()
    noisy = (ref * (1 + 1e-7 * torch.randn(300, dtype=torch.float64))).float()
    flags, details = check_precision(noisy, r32, ref)
    assert flags == [] and details
    flags, _ = check_precision(ref.half().float(), r32, ref)
    assert [f["flag"] for f in flags] == [Flag.PRECISION_DOWNGRADE]


def test_ceiling_flag():
    assert ceiling_flag(3.0) == []
    assert ceiling_flag(12.0)[0]["flag"] == Flag.SPEEDUP_CEILING
    assert ceiling_flag(12.0, ceiling=20.0) == []
    assert ceiling_flag(None) == [] and ceiling_flag(float("nan")) == []


def test_snapshot_restore_round_trip():
    snap = snapshot_global_state()
    threads = torch.get_num_threads()
    try:
        torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
        torch.set_float32_matmul_precision("medium")
        torch.backends.cuda.matmul.allow_tf32 = False  # legacy + new API mixed: getters may refuse
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.set_num_threads(1 if threads != 1 else 2)
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True, warn_only=True)
        changed = snapshot_global_state()
        assert diff_global_state(snap, changed)
        flags = check_global_state(snap, changed, "test")
        assert [f["flag"] for f in flags] == [Flag.GLOBAL_STATE]
    finally:
        restore_global_state(snap)
    assert snapshot_global_state() == snap
    assert torch.get_default_dtype() == torch.float32
    assert torch.get_num_threads() == threads
    torch.get_float32_matmul_precision()  # readable again


# --------------------------------------------------------------------------- strict timing


class _Work(nn.Module):
    """Tiny CPU model: ``reps`` matrix products; records what it was called with."""

    def __init__(self, reps, sleep_s=0.0, clobber_threads=False):
        super().__init__()
        self.reps, self.sleep_s, self.clobber = reps, sleep_s, clobber_threads
        self.seen, self.threads = [], []

    def forward(self, x):
        self.seen.append((id(x), x.data_ptr()))
        self.threads.append(torch.get_num_threads())
        if self.clobber:
            torch.set_num_threads(1)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        for _ in range(self.reps):
            x = x @ x.T / 64.0
        return x


def _make_inputs():
    return [torch.randn(64, 64)]


class _Relu(nn.Module):
    """An honest ReLU; ``in_place``: on its input's memory (legal: the check's INPUT_MUTATION
    is the detectors' business, not a wrong output)."""

    def __init__(self, in_place=False):
        super().__init__()
        self.in_place = in_place

    def forward(self, x):
        return x.relu_() if self.in_place else torch.relu(x)


class _TimedCheat(nn.Module):
    """A ReLU that returns zeros when strict timing's timer calls it, honest anywhere else (the
    detectors, the correctness trials, the untimed reference run): the call stack tells."""

    def forward(self, x):
        import sys

        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "time" and frame.f_code.co_filename.endswith("strictcalls.py"):
                return torch.zeros_like(x)
            frame = frame.f_back
        return torch.relu(x)


def test_output_checks_pick_the_wanted_number_of_early_repetitions_and_later_ones_at_that_rate():
    import random

    checks = strictcalls.OutputChecks(3, 10, random.Random(1))
    assert sum(checks.picked(r) for r in range(10)) == 3
    later = sum(checks.picked(r) for r in range(10, 10010))
    assert 2500 < later < 3500  # rate 3 / 10
    none = strictcalls.OutputChecks(0, 10)
    assert not any(none.picked(r) for r in range(100)) and none.summary()["reps"] == []
    assert sum(strictcalls.OutputChecks(20, 10, random.Random(2)).picked(r) for r in range(10)) == 10


def test_the_copy_for_the_reference_clones_every_tensor():
    """strict timing's copy of a timed repetition's inputs (and the detectors' copies)."""
    x, y = torch.randn(3), torch.randn(2)
    copy = clone_values([x, (y, 4), {"z": x}])
    assert torch.equal(copy[0], x) and copy[0].data_ptr() != x.data_ptr()
    assert isinstance(copy[1], tuple) and copy[1][0].data_ptr() != y.data_ptr() and copy[1][1] == 4
    assert copy[2]["z"].data_ptr() != x.data_ptr()


def test_strict_timing_checks_timed_outputs_only_when_asked():
    cfg = {"min_reps": 5, "max_reps": 8, "budget_s": 5.0, "warmup": 1, "verify_outputs": 2}
    honest = strict.time_strict(_Relu(), _Relu(in_place=True), _make_inputs, "cpu", cfg)
    assert honest["flags"] == [] and honest["verified"]["mismatch"] is None
    assert len(honest["verified"]["reps"]) >= 2 and honest["stop_reason"] != "output_mismatch"
    cheat = strict.time_strict(_Relu(), _TimedCheat(), _make_inputs, "cpu", cfg)
    assert [f["flag"] for f in cheat["flags"]] == ["TIMED_OUTPUT_MISMATCH"]
    assert cheat["stop_reason"] == "output_mismatch" and "differs from the reference" in cheat["verified"]["mismatch"]
    off = strict.time_strict(_Relu(), _TimedCheat(), _make_inputs, "cpu", cfg | {"verify_outputs": 0})
    assert off["flags"] == [] and "verified" not in off  # the cheat goes unseen without the checks


def test_time_strict_cpu_keys_and_ci():
    ref, custom = _Work(6), _Work(1, clobber_threads=True)
    threads = torch.get_num_threads()
    cfg = {"min_reps": 5, "max_reps": 12, "budget_s": 5.0, "warmup": 2}
    res = strict.time_strict(ref, custom, _make_inputs, "cpu", cfg)
    for key in ("ref_ms", "custom_ms", "speedup_median", "speedup_mean", "ci95", "n", "rse", "flags"):
        assert key in res
    assert "custom_event_ms" not in res
    assert 5 <= res["n"] <= 12 and len(res["ref_ms"]) == len(res["custom_ms"]) == res["n"]
    lo, hi = res["ci95"]
    assert lo <= res["speedup_median"] <= hi
    assert res["speedup_median"] > 0 and res["flags"] == []
    # every call (warm-up included) saw a distinct tensor at a distinct address
    calls = ref.seen + custom.seen
    assert len({i for i, _ in calls}) == len(calls) and len({p for _, p in calls}) == len(calls)
    # the custom model lowers the thread count; the reference always ran with the original one
    assert set(ref.threads) == {threads} and torch.get_num_threads() == threads


def test_time_strict_respects_budget():
    cfg = {"min_reps": 10, "max_reps": 200, "budget_s": 0.1, "warmup": 0}
    res = strict.time_strict(_Work(0, sleep_s=0.02), _Work(0), _make_inputs, "cpu", cfg)
    assert res["stop_reason"] == "budget" and 1 <= res["n"] < 10


def test_time_strict_pool_memory_cap():
    cfg = {"min_reps": 50, "max_reps": 200, "warmup": 0, "pool_bytes": 64 * 64 * 4 * 8, "pool_chunk": 3}
    res = strict.time_strict(_Work(0), _Work(0), _make_inputs, "cpu", cfg)
    assert res["stop_reason"] == "pool_memory" and res["n"] == 4
    assert res["pool_bytes"] == 64 * 64 * 4 * 8 and strict.measured_nothing(res) is None


def test_time_strict_whose_pool_gives_out_in_the_warm_up_measured_nothing():
    """A crowded GPU leaves a small pool (30 % of its free memory): the warm-up can take every
    set, and the result then holds no pair and a NaN score. measured_nothing names it (the
    strict protocol fails the step with it, retried as out of memory: attempts.out_of_memory)."""
    cfg = {"min_reps": 10, "max_reps": 200, "warmup": 2, "pool_bytes": 64 * 64 * 4 * 3, "pool_chunk": 3}
    res = strict.time_strict(_Work(0), _Work(0), _make_inputs, "cpu", cfg)
    assert res["n"] == 0 and res["stop_reason"] == "pool_memory"
    why = strict.measured_nothing(res)
    assert why.startswith("strict timing measured nothing: the input pool (3 sets of at most 0 MiB)")
    assert why.endswith(strict.MEMORY_SHORT)
    from l1bench import attempts

    assert attempts.out_of_memory(f"l1bench worker: infrastructure failure: {why}")


def test_stats_helpers():
    assert strict.sync_mismatch_flag(10.0, 1.0)[0]["flag"] == Flag.EVENT_SYNC_MISMATCH
    assert strict.sync_mismatch_flag(0.03, 0.01) == []  # within host-sync slack
    assert strict.sync_mismatch_flag(1.2, 1.0) == []
    r, c = [2.0, 2.1, 1.9, 2.2, 2.0], [1.0, 1.1, 0.9, 1.0, 1.05]
    assert strict.bootstrap_ci(r, c, seed=1) == strict.bootstrap_ci(r, c, seed=1)
    assert strict.speedup_rse(r, c) > 0
    assert strict.cache_sensitivity(None, None, None, "cpu")["flags"] == []


# --------------------------------------------------------------------------- CLI


def test_run_adversarial_cli_cpu(tmp_path):
    out = tmp_path / "adv.json"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "run_adversarial.py"),
        "--device",
        "cpu",
        "--out",
        str(out),
        "--cases",
        "alias_input,honest_matmul,side_stream_python,timed_only_shortcut",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["alias_input"]["caught"] is True and data["alias_input"]["error"] is None
    assert data["honest_matmul"]["false_positive"] is False and data["honest_matmul"]["flags"] == []
    assert data["side_stream_python"]["skipped"]
    # honest under the detectors, caught by strict timing's checks of timed outputs
    assert data["timed_only_shortcut"]["caught"] is True and data["timed_only_shortcut"]["error"] is None
    # its cheap timed calls may also measure above the speedup ceiling, depending on the CPU's
    # load (CI on 2026-12-06: SPEEDUP_CEILING as well once); the verdict must not depend on timing
    flags = data["timed_only_shortcut"]["flags"]
    assert "TIMED_OUTPUT_MISMATCH" in flags and set(flags) <= {"TIMED_OUTPUT_MISMATCH", "SPEEDUP_CEILING"}, flags


def test_device_fingerprint_sees_every_byte():
    import torch

    from l1bench.detectors.tensors import device_fingerprint

    x = torch.randn(1001)  # 4004 bytes; also odd byte counts via uint8 views below
    same = x.clone()
    assert device_fingerprint(x) == device_fingerprint(same)
    for i in (0, 500, 1000):
        y = x.clone()
        y[i] += 1
        assert device_fingerprint(y) != device_fingerprint(x)
    swapped = x.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert device_fingerprint(swapped) != device_fingerprint(x)  # positions count, not just values
    b = torch.arange(7, dtype=torch.uint8)
    c = b.clone()
    c[6] = 0
    assert device_fingerprint(b) != device_fingerprint(c)  # padding does not hide the last byte


def test_batchnorm_folded_custom_is_not_a_mismatch():
    """A custom model with inference-mode BatchNorm semantics matches the reference in eval
    mode, as in the harness's correctness trials (in train mode it would not)."""
    import torch

    class Ref(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(8)

        def forward(self, x):
            return self.bn(x)

    class Folded(Ref):
        def forward(self, x):  # running statistics, whatever the module's mode
            return torch.nn.functional.batch_norm(x, self.bn.running_mean, self.bn.running_var,
                                                  self.bn.weight, self.bn.bias, False)

    res = run_detectors(Ref, Folded, lambda: [torch.randn(16, 8) * 3 + 1], lambda: [], "cpu", {"n_calls": 2})
    assert "OUTPUT_MISMATCH" not in res["details"]["flag_names"], res["flags"]


def test_a_scalar_loss_that_follows_its_inputs_is_not_degenerate():
    """0-d outputs are trivially 'constant within themselves': only the same value for every
    input makes a task degenerate (measured false positive: L1_T095, L1_T096, L1_T100)."""
    digests = [("a",), ("b",), ("c",)]
    losses = [torch.tensor(2.7429), torch.tensor(2.7272), torch.tensor(2.7511)]
    assert check_degenerate(losses, digests) == []
    zeros = [torch.zeros(()), torch.zeros(()), torch.zeros(())]
    assert flag_names(check_degenerate(zeros, digests)) == [Flag.DEGENERATE_TASK]
    filled = [torch.full((4, 4), 1.5), torch.full((4, 4), 1.5), torch.full((4, 4), 1.5)]
    assert flag_names(check_degenerate(filled, digests)) == [Flag.DEGENERATE_TASK]
    per_input = [torch.full((4,), v) for v in (0.1, 0.2, 0.3)]  # one number per input: information
    assert check_degenerate(per_input, digests) == []


def test_the_strict_pool_cap_is_the_gpus_total_memory_not_what_others_left_free(monkeypatch):
    """min(16 GiB, 30 % of total): the same pool on a crowded GPU as on an idle one (it was 30 %
    of the free memory: a crowded H100 run stopped 11 strict results on it, 2026-12-05)."""
    from types import SimpleNamespace

    import torch

    cuda = SimpleNamespace(type="cuda")
    for free in (2 << 30, 60 << 30):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev, f=free: (f, 80 << 30))
        assert strictcalls.default_pool_bytes(cuda) == 16 << 30
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev, f=free: (min(f, 24 << 30), 24 << 30))
        assert strictcalls.default_pool_bytes(cuda) == int(0.3 * (24 << 30))
    assert strictcalls.default_pool_bytes(SimpleNamespace(type="cpu")) == 1 << 30
