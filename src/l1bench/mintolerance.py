"""The smallest tolerance at which a correctness trial passes.

``torch.allclose(input, other, atol=t, rtol=t)`` holds when ``|input - other| <= t + t * |other|``
for every element (elements equal to each other, infinities included, always pass; a NaN never
does). So it holds exactly when ``t >= max |input - other| / (1 + |other|)``: one number per trial
answers the check at every tolerance with ``atol == rtol``, and a table at a new tolerance needs
no new run. torch compares in the tensors' own dtype, so within a few units in the last place of
that number the two may round differently.

``math.inf``: no tolerance passes (a NaN, an infinity against a finite value, another shape or
dtype, a non-tensor output, another number of outputs). A result stores it as JSON ``null``
(:func:`to_json`), the tables read ``null`` back as ``math.inf`` (:func:`from_json`).
"""

from __future__ import annotations

import math

from l1bench.snippet import flatten_outputs

#: The tables' tolerances when config ``tolerances`` is not set (the schema's default).
DEFAULT_TOLERANCES = (1e-2, 1e-4)


def min_tolerance(input, other) -> float:
    """The smallest ``t`` with ``torch.allclose(input, other, atol=t, rtol=t)``; ``math.inf``
    when none (see the module's docstring). ``other`` is allclose's second argument: the
    harness calls ``allclose(reference_output, custom_output)``."""
    import torch

    if not (isinstance(input, torch.Tensor) and isinstance(other, torch.Tensor)):
        return math.inf
    if input.shape != other.shape or input.dtype != other.dtype:
        return math.inf
    if input.numel() == 0:
        return 0.0
    wide = torch.promote_types(input.dtype, torch.float64)
    a, b = input.detach().to(wide), other.detach().to(wide)
    ratio = (a - b).abs() / (1 + b.abs())
    ratio = torch.where(a == b, torch.zeros_like(ratio), ratio)
    worst = float(ratio.max())  # NaN propagates: inf / inf, or a NaN element
    return worst if math.isfinite(worst) else math.inf


def outputs_min_tolerance(ref_out, cus_out) -> float:
    """:func:`min_tolerance` of a model's outputs (a tensor, or a tuple or list of them): the
    largest over the outputs, ``math.inf`` when their numbers differ."""
    refs, cuss = flatten_outputs(ref_out), flatten_outputs(cus_out)
    if len(refs) != len(cuss):
        return math.inf
    return max((min_tolerance(r, c) for r, c in zip(refs, cuss, strict=True)), default=0.0)


def to_json(t: float) -> float | None:
    """A tolerance as a result stores it: ``None`` (JSON null) for ``math.inf``."""
    return t if math.isfinite(t) else None


def from_json(t) -> float:
    """Inverse of :func:`to_json`."""
    return math.inf if t is None else float(t)


def table_param(tolerances) -> dict:
    """The tolerances among the parameters that shape the tables (l1bench.tables_inputs): none
    when they are the default, so tables made before the key existed stay current."""
    if tolerances is None or sorted(tolerances) == sorted(DEFAULT_TOLERANCES):
        return {}
    return {"tolerances": sorted(float(t) for t in tolerances)}
