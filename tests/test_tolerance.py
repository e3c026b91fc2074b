"""The smallest passing tolerance of a correctness trial, against torch.allclose itself."""

import json
import math
import re

import pytest
import torch

from l1bench.mintolerance import from_json, min_tolerance, outputs_min_tolerance, to_json


def _random_pair(gen, dtype, n=64):
    """A reference and an output off by errors of several magnitudes, some elements exact."""
    a = torch.randn(n, generator=gen, dtype=torch.float64) * 10 ** torch.randint(-3, 3, (n,), generator=gen)
    scale = 10.0 ** float(torch.randint(-7, 0, (1,), generator=gen))
    b = a + torch.randn(n, generator=gen, dtype=torch.float64) * scale * (1 + a.abs())
    same = torch.rand(n, generator=gen) < 0.2
    b[same] = a[same]
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("dtype,margin", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_allclose_holds_just_above_and_fails_just_below(dtype, margin):
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for _ in range(200):
        a, b = _random_pair(gen, dtype)
        t = min_tolerance(a, b)
        assert math.isfinite(t) and t >= 0
        above = t * (1 + margin)
        assert torch.allclose(a, b, atol=above, rtol=above)
        if t > 0:
            below = t * (1 - margin)
            assert not torch.allclose(a, b, atol=below, rtol=below)
            checked += 1
    assert checked > 150


def test_the_second_argument_is_the_one_scaled_by_rtol():
    """allclose(input, other): |input - other| <= atol + rtol * |other|."""
    a, b = torch.tensor([0.0]), torch.tensor([1.0])
    assert min_tolerance(a, b) == pytest.approx(0.5)  # 1 / (1 + 1)
    assert min_tolerance(b, a) == pytest.approx(1.0)  # 1 / (1 + 0)
    assert torch.allclose(a, b, atol=0.5, rtol=0.5) and not torch.allclose(b, a, atol=0.99, rtol=0.99)


def test_equal_outputs_need_no_tolerance():
    x = torch.tensor([1.0, -2.0, math.inf, -math.inf])
    assert min_tolerance(x, x.clone()) == 0.0
    assert torch.allclose(x, x.clone(), atol=0, rtol=0)
    assert min_tolerance(torch.zeros(0), torch.zeros(0)) == 0.0


@pytest.mark.parametrize(
    "a,b",
    [
        (torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan])),  # equal_nan=False
        (torch.tensor([1.0]), torch.tensor([math.nan])),
        (torch.tensor([1.0]), torch.tensor([math.inf])),
        (torch.tensor([math.inf]), torch.tensor([1.0])),
        (torch.tensor([math.inf]), torch.tensor([-math.inf])),
        (torch.zeros(2), torch.zeros(3)),  # another shape
        (torch.zeros(2), torch.zeros(2, dtype=torch.float16)),  # another dtype: the harness fails it
        (torch.zeros(2), 0.0),  # not a tensor
    ],
)
def test_no_tolerance_passes(a, b):
    assert min_tolerance(a, b) == math.inf
    if isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype:
        assert not torch.allclose(a, b, atol=1e30, rtol=1e30)


def test_outputs_take_the_worst_and_their_number_must_match():
    ref = (torch.tensor([1.0]), torch.tensor([2.0]))
    assert outputs_min_tolerance(ref, (torch.tensor([1.0]), torch.tensor([2.3]))) == pytest.approx(0.3 / 3.3)
    assert outputs_min_tolerance(ref, (torch.tensor([1.0]),)) == math.inf
    assert outputs_min_tolerance(torch.tensor([1.0]), torch.tensor([1.0])) == 0.0


def test_json_form_stores_infinity_as_null():
    assert to_json(math.inf) is None and from_json(None) == math.inf
    assert from_json(to_json(0.25)) == 0.25


# ----------------------------------------------------------------- the tables' pass rates

N = 10  # correctness trials per check


def _check(status, trials=None, n=N):
    return {"status": status, "trials": trials, "n_trials": n}


