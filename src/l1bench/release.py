"""Parse and normalise a CUDA-L1 release (``optimized_cuda_code/<device>.json``, JSONL).

Everything here is pure: no Snakemake, no torch. Bad input raises
:class:`ReleaseError` whose message is one line naming the file, the line (or
JSON path) and the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from l1bench.modes import MODES

#: GPUs with an upstream release file, and the embedded CPU demo.
GPU_DEVICES = ("h100", "a100", "h20", "l40", "3090")
DEVICES = GPU_DEVICES + ("demo",)

#: KernelBench task counts per level (levels 1/2/3 = 100/100/50).
KERNELBENCH_LEVELS = {1: 100, 2: 100, 3: 50}

#: Snippet file names inside a task folder: the reference, the custom code and each mode's own
#: baseline (l1bench.modes), named after the mode.
SNIPPET_FILES = {"ref": "ref.py", "custom": "custom.py"} | {m.name: f"{m.name}.py" for m in MODES if m.baseline}


class ReleaseError(ValueError):
    """Malformed release input; ``str(err)`` is one line naming file, place and field."""


def task_id(level: int, task: int) -> str:
    """Folder name of a task: ``L1_T012``."""
    return f"L{level}_T{task:03d}"


def parse_task_id(tid: str) -> tuple[int, int]:
    """Inverse of :func:`task_id`."""
    lv, tk = tid.split("_")
    return int(lv[1:]), int(tk[1:])


@dataclass
class Task:
    level: int
    task: int
    ref_code: str
    custom_code: str | None
    baselines: dict = field(default_factory=dict)  # mode -> its baseline snippet's code (Mode.baseline)
    published: dict = field(default_factory=dict)  # mode -> float | None
    #: how the release marked missing custom code: None (code present), "null", "None" or "empty"
    custom_missing: str | None = None

    @property
    def tid(self) -> str:
        return task_id(self.level, self.task)

    @property
    def code_status(self) -> str:
        return "no_code" if self.custom_code is None else "ok"

    def snippets(self) -> dict[str, str]:
        """Snippet name -> source, for the snippets present."""
        out = {"ref": self.ref_code}
        for name, src in [("custom", self.custom_code)] + [(m.name, self.baselines.get(m.name)) for m in MODES]:
            if src is not None:
                out[name] = src
        return out


# --------------------------------------------------------------------------- fields


def _int_field(obj, name, path, line) -> int:
    if name not in obj:
        raise ReleaseError(f"{path}:{line}: field '{name}' is missing")
    val = obj[name]
    if isinstance(val, bool):
        raise ReleaseError(f"{path}:{line}: field '{name}' must be an integer, got {val!r}")
    if isinstance(val, int):
        return val
    if isinstance(val, str) and val.strip().isdigit():
        return int(val)
    raise ReleaseError(f"{path}:{line}: field '{name}' must be an integer, got {val!r}")


def missing_kind(code) -> str | None:
    """How a release spells "no code": "null", "None", "empty"; None when code is present."""
    if code is None:
        return "null"
    if isinstance(code, str) and code.strip() == "None":
        return "None"
    if isinstance(code, str) and not code.strip():
        return "empty"
    return None


def _code_field(obj, name, path, line, required=True) -> str | None:
    if name not in obj:
        if required:
            raise ReleaseError(f"{path}:{line}: field '{name}' is missing")
        return None
    val = obj[name]
    if val is not None and not isinstance(val, str):
        raise ReleaseError(
            f"{path}:{line}: field '{name}' must be a string or null, got {type(val).__name__}"
        )
    return None if missing_kind(val) else val


def _score_field(obj, name, path, line) -> float | None:
    val = obj.get(name)
    if val is None:
        return None
    if isinstance(val, bool):
        raise ReleaseError(f"{path}:{line}: field '{name}' must be a number or null, got {val!r}")
    if isinstance(val, str):
        try:
            val = float(val)
        except ValueError:
            raise ReleaseError(
                f"{path}:{line}: field '{name}' must be a number or null, got {val!r}"
            ) from None
    if not isinstance(val, (int, float)) or not math.isfinite(val):
        raise ReleaseError(f"{path}:{line}: field '{name}' must be a finite number or null, got {val!r}")
    return float(val)


# --------------------------------------------------------------------------- readers


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReleaseError(f"{path}: file not found") from None
    except UnicodeDecodeError as err:
        raise ReleaseError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def _jsonl_objects(path: Path, text: str):
    """Yield (line_number, object) for each non-blank line of a JSONL text."""
    for no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            at = "" if err.msg.endswith(" at") else " at"  # "Unterminated string starting at"
            raise ReleaseError(f"{path}:{no}: invalid JSON ({err.msg}{at} column {err.colno})") from None
        if not isinstance(obj, dict):
            raise ReleaseError(f"{path}:{no}: expected a JSON object, got {type(obj).__name__}")
        yield no, obj


def parse_flat(path) -> list[Task]:
    """Parse a release file (``optimized_cuda_code/{device}.json``: JSONL, one task a line)."""
    path = Path(path)
    tasks: dict = {}
    for no, obj in _jsonl_objects(path, _read_text(path)):
        level = _int_field(obj, "level_id", path, no)
        if level < 1:
            raise ReleaseError(f"{path}:{no}: field 'level_id' must be >= 1, got {level}")
        t = Task(
            level=level,
            task=_int_field(obj, "task_id", path, no),
            ref_code=_code_field(obj, "ref_code", path, no),
            custom_code=_code_field(obj, "custom_code", path, no),
            baselines={m.name: code for m in MODES if m.baseline
                       and (code := _code_field(obj, m.baseline, path, no, required=False)) is not None},
            published={m.name: _score_field(obj, m.score_field, path, no) for m in MODES},
            custom_missing=missing_kind(obj.get("custom_code")),
        )
        if t.ref_code is None:
            raise ReleaseError(f"{path}:{no}: field 'ref_code' is empty")
        if (t.level, t.task) in tasks:
            raise ReleaseError(f"{path}:{no}: duplicate task (level_id={t.level}, task_id={t.task})")
        tasks[(t.level, t.task)] = t
    if not tasks:
        raise ReleaseError(f"{path}: no tasks found")
    return sorted(tasks.values(), key=lambda t: (t.level, t.task))


def parse_baselines(path) -> dict[tuple[int, int], str]:
    """Parse a baseline file (``more_baselines/<mode>.json``): JSONL of {level_id, task_id, code}."""
    path = Path(path)
    out: dict = {}
    for no, obj in _jsonl_objects(path, _read_text(path)):
        key = (_int_field(obj, "level_id", path, no), _int_field(obj, "task_id", path, no))
        code = _code_field(obj, "code", path, no)
        if key in out:
            raise ReleaseError(f"{path}:{no}: duplicate task (level_id={key[0]}, task_id={key[1]})")
        if code is not None:
            out[key] = code
    return out


def load_release(path, baselines: dict | None = None) -> list[Task]:
    """Parse a release file; fill missing baseline code from ``baselines`` (a mode with a
    baseline snippet -> its more_baselines file path, or None)."""
    tasks = parse_flat(path)
    for mode, bpath in (baselines or {}).items():
        if bpath is None:
            continue
        codes = parse_baselines(bpath)
        for t in tasks:
            if t.baselines.get(mode) is None and (t.level, t.task) in codes:
                t.baselines[mode] = codes[(t.level, t.task)]
    return tasks


def check_device(device: str, where: str = "config") -> str:
    if device not in DEVICES:
        raise ReleaseError(f"{where}: unknown device {device!r} (expected one of {', '.join(DEVICES)})")
    return device


# --------------------------------------------------------------------------- selection


def parse_task_selector(sel: str) -> tuple[int, int]:
    """``"1/12"`` or the task's id ``"L1_T012"`` -> (1, 12)."""
    m = re.fullmatch(r"(\d+)/(\d+)|L(\d+)_T(\d+)", str(sel).strip())
    if not m:
        raise ReleaseError(f"task {sel!r}: expected LEVEL/TASK (e.g. 1/12) or a task id (L1_T012)")
    return tuple(int(g) for g in m.groups() if g is not None)


def select_tasks(all_ids, levels=None, tasks=None) -> list[tuple[int, int]]:
    """Filter (level, task) pairs by levels and a list of selectors (``1/12`` or ``L1_T012``)."""
    ids = sorted(all_ids)
    if levels:
        ids = [i for i in ids if i[0] in set(levels)]
    if tasks:
        wanted = [parse_task_selector(s) for s in tasks]
        missing = [str(s) for s, w in zip(tasks, wanted, strict=True) if w not in set(all_ids)]  # as written
        if missing:
            raise ReleaseError(f"config: tasks not in the release: {', '.join(missing)}")
        ids = [i for i in ids if i in set(wanted)]
    return ids
