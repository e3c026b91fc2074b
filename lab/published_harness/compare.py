"""The side-by-side page: two passes of the published harness and two of the workflow.

    python lab/published_harness/compare.py \\
        --published results/sbs-pub1/h100 results/sbs-pub2/h100 \\
        --workflow results/sbs-wf1/h100 results/sbs-wf2/h100 \\
        --causes lab/published_harness/causes-v8.yaml --out lab/published_harness/SIDE_BY_SIDE.md \\
        --figure lab/published_harness/side_by_side.png
    (or: python -m lab.published_harness.compare ...)

Per task: each pass's score of both harnesses, each harness's own run-to-run spread
(|second − first| / first), the gap (workflow mean / published mean − 1), whether the gap is
within ±15 % or within the wider of the two spreads, which side's timed calls moved (the
workflow's mean reference and custom milliseconds over the published harness's), the
verdicts, the extensions that did not build, the workflow's flags and the cause of the gap from
``--causes`` (a YAML mapping task → text, filled once a cause is measured). The summary counts
the tasks that agree (issue 40's "done when": at least 90 %, every other one with a cause).
A tree is a results folder ``<results_dir>/<device>`` (or ``<results_dir>`` holding one device).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

#: |workflow/published − 1| within this agrees (the workflow's AGREEMENT).
TOLERANCE = 0.15
#: Share of tasks that must agree (within the tolerance or their own spread).
TARGET_SHARE = 0.90


# --------------------------------------------------------------------------- reading


def device_root(path) -> Path:
    """``path`` itself when it holds ``time/``, else its one sub-folder that does."""
    path = Path(path)
    if (path / "time").is_dir():
        return path
    subs = [p for p in sorted(path.glob("*")) if (p / "time").is_dir()]
    if len(subs) == 1:
        return subs[0]
    raise SystemExit(f"{path}: not a results tree (no time/ folder in it or in exactly one sub-folder)")


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_pass(root, mode: str) -> dict[str, dict]:
    """{tid: {status, score, verdict, ref_ms_mean, custom_ms_mean, ext_failed, flags}} of one pass."""
    root = device_root(root)
    out = {}
    for path in sorted((root / "time" / "paper" / mode).glob("*.json")):
        res = _load(path)
        if not res:
            continue
        check = _load(root / "check" / path.name) or {}
        out[path.stem] = {
            "status": res.get("status"),
            "score": res.get("score") if res.get("status") == "ok" else None,
            "verdict": res.get("verdict") if res.get("harness") == "published" else workflow_verdict(check, res),
            "ref_ms_mean": res.get("ref_ms_mean"),
            "custom_ms_mean": res.get("custom_ms_mean"),
            "ext_failed": sorted({f.get("extension") or "?" for r in (res, check)
                                  for f in r.get("extension_failures") or ()}),
            "flags": sorted({f.get("flag") for r in (res, check) for f in r.get("flags") or () if f.get("flag")}),
            "cpus": (res.get("provenance") or {}).get("cpus"),
            "cpu_count": (res.get("provenance") or {}).get("cpu_count"),
        }
    return out


def _cpu_ranges(cpus) -> str:
    """[0, 1, 2, 15] → "0–2, 15"."""
    cpus, parts = sorted(cpus), []
    for c in cpus:
        if parts and c == parts[-1][1] + 1:
            parts[-1][1] = c
        else:
            parts.append([c, c])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in parts)


def affinity(passes: list[dict]) -> str:
    """How the published harness's processes were run, from each result's recorded affinity
    (``provenance.cpus``, and ``cpu_count``, the machine's CPUs, where recorded): pinned or
    unpinned, as the page's first lines say."""
    recs = [r for p in passes for r in p.values() if r.get("cpus")]
    if not recs:
        return "the published harness's CPU affinity: not recorded"
    sets = sorted({tuple(sorted(r["cpus"])) for r in recs})
    counts = {r.get("cpu_count") for r in recs}
    where = "; ".join(f"CPU{'s' if len(c) > 1 else ''} {_cpu_ranges(c)}" for c in sets)
    if None not in counts and all(len(c) == max(counts) for c in sets):
        return f"the published harness ran unpinned, as a user runs it: each process could use all {max(counts)} CPUs"
    if None not in counts or all(len(c) == 1 for c in sets):
        return (f"the published harness ran pinned to {where} (each process's affinity, as recorded); "
                "a user runs it unpinned")
    return f"the published harness's processes could use {where} (the machine's CPU count not recorded)"


def workflow_verdict(check: dict, time_res: dict) -> str | None:
    """The workflow's verdict: its check's (pass / fail), else what its time result implies."""
    status = check.get("status") or time_res.get("status")
    if status in ("pass", "ok"):
        return "pass"
    if status in ("incorrect", "lazy"):
        return "fail"
    return None


def read_causes(path) -> dict[str, str]:
    """{tid: cause} from a YAML mapping (or one under ``causes:``); none without a file."""
    if not path or not Path(path).exists():
        return {}
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    data = data.get("causes", data) if isinstance(data, dict) else {}
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected a mapping task → cause")
    return {str(k): " ".join(str(v).split()) for k, v in data.items() if v}


# --------------------------------------------------------------------------- rows


def spread(scores: list) -> float | None:
    """|second − first| / first of a harness's two passes; None without both."""
    if len(scores) < 2 or scores[0] is None or scores[1] is None or scores[0] <= 0:
        return None
    return abs(scores[1] - scores[0]) / scores[0]


def _mean(values) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got else None


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def rows(published: list[dict], workflow: list[dict], causes: dict, tids=None, tol: float = TOLERANCE) -> list[dict]:
    """One row per task found in any pass (or per ``tids``)."""
    found = sorted(set().union(*published, *workflow)) if tids is None else list(tids)
    out = []
    for tid in found:
        pub = [p.get(tid) or {} for p in published]
        wf = [w.get(tid) or {} for w in workflow]
        ps, ws = [p.get("score") for p in pub], [w.get("score") for w in wf]
        pm, wm = _mean(ps), _mean(ws)
        sp, sw = spread(ps), spread(ws)
        gap = wm / pm - 1 if pm and wm is not None else None
        allowed = max([tol] + [s for s in (sp, sw) if s is not None])
        out.append({
            "tid": tid, "published": ps, "workflow": ws, "published_mean": pm, "workflow_mean": wm,
            "published_spread": sp, "workflow_spread": sw, "gap": gap, "allowed": allowed,
            "agrees": None if gap is None else abs(gap) <= allowed,
            "status_published": [p.get("status") for p in pub], "status_workflow": [w.get("status") for w in wf],
            "verdict_published": _one([p.get("verdict") for p in pub]),
            "verdict_workflow": _one([w.get("verdict") for w in wf]),
            "ref_x": _ratio(_mean(w.get("ref_ms_mean") for w in wf), _mean(p.get("ref_ms_mean") for p in pub)),
            "custom_x": _ratio(_mean(w.get("custom_ms_mean") for w in wf), _mean(p.get("custom_ms_mean") for p in pub)),
            "ext_published": sorted({e for p in pub for e in p.get("ext_failed") or ()}),
            "ext_workflow": sorted({e for w in wf for e in w.get("ext_failed") or ()}),
            "flags": sorted({f for w in wf for f in w.get("flags") or ()}),
            "cause": causes.get(tid, ""),
        })
    return out


def _one(verdicts: list) -> str | None:
    """The passes' verdict: the one they agree on, "pass/fail" when they differ."""
    got = [v for v in verdicts if v]
    if not got:
        return None
    return got[0] if len(set(got)) == 1 else "/".join(got)


def summary(table: list[dict], tol: float = TOLERANCE) -> dict:
    """The counts of the page's summary."""
    both = [r for r in table if r["agrees"] is not None]
    agree = [r for r in both if r["agrees"]]
    outside = [r for r in both if not r["agrees"]]
    verdicts = [r for r in table if r["verdict_published"] and r["verdict_workflow"]]
    spreads = {k: [r[f"{k}_spread"] for r in table if r[f"{k}_spread"] is not None] for k in ("published", "workflow")}
    share = len(agree) / len(both) if both else None
    return {
        "n": len(both), "agree": len(agree), "share": share, "tol": tol,
        "within_tol": sum(abs(r["gap"]) <= tol for r in both),
        "outside": [r["tid"] for r in outside],
        "outside_explained": [r["tid"] for r in outside if r["cause"]],
        "outside_unexplained": [r["tid"] for r in outside if not r["cause"]],
        "verdicts_n": len(verdicts),
        "verdicts_same": sum(r["verdict_published"] == r["verdict_workflow"] for r in verdicts),
        "median_spread": {k: statistics.median(v) if v else None for k, v in spreads.items()},
        "scored_by_one": [r["tid"] for r in table if r["agrees"] is None
                          and (r["published_mean"] is None) != (r["workflow_mean"] is None)],
        "done": bool(both) and share >= TARGET_SHARE and not [r for r in outside if not r["cause"]],
    }


# --------------------------------------------------------------------------- rendering


def _num(x, digits=2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _pct(x, signed=False) -> str:
    if x is None:
        return "—"
    return f"{x * 100:+.0f} %" if signed else f"{x * 100:.1f} %"


def _pair(values, statuses) -> str:
    cells = [_num(v) if v is not None else (s or "—") for v, s in zip(values, statuses, strict=False)]
    return " / ".join(cells) if cells else "—"


def render(table: list[dict], summ: dict, title: str = "", labels: dict | None = None) -> str:
    labels = labels or {}
    out = [f"# {title or 'The published harness beside the workflow'}", ""]
    if labels.get("affinity"):
        out += [f"{labels['affinity'][0].upper()}{labels['affinity'][1:]}.", ""]
    for key in ("published", "workflow"):
        if labels.get(key):
            out.append(f"* {key}: {labels[key]}")
    if labels.get("published") or labels.get("workflow"):
        out.append("")
    pct = _pct(summ["share"]) if summ["share"] is not None else "—"
    ms = summ["median_spread"]
    out += [
        f"* **{summ['agree']} of {summ['n']} tasks ({pct}) agree**: |gap| within ±{summ['tol'] * 100:.0f} % "
        f"({summ['within_tol']}) or within the wider of the two harnesses' own run-to-run spreads; "
        f"target {TARGET_SHARE * 100:.0f} %, every other task with a measured cause: "
        f"**{'met' if summ['done'] else 'not met'}**.",
        f"* outside: {', '.join(summ['outside']) or 'none'}; with a cause: "
        f"{', '.join(summ['outside_explained']) or 'none'}; "
        f"without: {', '.join(summ['outside_unexplained']) or 'none'}.",
        f"* median run-to-run spread: published {_pct(ms['published'])}, workflow {_pct(ms['workflow'])}.",
        f"* verdicts the same for {summ['verdicts_same']} of {summ['verdicts_n']} tasks judged by both.",
    ]
    if summ["scored_by_one"]:
        out.append(f"* scored by one harness only: {', '.join(summ['scored_by_one'])}.")
    out += [
        "",
        "gap = workflow mean / published mean − 1; spread = |pass 2 − pass 1| / pass 1; ref × and custom × = the "
        "workflow's mean timed call over the published harness's (which side moved); ext = extensions that did "
        "not build (published / workflow).",
        "",
        "| task | published 1 / 2 | spread | workflow 1 / 2 | spread | gap | agrees | ref × | custom × "
        "| verdicts | ext | workflow flags | cause |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        ext = " / ".join(", ".join(e) or "—" for e in (r["ext_published"], r["ext_workflow"]))
        agrees = "—" if r["agrees"] is None else ("yes" if r["agrees"] else "**no**")
        out.append(
            f"| {r['tid']} | {_pair(r['published'], r['status_published'])} | {_pct(r['published_spread'])} "
            f"| {_pair(r['workflow'], r['status_workflow'])} | {_pct(r['workflow_spread'])} | {_pct(r['gap'], True)} "
            f"| {agrees} | {_num(r['ref_x'])} | {_num(r['custom_x'])} "
            f"| {r['verdict_published'] or '—'} / {r['verdict_workflow'] or '—'} | {ext} "
            f"| {', '.join(r['flags']) or '—'} | {r['cause'] or '—'} |"
        )
    return "\n".join(out) + "\n"


def figure(table: list[dict], path, tol: float = TOLERANCE) -> bool:
    """Workflow mean against published mean (log-log, the passes' range as bars, the ±tol band);
    False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pts = [r for r in table if r["agrees"] is not None]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for r in pts:
        ps = [v for v in r["published"] if v is not None]
        ws = [v for v in r["workflow"] if v is not None]
        x, y = r["published_mean"], r["workflow_mean"]
        color = "tab:blue" if r["agrees"] else ("tab:orange" if r["cause"] else "tab:red")
        ax.errorbar(x, y, xerr=[[x - min(ps)], [max(ps) - x]], yerr=[[y - min(ws)], [max(ws) - y]], fmt="o",
                    color=color, ms=4, capsize=2)
        if not r["agrees"]:
            ax.annotate(r["tid"], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if pts:
        lo = min(min(r["published_mean"], r["workflow_mean"]) for r in pts) / 1.3
        hi = max(max(r["published_mean"], r["workflow_mean"]) for r in pts) * 1.3
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.fill_between([lo, hi], [lo * (1 - tol), hi * (1 - tol)], [lo * (1 + tol), hi * (1 + tol)], color="grey",
                        alpha=0.15, label=f"±{tol * 100:.0f} %")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    passes = max((len(r["published"]) for r in pts), default=2)
    what = "one pass" if passes == 1 else f"mean of {passes} passes"
    ax.set_xlabel(f"published harness: score ({what})")
    ax.set_ylabel(f"workflow (paper protocol): score ({what})")
    ax.set_title("Same GPU, same hour: blue agrees, orange explained, red not yet", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--published", nargs="+", required=True, help="the published harness's trees (pass 1, pass 2)")
    ap.add_argument("--workflow", nargs="+", required=True, help="the workflow's trees (pass 1, pass 2)")
    ap.add_argument("--mode", default="default")
    ap.add_argument("--causes", help="YAML: task → the measured cause of its gap")
    ap.add_argument("--tasks", help="only these tasks (comma-separated ids), in this order")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", help="write the page here (atomically) instead of printing it")
    ap.add_argument("--figure", help="write the figure here (PNG)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    published = [read_pass(p, args.mode) for p in args.published]
    workflow = [read_pass(p, args.mode) for p in args.workflow]
    tids = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    table = rows(published, workflow, read_causes(args.causes), tids)
    labels = {"published": ", ".join(args.published), "workflow": ", ".join(args.workflow),
              "affinity": affinity(published)}
    text = render(table, summary(table), args.title or f"The published harness beside the workflow ({args.mode})",
                  labels)
    if args.figure:
        if figure(table, args.figure):
            text += f"\n![published against workflow]({Path(args.figure).name})\n"
        else:
            print("compare: matplotlib is not installed: no figure", file=sys.stderr)
    from l1bench.io import write_page

    write_page(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
