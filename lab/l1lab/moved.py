"""What moved between two results trees of the same release: an older tree (another timing
version, another GPU) against a newer one, per protocol and mode.

    python -m l1lab moved OLD_TREE NEW_TREE [--protocol paper] [--modes default ...] [--out PAGE.md]

Per protocol and mode that both trees scored: how many tasks stayed within ±15 %, how many moved
up or down, the same split by what bounds the newer tree's timed calls (host-bound where a side's
median launch is at least 80 % of its median call: l1bench.timing.hostclock), and the tasks whose
status changed. Per task that moved by more than 15 %: both scores, and which side's mean timed
median timed call moved (the reference's, the custom code's or both), read from the two results, so that a move
of the reference (how its inputs and memory are held) is told from a move of CUDA-L1's code.
Each tree's timing versions and GPUs head the page: a tree timed on another GPU moves for that
reason too, and the page says so rather than guess which.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import Counter
from pathlib import Path

from l1bench.aggregate.conventions import MODE_LABELS
from l1bench.aggregate.markdown import fmt, md_table
from l1bench.detectors.flags import flag_names
from l1bench.io import write_page
from l1bench.results import AGREEMENT, Status, results_tree, timing_version
from l1bench.timing import hostclock
from l1lab.spread import time_results
from l1lab.stagetimes import bound_label

MODES = tuple(MODE_LABELS)


def _ok(result: dict | None) -> bool:
    return bool(result) and result.get("status") == Status.OK and (result.get("score") or 0) > 0


def _ratio(new, old) -> float | None:
    return new / old if new and old else None


def trial_means(result: dict, side: str) -> list[float]:
    """A side's mean timed call per outer trial (``ref_ms``/``custom_ms``: a list per trial)."""
    calls = result.get(f"{side}_ms")
    if not isinstance(calls, list) or not calls:
        return []
    trials = calls if isinstance(calls[0], list) else [calls]
    return [statistics.fmean(t) for t in trials if t]


def median_ms(result: dict, side: str) -> float | None:
    """The median over outer trials of a side's mean timed call (its ``*_ms_mean`` where the calls
    are not recorded): a median, since one slow trial (a stall) moves a mean more than the score."""
    means = trial_means(result, side)
    return statistics.median(means) if means else result.get(f"{side}_ms_mean")


def notes(result: dict, uneven: float = 1.5) -> list[str]:
    """What makes a score rest on part of its trials: an early stop, and a side with one trial
    ``uneven`` times its median trial or more."""
    out = []
    trials, planned = len(result.get("trial_scores") or []), (result.get("params") or {}).get("outer_trials")
    if planned and trials < planned:
        out.append(f"early stop ({trials} of {planned} trials)")
    for side, name in (("ref", "reference"), ("custom", "custom")):
        means = trial_means(result, side)
        if len(means) > 1 and max(means) >= uneven * statistics.median(means):
            out.append(f"a slow {name} trial ({max(means) / statistics.median(means):.1f}×)")
    return out


def call_ratios(old: dict, new: dict) -> tuple[float | None, float | None]:
    """New over old median timed call, (reference, custom)."""
    return tuple(_ratio(median_ms(new, side), median_ms(old, side)) for side in ("ref", "custom"))


def side_moved(old: dict, new: dict, still: float = 0.03) -> str:
    """Which side's median call carries a score's move: ``reference`` or ``custom`` where its
    change (in log) is at least twice the other's, ``both`` otherwise, ``neither`` where both
    changed by less than ``still`` (the move is in the trials: an early stop, a slow trial), or
    ``not recorded``."""
    ref, cus = call_ratios(old, new)
    if ref is None or cus is None:
        return "not recorded"
    lr, lc = abs(math.log(ref)), abs(math.log(cus))
    if max(lr, lc) < math.log1p(still):
        return "neither"
    return "reference" if lr >= 2 * lc else ("custom" if lc >= 2 * lr else "both")


def bound_of(sides: list[str] | None) -> str:
    """``host-bound`` (either side), ``GPU-bound`` or ``not recorded`` for a time result's
    :func:`l1bench.timing.hostclock.host_bound_sides`."""
    return "not recorded" if sides is None else ("host-bound" if sides else "GPU-bound")


def load(root, protocol: str, modes) -> dict[str, dict[str, dict]]:
    """``{mode: {tid: result}}``: a tree's time results of one protocol, read once."""
    return {mode: time_results(root, protocol, mode) for mode in modes}


