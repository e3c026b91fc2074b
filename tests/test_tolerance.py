"""The smallest passing tolerance of a correctness trial, against torch.allclose itself."""

import math

import pytest
import torch

from l1bench.tolerance import from_json, min_tolerance, outputs_min_tolerance, to_json


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
