"""The figure behind the timing-isolation design (results/isolation/figures/isolation.png).

Left: latency of a timed call that allocates device memory (as the first timed pair of every
outer trial does) while other processes do one thing a workflow job does outside the GPU lock
(scripts/bench_stalls.py, ``alloc``: median and 99th percentile). Right: two concurrent runs of
the same 53 tasks agree within ±15 % for how many tasks, and how many timed calls per 1000 were
stalled, per design (results/isolation/**, compared as src/l1bench/compare.py does); where the
results record their launches, the share apart for the GPU-bound tasks and for those with a
host-bound side (``compare.by_bound``).

    python scripts/plot_isolation.py [OUT.png]     (the rule isolation_figure: rules/reports.smk)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from l1bench import compare

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "results/h100/bench/stalls-alloc-h200.json"
#: label -> (first, second) results trees of the right panel (config/reports.yaml)
RUNS = yaml.safe_load((ROOT / "config/reports.yaml").read_text())["isolation_figure"]["runs"]


def main(out: Path = ROOT / "results/isolation/figures/isolation.png") -> Path:
    """Draw the figure into ``out`` (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bench = json.loads(BENCH.read_text())["phases"]
    # the right panel widens with its bars (about 1 inch each), so their labels keep apart
    right = max(7.0, 1.05 * len(RUNS))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7 + right, 4.6), gridspec_kw={"width_ratios": [7, right]})
    names = [p["activity"].replace(" (system isolated)", "\n(isolated)") for p in bench]
    med = [p["alloc"]["median_ms"] for p in bench]
    p99 = [p["alloc"]["p99_ms"] for p in bench]
    x = range(len(bench))
    ax1.bar([i - 0.2 for i in x], med, 0.4, label="median")
    ax1.bar([i + 0.2 for i in x], p99, 0.4, label="99th percentile")
    ax1.set_yscale("log")
    ax1.set_xticks(list(x), names, rotation=35, ha="right", fontsize=8)
    ax1.set_ylabel("timed call with a device allocation (ms)")
    ax1.set_title(
        "Other processes' calls into the GPU driver delay\na timed call that calls into it (H200)", fontsize=10
    )
    ax1.legend(fontsize=8)
    labels, within, stalled, split = [], [], [], {"gpu": [], "host": []}
    for i, (label, (a, b)) in enumerate(RUNS.items()):
        rr = compare.run_to_run(ROOT / a, ROOT / b)
        labels.append(f"{label}\n({rr['n']} tasks)")
        within.append(100 * rr["within"] / rr["n"])
        stalled.append(rr["stalled_per_1000"])
        for kind, part in split.items():  # only runs whose results record their launches
            b = rr["bound"][kind]
            if b["n"]:
                part.append((i, 100 * b["within"] / b["n"]))
    bars = ax2.bar(range(len(labels)), within, color="tab:green", label="all tasks")
    for kind, marker, color, name in (("gpu", "D", "tab:blue", "GPU-bound tasks"),
                                      ("host", "v", "tab:orange", "tasks with a host-bound side")):
        if split[kind]:
            ax2.scatter(*zip(*split[kind], strict=True), marker=marker, color=color, zorder=3, s=22, label=name)
    ax2.legend(fontsize=7, loc="lower left")
    ax2.axhline(90, color="grey", ls="--", lw=1)
    ax2.set_ylim(0, 112)
    ax2.set_xticks(range(len(labels)), labels, fontsize=7)
    ax2.set_ylabel("tasks within ±15 % of the other run (%)")
    ax2.set_title("Two runs of the same tasks (default mode, paper protocol)", fontsize=10)
    for bar, s in zip(bars, stalled, strict=False):
        ax2.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 1,
                 f"stalled/1000:\n{s[0]:.2f}, {s[1]:.2f}", ha="center", fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(out)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]).resolve()) if len(sys.argv) > 1 else main())
