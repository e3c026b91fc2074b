"""Time a task selection again into a results tree of its own (run-to-run spread, isolation runs).

``prepare`` copies the selection's build and check results (and the reference scan) from a
finished results tree into a new one, so that a run of the workflow with ``results_dir``
pointing there plans only the time jobs; built extensions can be shared with an earlier such
tree (``--ext-from``: hard links, so no task builds its extension twice on one machine).
``--stages check`` copies the checks only: the run plans no build and no check job (a time
job's inputs are its check, ``ancient``), and each task's first time job builds its extension
again as it loads it, the GPU lock released while compiling, in parallel across tasks (the
release's eager modes: 793 time jobs and nothing else, by a dry run).

``adopt`` brings the time results of such a tree back into the finished one: each result
replaces the one it re-times (written atomically), so a release is re-timed in place in as
many runs as it takes, every result always present, the old one until its new one exists.

    python -m l1lab retime prepare results/h100 results/spread/c1/h100 \\
        --tasks lab/runs/h100_isolation.yaml --ext-from results/spread/c0/h100
    python -m l1lab retime prepare results/h100 results/retime/h100 --stages check --keep-version 7
    python -m l1lab retime adopt results/retime/h100 results/h100
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from l1bench.aggregate.slices import load_task_list
from l1bench.io import atomic_write_text
from l1bench.results import Status

STAGES = ("build", "check")


#: The list of results :func:`prepare` copied into a results tree (paths relative to
#: it): an earlier run made them, so a report of the tree's own run leaves them out
#: (l1lab.stagetimes).
PREPARED = "prepared.json"


def prepared(root) -> set[str]:
    """The results :func:`prepare` copied into ``root`` (relative paths; empty
    without a list)."""
    try:
        return set(json.loads((Path(root) / PREPARED).read_text()).get("copied", []))
    except (OSError, ValueError, AttributeError):
        return set()


def checked_tasks(src: Path) -> list[str]:
    """Every task with a check result in ``src`` (the whole release of a finished run)."""
    return sorted(f.stem for f in (Path(src) / "check").glob("*.json"))


def prepare(src: Path, dest: Path, tids: list[str], ext_from: Path | None = None,
            stages: tuple[str, ...] = STAGES, keep_version: int | None = None) -> dict:
    """Copy the ``stages`` results (build, check) of ``tids`` (and reference_scan.json) from
    ``src`` to ``dest``; hard-link the built extensions of ``ext_from`` (or copy where links
    fail). With ``keep_version``, also the time results that need no new timing: scored with
    that timing version, or not scored (no code, incorrect...: the timing does not change them), so a
    run continues a re-timing where an earlier one stopped. Existing files in ``dest`` are
    kept. The copied results are listed in ``dest``/:data:`l1bench.results.PREPARED` (added to
    an earlier list). Returns counts."""
    src, dest = Path(src), Path(dest)
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stage(s) {sorted(unknown)}: choose from {', '.join(STAGES)}")
    counts = {"build": 0, "check": 0, "ext": 0}
    copied: list[str] = []
    if keep_version is not None:
        counts["time"] = 0
        wanted = set(tids)
        for f in sorted((src / "time").glob("*/*/*.json")):
            here = dest / f.relative_to(src)
            if f.stem not in wanted or here.exists():
                continue
            res = json.loads(f.read_text())
            if res.get("status") != Status.OK or timing_version(res) == keep_version:
                here.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, here)
                copied.append(here.relative_to(dest).as_posix())
                counts["time"] += 1
    for stage in stages:
        (dest / stage).mkdir(parents=True, exist_ok=True)
        for tid in tids:
            f = src / stage / f"{tid}.json"
            if f.exists() and not (dest / stage / f.name).exists():
                shutil.copy2(f, dest / stage / f.name)
                copied.append(f"{stage}/{f.name}")
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
    if copied:
        listed = sorted(prepared(dest) | set(copied))
        atomic_write_text(dest / PREPARED, json.dumps({"from": str(src), "copied": listed}, indent=1) + "\n")
    return counts


def adopt(src: Path, dest: Path, version: int | None = None) -> dict:
    """Copy every time result of ``src`` (``time/<protocol>/<mode>/<task>.json``) over the
    same file in ``dest``, atomically; with ``version``, only results of that timing version.
    A result the destination does not have is added. Returns counts (adopted, skipped, by
    protocol/mode)."""
    src, dest = Path(src), Path(dest)
    counts: dict = {"adopted": 0, "skipped": 0}
    for f in sorted((src / "time").glob("*/*/*.json")):
        rel = f.relative_to(src)
        text = f.read_text()
        try:
            res = json.loads(text)
        except (OSError, ValueError) as e:
            raise ValueError(f"{f}: not a result ({e})") from None
        if version is not None and res.get("status") == Status.OK and timing_version(res) != version:
            counts["skipped"] += 1
            continue
        atomic_write_text(dest / rel, text)
        key = "/".join(rel.parts[1:3])
        counts[key] = counts.get(key, 0) + 1
        counts["adopted"] += 1
    return counts


def timing_version(res: dict):
    """The timing version a result was scored with (its ``timing_version``, or the older key)."""
    return res.get("timing_version", res.get("timing_design"))


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
    p.add_argument("--tasks", nargs="+", help="YAML files with a tasks: list (default: every checked task)")
    p.add_argument("--ext-from", help="a results tree whose built extensions to share")
    p.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES,
                   help="which results to copy (default: build check)")
    p.add_argument("--keep-version", type=int,
                   help="also copy the time results scored with this timing version, and unscored ones")
    a = sub.add_parser("adopt", help="copy a re-timing tree's time results over a finished tree's")
    a.add_argument("src", help="the re-timing tree, results/<...>/<device>")
    a.add_argument("dest", help="the finished tree, results/<device>")
    a.add_argument("--version", type=int, help="adopt only scored results of this timing version")
    args = ap.parse_args(argv)
    if args.cmd == "adopt":
        counts = adopt(Path(args.src), Path(args.dest), args.version)
        print(f"{args.dest}: adopted from {args.src}: {counts}")
        return 0
    tids = sorted({t for f in args.tasks for t in load_task_list(f)}) if args.tasks else checked_tasks(args.src)
    counts = prepare(Path(args.src), Path(args.dest), tids, Path(args.ext_from) if args.ext_from else None,
                     tuple(args.stages), args.keep_version)
    print(f"{args.dest}: {len(tids)} tasks; copied {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
