"""The isolation figure (lab/evidence/isolation.png), from lab/evidence only.

Left: latency of a timed call that allocates device memory (as the first timed pair of every
outer trial does) while other processes do one thing a workflow job does outside the GPU lock
(``stalls-alloc-h200.json``: median and 99th percentile, one H200, 2026-12-03). Right: two runs
of the same tasks, how many agree within ±15 % and how many timed calls per 1000 were stalled
(:func:`l1lab.spread.run_to_run`), with the share apart for the GPU-bound tasks and for those
with a host-bound side.

    mkdir -p lab/evidence/trees && tar xJf lab/evidence/trees.tar.xz -C lab/evidence/trees
    PYTHONPATH=lab python -m l1lab figure lab/evidence
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from l1lab.spread import run_to_run

#: label -> (first, second) results trees (under EVIDENCE/trees) of the right panel
RUNS = {
    "H200: two\nconcurrent runs": ("h200-c1/h100", "h200-c2/h100"),
    "H200: concurrent\nvs one at a time": ("h200-c1/h100", "h200-s1/h100"),
    "H100: whole\nrelease, two runs": ("release-h100-r1/h100", "release-h100-r2/h100"),
}


def draw(evidence: Path, out: Path) -> Path:
    """Draw the figure from ``evidence`` (its bench JSON and unpacked trees/) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bench = json.loads((evidence / "stalls-alloc-h200.json").read_text())["phases"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [7, 5]})
    names = [p["activity"].replace(" (system isolated)", "\n(isolated)") for p in bench]
    x = range(len(bench))
    ax1.bar([i - 0.2 for i in x], [p["alloc"]["median_ms"] for p in bench], 0.4, label="median")
    ax1.bar([i + 0.2 for i in x], [p["alloc"]["p99_ms"] for p in bench], 0.4, label="99th percentile")
    ax1.set_yscale("log")
    ax1.set_xticks(list(x), names, rotation=35, ha="right", fontsize=8)
    ax1.set_ylabel("timed call with a device allocation (ms)")
    ax1.set_title("Other processes' calls into the GPU driver delay\na timed call that calls into it (H200)",
                  fontsize=10)
    ax1.legend(fontsize=8)
    labels, within, stalled, split = [], [], [], {"gpu": [], "host": []}
    for i, (label, (a, b)) in enumerate(RUNS.items()):
        rr = run_to_run(evidence / "trees" / a, evidence / "trees" / b)
        if not rr["n"]:
            raise ValueError(f"{evidence / 'trees' / a}: no task timed in both runs (unpack trees.tar.xz first)")
        labels.append(f"{label}\n({rr['n']} tasks)")
        within.append(100 * rr["within"] / rr["n"])
        stalled.append(rr["stalled_per_1000"])
        for kind, part in split.items():
            bound = rr["bound"][kind]
            if bound["n"]:
                part.append((i, 100 * bound["within"] / bound["n"]))
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
    for bar, s in zip(bars, stalled, strict=True):
        ax2.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 1,
                 f"stalled/1000:\n{s[0]:.2f}, {s[1]:.2f}", ha="center", fontsize=7)
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="l1lab figure", description=__doc__.split("\n\n")[0])
    ap.add_argument("evidence", help="the evidence folder (lab/evidence), its trees/ unpacked")
    ap.add_argument("--out", help="the figure (default: EVIDENCE/isolation.png)")
    args = ap.parse_args(argv)
    evidence = Path(args.evidence)
    try:
        print(draw(evidence, Path(args.out) if args.out else evidence / "isolation.png"))
    except (OSError, ValueError, KeyError) as err:
        print(f"figure: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
