#!/usr/bin/env python3
"""Build an offline wheelhouse of Snakemake's runtime closure for GPU nodes.

Air-gapped GPU machines cannot reach PyPI, so we download binary wheels here
for the target interpreter (CPython ``--python-version``, linux x86_64) and
carry the folder over::

    python scripts/build_wheelhouse.py --dest .whl --python-version 3.12

The pinned list lives in ``envs/requirements-gpu-node.txt``; ``--slurm`` adds
``envs/requirements-slurm.txt`` (the SLURM executor plugin of ``profiles/slurm`` and what it
needs beyond that list), for the nodes of a cluster. Pure-Python
packages published only as sdists (:data:`SDIST_ONLY`) are built into
``py3-none-any`` wheels here with ``pip wheel``. :data:`BUILD_TOOLS` (setuptools) go to
``build-tools/`` inside it: ``scripts/offline_install.sh`` builds this repository's l1bench
package with them on the node, without installing them beside snakemake. After the download
:func:`missing_requirements` checks that every ``Requires-Dist`` of every wheel
(markers evaluated for the target) is met by a wheel in the folder; the script
exits non-zero if not. :data:`LEFT_OUT` (pulp, 16 MB of bundled solver binaries, for
Snakemake's ILP scheduler, which the profiles do not use: ``scheduler: greedy``) stays out
unless ``--with-ilp``; the closure check then does not ask for it.
"""

from __future__ import annotations

import argparse
import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # pragma: no cover - pip always vendors packaging
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REQUIREMENTS = ROOT / "envs" / "requirements-gpu-node.txt"
SLURM_REQUIREMENTS = ROOT / "envs" / "requirements-slurm.txt"

#: pip ``--platform`` tags accepted on a glibc >= 2.28 linux x86_64 node.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux1_x86_64",
    "any",
)

#: Pure-Python packages without a wheel on PyPI; built locally with ``pip wheel``.
SDIST_ONLY = frozenset({"connection-pool"})

#: Requirements of Snakemake that the workflow never imports, and why: left out of the
#: wheelhouse unless ``--with-ilp`` (a carried working tree with the wheelhouse stays small).
LEFT_OUT = {"pulp": "Snakemake's ILP scheduler; profiles/*/config.yaml choose scheduler: greedy"}

#: What builds the l1bench package (pyproject.toml's build-system, here the development venv's
#: version) on a node without network, and the wheelhouse's folder that holds it.
BUILD_TOOLS = ("setuptools==84.2.1",)
BUILD_TOOLS_DIR = "build-tools"


def read_requirements(path: str | Path) -> list[str]:
    """Requirement lines of ``path`` without comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in Path(path).read_text().splitlines())
    return [line for line in lines if line]


def merge_requirements(paths) -> list[str]:
    """The requirement lines of several files, each name once; a name pinned differently in
    two files is an error (ValueError, one line naming both)."""
    seen: dict[str, tuple[str, Path]] = {}
    out = []
    for path in paths:
        for line in read_requirements(path):
            name = canonicalize_name(Requirement(line).name)
            if name in seen:
                if Requirement(seen[name][0]).specifier != Requirement(line).specifier:
                    raise ValueError(f"{path}: {line} conflicts with {seen[name][0]} in {seen[name][1]}")
                continue
            seen[name] = (line, Path(path))
            out.append(line)
    return out


def pip_download_command(
    dest: str | Path, python_version: str, requirements: list[str], python: str = sys.executable
) -> list[str]:
    """The ``pip download`` command line fetching ``requirements`` for the target."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    return cmd + ["-d", str(dest), *requirements]


def pip_wheel_command(dest: str | Path, requirements: list[str], python: str = sys.executable) -> list[str]:
    """The ``pip wheel`` command line building pure-Python sdists into ``dest``."""
    return [python, "-m", "pip", "wheel", "--no-deps", "-w", str(dest), *requirements]


def marker_environment(python_version: str = "3.12") -> dict[str, str]:
    """PEP 508 marker environment of a CPython ``python_version`` linux x86_64 node."""
    full = python_version if python_version.count(".") >= 2 else python_version + ".0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "python_version": ".".join(full.split(".")[:2]),
        "sys_platform": "linux",
        "extra": "",
    }


