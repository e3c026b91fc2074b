"""The lab's tests: ``python -m pytest lab/tests`` from the repository's root, with the l1bench
package installed (or src/ on PYTHONPATH). The lab's package (lab/l1lab) is put on the path
here, so PYTHONPATH=lab is not needed."""

import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1]
if str(LAB) not in sys.path:
    sys.path.insert(0, str(LAB))


@pytest.fixture(autouse=True)
def _lab_on_pythonpath(monkeypatch):
    """Subprocesses (the lab's shell scripts) find l1lab as the tests do."""
    import os

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(LAB), os.environ.get("PYTHONPATH", "")) if p))
