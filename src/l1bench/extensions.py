"""Custom extensions that do not build: one table from the results and the older annotations.

The worker records a failed ``load_inline`` on the result (``extension_failures``; the
``EXTENSION_BUILD_FAILED`` flag); results made before it did are annotated in
config/curation/<device>/extension_failures.json. Both are merged per task and rendered
(``l1bench extensions results/h100``; aggregate_results writes it with the tables).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

from l1bench.results import Status, results_tree

#: Compiler errors of code that may have built with the torch/CUDA its authors used.
API_PATTERNS = ("DeprecatedTypeProperties", "AT_CUDA_CHECK", "C++17 or later", "getCurrentCUDAStream")
SOURCE, API = "source", "torch/toolchain API"


UNKNOWN = "unknown (no compiler message recorded)"


def cause_of(error: str) -> str:
    """Classified by the compiler's message (a heuristic; the message is in the table)."""
    if any(p in error for p in API_PATTERNS):
        return API
    return UNKNOWN if error.startswith("Error building extension") else SOURCE


def short_error(error: str) -> str:
    """The compiler's message without the build folder's path and position."""
    m = re.search(r"(error:.*|#error.*)$", error)
    return (m.group(1) if m else error).strip()


def curation_file(results_root) -> Path:
    """The device's hand-made annotations: config/curation/<device>/extension_failures.json."""
    return Path("config/curation") / Path(results_root).name / "extension_failures.json"


#: ``notes`` argument meaning "the device's curation file" (:func:`curation_file`).
CURATION = "curation"


def _results(root: Path):
    """(path, result) of every readable check and time result below ``root``."""
    for path in sorted(list(root.glob("check/*.json")) + list(root.glob("time/*/*/*.json"))):
        try:
            yield path, json.loads(path.read_text())
        except ValueError:
            continue


def toolchain(results_root) -> str:
    """The torch (and CUDA) that most of the results were made with, from their provenance:
    ``torch 2.11.0+cu130 / CUDA 13.0``, ``torch 2.13.0+cpu without CUDA``."""
    made = Counter((p.get("torch"), p.get("cuda")) for _, r in _results(Path(results_root))
                   if (p := r.get("provenance") or {}).get("torch"))
    if not made:
        return "the torch of these results (not recorded)"
    torch, cuda = made.most_common(1)[0][0]
    return f"torch {torch} / CUDA {cuda}" if cuda else f"torch {torch} without CUDA"


def collect(results_root, notes=CURATION) -> dict[str, dict]:
    """{tid: {extension, error, cause, source}} over the check/time results and the annotations
    (``notes``: a file, :data:`CURATION` for :func:`curation_file`, None for none)."""
    root = Path(results_root)
    found: dict[str, dict] = {}
    for path, res in _results(root):
        for fail in res.get("extension_failures") or ():
            if res["tid"] not in found:
                err = short_error(str(fail.get("error", "")))
                found[res["tid"]] = {"extension": fail.get("extension"), "error": err, "cause": cause_of(err),
                                     "source": str(path.relative_to(root))}
    notes = curation_file(root) if notes == CURATION else notes
    if notes is not None and Path(notes).exists():
        notes = Path(notes)
        for tid, v in json.loads(notes.read_text()).get("tasks", {}).items():
            if tid in found and found[tid]["cause"] != UNKNOWN:
                continue  # the result's own record, unless it lacks the compiler's message
            found[tid] = {"extension": v.get("extension"), "error": v.get("error", ""),
                          "cause": v.get("cause") or cause_of(v.get("error", "")),
                          "source": f"{notes.name} (log {v.get('log')})"}
    return dict(sorted(found.items()))


def _published_measured(root: Path, tid: str) -> str:
    try:
        meta = json.loads((root / "tasks" / tid / "meta.json").read_text())
        t = json.loads((root / "time/paper/default" / f"{tid}.json").read_text())
    except (OSError, ValueError):
        return "–"
    pub = (meta.get("published") or {}).get("default")
    got = t.get("score") if t.get("status") == Status.OK else None
    fmt = lambda x: f"{x:.2f}×" if isinstance(x, (int, float)) else "–"  # noqa: E731
    return f"{fmt(pub)} → {fmt(got) if got is not None else t.get('status', '–')}"


def render(results_root, device: str = "h100", notes=CURATION) -> str:
    root = Path(results_root)
    notes = curation_file(root) if notes == CURATION else notes
    found = collect(root, notes)
    annotated = (
        f" and `{Path(notes).as_posix()}` (results made before the worker recorded it, "
        "read from the job logs in `runs/extension-build-logs.tgz`)"
        if notes is not None and Path(notes).exists() else ""
    )
    n_api = sum(v["cause"] == API for v in found.values())
    n_unknown = sum(v["cause"] == UNKNOWN for v in found.values())
    lines = [
        f"# Custom extensions that do not build ({device} release)",
        "",
        f"Generated by the workflow's `aggregate_results` (by hand: `l1bench extensions {root}`) "
        "from the results (the worker's "
        f"`extension_failures`){annotated}.",
        "",
        f"**{len(found)} tasks**: the custom code calls `load_inline`, the build fails, the code catches it "
        "and falls back to PyTorch ops, so its check passes and **what is timed is the fallback, not a "
        f"CUDA kernel** (flag `EXTENSION_BUILD_FAILED`). {len(found) - n_api - n_unknown} are, by their message, "
        "*source* errors that no "
        "torch compiles (a function bound in the module not declared in `cpp_sources`, a "
        "`PYBIND11_MODULE` next to `functions=`, …): the published speedup can only have timed the "
        f"fallback too. {n_api} use a *torch/toolchain API* that {toolchain(root)} (what these results ran on) "
        "no longer offers (`tensor.type()` in `AT_DISPATCH_*`, `AT_CUDA_CHECK`, a C++14 flag): they may have "
        f"built with the authors' torch. {n_unknown} failed without a compiler message in the result. The cause is "
        "classified from the message (`l1bench.extensions.cause_of`).",
        "",
        "| Task | Extension | Cause | First compiler error | Default: published → measured | Source |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for tid, v in found.items():
        err = v["error"].replace("|", "\\|")
        lines.append(f"| {tid} | `{v['extension']}` | {v['cause']} | {err} | {_published_measured(root, tid)} | "
                     f"`{v['source']}` |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="The table of custom extensions that do not build, on stdout.")
    ap.add_argument("results_root", nargs="?", default="results/h100", type=results_tree, help="results/<device>")
    root = ap.parse_args(argv).results_root
    sys.stdout.write(render(root, root.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
