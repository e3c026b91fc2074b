"""Raw material packed out of ``results/``: one checksummed, reproducible ``.tar.xz`` per body.

Per-call Snakemake logs, the GPU/CPU samplers of each device call and superseded experiment
trees are raw material: RUN_NOTES quotes them, no table is made from them. They live in a few
archives (``config/archives.yaml`` names each: the archive, its sha256, the folder it unpacks
to, what it holds) instead of as thousands of loose files. The tar is reproducible (members
sorted, owner and times zeroed), so packing the same files twice gives the same sha256.

``unpack`` checks the sha256 before anything is written, extracts only regular files and
folders under the destination (``tarfile``'s ``data`` filter), into a temporary folder first,
and moves each top-level member into place only when every member was extracted: an
interrupted unpack leaves nothing half-written. The rule ``unpack_archive``
(``rules/reports.smk``) and ``l1bench archive unpack NAME`` do this.

    l1bench archive pack results/archive/h100-runs.tar.xz results/h100/runs
    l1bench archive unpack h100-runs          # by its name in config/archives.yaml
    l1bench archive verify                    # every archive against its sha256
"""

from __future__ import annotations

import argparse
import io
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from l1bench.fetch import sha256_file
from l1bench.io import atomic_path

CONFIG = Path("config/archives.yaml")


class ArchiveError(Exception):
    """A problem with an archive, in one line that names it."""


def check(archive, sha256: str) -> None:
    """ArchiveError unless ``archive`` exists and has the recorded ``sha256``."""
    if not Path(archive).is_file():
        raise ArchiveError(f"{archive}: archive not found")
    got = sha256_file(archive)
    if got != sha256:
        raise ArchiveError(f"{archive}: sha256 {got} does not match the recorded {sha256}")


def members(paths, root: Path = Path(".")) -> list[str]:
    """The files under ``paths`` (files or folders, relative to ``root``), sorted, as the
    relative paths they get in the archive. A path that does not exist is an error."""
    out = set()
    for p in paths:
        full = root / p
        if full.is_file():
            out.add(Path(p).as_posix())
        elif full.is_dir():
            out.update((Path(p) / f.relative_to(full)).as_posix() for f in full.rglob("*") if f.is_file())
        else:
            raise ArchiveError(f"{p}: no such file or folder to pack")
    return sorted(out)


def pack(archive, paths, root: Path = Path(".")) -> tuple[str, int]:
    """Write ``archive`` (tar.xz) of the files under ``paths``, reproducibly and atomically;
    returns (sha256, number of files)."""
    names = members(paths, root)
    if not names:
        raise ArchiveError(f"{archive}: nothing to pack under {', '.join(map(str, paths))}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    with atomic_path(archive) as tmp:
        tmp.write_bytes(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    return sha256_file(archive), len(names)


def unpack(archive, sha256: str, dest: Path = Path(".")) -> list[str]:
    """Check ``archive`` against ``sha256``, then extract it under ``dest``; returns the
    member names. Existing files of the same names are replaced."""
    archive, dest = Path(archive), Path(dest)
    check(archive, sha256)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".unpack-", dir=dest) as tmp:
        with tarfile.open(archive, mode="r:xz") as tar:
            names = [m.name for m in tar.getmembers() if m.isfile()]
            tar.extractall(tmp, filter="data")
        for top in sorted({Path(n).parts[0] for n in names}):
            _merge(Path(tmp) / top, dest / top)
    return names


def _merge(src: Path, dst: Path) -> None:
    """Move the files under ``src`` to the same places under ``dst`` (each an atomic rename)."""
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
        return
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(f, target)


def read_config(path: Path = CONFIG) -> dict:
    """``{name: {archive, sha256, unpacks, about}}`` from ``config/archives.yaml``; an entry
    without one of the keys is an error naming it."""
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    entries = data.get("archives") or {}
    for name, entry in entries.items():
        for key in ("archive", "sha256", "unpacks", "about"):
            if not (entry or {}).get(key):
                raise ArchiveError(f"{path}: archive {name!r} has no {key!r}")
    return entries


def holder(path, entries: dict) -> str | None:
    """The name of the archive whose ``unpacks`` folder holds ``path`` (or is it), else None."""
    path = Path(path)
    for name, entry in entries.items():
        folder = Path(entry["unpacks"])
        if path == folder or folder in path.parents:
            return name
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="pack files or folders into a reproducible tar.xz; prints its sha256")
    p.add_argument("archive")
    p.add_argument("paths", nargs="+")
    p.add_argument("--remove", action="store_true", help="remove the packed files afterwards")
    u = sub.add_parser("unpack", help="unpack an archive of config/archives.yaml after checking its sha256")
    u.add_argument("names", nargs="*", help="archive names (default: all)")
    u.add_argument("--config", type=Path, default=CONFIG)
    v = sub.add_parser("verify", help="check every archive of config/archives.yaml against its sha256")
    v.add_argument("--config", type=Path, default=CONFIG)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            sha, n = pack(args.archive, args.paths)
            if args.remove:
                for p in args.paths:
                    shutil.rmtree(p) if Path(p).is_dir() else Path(p).unlink()
            print(f"{args.archive}: {n} files, sha256 {sha}")
            return 0
        entries = read_config(args.config)
        names = getattr(args, "names", None) or list(entries)
        unknown = [n for n in names if n not in entries]
        if unknown:
            raise ArchiveError(f"{args.config}: no archive named {unknown[0]!r} (known: {', '.join(entries)})")
        for name in names:
            e = entries[name]
            if args.cmd == "verify":
                check(e["archive"], e["sha256"])
                print(f"{name}: ok")
            else:
                n = len(unpack(e["archive"], e["sha256"]))
                print(f"{name}: {n} files unpacked to {e['unpacks']}")
    except ArchiveError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