def compare(old: dict[str, dict], new: dict[str, dict], tol: float = AGREEMENT) -> dict:
    """Of two trees' ``{tid: result}`` of one protocol and mode: rows of the tasks both scored
    (``rows``), with the tasks whose status differs (``changed``: tid, old status, new status)."""
    rows, changed = [], []
    for tid in sorted(set(old) & set(new)):
        a, b = old[tid], new[tid]
        if a.get("status") != b.get("status"):
            changed.append((tid, a.get("status"), b.get("status")))
        if not (_ok(a) and _ok(b)):
            continue
        move, sides = b["score"] / a["score"] - 1, hostclock.host_bound_sides(b)
        rows.append({
            "tid": tid, "old": a["score"], "new": b["score"], "move": move, "moved": abs(move) > tol,
            **dict(zip(("ref", "custom"), call_ratios(a, b), strict=True)),
            "side": side_moved(a, b), "bound": bound_of(sides), "sides": bound_label(sides or []),
            "flags": ", ".join(flag_names(b.get("flags") or [])),
            "notes": "; ".join([f"old: {n}" for n in notes(a)] + [f"new: {n}" for n in notes(b)]),
        })
    return {"rows": rows, "changed": changed}


def tree_line(root, results) -> str:
    """``root``: the timing versions and GPUs of its scores among ``results``."""
    versions, gpus, n = Counter(), Counter(), 0
    for r in results:
        if _ok(r):
            n += 1
            versions[timing_version(r)] += 1
            gpus[(r.get("provenance") or {}).get("gpu") or "no GPU recorded"] += 1
    vs = ", ".join(f"version {v}: {c}" for v, c in sorted(versions.items(), key=lambda kv: (kv[0] is None, kv[0])))
    return f"`{root}`: {n} scores ({vs or 'none'}); {', '.join(f'{g}: {c}' for g, c in gpus.most_common()) or '—'}"


def _counts(rows: list[dict], tol: float) -> list[str]:
    up = sum(r["move"] > tol for r in rows)
    down = sum(r["move"] < -tol for r in rows)
    med = statistics.median(abs(r["move"]) for r in rows) if rows else None
    return [str(len(rows)), str(len(rows) - up - down), str(up), str(down), f"{med:.1%}" if med is not None else "—"]


def section(title: str, result: dict, tol: float) -> list[str]:
    rows, pct = result["rows"], f"{tol:.0%}"
    out = [f"## {title}", ""]
    if not rows and not result["changed"]:
        return out + ["No task scored in both trees.", ""]
    head = ["tasks", "scored in both", f"within ±{pct}", f"up > {pct}", f"down > {pct}", "median |move|"]
    groups = [("all", rows)] + [(b, [r for r in rows if r["bound"] == b])
                                for b in ("host-bound", "GPU-bound", "not recorded")]
    out += [md_table([[name, *_counts(g, tol)] for name, g in groups if g], head), ""]
    sides = Counter(r["side"] for r in rows if r["moved"])
    if sides:
        out += ["Moved, by the side whose call carries the move: "
                + ", ".join(f"{s} {c}" for s, c in sides.most_common()) + ".", ""]
    moved = sorted((r for r in rows if r["moved"]), key=lambda r: -abs(r["move"]))
    if moved:
        out += [md_table([[r["tid"], fmt(r["old"]), fmt(r["new"]), f"{r['move']:+.0%}",
                           f"{r['ref']:.2f}×" if r["ref"] else "—", f"{r['custom']:.2f}×" if r["custom"] else "—",
                           r["side"], f"{r['bound']} ({r['sides']})" if r["bound"] == "host-bound" else r["bound"],
                           r["flags"] or "—", r["notes"] or "—"] for r in moved],
                         ["task", "old", "new", "move", "reference call new/old", "custom call new/old", "side moved",
                          "new: bound", "new: flags", "trials"]), ""]
    if result["changed"]:
        out += ["Status changed: " + ", ".join(f"{t} {a} → {b}" for t, a, b in result["changed"]) + ".", ""]
    return out


def page(old_root, new_root, protocol: str = "paper", modes=MODES, tol: float = AGREEMENT) -> str:
    old, new = load(old_root, protocol, modes), load(new_root, protocol, modes)
    present = [m for m in modes if old[m] and new[m]]
    lines = [tree_line(root, [r for m in present for r in tree[m].values()])
             for root, tree in ((old_root, old), (new_root, new))]
    out = [f"# What moved: {protocol} protocol, `{old_root}` → `{new_root}`", "",
           f"* old: {lines[0]}", f"* new: {lines[1]}",
           "* move = new score / old score − 1; a side's call = the median over outer trials of its mean timed call; "
           "side moved: the side whose call changed at least twice as much as the other's (in log), both, or neither "
           "(both within 3 %: the move is in the trials). trials: what makes a score rest on part of its "
           "trials (an early stop, a trial 1.5× its side's median or slower). Where the two trees' GPUs differ, "
           "every move carries the GPU's change too.", ""]
    for mode in present:
        out += section(f"{MODE_LABELS[mode]} ({protocol})", compare(old[mode], new[mode], tol), tol)
    if not present:
        out += ["No mode was scored in both trees.", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m l1lab moved", description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=results_tree, help="the older results tree (results/<device>)")
    ap.add_argument("new", type=results_tree, help="the newer results tree")
    ap.add_argument("--protocol", default="paper", choices=["paper", "strict"])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--out", type=Path, help="write the page here (else stdout)")
    args = ap.parse_args(argv)
    text = page(args.old, args.new, args.protocol, args.modes)
    write_page(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
