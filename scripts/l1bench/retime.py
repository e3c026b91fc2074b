"""Time a task selection again into a results tree of its own (run-to-run spread, isolation runs).

``prepare`` copies the selection's build and check results (and the reference scan) from a
finished results tree into a new one, so that a run of the workflow with ``results_dir``
pointing there plans only the time jobs; built extensions can be shared with an earlier such
tree (``--ext-from``: hard links, so no task builds its extension twice on one machine).

    python -m l1bench.retime prepare results/h100 results/isolation/c1/h100 \\
        --tasks config/runs/h100_isolation.yaml --ext-from results/isolation/c0/h100
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from l1bench.compare import load_task_list  # noqa: E402


def prepare(src: Path, dest: Path, tids: list[str], ext_from: Path | None = None) -> dict:
    """Copy the build and check results of ``tids`` (and reference_scan.json) from ``src`` to
    ``dest``; hard-link the built extensions of ``ext_from`` (or copy where links fail).
    Existing files in ``dest`` are kept. Returns counts."""
    src, dest = Path(src), Path(dest)
    counts = {"build": 0, "check": 0, "ext": 0}
    for stage in ("build", "check"):
        (dest / stage).mkdir(parents=True, exist_ok=True)
        for tid in tids:
            f = src / stage / f"{tid}.json"
            if f.exists() and not (dest / stage / f.name).exists():
                shutil.copy2(f, dest / stage / f.name)
                counts[stage] += 1
    scan = src / "reference_scan.json"
    if scan.exists() and not (dest / scan.name).exists():
        shutil.copy2(scan, dest / scan.name)
    if ext_from is not None and (Path(ext_from) / "build" / "ext").is_dir():
        for tid in tids:
            there = Path(ext_from) / "build" / "ext" / tid
            here = dest / "build" / "ext" / tid
            if there.is_dir() and not here.exists():
                shutil.copytree(there, here, copy_function=_link_or_copy)
                counts["ext"] += 1
    return counts


def _link_or_copy(a, b):
    try:
        Path(b).hardlink_to(a)
    except OSError:
        shutil.copy2(a, b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="copy build/check results of a task list into a new results tree")
    p.add_argument("src", help="results/<device> of a finished run")
    p.add_argument("dest", help="the new results/<...>/<device>")
    p.add_argument("--tasks", required=True, nargs="+", help="YAML files with a tasks: list")
    p.add_argument("--ext-from", help="a results tree whose built extensions to share")
    args = ap.parse_args(argv)
    tids = sorted({t for f in args.tasks for t in load_task_list(f)})
    counts = prepare(Path(args.src), Path(args.dest), tids, Path(args.ext_from) if args.ext_from else None)
    print(f"{args.dest}: {len(tids)} tasks; copied {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
