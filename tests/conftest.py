"""Test configuration: markers, and where the real release data is. The l1bench package is
imported as installed (pip install -r envs/requirements-dev.txt installs it: -e .)."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: end-to-end runs of the workflow (minutes); skip with -m 'not slow', CI runs them"
    )
    config.addinivalue_line(
        "markers", "slurm: runs a real single-node SLURM (opt-in: L1_SLURM_TEST=1, as root; CI runs it)"
    )


def _release_dir():
    env = os.environ.get("L1_RELEASE_DIR")
    if env:
        return Path(env)
    guess = ROOT.parent / "shared" / "cuda-l1"
    return guess if guess.is_dir() else None


@pytest.fixture(scope="session")
def release_dir():
    """The upstream release folder (``$L1_RELEASE_DIR``, default ``../shared/cuda-l1``)."""
    d = _release_dir()
    if d is None or not (d / "optimized_cuda_code").is_dir():
        pytest.skip("real release data not available (set L1_RELEASE_DIR)")
    return d
