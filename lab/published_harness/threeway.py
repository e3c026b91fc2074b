"""The three-way page: the published harness unpinned (a, as a user runs it), the same pinned (b,
as the earlier side-by-side pages ran it) and the workflow (c), two passes each, same node and hour.

    python lab/published_harness/threeway.py --unpinned results/sbs-pub1 results/sbs-pub2 \\
        --pinned results/sbs-pin1 results/sbs-pin2 --workflow results/sbs-wf1 results/sbs-wf2 \\
        --line "22 tasks drawn with seed 20261207" --out THREE_WAY.md

Per task: each arm's mean score and run-to-run spread (|pass 2 − pass 1| / pass 1), the gaps
c/a − 1 and c/b − 1 (the workflow against each way of running the harness) and b/a − 1 (what
pinning does to the harness itself); a gap is *beyond the spreads* when it is larger than ±15 %
and larger than the wider of the two arms' spreads. Tasks are split by whether the workflow's
result is ``HOST_BOUND`` in either pass (a side's median launch is at least 80 % of its median timed
call: ``l1bench.timing.hostclock.host_bound_sides``, the tables' flag); each task's row gives the
workflow's host-bound sides and launch shares.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

try:
    from . import compare
except ImportError:  # run as a script
    import compare

ARMS = ("a", "b", "c")
NAMES = {"a": "published, unpinned", "b": "published, pinned", "c": "workflow"}
#: The gaps of the page: (name, numerator arm, denominator arm).
GAPS = (("c/a", "c", "a"), ("c/b", "c", "b"), ("b/a", "b", "a"))


def host_bound(trees, mode: str) -> dict[str, dict]:
    """{tid: {"sides": host-bound sides in any pass, "shares": {side: launch share, max over passes}}}
    of the workflow's time results."""
    from l1bench.timing import hostclock

    out: dict[str, dict] = {}
    for tree in trees:
        root = compare.device_root(tree)
        for path in sorted((root / "time" / "paper" / mode).glob("*.json")):
            res = compare._load(path) or {}
            entry = out.setdefault(path.stem, {"sides": set(), "shares": {}})
            entry["sides"] |= set(hostclock.host_bound_sides(res) or ())
            for side, share in (hostclock.launch_shares(res) or {}).items():
                entry["shares"][side] = max(share, entry["shares"].get(side, 0.0))
    return out


def rows(passes: dict[str, list[dict]], tol: float = compare.TOLERANCE, bound: dict | None = None) -> list[dict]:
    """One row per task scored or judged in any pass of any arm; ``bound``: :func:`host_bound`."""
    bound = bound or {}
    found = sorted(set().union(*(p for arm in passes.values() for p in arm)))
    out = []
    for tid in found:
        hb = bound.get(tid) or {"sides": set(), "shares": {}}
        # None: no workflow result to tell (its pass not run, or the task not reached).
        row = {"tid": tid, "host_bound": bool(hb["sides"]) if tid in bound else None,
               "bound_sides": sorted(hb["sides"]),
               "shares": hb["shares"], "statuses": {}}
        for arm, trees in passes.items():
            got = [p.get(tid) or {} for p in trees]
            scores = [g.get("score") for g in got]
            row[arm] = scores
            row[f"{arm}_mean"] = compare._mean(scores)
            row[f"{arm}_spread"] = compare.spread(scores)
            row["statuses"][arm] = [g.get("status") for g in got]
            if arm == "c":
                row["flags"] = sorted({f for g in got for f in g.get("flags") or ()})
        for name, num, den in GAPS:
            top, bottom = row[f"{num}_mean"], row[f"{den}_mean"]
            gap = top / bottom - 1 if top is not None and bottom else None
            allowed = max([tol] + [s for s in (row[f"{num}_spread"], row[f"{den}_spread"]) if s is not None])
            row[name] = gap
            row[f"{name}_beyond"] = None if gap is None else abs(gap) > allowed
        out.append(row)
    return out


def group_summary(table: list[dict], tol: float = compare.TOLERANCE) -> dict:
    """Per gap: tasks scored by both arms, within ±tol, beyond the spreads, median |gap| and
    median signed gap; per arm: median spread."""
    out = {"n": len(table)}
    for name, _, _ in GAPS:
        gaps = [r[name] for r in table if r[name] is not None]
        out[name] = {
            "n": len(gaps),
            "within": sum(abs(g) <= tol for g in gaps),
            "beyond": [r["tid"] for r in table if r[f"{name}_beyond"]],
            "median_abs": statistics.median(abs(g) for g in gaps) if gaps else None,
            "median": statistics.median(gaps) if gaps else None,
        }
    for arm in ARMS:
        spreads = [r[f"{arm}_spread"] for r in table if r[f"{arm}_spread"] is not None]
        out[f"{arm}_spread"] = statistics.median(spreads) if spreads else None
        out[f"{arm}_spread_n"] = len(spreads)
    return out


