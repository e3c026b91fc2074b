"""Imported first by the GPU bench scripts: without the l1bench package (a bare GPU node before
``. scripts/offline_install.sh``), stop in one line that names the fix, not a traceback. The
package is never put on sys.path from here (tests/test_package.py): it must be installed."""

import sys
from pathlib import Path

try:
    import l1bench  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "l1bench":
        raise
    sys.exit(f"{Path(sys.argv[0]).name}: the l1bench package is not installed: `pip install -e .` here, or on an "
             "offline GPU node `. scripts/offline_install.sh .whl` first (lab/device_run.sh does it)")
