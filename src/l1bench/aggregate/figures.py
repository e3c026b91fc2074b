"""Figures: measured vs published scatter and the ratio histogram, one panel per protocol x mode.

Each panel's numbers are the tables' (:func:`.stats.status_counts`: the same median, threshold and
counts), written by :func:`annotations`, which the figures draw and the tests read.
matplotlib is imported lazily (Agg backend) inside the figure functions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..results import AGREEMENT
from .conventions import _mode_label, status_class
from .markdown import fmt
from .stats import _modes, _protocols, status_counts

_LEVEL_COLORS = {1: "#1f77b4", 2: "#ff7f0e", 3: "#2ca02c"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _panels(df):
    """Panel layout: one row per protocol, one column per mode present for it.

    Returns (rows, ncols) with rows = [(protocol, [mode, ...]), ...].
    """
    if df.empty:
        return [("paper", ["default"])], 1
    rows = []
    for proto in _protocols(df):
        present = set(df.loc[df["protocol"] == proto, "mode"])
        rows.append((proto, [m for m in _modes(df) if m in present]))
    return rows, max(len(ms) for _, ms in rows)


def _layout(plt, df, cell_w, cell_h, extra_h=0.0):
    rows, nc = _panels(df)
    nr = len(rows)
    fig, axes = plt.subplots(nr, nc, figsize=(cell_w * nc + 0.6, cell_h * nr + extra_h), squeeze=False)
    used = []
    for i, (proto, modes) in enumerate(rows):
        for j in range(nc):
            if j < len(modes):
                # x label where no used panel sits below
                bottom = i == nr - 1 or j >= len(rows[i + 1][1])
                used.append((axes[i][j], proto, modes[j], bottom, j == 0))
            else:
                axes[i][j].set_visible(False)
    return fig, used


def _save(fig, path):
    from ..io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")


def _times_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:g}×")


def _scatter_limits(df) -> tuple[float, float]:
    """The scatter's axis limits: every compared score, and at least 0.5-2×, with a margin."""
    vals = np.array([])
    if len(df):
        pub_all = df["published"].astype(float)
        meas_all = df["measured"].astype(float)
        both = np.isfinite(pub_all) & np.isfinite(meas_all)
        vals = np.concatenate([pub_all[both], meas_all[both]])
        vals = vals[vals > 0]
    lo = min(float(vals.min()) if len(vals) else 0.5, 0.5) / 1.5
    hi = max(float(vals.max()) if len(vals) else 2.0, 2.0) * 1.5
    return lo, hi


def annotations(df) -> dict[tuple[str, str], dict]:
    """Per (protocol, mode) panel, from the tables' :func:`.stats.status_counts`: ``scatter`` (the
    scatter panel's count line), ``hist`` (the histogram panel's box) and ``median`` (its line)."""
    out = {}
    for r in status_counts(df).itertuples(index=False) if len(df) else []:
        out[(r.protocol, r.mode)] = {
            "scatter": f"{r.compared} compared, {r.failed} failed",
            "hist": f"n = {r.compared}\nmedian {fmt(r.median_ratio)}×\n"
            f"within ±{AGREEMENT:.0%}: {r.within} of {r.compared}",
            "median": r.median_ratio,
        }
    return out


def _scatter_panel(ax, sel, floor: float) -> int:
    """One panel's compared tasks by level, and its failed tasks with a published score as crosses
    at ``floor``: how many points."""
    pub = sel["published"].astype(float)
    meas = sel["measured"].astype(float)
    ok = np.isfinite(sel["ratio"].astype(float))
    for lv, color in _LEVEL_COLORS.items():
        m = ok & (sel["level"] == lv).fillna(False).to_numpy(dtype=bool)
        if m.any():
            ax.scatter(pub[m], meas[m], s=13, alpha=0.65, color=color, edgecolors="none", zorder=3)
    failed = np.isfinite(pub) & ~np.isfinite(meas) & sel["status"].map(status_class).eq("failed")
    n_fail = int(failed.sum())
    if n_fail:
        ax.scatter(pub[failed], np.full(n_fail, floor), marker="x", s=20, color="#d62728", lw=1, zorder=4)
    return int(ok.sum()) + n_fail


