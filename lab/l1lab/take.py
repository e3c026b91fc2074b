"""Take one results tree (and its run's logs) out of a device run's ``results.tgz``.

``lab/device_run.sh`` packs the whole ``results/`` and ``logs/`` of the GPU node into
``OUT/results.tgz``: the tree the run wrote, every committed tree the checkout carried, and the
logs of every run made on that node so far. An experiment keeps only the tree it ran and the
logs of that run, under a name of its own (``results/spread/c1/h100``, its
``runs/c1``). ``take`` does that:

- the tree's files, without built extensions, task snippets and scratch (``build/ext``,
  ``tasks``, ``tmp``: they are rebuilt from the release), are extracted into a temporary
  folder beside ``DEST`` and moved into place only when all were extracted; an existing
  ``DEST`` is replaced then, not before (an interrupted take leaves the old tree whole);
- with ``--runs DIR``, the Snakemake log and sampler files of the newest run in the archive
  (the stamp ``lab/device_run.sh`` gives one run: ``logs/snakemake-<stamp>.log``,
  ``logs/samples/*-<stamp>.*``), of every run whose Snakemake log names the tree with
  ``--tree-logs`` (a tree a second run finished: both runs, not the node's other runs), or of
  every run with ``--all-logs``;
- only regular files are extracted (no links, devices or paths with ``..``).

    python -m l1lab take OUT/c1/results.tgz results/c1/h100 results/spread/c1/h100 \\
        --runs results/spread/runs/c1
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

#: folders of a results tree that are not results (rebuilt from the release on demand)
SKIP = ("build/ext", "tasks", "tmp")
#: logs/snakemake-<stamp>.log, logs/samples/<kind>-<stamp>.<ext> (device_run.sh)
STAMP = re.compile(r"^logs/(?:snakemake-|samples/[a-z]+-)(\d{8}T\d{6})\.[a-z]+$")


class TakeError(Exception):
    """A problem with the archive or the paths, in one line that names it."""


def _norm(name: str) -> str:
    return PurePosixPath(name.removeprefix("./")).as_posix()


def trees(names) -> list[str]:
    """The results trees in an archive's member names: folders holding ``check/`` or ``time/``."""
    out = set()
    for n in map(_norm, names):
        parts = n.split("/")
        for i, p in enumerate(parts[:-1]):
            if p in ("check", "time") and i > 0:
                out.add("/".join(parts[:i]))
                break
    return sorted(out)


def tree_members(names, tree: str) -> dict[str, str]:
    """{member name: path relative to ``tree``} of the files under ``tree``, without ``SKIP``."""
    tree = _norm(tree).rstrip("/")
    out = {}
    for name in names:
        n = _norm(name)
        if not n.startswith(tree + "/"):
            continue
        rel = n[len(tree) + 1:]
        if any(rel == s or rel.startswith(s + "/") for s in SKIP):
            continue
        out[name] = rel
    return out


def log_members(names, all_logs: bool = False, stamps=None) -> dict[str, str]:
    """{member name: file name} of the run logs: the newest stamp's, all with ``all_logs``, or
    those of the given ``stamps``."""
    stamped = {name: m.group(1) for name in names if (m := STAMP.match(_norm(name)))}
    if not stamped:
        return {}
    if all_logs:
        chosen = set(stamped.values())
    elif stamps is not None:
        chosen = set(stamps)
    else:
        chosen = {max(stamped.values())}
    return {name: PurePosixPath(_norm(name)).name for name, stamp in stamped.items() if stamp in chosen}


def calls_naming(tgz: tarfile.TarFile, names, tree: str) -> set[str]:
    """The stamps of the runs whose Snakemake log names a file of ``tree`` (the runs that ran
    jobs writing to it)."""
    needle = tree.rstrip("/").encode() + b"/"
    out = set()
    for name in names:
        m = STAMP.match(_norm(name))
        if m and _norm(name).startswith("logs/snakemake-"):
            f = tgz.extractfile(name)
            if f is not None and needle in f.read():
                out.add(m.group(1))
    return out


def _extract(tgz: tarfile.TarFile, wanted: dict[str, str], dest: Path) -> int:
    """Extract the regular files ``wanted`` ({member: relative path}) under ``dest``."""
    n = 0
    for info in tgz.getmembers():
        if info.name not in wanted or not info.isfile():
            continue
        if ".." in PurePosixPath(wanted[info.name]).parts:
            raise TakeError(f"{info.name}: member leaves its folder")
        target = dest / wanted[info.name]
        target.parent.mkdir(parents=True, exist_ok=True)
        with tgz.extractfile(info) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out)
        n += 1
    return n


def _replace(tmp: Path, dest: Path) -> None:
    """Move ``tmp`` to ``dest``; an existing ``dest`` is moved aside first, removed after."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
    tmp.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def take(archive, tree: str, dest, runs=None, all_logs: bool = False, tree_logs: bool = False) -> dict:
    """Extract ``tree`` of ``archive`` to ``dest`` (and the run's logs to ``runs``): counts."""
    archive, dest = Path(archive), Path(dest)
    if not archive.is_file():
        raise TakeError(f"{archive}: archive not found")
    try:
        tgz = tarfile.open(archive)
    except (tarfile.TarError, OSError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0].rstrip(":")
        raise TakeError(f"{archive}: not a readable tar archive ({first})") from None
    with tgz:
        names = tgz.getnames()
        wanted = tree_members(names, tree)
        if not wanted:
            found = ", ".join(trees(names)) or "none"
            raise TakeError(f"{archive}: no results tree {tree} (results trees in it: {found})")
        dest.parent.mkdir(parents=True, exist_ok=True)
        counts = {"files": 0, "logs": 0}
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as tmp:
            staged = Path(tmp) / "tree"
            counts["files"] = _extract(tgz, wanted, staged)
            _replace(staged, dest)
        if runs is not None:
            stamps = calls_naming(tgz, names, tree) if tree_logs and not all_logs else None
            logs = log_members(names, all_logs, stamps)
            if logs:
                counts["logs"] = _extract(tgz, logs, Path(runs))
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive", help="a device run's results.tgz (lab/device_run.sh)")
    ap.add_argument("tree", help="the results tree in it, e.g. results/d7-c1/h100")
    ap.add_argument("dest", help="where the tree goes, e.g. results/spread/c1/h100 (replaced)")
    ap.add_argument("--runs", help="a folder for the run's Snakemake log and sampler files")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--all-logs", action="store_true", help="every run's logs, not only the newest run's")
    which.add_argument("--tree-logs", action="store_true",
                       help="the logs of every run whose Snakemake log names the tree (one finished over two runs)")
    args = ap.parse_args(argv)
    try:
        counts = take(args.archive, args.tree, args.dest, args.runs, args.all_logs, args.tree_logs)
    except TakeError as e:
        print(f"take: {e}", file=sys.stderr)
        return 1
    print(f"{args.dest}: {counts['files']} files from {args.archive}:{args.tree}"
          + (f"; {counts['logs']} log files in {args.runs}" if args.runs else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
