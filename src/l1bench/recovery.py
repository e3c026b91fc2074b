"""After a killed run: keep what its jobs completed, and start the next run without ``--unlock``.

When the Snakemake process is killed (``kill -9``, a lost node) it leaves behind

* an *incomplete* mark on the output of every job it had started (``.snakemake/incomplete/``).
  The next run (``rerun-incomplete``) deletes such outputs and runs their jobs again, also a
  result its job wrote completely after the mark (a job that finished in the moment the
  Snakemake process died, or ran on without it): that result, and the attempts ledger it had
  absorbed, would be thrown away. Results of build/check/time jobs are written atomically
  (``l1bench.io``), so one that exists is complete: :func:`keep_completed_results` clears the
  marks of those, before the next run plans its jobs.
* its locks (``.snakemake/locks/``), which make every later run stop with "Directory cannot be
  locked" until someone runs ``--unlock``. The workflow records which lock files it holds
  (:func:`record_lock_owner`, at ``onstart``); :func:`release_locks_of_dead_runs` removes those
  of a run whose process is gone (same host only), and nothing else: a lock of a run that is
  still going, or one not recorded by this workflow, is left to Snakemake.

The marks are files named after the output path (urlsafe base64, split into folders of at
most NAME_MAX characters whose names but the last start with "@"), as Snakemake's file
persistence writes them (format 2, Snakemake >= 8).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import socket
from pathlib import Path

from l1bench import lifeline

INCOMPLETE = Path(".snakemake/incomplete")
LOCKS = Path(".snakemake/locks")
OWNER_PREFIX = "l1bench-owner-"

#: Results written atomically by l1bench.job: results/<device>/{build,check,time/<protocol>/<mode>}/<tid>.json
_RESULT = re.compile(r"^(build|check|time/(paper|strict)/\w+)/L\d+_T\d{3}\.json$")


def _decode(parts: tuple[str, ...]) -> str | None:
    text = "".join(p[1:] if p.startswith("@") else p for p in parts)
    try:
        return base64.urlsafe_b64decode(text.encode()).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None


def incomplete_marks(workdir: str | Path = ".") -> dict[str, Path]:
    """{output path as the workflow names it: its incomplete mark} of a working directory."""
    top = Path(workdir) / INCOMPLETE
    marks = {}
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            mark = Path(dirpath) / name
            key = _decode(mark.relative_to(top).parts)
            if key is not None:
                marks[key] = mark
    return marks


def is_complete_result(path: Path, results_root: Path) -> bool:
    """Whether ``path`` is a build/check/time result below ``results_root`` that its job wrote
    to the end (an atomic write: it parses, with its status and the release it belongs to)."""
    try:
        rel = path.resolve().relative_to(results_root.resolve()).as_posix()
    except ValueError:
        return False
    if not _RESULT.match(rel):
        return False
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(res, dict) and bool(res.get("status")) and "release_fingerprint" in res


def _remove_mark(mark: Path, top: Path) -> None:
    mark.unlink(missing_ok=True)
    parent = mark.parent
    while parent != top and parent.is_relative_to(top):
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


def keep_completed_results(results_root: str | Path, workdir: str | Path = ".") -> list[str]:
    """Clear the incomplete marks of complete results below ``results_root``; returns them.

    Only results written atomically by l1bench.job are kept this way; any other output of an
    interrupted job (tables, figures, downloads) is still made again.
    """
    workdir, root = Path(workdir), Path(results_root)
    root = root if root.is_absolute() else workdir / root
    kept = []
    for key, mark in sorted(incomplete_marks(workdir).items()):
        path = Path(key) if Path(key).is_absolute() else workdir / key
        if is_complete_result(path, root):
            _remove_mark(mark, workdir / INCOMPLETE)
            kept.append(key)
    return kept


def record_lock_owner(lock_files, workdir: str | Path = ".") -> Path | None:
    """Note that this process holds ``lock_files`` (Snakemake's, in .snakemake/locks/)."""
    lock_files = [str(Path(f).resolve()) for f in lock_files]
    if not lock_files:
        return None
    path = Path(workdir) / LOCKS / f"{OWNER_PREFIX}{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"token": lifeline.process_token(), "host": socket.gethostname(), "locks": lock_files}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return path


def release_locks_of_dead_runs(workdir: str | Path = ".") -> list[dict]:
    """Remove the locks recorded by runs of this host whose process has ended; returns their
    records ({token, host, locks})."""
    released = []
    for owner in sorted((Path(workdir) / LOCKS).glob(f"{OWNER_PREFIX}*.json")):
        try:
            record = json.loads(owner.read_text())
            token, host, locks = record["token"], record["host"], list(record["locks"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host != socket.gethostname() or lifeline.alive(token):
            continue
        for lock in locks:
            Path(lock).unlink(missing_ok=True)
        owner.unlink(missing_ok=True)
        released.append(record)
    return released