CHECKS = {
    "L1_T001": _check("pass", [1e-6] * N),
    "L1_T002": _check("pass", [1e-6] * (N - 1) + [5e-3]),  # passes only at 1e-2
    "L1_T003": _check("incorrect", [1e-6, 0.05]),  # stopped at its second trial
    "L1_T004": _check("incorrect", [0.02]),  # at 0.1: the trials not run decide
    "L1_T005": _check("incorrect", [1e-6] * (N - 1) + [0.02]),  # its last trial failed: passes at 0.1
    "L1_T006": _check("incorrect", [math.inf]),  # NaN output
    "L1_T007": _check("compile_error"),
    "L1_T008": _check("no_code"),
    "L1_T009": _check("pass"),  # written before the record existed
}


@pytest.mark.parametrize(
    "t,expected",
    [
        (1e-2, {"pass": 2, "fail": 5, "unknown": 0, "unrecorded": 1}),
        (1e-4, {"pass": 1, "fail": 6, "unknown": 0, "unrecorded": 1}),
        (0.1, {"pass": 3, "fail": 2, "unknown": 2, "unrecorded": 1}),  # L1_T003, L1_T004 stopped early
    ],
)
def test_pass_counts_at_a_tolerance(t, expected):
    from l1bench.aggregate import tolerance as tt

    assert tt.pass_counts(CHECKS, t) == expected
    assert tt.verdict_at(CHECKS["L1_T008"], t) is None  # no code: not in the pool


def test_the_tasks_that_pass_only_at_the_looser_tolerance():
    from l1bench.aggregate import tolerance as tt

    assert tt.pass_only_looser(CHECKS, 1e-2, 1e-4) == ["L1_T002"]
    assert tt.pass_only_looser(CHECKS, 0.1, 1e-2) == ["L1_T005"]
    page = tt.per_task_section(CHECKS, [1e-4, 1e-2])
    assert "Pass at atol = rtol = 0.01, fail at 0.0001: 1 task(s)." in page
    assert re.search(r"\| L1_T002 \| +0\.005 \|", page)


def test_summary_gives_the_verdict_and_each_tolerance():
    from l1bench.aggregate import tolerance as tt

    text = tt.summary_section(CHECKS, (0.01, 0.01), [1e-2, 1e-4])
    assert "the paper's check (atol 0.01, rtol 0.01): the verdict" in text
    assert "3/8 (37.5%)" in text  # three checks passed of the eight that ran code
    assert "2/8 (25.0%); 1 not recorded" in text  # at 1e-2 from the records
    assert "1 task(s) pass at 0.01 but not at 0.0001" in text


def test_checks_without_records_are_not_recorded_never_zero(tmp_path):
    from l1bench.aggregate import tolerance as tt

    paths = []
    statuses = (("L1_T001", "pass"), ("L1_T002", "incorrect"), ("L1_T003", "no_code"), ("L1_T004", "lazy"))
    for tid, status in statuses:
        paths.append(tmp_path / f"{tid}.json")
        paths[-1].write_text(json.dumps({"kind": "check", "tid": tid, "status": status, "params": {}}))
    summary, per_task = tt.sections(paths, (0.01, 0.01), [1e-2, 1e-4])
    assert summary.startswith("\n## Correctness at other tolerances")
    assert summary.count(tt.NOT_RECORDED) == 2 and "(0.0%)" not in summary
    assert "1/3 (33.3%)" in summary  # the verdict itself is known
    assert "Not recorded (needs a check run)." in per_task
    assert tt.sections([], (0.01, 0.01), [1e-2]) == ("", "")


def test_records_are_read_back_from_json(tmp_path):
    from l1bench.aggregate import tolerance as tt

    path = tmp_path / "L2_T001.json"
    res = {"tid": "L2_T001", "status": "incorrect", "min_tolerance": [1e-3, None], "params": {"correctness_trials": 10}}
    path.write_text(json.dumps(res))
    assert tt.load_checks([path, tmp_path / "absent.json"]) == {
        "L2_T001": {"status": "incorrect", "trials": [1e-3, math.inf], "n_trials": 10}
    }


def test_default_tolerances_leave_the_tables_record_as_it_was():
    from l1bench.mintolerance import DEFAULT_TOLERANCES, table_param

    assert table_param(None) == {} and table_param(list(reversed(DEFAULT_TOLERANCES))) == {}
    assert table_param([1e-3]) == {"tolerances": [1e-3]}
