"""``python -m l1lab TOOL [ARGS...]`` (with ``lab`` on PYTHONPATH): runs ``l1lab.TOOL``'s ``main``
with the rest of the command line. ``python -m l1lab TOOL --help`` lists a tool's arguments."""

from __future__ import annotations

import importlib
import sys

#: tool (= module of l1lab) -> what it is for
TOOLS = {
    "spread": "the same tasks timed twice: per-task spread and targets (repeat); RUN_SPREAD lists (spreads)",
    "stagetimes": "per-stage wall time, exclusive GPU time and stalled timed calls of a results tree",
    "retime": "a results tree that times a task list again (prepare), and its results taken back (adopt)",
    "take": "one results tree and its run's logs out of lab/device_run.sh's results.tgz",
    "figure": "the isolation figure of lab/evidence (driver calls delay a timed call; two runs agree)",
}


def usage() -> str:
    width = max(map(len, TOOLS))
    lines = [f"  {name:<{width}}  {text}" for name, text in TOOLS.items()]
    return "usage: python -m l1lab TOOL [ARGS...]   (TOOL --help)\n\ntools:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    tool, rest = argv[0], argv[1:]
    if tool not in TOOLS:
        print(f"l1lab: unknown tool {tool!r}\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"l1lab.{tool}")
    saved, sys.argv = sys.argv, [f"l1lab {tool}", *rest]
    try:
        return module.main(rest) or 0
    finally:
        sys.argv = saved


if __name__ == "__main__":
    raise SystemExit(main())
