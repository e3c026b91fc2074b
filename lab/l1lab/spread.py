"""Run-to-run spread: the same tasks timed twice (two results trees), per task the two scores and
their relative difference, with the median and maximum, the stalled timed calls, the GPU-bound
and host-bound tasks apart, and the run-to-run targets (median, share within ±15 %, stalls).

    python -m l1lab spread repeat FIRST_TREE SECOND_TREE [--targets] [--out PAGE.md]
    python -m l1lab spread spreads FIRST SECOND [FIRST SECOND ...] --out run_spread.json

``spreads`` writes, per task over several pairs of runs, how often its score moved: the
product's tables flag ``RUN_SPREAD`` from such a file (config/curation/<device>/run_spread.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from l1bench.aggregate.conventions import MODE_LABELS, NA
from l1bench.aggregate.markdown import fmt as _fmt
from l1bench.aggregate.markdown import md_table
from l1bench.aggregate.slices import _num
from l1bench.io import write_page
from l1bench.results import AGREEMENT, Status
from l1bench.timing import hostclock, stalls
from l1lab.stagetimes import bound_label, per_1000, stall_rate


def probe_median_us(result: dict) -> float | None:
    """The CPU probe's median (µs) in a time result that recorded one (``host_timing.probe``,
    older results): a fixed piece of Python work, so its ratio between two runs of a task is the
    ratio of the two hosts' speeds as that task's process saw them."""
    value = ((result.get("host_timing") or {}).get("probe") or {}).get("median_us")
    return float(value) if value else None


def time_results(root, protocol: str, mode: str) -> dict[str, dict]:
    """``{tid: result}`` of a results tree's time results of one protocol and mode."""
    out = {}
    for path in sorted(Path(root, "time", protocol, mode).glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(f"{path}: not JSON ({err})") from err
    return out


def run_to_run(first_root, second_root, mode: str = "default", protocol: str = "paper", tol: float = AGREEMENT) -> dict:
    """Scores of the tasks timed in both result folders, and their relative differences
    (|second − first| / first). ``early_stopped`` marks a result cut short by the paper
    protocol's early stop (one outer trial below the threshold decides the score)."""
    a, b = time_results(first_root, protocol, mode), time_results(second_root, protocol, mode)
    rows = []
    for tid in sorted(set(a) & set(b)):
        ra, rb = a[tid], b[tid]
        sa, sb = _num(ra.get("score")), _num(rb.get("score"))
        if ra.get("status") != Status.OK or rb.get("status") != Status.OK or not sa or sb is None:
            continue
        stopped = any(
            len(r.get("trial_scores") or []) < (r.get("params") or {}).get("outer_trials", 0) for r in (ra, rb)
        )
        # the same comparison with each score taken without its stalled pairs (l1bench.timing.stalls)
        clean, stalled = [], 0
        for r, score in ((ra, sa), (rb, sb)):
            info = stalls.rescore(r.get("ref_ms") or [], r.get("custom_ms") or [])
            n = info["stalled_calls"] if info else 0
            stalled += n
            clean.append(info["score_without"] if n and info["score_without"] else score)
        bound = [hostclock.host_bound_sides(r) for r in (ra, rb)]
        probes = [probe_median_us(r) for r in (ra, rb)]
        rows.append({"tid": tid, "first": sa, "second": sb, "rel_diff": abs(sb - sa) / sa, "early_stopped": stopped,
                     "stalled_calls": stalled, "rel_diff_without_stalls": abs(clean[1] - clean[0]) / clean[0],
                     # sides host-bound in either run; None where a run's result does not say
                     "host_bound": None if None in bound else [s for s in hostclock.SIDES if s in bound[0] + bound[1]],
                     "probe_ratio": probes[1] / probes[0] if all(probes) else None})
    diffs = [r["rel_diff"] for r in rows]
    full = [r["rel_diff"] for r in rows if not r["early_stopped"]]
    clean = [r["rel_diff_without_stalls"] for r in rows]
    rates = [per_1000(stall_rate(res.values())) for res in (a, b)]
    return {
        "machines": [machine_of(res.values()) for res in (a, b)],
        "tol": tol,
        "within": sum(d <= tol for d in diffs),
        "stalled_per_1000": rates,
        "median_without_stalls": statistics.median(clean) if clean else None,
        "max_without_stalls": max(clean) if clean else None,
        "mode": mode,
        "protocol": protocol,
        "rows": rows,
        "n": len(rows),
        "median": statistics.median(diffs) if diffs else None,
        "max": max(diffs) if diffs else None,
        "n_full": len(full),
        "median_full": statistics.median(full) if full else None,
        "max_full": max(full) if full else None,
        "call_times": call_time_ratios(a, b),
        "bound": by_bound(rows, tol),
        "probe_ratio": _median_of(r["probe_ratio"] for r in rows),
    }


def _median_of(values) -> dict:
    got = [v for v in values if v is not None]
    return {"n": len(got), "median": statistics.median(got) if got else None}


def by_bound(rows: list[dict], tol: float = AGREEMENT) -> dict:
    """The spread apart for the tasks whose timed calls are GPU-bound on both sides in both
    runs (``gpu``) and those with a host-bound side in either (``host``,
    :func:`l1bench.timing.hostclock.host_bound_sides`): n, median and maximum relative difference,
    and how many are within ``tol``; ``unknown`` counts the tasks whose results do not say."""
    out: dict = {"unknown": sum(r.get("host_bound") is None for r in rows)}
    for name, keep in (("gpu", lambda b: b == []), ("host", lambda b: bool(b))):
        diffs = [r["rel_diff"] for r in rows if r.get("host_bound") is not None and keep(r["host_bound"])]
        out[name] = {**_median_of(diffs), "max": max(diffs) if diffs else None, "within": sum(d <= tol for d in diffs)}
    return out


def machine_of(results) -> dict:
    """What measured a run's results, from their provenance: the GPU names and the timing
    versions, each as a sorted list of the values found (results without one say nothing)."""
    gpus, versions = set(), set()
    for res in results:
        gpu = (res.get("provenance") or {}).get("gpu")
        if gpu:
            gpus.add(str(gpu))
        version = res.get("timing_version", res.get("timing_design"))
        if version is not None:
            versions.add(version)
    return {"gpus": sorted(gpus), "versions": sorted(versions, key=str)}


def same_gpu(rr: dict) -> bool | None:
    """Did both runs time on the same GPU model? None when a run's results do not say."""
    machines = rr.get("machines") or []
    if len(machines) != 2 or not all(m["gpus"] for m in machines):
        return None
    return machines[0]["gpus"] == machines[1]["gpus"] and len(machines[0]["gpus"]) == 1


def render_machines(rr: dict) -> str | None:
    """One line: each run's GPU and timing version; a warning when the GPUs differ (the spread
    then holds the GPUs' difference, not only the runs')."""
    machines = rr.get("machines") or []
    if len(machines) != 2 or not any(m["gpus"] or m["versions"] for m in machines):
        return None

    def one(m):
        gpu = " + ".join(m["gpus"]) or "GPU not recorded"
        return gpu + (f", timing version {'/'.join(map(str, m['versions']))}" if m["versions"] else "")

    line = f"* measured on: first {one(machines[0])}; second {one(machines[1])}"
    if same_gpu(rr) is False:
        line += " (**different GPUs**: the differences below hold the GPUs' difference, not only the runs')"
    return line


def _call_times(trials) -> tuple[float, float] | None:
    """(first, steady) of one side of a paper result's timings (``ref_ms``/``custom_ms``: per
    outer trial, its timed calls in order): the median over trials of the trial's first call
    (the one that allocates: the harness empties the allocator between trials) and of the
    median of its other calls. None without trials of two calls or more."""
    full = [t for t in trials or [] if len(t) > 1]
    if not full:
        return None
    return statistics.median(t[0] for t in full), statistics.median(statistics.median(t[1:]) for t in full)


def call_time_ratios(a: dict[str, dict], b: dict[str, dict]) -> dict:
    """How the timed calls themselves moved between two runs, apart from the scores: for the
    tasks scored in both, the second run's first-call and steady-state times over the first's
    (:func:`_call_times`), per side, as medians over the tasks. A run whose calls all ran
    slower (a busier machine, a timing that lets other work near the timed calls) shows here
    even where the scores, ratios of two such times, hide it."""
    ratios: dict[str, list[float]] = {k: [] for k in ("ref_first", "ref_steady", "custom_first", "custom_steady")}
    for tid in sorted(set(a) & set(b)):
        if a[tid].get("status") != Status.OK or b[tid].get("status") != Status.OK:
            continue
        for side in ("ref", "custom"):
            ta, tb = _call_times(a[tid].get(f"{side}_ms")), _call_times(b[tid].get(f"{side}_ms"))
            if ta and tb and ta[0] > 0 and ta[1] > 0:
                ratios[f"{side}_first"].append(tb[0] / ta[0])
                ratios[f"{side}_steady"].append(tb[1] / ta[1])
    return {k: _median_of(v) for k, v in ratios.items()}


#: The run-to-run targets for two runs of the same tasks (``--targets``): median |Δscore| at most
#: 5 %, at least 90 % of the tasks within ±15 %, at most 0.5 stalled timed calls per 1000 in
#: each run.
TARGET_MEDIAN, TARGET_WITHIN_SHARE, TARGET_STALLED_PER_1000 = 0.05, 0.90, 0.5


def target_names(tol: float = AGREEMENT) -> tuple[str, str, str]:
    """The three targets' names, the share's at the tolerance ``tol``."""
    return (f"median ≤ {100 * TARGET_MEDIAN:.0f} %", f"≥ {100 * TARGET_WITHIN_SHARE:.0f} % within ±{100 * tol:.0f} %",
            f"stalled ≤ {TARGET_STALLED_PER_1000} per 1000 in each run")


def targets(rr: dict) -> list[tuple[str, str, bool]]:
    """The run-to-run targets against a :func:`run_to_run` result: (target, measured, met) each.
    No task in both runs meets none. The targets are for two runs on one GPU model: where the
    results say the GPUs differ, none is met (their spread holds the GPUs' difference)."""
    names = target_names(rr.get("tol", AGREEMENT))
    if same_gpu(rr) is False:
        return [(name, "different GPUs", False) for name in names]
    n, within = rr["n"], rr.get("within", 0)
    rates = rr.get("stalled_per_1000") or [0.0, 0.0]
    return [
        (names[0], NA if rr["median"] is None else f"{100 * rr['median']:.1f} %",
         rr["median"] is not None and rr["median"] <= TARGET_MEDIAN),
        (names[1], f"{within} of {n}" + (f", {100 * within / n:.0f} %" if n else ""),
         n > 0 and within >= TARGET_WITHIN_SHARE * n),
        (names[2], ", ".join(f"{x:.2f}" for x in rates), n > 0 and all(x <= TARGET_STALLED_PER_1000 for x in rates)),
    ]


def _checks_text(checks) -> str:
    """``target: met (value); ...`` of :func:`targets`' checks."""
    return "; ".join(f"{name}: {'met' if ok else 'NOT met'} ({value})" for name, value, ok in checks)


def render_targets(rr: dict) -> str:
    """One line: each target, met or not, and the verdict."""
    checks = targets(rr)
    parts = _checks_text(checks)
    verdict = "all met" if all(ok for *_, ok in checks) else "not all met"
    if same_gpu(rr) is False:
        return "* the run-to-run targets: **not judged** (the runs timed on different GPUs)"
    return f"* the run-to-run targets: {parts}; **{verdict}**"


def _pct(x) -> str:
    """A relative difference as the spread pages write it (one decimal, ``NA`` for none)."""
    return NA if x is None else f"{100 * x:.1f} %"


def render_run_to_run(rr: dict, first_label: str, second_label: str, with_targets: bool = False) -> str:
    pct = _pct
    lines = [
        f"# Run-to-run spread: {MODE_LABELS.get(rr['mode'], rr['mode'])} ({rr['protocol']} protocol)",
        "",
        f"{rr['n']} tasks timed in both `{first_label}` and `{second_label}`. Relative difference = "
        "|second − first| / first.",
        "",
        f"* all {rr['n']}: median **{pct(rr['median'])}**, max **{pct(rr['max'])}**",
        f"* within ±{100 * rr.get('tol', AGREEMENT):.0f} %: **{rr.get('within', 0)} of {rr['n']}**",
        "* timed calls stalled by the host (`l1bench.timing.stalls`) per 1000: first "
        + ", second ".join(f"{x:.2f}" for x in rr.get("stalled_per_1000") or [0.0, 0.0]),
        f"* the {rr['n_full']} whose two results ran all outer trials: median {pct(rr['median_full'])}, "
        f"max {pct(rr['max_full'])}",
        f"* all {rr['n']}, each score taken without the timed pairs holding a call stalled by the host "
        f"(`l1bench.timing.stalls`): median {pct(rr.get('median_without_stalls'))}, "
        f"max {pct(rr.get('max_without_stalls'))}",
    ]
    if with_targets:
        lines.insert(7, render_targets(rr))
    machines = render_machines(rr)
    if machines:
        lines.insert(4, machines)
    ct = rr.get("call_times")
    if ct and ct["ref_steady"]["n"]:
        x = lambda k: NA if ct[k]["median"] is None else f"{ct[k]['median']:.3f}×"  # noqa: E731
        lines.append(
            f"* timed calls, second run over first (median over {ct['ref_steady']['n']} tasks): reference "
            f"{x('ref_first')} first call, {x('ref_steady')} the others; custom {x('custom_first')} first call, "
            f"{x('custom_steady')} the others (a trial's first call allocates)"
        )
    lines += [line for line in (render_bound(rr, with_targets), render_probe_ratio(rr)) if line]
    lines.append("")
    ordered = sorted(rr["rows"], key=lambda r: -r["rel_diff"])
    rows = [
        [r["tid"], _fmt(r["first"], 3), _fmt(r["second"], 3), pct(r["rel_diff"]), "yes" if r["early_stopped"] else "",
         str(r.get("stalled_calls", 0) or ""), pct(r.get("rel_diff_without_stalls"))]
        for r in ordered
    ]
    head = ["Task", "First", "Second", "Rel. difference", "Early stop in a run", "Stalled calls", "Without stalls"]
    # the host's share only where the results record it (older results do not)
    if any(r.get("host_bound") is not None for r in ordered):
        head.append("Host-bound side")
        for row, r in zip(rows, ordered, strict=True):
            row.append(_bound_cell(r.get("host_bound")))
    if any(r.get("probe_ratio") is not None for r in ordered):
        head.append("CPU probe, second/first")
        for row, r in zip(rows, ordered, strict=True):
            row.append(NA if r.get("probe_ratio") is None else f"{r['probe_ratio']:.2f}×")
    lines.append(md_table(rows, head))
    return "\n".join(lines) + "\n"


def _bound_cell(sides: list[str] | None) -> str:
    if sides is None:
        return NA
    label = bound_label(sides)
    return "" if label == "neither" else label


def render_bound(rr: dict, with_targets: bool = False) -> str | None:
    """One line: the spread of the GPU-bound tasks apart from the host-bound ones (:func:`by_bound`);
    with ``with_targets`` the median and share targets over the GPU-bound ones too. None where
    no result records its launches."""
    bound = rr.get("bound") or {}
    gpu, host = bound.get("gpu") or {}, bound.get("host") or {}
    if not (gpu.get("n") or host.get("n")):
        return None
    pct = _pct
    tol = f"±{100 * rr.get('tol', AGREEMENT):.0f} %"

    def part(name, b):
        if not b["n"]:
            return f"{name} 0"
        return f"{name} {b['n']}: median {pct(b['median'])}, max {pct(b['max'])}, {b['within']} within {tol}"

    share = f"{100 * hostclock.HOST_BOUND_SHARE:.0f} %"
    line = (f"* by what bounds the timed calls (a side is host-bound where its median launch is ≥ {share} of its "
            f"median timed call, in either run): " + "; ".join((part("GPU-bound on both sides", gpu),
                                                                 part("host-bound", host))))
    if bound.get("unknown"):
        line += f"; {bound['unknown']} whose results do not record their launches"
    if with_targets and gpu.get("n") and same_gpu(rr) is not False:
        sub = {**rr, "n": gpu["n"], "median": gpu["median"], "within": gpu["within"]}
        checks = targets(sub)[:2]
        line += "\n* the run-to-run median and share targets over the GPU-bound tasks only: " + _checks_text(checks)
    return line


def render_probe_ratio(rr: dict) -> str | None:
    """One line: the CPU probe's median, second run over first, over the tasks whose two
    results ran it; None where no task's two results did."""
    pr = rr.get("probe_ratio") or {}
    if not pr.get("n"):
        return None
    return (f"* CPU probe (`L1BENCH_HOST_PROBE`), second run over first (median over {pr['n']} tasks): "
            f"{pr['median']:.3f}× (below 1: the second run's host ran the same Python faster; host-bound "
            "calls move with it)")


def spread_list(pairs, mode: str = "default", protocol: str = "paper", tol: float = AGREEMENT) -> dict:
    """Per task, over several pairs of runs of the same code on one GPU model (``pairs``:
    (first, second) results trees): in how many pairs it was scored in both, in how many its
    scores differed by more than ``tol`` (:func:`run_to_run`), and the largest difference. The
    tables flag the tasks that moved in two pairs or more (``RUN_SPREAD``). A pair of runs on
    different GPUs is refused (ValueError): its spread holds the GPUs' difference."""
    tasks: dict[str, dict] = {}
    used = []
    for first, second in pairs:
        rr = run_to_run(first, second, mode, protocol, tol)
        if same_gpu(rr) is False:
            raise ValueError(f"{first} and {second} were timed on different GPUs: not a run-to-run pair")
        used.append([str(first), str(second)])
        for row in rr["rows"]:
            t = tasks.setdefault(row["tid"], {"pairs": 0, "over": 0, "max_rel_diff": 0.0})
            t["pairs"] += 1
            t["over"] += row["rel_diff"] > tol
            t["max_rel_diff"] = round(max(t["max_rel_diff"], row["rel_diff"]), 4)
    return {"mode": mode, "protocol": protocol, "tol": tol, "pairs": used, "tasks": dict(sorted(tasks.items()))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="l1lab spread", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("repeat", help="the same tasks timed twice")
    r.add_argument("first")
    r.add_argument("second")
    r.add_argument("--mode", default="default")
    r.add_argument("--protocol", default="paper")
    r.add_argument("--targets", action="store_true",
                   help="add a line: the run-to-run targets (median, share within, stalls), met or not")
    r.add_argument("--out")
    sp = sub.add_parser("spreads", help="per task, over pairs of repeated runs: how often its score moved (JSON)")
    sp.add_argument("trees", nargs="+", help="FIRST SECOND [FIRST SECOND ...]: pairs of results trees")
    sp.add_argument("--mode", default="default")
    sp.add_argument("--protocol", default="paper")
    sp.add_argument("--out")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "spreads":
            if len(args.trees) % 2:
                raise ValueError(f"{len(args.trees)} trees given: pairs are needed (FIRST SECOND ...)")
            pairs = list(zip(args.trees[::2], args.trees[1::2], strict=True))
            text = json.dumps(spread_list(pairs, args.mode, args.protocol), indent=1) + "\n"
        else:
            rr = run_to_run(args.first, args.second, args.mode, args.protocol)
            text = render_run_to_run(rr, args.first, args.second, args.targets)
    except (OSError, ValueError, KeyError) as err:
        print(f"spread: {err}", file=sys.stderr)
        return 2
    write_page(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