def wheel_metadata(wheel: str | Path):
    """The parsed ``*.dist-info/METADATA`` of a wheel (an ``email.message.Message``)."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not names:
            raise ValueError(f"{wheel}: no .dist-info/METADATA")
        text = zf.read(names[0]).decode("utf-8")
    return email.parser.HeaderParser().parsestr(text)


def missing_requirements(folder: str | Path, python_version: str = "3.12", left_out=()) -> list[str]:
    """Unmet requirements of the wheels in ``folder``, one readable line each.

    Every ``Requires-Dist`` whose marker is true for the target (extras off)
    must be matched, name and version, by a wheel in the same folder, except the names in
    ``left_out`` (left out on purpose: :data:`LEFT_OUT`).
    """
    metas = [wheel_metadata(w) for w in sorted(Path(folder).glob("*.whl"))]
    dists = [(m["Name"], m["Version"], m.get_all("Requires-Dist") or []) for m in metas]
    return _unmet(dists, python_version, "not in wheelhouse", left_out)


def missing_from_pins(requirements: list[str], requires_of, python_version: str = "3.12") -> list[str]:
    """Unmet requirements of pinned distributions, one readable line each: what
    :func:`missing_requirements` would report for a wheelhouse of exactly these pins, read from
    metadata instead of wheels (no download). ``requires_of(name, version)`` gives a
    distribution's ``Requires-Dist`` lines, or None where its metadata is not at hand (then its
    own requirements are not checked)."""
    dists = []
    for line in requirements:
        req = Requirement(line)
        pins = [sp.version for sp in req.specifier if sp.operator == "=="]
        if not pins:
            raise ValueError(f"{line}: not pinned (name==version)")
        dists.append((req.name, pins[0], requires_of(req.name, pins[0])))
    return _unmet([d for d in dists if d[2] is not None] + [(n, v, []) for n, v, r in dists if r is None],
                  python_version, "not pinned")


def _unmet(dists, python_version: str, absent: str, left_out=()) -> list[str]:
    """Requirements of ``dists`` ([(name, version, Requires-Dist lines)]) that no other of
    them meets, markers evaluated for the target (extras off), ``left_out`` names excepted."""
    env = marker_environment(python_version)
    skip = {canonicalize_name(n) for n in left_out}
    have = {canonicalize_name(name): Version(version) for name, version, _ in dists}
    missing = []
    for name, version, requires in dists:
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if canonicalize_name(req.name) in skip:
                continue
            got = have.get(canonicalize_name(req.name))
            if got is None or not req.specifier.contains(got, prereleases=True):
                found = f"found {got}" if got else absent
                missing.append(f"{name} {version} requires {line.split(';')[0].strip()} ({found})")
    return missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", required=True, type=Path, help="wheelhouse folder (keep it out of git)")
    ap.add_argument("--python-version", default="3.12", help="target CPython version (default 3.12)")
    ap.add_argument("--requirements", type=Path, action="append",
                    help=f"pinned list (repeatable; default {DEFAULT_REQUIREMENTS.relative_to(ROOT)})")
    ap.add_argument("--slurm", action="store_true",
                    help=f"also the SLURM executor of profiles/slurm ({SLURM_REQUIREMENTS.relative_to(ROOT)})")
    ap.add_argument("--python", default=sys.executable, help="interpreter whose pip downloads")
    ap.add_argument("--with-ilp", action="store_true",
                    help="also pulp, for Snakemake's ILP scheduler (" + LEFT_OUT["pulp"] + ")")
    args = ap.parse_args(argv)
    left_out = () if args.with_ilp else tuple(LEFT_OUT)

    files = (args.requirements or [DEFAULT_REQUIREMENTS]) + ([SLURM_REQUIREMENTS] if args.slurm else [])
    try:
        skip = {canonicalize_name(n) for n in left_out}
        reqs = [r for r in merge_requirements(files) if canonicalize_name(Requirement(r).name) not in skip]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    args.dest.mkdir(parents=True, exist_ok=True)
    sdist = [r for r in reqs if canonicalize_name(Requirement(r).name) in SDIST_ONLY]
    binary = [r for r in reqs if r not in sdist]
    cmds = [pip_download_command(args.dest, args.python_version, binary, args.python)]
    if sdist:
        cmds.append(pip_wheel_command(args.dest, sdist, args.python))
    cmds.append(pip_download_command(args.dest / BUILD_TOOLS_DIR, args.python_version, list(BUILD_TOOLS), args.python))
    for cmd in cmds:
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode:
            print(f"error: pip {cmd[3]} failed", file=sys.stderr)
            return 1

    missing = missing_requirements(args.dest, args.python_version, left_out)
    wheels = sorted(p.name for p in args.dest.glob("*.whl"))
    print(f"{len(wheels)} wheels in {args.dest}" + (f" (left out: {', '.join(left_out)}; --with-ilp adds them)"
                                                    if left_out else ""))
    if missing:
        print("error: wheelhouse is not closed:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    print("closure check ok. Install on the target, in the repository (the wheelhouse, then its l1bench package;\n"
          "scripts/offline_run.sh does this and runs the workflow):\n"
          f"  python3 -m pip install --no-index --no-deps --target /tmp/site {args.dest}/*.whl\n"
          f"  python3 -m pip install --no-index --no-deps --find-links {args.dest / BUILD_TOOLS_DIR}"
          " --target /tmp/site .\n"
          "  export PYTHONPATH=/tmp/site")
    return 0


if __name__ == "__main__":
    sys.exit(main())
