"""Atomic file writes (a temporary file beside the destination, renamed over it only when the
write succeeded): a reader never sees a half-written output. A tool's page is written so to its
``--out``, or to stdout without one (:func:`write_page`)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path`` (written by any means: ``savefig``, ``to_csv``);
    rename it to ``path`` on success, delete it if the body raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    # mkstemp creates 0600; give the result the permissions a plain open() would.
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_text(path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    return Path(path)


def atomic_write_json(path, obj) -> Path:
    """Write ``obj`` as JSON (indent=1, sorted keys, trailing newline) atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def logs_dir(results: str) -> str:
    """The job-log folder of a results tree ``<results_dir>/<device>``: ``logs/<device>`` for
    the default ``results/<device>``, ``logs/<the rest of its path>`` otherwise, so two results
    trees of one device never share logs."""
    path = Path(results)
    parts = path.parts[1:] if path.parts[:1] == ("results",) else path.parts
    parts = tuple(p for p in parts if p not in ("/", "", ".", ".."))
    return "/".join(("logs",) + parts)


def write_page(path, text: str) -> None:
    """A tool's page: to ``path`` atomically (:func:`atomic_write_text`), to stdout without one."""
    if path:
        atomic_write_text(path, text)
    else:
        sys.stdout.write(text)
