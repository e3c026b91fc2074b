"""Timed calls stretched by a host-side stall, found in a paper-protocol result's raw timings.

A call is *stalled* when it exceeds ``FACTOR`` times the median of its side by at least
``MIN_EXTRA_MS`` (on the H200 run a 0.03 ms call was now and then timed at 4 or 8 ms, multiples
of a scheduler tick). No score changes: :func:`rescore` scores a result without the pairs that
hold a stalled call, and :func:`outlier_flag` raises ``TIMING_OUTLIER`` when that matters.
"""

from __future__ import annotations

import statistics

from l1bench.results import Flag, Status, results_tree

FLAG = Flag.TIMING_OUTLIER
FACTOR = 3.0
MIN_EXTRA_MS = 1.0
#: Relative change of the score, without the stalled pairs, that raises the flag.
TOLERANCE = 0.10


def stalled(
    values: list[float], median: float, factor: float = FACTOR, min_extra_ms: float = MIN_EXTRA_MS
) -> list[bool]:
    return [v > factor * median and v - median >= min_extra_ms for v in values]


def rescore(ref_ms: list[list[float]], custom_ms: list[list[float]], factor: float = FACTOR,
            min_extra_ms: float = MIN_EXTRA_MS) -> dict | None:
    """The stalled calls of a paper-protocol result and its score without them.

    ``ref_ms``/``custom_ms``: per outer trial, the timed calls in pair order (call *j* of both
    lists was one pair). A pair is dropped when either call stalled; each trial scores
    mean(ref)/mean(custom) over the pairs left, the result the mean over trials (the harness's
    formula). None when there are no timings.
    """
    refs = [v for trial in ref_ms for v in trial]
    cuss = [v for trial in custom_ms for v in trial]
    if not refs or not cuss:
        return None
    med = {"ref": statistics.median(refs), "custom": statistics.median(cuss)}
    n_stalled, worst, trials = 0, 0.0, []
    for r, c in zip(ref_ms, custom_ms, strict=False):
        rs, cs = stalled(r, med["ref"], factor, min_extra_ms), stalled(c, med["custom"], factor, min_extra_ms)
        n_stalled += sum(rs) + sum(cs)
        worst = max(
            [worst]
            + [v - med["ref"] for v, s in zip(r, rs, strict=False) if s]
            + [v - med["custom"] for v, s in zip(c, cs, strict=False) if s]
        )
        keep = [j for j in range(min(len(r), len(c))) if not (rs[j] or cs[j])]
        trials.append(statistics.fmean(r[j] for j in keep) / statistics.fmean(c[j] for j in keep) if keep else None)
    scored = [t for t in trials if t is not None]
    return {
        "stalled_calls": n_stalled,
        "max_stall_ms": worst,
        "median_ms": med,
        "score_without": statistics.fmean(scored) if scored else None,
        "trial_scores_without": trials,
    }


def outlier_flag(res: dict, tolerance: float = TOLERANCE) -> tuple[str, dict] | None:
    """(reason, rescore info) when stalled calls matter to a paper-protocol result, else None.

    They matter when the score without them differs by more than ``tolerance``, or when the
    measurement stopped early after a first trial that, without them, would have continued.
    """
    if res.get("status") != Status.OK or res.get("protocol", "paper") != "paper" or not res.get("score"):
        return None
    info = rescore(res.get("ref_ms") or [], res.get("custom_ms") or [])
    if not info or not info["stalled_calls"] or info["score_without"] is None:
        return None
    score, without = float(res["score"]), info["score_without"]
    params = res.get("params") or {}
    stop = params.get("early_stop_below")
    trials_run = len(res.get("ref_ms") or [])
    early = stop is not None and trials_run < int(params.get("outer_trials", trials_run))
    last = info["trial_scores_without"][-1]
    early_by_stall = early and last is not None and last >= stop
    if abs(without / score - 1) <= tolerance and not early_by_stall:
        return None
    reason = (
        f"{info['stalled_calls']} timed call(s) stalled by up to {info['max_stall_ms']:.1f} ms "
        f"(medians {info['median_ms']['ref']:.3g} / {info['median_ms']['custom']:.3g} ms ref / custom); "
        f"without those pairs the score is {without:.2f}x, not {score:.2f}x"
    )
    if early_by_stall:
        reason += f"; the early stop after trial {trials_run} (score < {stop}) came from them"
    return reason, info


def flagged_results(results_root) -> list[str]:
    """Paths of the paper-protocol time results under ``results_root`` that :func:`outlier_flag`
    flags, sorted (to re-time them: ``--forcerun`` these files)."""
    import json
    from pathlib import Path

    out = []
    for path in sorted(Path(results_root).glob("time/paper/*/*.json")):
        try:
            res = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(res, dict) and outlier_flag(res) is not None:
            out.append(str(path))
    return out


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="List the paper results flagged TIMING_OUTLIER (one path a line).")
    ap.add_argument("results_root", type=results_tree, help="results/<device>")
    args = ap.parse_args(argv)
    for path in flagged_results(args.results_root):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
