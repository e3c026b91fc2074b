"""What the paper protocol's host draws cost a whole release: each task's input size, a fit of the
GPU lock a time step held against it, and the fit applied to every task with code.

    PYTHONPATH=lab python -m l1lab drawcost --release .release/optimized_cuda_code/h100.json \
        --tree results/sbs-wf1/h100 --timed results/h100 --out lab/evidence/drawcost-h100-v9.md

The paper protocol draws every ``get_inputs()`` on the host and copies it, as the published
harness does, once per timed pair, while the task holds the GPU lock; a task's lock time then
grows with its input size. Each task's input elements come from its reference's ``get_inputs()``
run under ``torch.device("meta")`` (shapes only, nothing drawn; the KernelBench reference code,
never the custom code). The fit is least squares, ``lock_held_s = a + b * M`` with ``M`` the input
elements in millions, over the tree's ``ok`` time results of one mode.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tabulate import tabulate

from l1bench import release as rel
from l1bench.io import write_page
from l1lab.spread import time_results

#: Tasks above this many million input elements are listed as the large ones.
LARGE_M = 10.0


def input_elements(release_file: str | Path) -> dict[str, dict]:
    """``{tid: {"m": million input elements, "has_code": bool}}`` (code as the workflow reads the
    release: ``null``, ``"None"`` and empty custom code are none); a reference whose
    ``get_inputs()`` does not run on the meta device gets ``{"error": ...}`` instead of ``m``."""
    import torch

    out = {}
    for task in rel.parse_flat(release_file):
        entry = {"has_code": task.custom_missing is None}
        try:
            ns: dict = {}
            exec(compile(task.ref_code, f"<{task.tid} reference>", "exec"), ns)  # KernelBench's reference only
            with torch.device("meta"):
                inputs = ns["get_inputs"]()
            entry["m"] = sum(x.numel() for x in inputs if isinstance(x, torch.Tensor)) / 1e6
        except Exception as err:  # noqa: BLE001 - recorded per task
            entry["error"] = f"{type(err).__name__}: {err}"[:160]
        out[task.tid] = entry
    return out


def lock_times(tree: str | Path, mode: str = "default") -> tuple[dict[str, float], set[str]]:
    """``{tid: lock_held_s}`` of a results tree's ``ok`` paper time results of ``mode``, and the
    set of "GPU, date, timing version N" they were made with."""
    out, made = {}, set()
    for tid, res in time_results(tree, "paper", mode).items():
        if res.get("status") == "ok" and res.get("lock_held_s") is not None:
            out[tid] = float(res["lock_held_s"])
            prov = res.get("provenance", {})
            made.add(f"{prov.get('gpu')}, {str(prov.get('finished'))[:10]}, timing version {res.get('timing_version')}")
    return out, made


def ok_tids(tree: str | Path, mode: str = "default") -> set[str]:
    """The tasks with an ``ok`` paper time result of ``mode`` in a results tree."""
    return {tid for tid, res in time_results(tree, "paper", mode).items() if res.get("status") == "ok"}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b * x`` over ``(x, y)`` points (at least two x's)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if n < 2 or sxx == 0:
        raise ValueError("a fit needs at least two tasks of different input sizes")
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def _projection(sizes: dict[str, dict], tids, a: float, b: float) -> tuple[str, list[str]]:
    """One bullet: the lock ``tids`` would hold in one mode, and the share of the large ones; and
    the tasks among them that could not be sized."""
    sized = [sizes[t]["m"] for t in tids if "m" in sizes[t]]
    total = sum(a + b * m for m in sized)
    large = [m for m in sized if m > LARGE_M]
    large_s = sum(a + b * m for m in large)
    text = (f"{len(sized)} tasks, {sum(sized):,.0f} M input elements in all (median "
            f"{sorted(sized)[len(sized) // 2]:.2f} M): **{total:,.0f} s per mode**; the {len(large)} above "
            f"{LARGE_M:.0f} M elements hold {large_s:,.0f} s of it ({100 * large_s / total:.0f} %)")
    return text, sorted(t for t in tids if "m" not in sizes[t])


def report(sizes: dict[str, dict], locks: dict[str, float], made: set[str], tree: str, mode: str,
           timed: tuple[str, set[str]] | None = None) -> str:
    """The page: the fit, its projection over the release's tasks with code (and over the tasks
    ``timed`` names: a tree and its tasks with an ``ok`` result), and the fit's worst residuals."""
    points = [(sizes[t]["m"], s) for t, s in locks.items() if "m" in sizes.get(t, {})]
    a, b = fit(points)
    coded = sorted(t for t, e in sizes.items() if e["has_code"])
    text, unsized = _projection(sizes, coded, a, b)
    lines = [
        f"# What the host draws cost: GPU lock of a paper {mode}-mode time step against input size",
        "",
        f"Made by `PYTHONPATH=lab python -m l1lab drawcost` from `{tree}` ({len(points)} `ok` time results; "
        f"{'; '.join(sorted(made))}).",
        "",
        f"* fit: lock held = **{a:.2f} s + {b:.3f} s per million input elements** (least squares)",
        f"* projected over the release's tasks with code: {text}",
    ]
    if timed:
        where, tids = timed
        text, _ = _projection(sizes, sorted(t for t in tids if t in sizes), a, b)
        lines.append(f"* over the tasks with an `ok` {mode}-mode result in `{where}` (the others stop at the "
                     f"check): {text}")
    if unsized:
        lines.append(f"* not sized (their `get_inputs()` does not run here): {', '.join(unsized)}")
    worst = sorted(((s - (a + b * sizes[t]["m"]), t, s) for t, s in locks.items() if "m" in sizes.get(t, {})),
                   key=lambda r: -abs(r[0]))[:5]
    rows = [[t, f"{sizes[t]['m']:.1f}", f"{s:.2f}", f"{a + b * sizes[t]['m']:.2f}", f"{r:+.2f}"] for r, t, s in worst]
    lines += ["", "The fit's largest residuals:", "",
              tabulate(rows, ["task", "M elements", "lock s", "fit s", "residual s"], tablefmt="github"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", required=True, help="a release file (one JSON line per task)")
    ap.add_argument("--tree", required=True, help="a results tree of the device, e.g. results/sbs-wf1/h100")
    ap.add_argument("--mode", default="default")
    ap.add_argument("--timed", help="also project over the tasks with an ok result in this tree (e.g. results/h100)")
    ap.add_argument("--out", help="write the page here instead of printing it")
    args = ap.parse_args(argv)
    timed = (args.timed, ok_tids(args.timed, args.mode)) if args.timed else None
    page = report(input_elements(args.release), *lock_times(args.tree, args.mode), args.tree, args.mode, timed)
    write_page(args.out, page if args.out else page + "\n")
    return 0
