"""``python -m l1bench TOOL ...``: the ``l1bench`` command (l1bench.cli) without the PATH."""

from l1bench.cli import main

raise SystemExit(main())