def _pct(x, signed=False) -> str:
    return compare._pct(x, signed)


def _scores(values, statuses) -> str:
    return compare._pair(values, statuses)


def render(table: list[dict], title: str, lines: list[str]) -> str:
    groups = {"all": table, "host-bound": [r for r in table if r["host_bound"]],
              "not host-bound": [r for r in table if r["host_bound"] is False]}
    unknown = [r for r in table if r["host_bound"] is None]
    if unknown:
        groups["no workflow result"] = unknown
    out = [f"# {title}", "", *lines, ""]
    out += ["| tasks | n | median spread a / b / c | c/a within ±15 % | c/a median (abs) | c/a beyond spreads "
            "| c/b within ±15 % | c/b median (abs) | c/b beyond spreads | b/a median (abs) | b/a beyond spreads |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, rows_ in groups.items():
        s = group_summary(rows_)
        cells = [label, str(s["n"]), " / ".join(_pct(s[f"{a}_spread"]) for a in ARMS)]
        for name, _, _ in GAPS:
            g = s[name]
            med = f"{_pct(g['median'], True)} ({_pct(g['median_abs'])})" if g["n"] else "—"
            if name != "b/a":
                cells.append(f"{g['within']} of {g['n']}")
            cells += [med, ", ".join(g["beyond"]) or "none"]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "a = " + NAMES["a"] + ", b = " + NAMES["b"] + ", c = " + NAMES["c"] + "; scores are pass 1 / pass 2; "
            "spread = |pass 2 − pass 1| / pass 1; c/a = c's mean / a's mean − 1; **bold**: beyond ±15 % and beyond "
            "the wider of the two arms' spreads.", "",
            "| task | host-bound (launch share ref / custom) | a 1 / 2 | spread | b 1 / 2 | spread | c 1 / 2 | spread "
            "| c/a | c/b | b/a "
            "| workflow flags |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        gaps = []
        for name, _, _ in GAPS:
            cell = _pct(r[name], True)
            gaps.append(f"**{cell}**" if r[f"{name}_beyond"] else cell)
        arms = [f"{_scores(r[a], r['statuses'][a])} | {_pct(r[f'{a}_spread'])}" for a in ARMS]
        shares = " / ".join(f"{r['shares'][s]:.2f}" if s in r["shares"] else "—" for s in ("ref", "custom"))
        bound = "—" if r["host_bound"] is None else ", ".join(r["bound_sides"]) or "no"
        out.append(f"| {r['tid']} | {bound} ({shares}) | {' | '.join(arms)} | {' | '.join(gaps)} "
                   f"| {', '.join(r['flags']) or '—'} |")
    return "\n".join(out) + "\n"


def page(given: dict[str, list], mode: str, title: str, lines: list[str], read=compare.read_pass) -> str:
    """The page of the trees ``given`` per arm (a, b, c), each read by ``read`` (a tree, the mode:
    :func:`compare.read_pass`'s records). A pass that a call's deadline left unrun has no tree:
    the page is made of the passes that ran, and says which did not."""
    ran = {arm: [t for t in trees if Path(t).is_dir()] for arm, trees in given.items()}
    passes = {arm: [read(t, mode) for t in trees] for arm, trees in ran.items()}
    recorded = [f"* a: {compare.affinity(passes['a'])}.", f"* b: {compare.affinity(passes['b'])}."]
    recorded += [f"* {arm} ({NAMES[arm]}): not run: {', '.join(sorted(set(given[arm]) - set(trees)))}."
                 for arm, trees in ran.items() if len(trees) < len(given[arm])]
    return render(rows(passes, bound=host_bound(ran["c"], mode)), title, recorded + lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unpinned", nargs="+", required=True, help="arm a: the published harness unpinned (passes)")
    ap.add_argument("--pinned", nargs="+", required=True, help="arm b: the published harness pinned (passes)")
    ap.add_argument("--workflow", nargs="+", required=True, help="arm c: the workflow (passes)")
    ap.add_argument("--mode", default="default")
    ap.add_argument("--title", default="Three ways of timing the same tasks: the published harness unpinned "
                                        "and pinned, and the workflow")
    ap.add_argument("--line", action="append", default=[], help="a line under the title (repeatable)")
    ap.add_argument("--out", help="write the page here (atomically) instead of printing it")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    text = page({"a": args.unpinned, "b": args.pinned, "c": args.workflow}, args.mode, args.title, args.line)
    from l1bench.io import write_page

    write_page(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