def plot_measured_vs_published(df, path, caption: str = "") -> Path:
    """Log-log scatter of measured vs published speedup; one panel per protocol x mode.

    Points are coloured by KernelBench level; failed tasks (published score, no
    measurement) are drawn as red crosses along the bottom edge. ``caption``: the title's second
    line (the tables' :func:`.markdown.timing_version_caption`: what made the scores).
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import LogLocator

    fig, panels = _layout(plt, df, 3.5, 3.6, 0.5)
    texts = annotations(df)
    lo, hi = _scatter_limits(df)
    xs = np.array([lo, hi])
    for ax, proto, mode, bottom, left in panels:
        sel = df[(df["protocol"] == proto) & (df["mode"] == mode)] if len(df) else df
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.plot(xs, xs, color="0.2", lw=1, zorder=2)
        ax.plot(xs, xs * 2, color="0.55", lw=0.8, ls=":", zorder=2)
        ax.plot(xs, xs / 2, color="0.55", lw=0.8, ls=":", zorder=2)
        if not (_scatter_panel(ax, sel, floor=lo * 1.3) if len(sel) else 0):
            ax.text(0.5, 0.5, "no task to draw", transform=ax.transAxes, ha="center", va="center", color="0.5")
        counts = texts.get((proto, mode), {}).get("scatter", "no results")
        ax.set_title(f"{_mode_label(mode)} · {proto}\n{counts}", fontsize=10)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10))
            axis.set_major_formatter(_times_formatter())
        ax.grid(True, which="major", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
        if bottom:
            ax.set_xlabel("published speedup")
        if left:
            ax.set_ylabel("measured speedup")
    handles = [
        Line2D([], [], ls="", marker="o", color=c, label=f"level {lv}") for lv, c in _LEVEL_COLORS.items()
    ] + [
        Line2D([], [], ls="", marker="x", color="#d62728", label="failed, published score (bottom edge)"),
        Line2D([], [], color="0.2", lw=1, label="measured = published"),
        Line2D([], [], color="0.55", lw=0.8, ls=":", label="2× / ½×"),
    ]
    fig.suptitle("\n".join(filter(None, ["Measured vs published speedup per task (log–log)", caption])), fontsize=12)
    fig.tight_layout(h_pad=1.5)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles), frameon=False,
               fontsize=9)
    _save(fig, path)
    plt.close(fig)
    return Path(path)


def plot_ratio_hist(df, path, clip: float = 4.0, caption: str = "") -> Path:
    """Histograms of log2(measured/published); one panel per protocol x mode.

    Ratios beyond 2**±clip are piled into the outermost bins; ``caption`` as for the scatter.
    """
    plt = _pyplot()
    fig, panels = _layout(plt, df, 3.5, 2.9)
    texts = annotations(df)
    bins = np.linspace(-clip, clip, int(clip * 2 * 6) + 1)  # 6 bins per factor of 2
    ticks = np.arange(-clip, clip + 1, 2 if clip > 3 else 1)
    tick_labels = [("1" if t == 0 else (f"{2**t:g}" if t > 0 else f"1/{2**-t:g}")) + "×" for t in ticks]
    for ax, proto, mode, bottom, left in panels:
        sel = df[(df["protocol"] == proto) & (df["mode"] == mode)] if len(df) else df
        r = sel["ratio"].astype(float).to_numpy() if len(sel) else np.array([])
        r = r[np.isfinite(r) & (r > 0)]
        lr = np.log2(r)
        if len(lr):
            ax.hist(np.clip(lr, -clip + 1e-9, clip - 1e-9), bins=bins, color="#4c72b0", alpha=0.9)
            ax.axvline(np.log2(texts[(proto, mode)]["median"]), color="#d62728", ls="--", lw=1.2)
            n_out = int((np.abs(lr) >= clip).sum())
            text = texts[(proto, mode)]["hist"]
            if n_out:
                text += f"\nbeyond axis: {n_out}"
            ax.text(0.03, 0.96, text, transform=ax.transAxes, va="top", fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9})
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
        ax.axvline(0, color="0.2", lw=1)
        ax.set_xlim(-clip, clip)
        ax.set_xticks(ticks)
        ax.set_xticklabels(tick_labels)
        ax.set_title(f"{_mode_label(mode)} · {proto}", fontsize=10)
        ax.grid(True, axis="y", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
        if bottom:
            ax.set_xlabel("measured / published (log scale)")
        if left:
            ax.set_ylabel("tasks")
    title = "Measured / published speedup per task (black: equal; red dashed: median)"
    fig.suptitle("\n".join(filter(None, [title, caption])), fontsize=12)
    fig.tight_layout(h_pad=1.2)
    _save(fig, path)
    plt.close(fig)
    return Path(path)
