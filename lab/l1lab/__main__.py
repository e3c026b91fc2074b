"""``python -m l1lab TOOL [ARGS...]`` (with ``lab`` on PYTHONPATH): runs ``l1lab.TOOL``'s ``main``
with the rest of the command line. ``python -m l1lab TOOL --help`` lists a tool's arguments."""

from __future__ import annotations

from l1bench.cli import dispatch

#: tool (= module of l1lab) -> what it is for
TOOLS = {
    "spread": "the same tasks timed twice: per-task spread and targets (repeat); RUN_SPREAD lists (spreads)",
    "stagetimes": "per-stage wall time, exclusive GPU time and stalled timed calls of a results tree",
    "retime": "a results tree that times a task list again (prepare), and its results taken back (adopt)",
    "take": "one results tree and its run's logs out of lab/device_run.sh's results.tgz",
    "drawcost": "what the paper protocol's host draws cost a release: lock time against input size, projected",
    "cost": "what a run made in pieces cost per stage: GPU lock, the wall its steps ran in, the lock's share",
    "moved": "what moved between two results trees (another timing version or GPU): per task, which side moved",
    "figure": "the isolation figure of lab/evidence (driver calls delay a timed call; two runs agree)",
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m l1lab", TOOLS, lambda tool: f"l1lab.{tool}", argv)


if __name__ == "__main__":
    raise SystemExit(main())
