"""What a run made in pieces cost, per stage, from its results: the GPU lock held, the wall of the
stretches its steps ran in, and the lock's share of that wall; builds and checks apart from each
protocol and mode.

    python -m l1lab cost results/h100 [--gap-s 600] [--since ISO] [--until ISO] [--out PAGE.md]

A run on lent machines is made in pieces (one bounded call each, ``lab/device_run.sh``); steps
further apart than ``--gap-s`` belong to different pieces. A stage's wall is the sum over pieces of
the stretch from its first step's start to its last step's finish there, so stages that ran side by
side share wall; the run's wall is the same over all stages. Only the results' own times count: a
piece's install and start before its first step are not in them.

With ``--release FILE --fit A,B`` (the fit of ``python -m l1lab drawcost``: a paper time step holds
the lock ``A + B * M`` s, ``M`` the task's input elements in millions) each paper stage also gets
its ``ok`` results' lock beside what the fit projects for exactly those tasks.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from l1bench.aggregate.markdown import md_table
from l1bench.io import write_page
from l1bench.results import results_tree
from l1lab.stagetimes import PREPARED_KEY, _span, results, stage_of

#: Steps further apart than this (s) are of different pieces of a run.
GAP_S = 600.0


def stretches(spans, gap_s: float = GAP_S) -> list[tuple[float, float]]:
    """(start, finish) spans merged into the stretches they ran in: a span that starts more than
    ``gap_s`` after every earlier one has finished starts a new stretch."""
    out: list[tuple[float, float]] = []
    for start, finish in sorted(spans):
        if out and start - out[-1][1] <= gap_s:
            out[-1] = (out[-1][0], max(out[-1][1], finish))
        else:
            out.append((start, finish))
    return out


def wall(spans, gap_s: float = GAP_S) -> float:
    return sum(f - s for s, f in stretches(spans, gap_s))


def collect(rows) -> dict[str, dict]:
    """Per stage (:func:`l1lab.stagetimes.stage_of`): results, GPU lock held (s) and the steps'
    (start, finish) spans; results an earlier run made are left out."""
    out: dict[str, dict] = defaultdict(lambda: {"results": 0, "lock_s": 0.0, "spans": [], "ok": {}})
    for res in rows:
        if res.get(PREPARED_KEY):
            continue
        st = out[stage_of(res)]
        st["results"] += 1
        st["lock_s"] += res.get("lock_held_s") or 0.0
        if res.get("status") == "ok" and res.get("tid"):
            st["ok"][res["tid"]] = res.get("lock_held_s") or 0.0
        if span := _span(res.get("provenance") or {}):
            st["spans"].append(span)
    return dict(out)


def _stage_key(stage: str) -> tuple:
    order = {"build": 0, "check": 1}
    return (order.get(stage, 2), stage)


def _row(name: str, n: int, lock: float, spans, gap_s: float) -> list:
    parts = stretches(spans, gap_s)
    w = sum(f - s for s, f in parts)
    return [name, str(n), f"{lock:,.0f}", f"{w:,.0f}", f"{lock / w:.0%}" if w else "—", str(len(parts))]


def projected(stage: str, st: dict, projection) -> list[str]:
    """The two projection cells of a stage: its ``ok`` results' lock and the fit's lock for the same
    tasks (``projection``: ``(sizes, a, b)``, sizes as :func:`l1lab.drawcost.input_elements`);
    paper time stages only, tasks the sizes cannot size left out of both."""
    sizes, a, b = projection
    if not stage.startswith("time:paper:"):
        return ["—", "—"]
    sized = {t: s for t, s in st["ok"].items() if "m" in sizes.get(t, {})}
    fit = sum(a + b * sizes[t]["m"] for t in sized)
    return [f"{sum(sized.values()):,.0f} ({len(sized)})", f"{fit:,.0f}"]


def page(stats: dict[str, dict], gap_s: float = GAP_S, title: str = "What the run cost", projection=None) -> str:
    ordered = sorted(stats.items(), key=lambda kv: _stage_key(kv[0]))
    extra = (lambda stage, st: projected(stage, st, projection)) if projection else (lambda stage, st: [])
    rows = [_row(stage.replace("time:", "").replace(":", " "), st["results"], st["lock_s"], st["spans"], gap_s)
            + extra(stage, st) for stage, st in ordered]
    every = [s for st in stats.values() for s in st["spans"]]
    lock = sum(st["lock_s"] for st in stats.values())
    rows.append(_row("the run", sum(st["results"] for st in stats.values()), lock, every, gap_s) + extra("", {}))
    head = ["stage", "results", "GPU lock s", "wall s", "lock share", "pieces"]
    if projection:
        head += ["lock s of ok results (tasks)", "projected s"]
    out = [f"# {title}", "", md_table(rows, head, ["left"] + ["right"] * (len(head) - 1)), ""]
    for i, (start, finish) in enumerate(stretches(every, gap_s), 1):
        n = sum(start <= s <= finish for s, _ in every)
        when = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%d %H:%M")
        out.append(f"* piece {i}: {when} UTC, {finish - start:,.0f} s, {n} step{'' if n == 1 else 's'}")
    out += ["", f"Steps more than {gap_s:.0f} s apart are of different pieces; a stage's wall is the sum over "
            "pieces of its first start to its last finish there (stages that ran side by side share wall); the "
            "results' own times only, without a piece's install and start.", ""]
    if projection:
        _, a, b = projection
        out += [f"*Projected*: the draw-cost fit, {a:.2f} s + {b:.3f} s per million input elements of a paper time "
                "step (`python -m l1lab drawcost`), over the same tasks as the `ok` results beside it.", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m l1lab cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=results_tree, help="a results tree (results/<device>)")
    ap.add_argument("--gap-s", type=float, default=GAP_S, help="steps further apart are of different pieces")
    ap.add_argument("--since", help="only results whose worker started at or after this ISO time")
    ap.add_argument("--until", help="only results whose worker started before this ISO time")
    ap.add_argument("--title", default="What the run cost")
    ap.add_argument("--release", help="a release file: size each task's inputs for --fit")
    ap.add_argument("--fit", help="A,B: a paper time step holds the lock A + B * (million input elements) s")
    ap.add_argument("--out", type=Path, help="write the page here (else stdout)")
    args = ap.parse_args(argv)
    if bool(args.release) != bool(args.fit):
        ap.error("--release and --fit go together")
    projection = None
    if args.fit:
        from l1lab.drawcost import input_elements

        a, b = (float(x) for x in args.fit.split(","))
        projection = (input_elements(args.release), a, b)
    text = page(collect(results(args.root, args.since, args.until)), args.gap_s, args.title, projection)
    write_page(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
