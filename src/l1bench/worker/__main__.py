"""``python -m l1bench.worker JOB.json RESULT.json``: :func:`l1bench.worker.entry.main`."""

import sys
import traceback

from l1bench.worker.entry import main

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - anything unexpected is a crash: no result
        traceback.print_exc()
        sys.exit(1)
