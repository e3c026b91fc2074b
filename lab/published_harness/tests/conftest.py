"""Tests of the published-harness tool: ``python -m pytest lab/published_harness/tests`` from the
repository's root (l1bench installed, or src/ on PYTHONPATH). lab/ goes on the path here."""

import sys
from pathlib import Path

LAB = Path(__file__).resolve().parents[2]
if str(LAB) not in sys.path:
    sys.path.insert(0, str(LAB))
