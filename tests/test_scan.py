"""Degenerate-reference scan (CPU)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("scan_references", ROOT / "scripts/scan_references.py")
scan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scan)

ZERO_REF = """import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.clamp(torch.min(x, torch.tensor(0.0)), min=0.0, max=1.0)
def get_inputs():
    return [torch.randn(4, 8)]
def get_init_inputs():
    return []
"""


def test_verdicts():
    assert scan.verdict([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]) == "zero"
    assert scan.verdict([[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]) == "constant"
    assert scan.verdict([[0.7, 0.7, 0.7], [0.9, 0.9, 0.9]]) == "ok"  # a scalar loss that varies
    assert scan.verdict([[0.0, 0.0, 0.0], [-1.0, 1.0, 1.0]]) == "ok"
    assert scan.verdict([]) == "no_tensor_output"


def test_scan_finds_identically_zero_reference(tmp_path):
    ref = tmp_path / "ref.py"
    ref.write_text(ZERO_REF)
    assert scan.scan_one(ref, trials=2, timeout=60)["verdict"] == "zero"
    ref.write_text(ZERO_REF.replace("torch.min(x, torch.tensor(0.0))", "x"))
    assert scan.scan_one(ref, trials=2, timeout=60)["verdict"] == "ok"
    ref.write_text("raise RuntimeError('boom')\n")
    assert scan.scan_one(ref, trials=1, timeout=60)["verdict"] == "error"
