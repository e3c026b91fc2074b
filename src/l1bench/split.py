"""Split a parsed release into one folder per task: snippet files and ``meta.json``."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from l1bench.release import SNIPPET_FILES, Task
from l1bench.snippet import sha256_text


def task_meta(task: Task, device: str, release: dict) -> dict:
    """The ``meta.json`` of a task: identity, published scores, snippet checksums."""
    snippets = {
        name: {"file": SNIPPET_FILES[name], "sha256": sha256_text(src)}
        for name, src in task.snippets().items()
    }
    return {
        "device": device,
        "tid": task.tid,
        "level": task.level,
        "task": task.task,
        "code_status": task.code_status,
        "custom_missing": task.custom_missing,
        "published": task.published,
        "snippets": snippets,
        "release": release,
    }


def meta_text(task: Task, device: str, release: dict) -> str:
    """The text of a task's ``meta.json``."""
    return json.dumps(task_meta(task, device, release), indent=1, sort_keys=True) + "\n"


def write_task_folder(task: Task, folder: Path, device: str, release: dict) -> None:
    """Write one task folder atomically: built in a sibling temp dir, then swapped in."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for name, src in task.snippets().items():
            (tmp / SNIPPET_FILES[name]).write_text(src, encoding="utf-8")
        (tmp / "meta.json").write_text(meta_text(task, device, release))
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def split_release(tasks: list[Task], out_root: Path, device: str, release: dict, wanted=None) -> list[str]:
    """Write the folders of ``tasks`` (only those whose ``tid`` is in ``wanted``, if given)."""
    written = []
    for t in tasks:
        if wanted is not None and t.tid not in wanted:
            continue
        write_task_folder(t, Path(out_root) / t.tid, device, release)
        written.append(t.tid)
    return written
