"""What the order of a timed pair does to a paper score, from a results tree's raw times: the
workflow's, or the published harness's as ``run.py`` records them.

    python lab/published_harness/pair_order.py results/sbs-wf1 results/sbs-pub1 [--mode default] [--out F]

The paper protocol times each pair (reference, custom) in an order drawn from ``random.Random(seed)``
(``params.seed``, 42): the same 70 orders for every task and run. The published harness draws each
pair's order with ``random.choice``, unseeded: new orders in every process. Per task and tree this
page gives, from the recorded per-pair times and orders (``host_timing.ref_first``; results made
before it was recorded: the orders the seed draws, and results with re-timed pairs left out, since
a re-timed pair draws again):

* ``first/second``: each side's mean time when it ran first in its pair over its mean when second;
* ``lowest/highest``: the trials with the lowest and highest trial score, beside the number of
  reference-first pairs in each trial;
* ``fixed − random``: the score the seed's orders give (a published-harness tree: the orders that run
  drew, as ``child.py`` recorded them) against the expectation over random orders
  (each trial's reference-first count binomial(n, ½)), under the model that a side's time is its
  first or second mean; ``random SD``: that model's standard deviation of one run's score with
  random orders, the swing the published harness's own order gives a score.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from math import comb
from pathlib import Path

try:
    from . import compare, threeway
except ImportError:  # run as a script
    import compare
    import threeway


def orders(seed: int, trials: int, inner: int) -> list[list[bool]]:
    """Per trial, per pair: reference first? As ``timing.harness._time_pair`` draws it."""
    rng = random.Random(seed)
    return [[rng.random() < 0.5 for _ in range(inner)] for _ in range(trials)]


def order_effect(res: dict) -> dict | None:
    """The page's numbers for one workflow time result; None without per-pair times or with re-timed pairs."""
    ref, cus, p = res.get("ref_ms") or [], res.get("custom_ms") or [], res.get("params") or {}
    host = res.get("host_timing") or {}
    if host.get("ref_first"):  # recorded (l1bench 0.5.0 on), re-timed pairs included
        return effect(ref, cus, host["ref_first"], res.get("trial_scores") or [])
    if not ref or host.get("retimed_pairs") or len(ref) != len(cus):
        return None
    drawn = orders(int(p.get("seed", 42)), len(ref), len(ref[0]))
    return effect(ref, cus, drawn, res.get("trial_scores") or [])


def harness_trials(events: Path) -> tuple[list, list, list, list] | None:
    """(reference ms, custom ms, reference first?, trial scores) per trial of one published-harness
    run, from the ``trial`` events ``child.py`` recorded (who ran first in each pair included)."""
    try:
        lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    trials = [e for e in lines if e.get("event") == "trial" and e.get("ref_first")]
    if not trials:
        return None
    return tuple([t[k] for t in trials] for k in ("ref_ms", "custom_ms", "ref_first", "score"))


def effect(ref: list, cus: list, drawn: list, trials: list) -> dict | None:
    """Each side's first/second, the trial extremes, and the score of the orders ``drawn`` against
    the random-order expectation (the model of the module's docstring)."""
    means = {}
    for side, times in (("ref", ref), ("custom", cus)):
        first = [v for t, row in enumerate(times) for i, v in enumerate(row) if drawn[t][i] == (side == "ref")]
        second = [v for t, row in enumerate(times) for i, v in enumerate(row) if drawn[t][i] != (side == "ref")]
        if not first or not second:
            return None
        means[side] = (statistics.fmean(first), statistics.fmean(second))
    n = len(ref[0])

    def score(k: int) -> float:  # k reference-first pairs of n
        r = (k * means["ref"][0] + (n - k) * means["ref"][1]) / n
        c = ((n - k) * means["custom"][0] + k * means["custom"][1]) / n
        return r / c

    counts = [sum(row) for row in drawn]
    fixed = statistics.fmean(score(k) for k in counts)
    weights = [comb(n, k) / 2**n for k in range(n + 1)]
    expect = sum(w * score(k) for k, w in enumerate(weights))
    sd = (sum(w * (score(k) - expect) ** 2 for k, w in enumerate(weights)) / len(counts)) ** 0.5
    return {
        "first_second": {side: f / s - 1 for side, (f, s) in means.items()},
        "ref_first": counts,
        "lowest": trials.index(min(trials)) + 1 if trials else None,
        "highest": trials.index(max(trials)) + 1 if trials else None,
        "fixed_vs_random": fixed / expect - 1,
        "random_sd": sd / expect,
    }


def render(trees, mode: str) -> str:
    out = ["| tree | task | ref first/second | custom first/second | lowest / highest trial "
           "| fixed − random | random SD |", "|---|---|---|---|---|---|---|"]
    drawn = None
    for tree in trees:
        root = compare.device_root(tree)
        for path in sorted((root / "time" / "paper" / mode).glob("*.json")):
            e = run_effect(root, mode, path.stem)
            if e is None:
                continue
            if drawn is None and not (root / "harness_logs").is_dir():  # a workflow tree's orders
                drawn = e["ref_first"]
            fs = e["first_second"]
            out.append(f"| {Path(tree).name} | {path.stem} | {fs['ref']:+.0%} | {fs['custom']:+.0%} "
                       f"| {e['lowest']} / {e['highest']} | {e['fixed_vs_random']:+.1%} | {e['random_sd']:.1%} |")
    head = [f"The workflow's reference-first pairs per trial, as the seed draws them: {drawn}.", ""] if drawn else []
    return "\n".join(head + out) + "\n"


def run_effect(root: Path, mode: str, tid: str) -> dict | None:
    """:func:`effect` of one task's result in a tree, the published harness's or the workflow's."""
    run = harness_trials(root / "harness_logs" / mode / tid / "events.jsonl")
    return effect(*run) if run else order_effect(compare._load(root / "time" / "paper" / mode / f"{tid}.json") or {})


def corrected_pass(tree, mode: str) -> dict[str, dict]:
    """``compare.read_pass`` of a tree with each score divided by (1 + its orders' offset,
    ``fixed − random``): the score that run would have had on random orders' expectation. A result
    whose offset is not known (re-timed pairs) keeps its score and gets the flag ``ORDER_UNKNOWN``."""
    root = compare.device_root(tree)
    out = compare.read_pass(tree, mode)
    for tid, rec in out.items():
        e = run_effect(root, mode, tid) if rec.get("score") is not None else None
        if e is not None:
            rec["score"] = rec["score"] / (1 + e["fixed_vs_random"])
        elif rec.get("score") is not None:
            rec["flags"] = sorted(set(rec.get("flags") or ()) | {"ORDER_UNKNOWN"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="*", help="results trees (paper protocol): the per-run table")
    ap.add_argument("--mode", default="default")
    ap.add_argument("--unpinned", nargs="+", help="with --pinned and --workflow: threeway.py's page of the "
                                                  "scores with each run's order offset taken out")
    ap.add_argument("--pinned", nargs="+")
    ap.add_argument("--workflow", nargs="+")
    ap.add_argument("--line", action="append", default=[], help="a line under the title (repeatable)")
    ap.add_argument("--out", help="write the table here instead of printing it")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.unpinned and args.pinned and args.workflow:
        text = threeway.page({"a": args.unpinned, "b": args.pinned, "c": args.workflow}, args.mode,
                             "The three ways with each run's pair-order offset taken out", args.line,
                             read=corrected_pass)
    else:
        text = render(args.trees, args.mode)
    from l1bench.io import write_page

    write_page(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
