"""The cross-release page ``results/transfer.md`` and its figure, from the release trees
``results/<release>/scores.csv`` (h100, a100, h20, l40, 3090).

CUDA-L1 published five optimized versions of the same KernelBench programs, each tuned and
scored on its own GPU; the references (and baselines) are the same in all five. Measured on one
GPU, each release's code is timed against the same reference there, so the releases can be
ranked task by task. A release measured on a GPU other than its own is a transfer, not a
reproduction, and the page says so. Trees or tasks not measured are named, never filled in.

``python -m l1bench.aggregate.transfer --out transfer.md --figure figures/transfer.png results/*/scores.csv``
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections import Counter
from pathlib import Path

import pandas as pd

from ..mintolerance import DEFAULT_TOLERANCES
from ..release import GPU_DEVICES
from ..results import AGREEMENT, FAILED_STATUSES, Status
from . import tolerance
from .conventions import NA
from .markdown import fmt, md_table, timing_version_caption, timing_version_sentence

#: The GPU each release's scores were published on.
RELEASE_GPU = {"h100": "H100", "a100": "A100", "h20": "H20", "l40": "L40", "3090": "RTX 3090"}

#: Which release was tuned for a measured GPU's family (same chip): a GPU name pattern each.
_FAMILY = (
    (re.compile(r"\b(?:H100|H200|GH200)\b"), "h100"),
    (re.compile(r"\bH20\b"), "h20"),
    (re.compile(r"\b(?:A100|A800)\b"), "a100"),
    (re.compile(r"\bL40S?\b"), "l40"),
    (re.compile(r"\b3090\b"), "3090"),
)

#: The rows the page compares: the paper protocol, eager reference (custom code vs reference).
PROTOCOL, MODE = "paper", "default"


def native_release(gpu: str | None) -> str | None:
    """The release tuned for ``gpu``'s family (an H200 runs the H100's chip), or None."""
    for pattern, release in _FAMILY:
        if gpu and pattern.search(gpu):
            return release
    return None


def is_release_gpu(release: str, gpu: str | None) -> bool:
    """Whether ``gpu`` (a measured GPU's name) is the model ``release`` was published on."""
    name = RELEASE_GPU.get(release)
    return bool(gpu and name and re.search(rf"\b{re.escape(name.split()[-1])}\b", gpu))


def transfer_note(release: str, gpu: str | None) -> str | None:
    """'published on A100, measured on NVIDIA H100 80GB HBM3: a transfer, not a reproduction'
    when the measured GPU is not the release's own; None when it is, or nothing was measured."""
    if not gpu or release not in RELEASE_GPU or is_release_gpu(release, gpu):
        return None
    return f"published on {RELEASE_GPU[release]}, measured on {gpu}: a transfer, not a reproduction"


def tree_transfer_note(release: str, df: pd.DataFrame) -> str | None:
    """:func:`transfer_note` of a tree; one measured on several GPUs (a re-run in progress) names
    each other GPU's scores and how many its own GPU made: the majority's GPU would pass for all."""
    gpus = gpu_counts(df[df["measured"].notna()])
    if len(gpus) < 2:
        return transfer_note(release, measured_gpu(df))
    others = [(g, n) for g, n in gpus.most_common() if not is_release_gpu(release, g)]
    if release not in RELEASE_GPU or not others:
        return None
    total, own = sum(gpus.values()), [g for g in gpus if is_release_gpu(release, g)]
    scores = ", ".join(f"{n:,} of {total:,} scores on {g}" for g, n in others)
    mine = f"; the other {sum(gpus[g] for g in own):,} on its own GPU ({', '.join(own)})" if own else ""
    return f"published on {RELEASE_GPU[release]}, measured {scores}: a transfer, not a reproduction{mine}"


def gpu_counts(df: pd.DataFrame) -> Counter:
    """How many of a tree's results each GPU measured (their provenance's ``gpu``)."""
    return Counter(g for g in df.get("gpu", pd.Series(dtype=object)).dropna() if isinstance(g, str) and g)


def measured_gpu(df: pd.DataFrame) -> str | None:
    """The GPU most of a tree's results were measured on (its provenance), or None."""
    gpus = gpu_counts(df)
    return gpus.most_common(1)[0][0] if gpus else None


def load_trees(paths, releases=GPU_DEVICES) -> dict[str, pd.DataFrame]:
    """The release trees' ``scores.csv`` at ``paths`` (``<release>/scores.csv``; those missing
    and those of other trees, such as the demo's, are left out), in release order."""
    found = {Path(p).parent.name: Path(p) for p in paths if Path(p).is_file()}
    return {r: pd.read_csv(found[r], dtype={"tid": str}) for r in releases if r in found}


def load_checks(paths, releases=GPU_DEVICES) -> dict[str, dict[str, dict]]:
    """Each release tree's check results (``<release>/check/*.json`` beside its ``scores.csv``),
    as :func:`l1bench.aggregate.tolerance.load_checks` reads them."""
    found = {Path(p).parent.name: Path(p).parent for p in paths if Path(p).is_file()}
    return {r: tolerance.load_checks(sorted((found[r] / "check").glob("*.json"))) for r in releases if r in found}


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per task: the paper protocol's default mode."""
    sel = df[(df["protocol"] == PROTOCOL) & (df["mode"] == MODE)]
    return sel.drop_duplicates("tid").set_index("tid")


def score_table(trees: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(measured scores, statuses): one row per task of any tree, one column per release.
    A score is NaN where the release's code has none (failed, no code, not measured)."""
    rows = {r: _rows(df) for r, df in trees.items()}
    tids = sorted(set().union(*(set(d.index) for d in rows.values()))) if rows else []
    scores = pd.DataFrame(index=tids, columns=list(rows), dtype=float)
    status = pd.DataFrame(index=tids, columns=list(rows), dtype=object)
    for release, d in rows.items():
        ok = d["status"] == Status.OK
        scores[release] = pd.to_numeric(d["measured"].where(ok), errors="coerce").reindex(tids)
        status[release] = d["status"].reindex(tids).fillna("missing")
    return scores, status


def fastest(scores: pd.DataFrame) -> pd.Series:
    """Per task, the release whose code scored highest (tasks with no score left out)."""
    scored = scores.dropna(how="all")
    return scored.idxmax(axis=1) if len(scored) else pd.Series(dtype=object)


def beats_native(scores: pd.DataFrame, native: str | None, margin: float = AGREEMENT) -> dict | None:
    """How often another release's code beats the native one's (tasks where the native code
    and at least one other have a score): ``{"compared", "faster", "clearly_faster",
    "per_release": {release: (wins, compared)}}``; None without a native tree."""
    if native is None or native not in scores:
        return None
    others = [c for c in scores if c != native]
    both = scores[scores[native].notna() & scores[others].notna().any(axis=1)] if others else scores.iloc[:0]
    best_other = both[others].max(axis=1) if others else pd.Series(dtype=float)
    per = {}
    for other in others:
        pair = both[both[other].notna()]
        per[other] = (int((pair[other] > pair[native]).sum()), len(pair))
    return {
        "compared": len(both),
        "faster": int((best_other > both[native]).sum()),
        "clearly_faster": int((best_other > both[native] * (1 + margin)).sum()),
        "per_release": per,
    }


def spearman(df: pd.DataFrame) -> tuple[float, int]:
    """Spearman's rank correlation of published and measured speedups over the tree's tasks
    with both (average ranks for ties), and how many there are; NaN below three tasks."""
    d = _rows(df)
    d = d[(d["status"] == Status.OK) & d["published"].notna() & d["measured"].notna()]
    if len(d) < 3:
        return math.nan, len(d)
    pub, meas = d["published"].astype(float).rank(), d["measured"].astype(float).rank()
    return float(pub.corr(meas)), len(d)


def checks_table(trees: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The check's verdict per task and release (``missing`` where a tree has no such task)."""
    rows = {r: _rows(df) for r, df in trees.items()}
    tids = sorted(set().union(*(set(d.index) for d in rows.values()))) if rows else []
    out = pd.DataFrame(index=tids, columns=list(rows), dtype=object)
    for release, d in rows.items():
        out[release] = d["check_status"].fillna(d["status"]).reindex(tids).fillna("missing")
    return out


def verdicts_differ(checks: pd.DataFrame) -> pd.DataFrame:
    """Tasks whose code passes the check in one release and fails it in another (releases
    without code or without a result give no verdict)."""
    if checks.empty:
        return checks
    verdict = checks.map(lambda s: "pass" if s == Status.PASS else ("fail" if s in FAILED_STATUSES else None))
    return checks[verdict.apply(lambda row: {"pass", "fail"} <= set(row.dropna()), axis=1)]


def page_gpu(trees: dict[str, pd.DataFrame]) -> str | None:
    """The GPU the page compares on: the one most trees were measured on (first in release
    order on a tie)."""
    gpus = [g for g in (measured_gpu(df) for df in trees.values()) if g]
    return Counter(gpus).most_common(1)[0][0] if gpus else None


def _tree_rows(trees, releases, gpu) -> list[list[str]]:
    rows = []
    for release in releases:
        if release not in trees:
            rows.append([release, RELEASE_GPU[release], NA, NA, f"not measured (no {release}/scores.csv)"])
            continue
        df, here = _rows(trees[release]), measured_gpu(trees[release])
        n = int((df["status"] == Status.OK).sum())
        note = tree_transfer_note(release, df) or ("no timed result yet" if not here else "its own GPU")
        if here and here != gpu:
            note += "; measured on another GPU than the page's: left out of the comparisons"
        rows.append([release, RELEASE_GPU[release], here or NA, str(n), note])
    return rows


def _fastest_lines(scores: pd.DataFrame) -> list[str]:
    multi = scores[scores.notna().sum(axis=1) >= 2]
    if multi.empty:
        return ["Fewer than two releases have scores for any one task: nothing to rank yet.", ""]
    wins = fastest(multi).value_counts()
    rows = [[r, f"{int(wins.get(r, 0))}/{len(multi)}"] for r in scores.columns]
    return [
        f"Of the {len(multi)} tasks that two or more releases' code scored on this GPU, the number "
        "each release's code was fastest on:",
        "",
        md_table(rows, ["Release", "Fastest"], ["left", "right"]),
        "",
    ]


def _native_lines(scores: pd.DataFrame, gpu: str | None) -> list[str]:
    native = native_release(gpu)
    if native is None:
        return [f"No release was tuned for {gpu or 'this GPU'}'s family.", ""]
    beat = beats_native(scores, native)
    if beat is None or not beat["compared"]:
        return [f"The code tuned for this GPU's family is {native}'s: not measured beside another release yet.", ""]
    rows = [[r, f"{w}/{n}"] for r, (w, n) in beat["per_release"].items()]
    return [
        f"The code tuned for this GPU's family is **{native}**'s. Another release's code is faster in "
        f"**{beat['faster']} of {beat['compared']}** tasks ({beat['clearly_faster']} by more than "
        f"{AGREEMENT:.0%}); per release, the tasks where it beats {native}'s:",
        "",
        md_table(rows, ["Release", f"Faster than {native}"], ["left", "right"]),
        "",
    ]


def _rank_lines(trees) -> list[str]:
    rows = []
    for release, df in trees.items():
        rho, n = spearman(df)
        rows.append([release, RELEASE_GPU[release], measured_gpu(df) or NA, fmt(rho), str(n)])
    return [
        "Spearman's rank correlation between each release's published speedups and those measured "
        "here (paper protocol, default mode, tasks with both): does a published rank survive the move?",
        "",
        md_table(rows, ["Release", "Published on", "Measured on", "Spearman ρ", "Tasks"], ["left"] * 3 + ["right"] * 2),
        "",
    ]


def _tolerance_lines(checks: dict[str, dict[str, dict]], tolerances) -> list[str]:
    """Per release: the pass rates at the loosest and the strictest tolerance, from the trials
    each check recorded, and the tasks that pass only at the loosest."""
    ts = sorted({float(t) for t in tolerances}, reverse=True)
    if len(ts) < 2 or not checks:
        return ["Needs two tolerances and a release measured here.", ""]
    loose, strict = ts[0], ts[-1]
    rows = []
    for release, c in checks.items():
        recorded = tolerance.any_record(c)
        only = tolerance.pass_only_looser(c, loose, strict) if recorded else []
        rates = [tolerance.pass_rate(c, t) for t in (loose, strict)]
        named = ", ".join(only) or ("none" if recorded else NA)
        rows.append([release, *rates, str(len(only)) if recorded else NA, named])
    return [
        f"Each check records, per correctness trial, the smallest tolerance t at which `allclose(atol=t, rtol=t)` "
        f"passes; a task passes at t when all its trials do. Pass rates at {loose:g} and {strict:g} per release "
        "(pool: the tasks whose check ran their code), and the tasks that pass only at the looser one.",
        "",
        md_table(rows, ["Release", f"Pass at {loose:g}", f"Pass at {strict:g}", f"Only at {loose:g}", "Tasks"],
                 ["left", "right", "right", "right", "left"]),
        "",
    ]


def _cell(score, status, best: bool) -> str:
    if isinstance(score, float) and math.isfinite(score):
        return f"**{fmt(score)}**" if best else fmt(score)
    return str(status)


def _task_rows(scores: pd.DataFrame, status: pd.DataFrame) -> list[list[str]]:
    best = fastest(scores[scores.notna().sum(axis=1) >= 2])
    rows = []
    for tid in scores.index:
        cells = [_cell(scores.at[tid, r], status.at[tid, r], best.get(tid) == r) for r in scores.columns]
        rows.append([tid, *cells, best.get(tid, NA)])
    return rows


def render(trees: dict[str, pd.DataFrame], figure: str | None = None, releases=GPU_DEVICES,
           checks: dict[str, dict[str, dict]] | None = None, tolerances=DEFAULT_TOLERANCES) -> str:
    """The page's markdown. ``figure``: its path relative to the page; ``checks``: each release
    tree's check results (:func:`load_checks`) for the tolerance section."""
    gpu = page_gpu(trees)
    here = {r: df for r, df in trees.items() if measured_gpu(df) == gpu}
    scores, status = score_table(here)
    missing = [r for r in releases if r not in trees]
    lines = [
        "# Every release on one GPU: what transfers",
        "",
        "CUDA-L1 published code for five GPUs (h100, a100, h20, l40, 3090), each release tuned and scored on its "
        "own; the KernelBench references are the same in all five. Here each release's custom code is timed "
        f"against that same reference on one GPU, **{gpu or 'none yet'}** (paper protocol, default mode). A "
        "release measured on a GPU other than its own is a transfer, not a reproduction.",
        "",
        md_table(_tree_rows(trees, releases, gpu), ["Release", "Published on", "Measured on", "Scored", "Note"]),
        "",
    ]
    if missing:
        lines += [f"Releases not measured: {', '.join(missing)}.", ""]
    lines += [f"* {r} ({PROTOCOL}, {MODE}): {timing_version_sentence(_rows(df))}" for r, df in trees.items()
              if len(_rows(df))] + [""]
    lines += ["## Which release's code is fastest", "", *_fastest_lines(scores)]
    lines += ["## The code tuned for this GPU against the others", "", *_native_lines(scores, gpu)]
    lines += ["## Published rank against measured rank", "", *_rank_lines(here)]
    differ = verdicts_differ(checks_table(here))
    lines += ["## Tasks whose verdict differs between releases", ""]
    if differ.empty:
        lines += ["None among the releases measured here.", ""]
    else:
        rows = [[tid, *differ.loc[tid].tolist()] for tid in differ.index]
        lines += [md_table(rows, ["Task", *differ.columns]), ""]
    lines += ["## Tasks that pass only at the looser tolerance", ""]
    lines += _tolerance_lines({r: c for r, c in (checks or {}).items() if r in here}, tolerances)
    if figure:
        lines += [f"![Measured against published, and the fastest release per task]({figure})", ""]
    lines += [
        "## Per task",
        "",
        "Measured speedup of each release's code (its status where it has none); the fastest in bold.",
        "",
    ]
    if len(scores):
        lines += [md_table(_task_rows(scores, status), ["Task", *scores.columns, "Fastest"]), ""]
    return "\n".join(lines).rstrip() + "\n"


def plot(trees: dict[str, pd.DataFrame], path) -> Path:
    """Left: measured against published speedup per release (log-log); right: on how many tasks
    each release's code was fastest. matplotlib, imported here (Agg)."""
    from .figures import _pyplot, _save, _times_formatter

    plt = _pyplot()
    gpu = page_gpu(trees)
    here = {r: df for r, df in trees.items() if measured_gpu(df) == gpu}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for release, df in here.items():
        d = _rows(df)
        d = d[(d["status"] == Status.OK) & d["published"].notna() & d["measured"].notna()]
        left.scatter(d["published"].astype(float), d["measured"].astype(float), s=10, alpha=0.7, label=release)
    left.set_xscale("log")
    left.set_yscale("log")
    lo, hi = left.get_xlim()
    left.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
    for axis in (left.xaxis, left.yaxis):
        axis.set_major_formatter(_times_formatter())
    left.set_xlabel("published (its own GPU)")
    left.set_ylabel(f"measured ({gpu or 'no GPU yet'})")
    if here:
        left.legend(fontsize=8)
    scores, _ = score_table(here)
    wins = fastest(scores[scores.notna().sum(axis=1) >= 2]).value_counts() if len(scores) else pd.Series(dtype=int)
    names = list(scores.columns)
    right.bar(names, [int(wins.get(r, 0)) for r in names], color="#1f77b4")
    right.set_ylim(bottom=0)
    if wins.empty:
        right.text(0.5, 0.5, "needs two releases measured", transform=right.transAxes, ha="center", color="grey")
    right.set_ylabel("tasks where its code is fastest")
    right.set_title("fastest release per task", fontsize=10)
    title = f"Every release's code on {gpu or 'no GPU yet'} (paper protocol, default mode)"
    caption = timing_version_caption(pd.concat([_rows(df) for df in here.values()])) if here else ""
    fig.suptitle("\n".join(filter(None, [title, caption])), fontsize=11)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return Path(path)


def main(argv=None) -> int:

    from ..io import atomic_write_text

    ap = argparse.ArgumentParser(description="The cross-release page from results/<release>/scores.csv.")
    ap.add_argument("scores", nargs="*", help="the release trees' scores.csv (results/<release>/scores.csv)")
    ap.add_argument("--out", required=True, help="the page (markdown)")
    ap.add_argument("--figure", required=True, help="the figure (png)")
    ap.add_argument("--tolerances", nargs="+", type=float, default=list(DEFAULT_TOLERANCES),
                    help="the correctness tolerances compared (config tolerances)")
    args = ap.parse_args(argv)
    trees = load_trees(args.scores)
    plot(trees, args.figure)
    figure = Path(os.path.relpath(args.figure, Path(args.out).parent)).as_posix()
    atomic_write_text(args.out, render(trees, figure, checks=load_checks(args.scores), tolerances=args.tolerances))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
