"""Figures and tables are two views of one computation: each figure panel's numbers, recomputed
from ``scores.csv`` by the figure code (:func:`l1bench.aggregate.figures.annotations`, the texts
the figures draw), equal the status table of ``summary.md`` and of the report (``README.md``)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from l1bench.aggregate.conventions import MODE_LABELS
from l1bench.aggregate.figures import annotations
from l1bench.aggregate.stats import ratio_stats, status_counts

ROOT = Path(__file__).resolve().parents[1]
MEDIAN = "Median measured/published"


def status_table(page: str) -> dict[tuple[str, str], dict[str, str]]:
    """The page's status table: {(protocol, mode label): {column: cell}}."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Protocol") and MEDIAN in line)
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[(cells["Protocol"], cells["Mode"])] = cells
    return rows


def disagreements(res: Path) -> list[str]:
    """Where a figure annotation of the tree ``res`` differs from its tables (empty: none)."""
    texts = annotations(pd.read_csv(res / "scores.csv", dtype={"tid": str}))
    assert texts, f"{res}: no figure panel"
    wrong = []
    for page in ("summary.md", "README.md"):
        table = status_table((res / page).read_text())
        assert len(table) == len(texts), (page, sorted(table), sorted(texts))
        for (proto, mode), text in texts.items():
            row = table[(proto, MODE_LABELS[mode])]
            within = next(v for k, v in row.items() if k.startswith("Within ±"))  # "157/200"
            compared = within.split("/")[1]
            want = {
                "scatter": f"{compared} compared, {row['Failed']} failed",
                "hist": f"n = {compared}\nmedian {row[MEDIAN]}×\nwithin ±15%: {within.replace('/', ' of ')}",
            }
            wrong += [f"{page} {proto} {mode} {k}: figure {text[k]!r}, table {v!r}" for k, v in want.items()
                      if text[k] != v]
    return wrong


def test_the_committed_h100_figures_say_what_its_tables_say():
    assert not disagreements(ROOT / "results/h100")


def test_a_figure_takes_the_tables_median_threshold_and_failures():
    """The defects the figures had: the median of log ratios (an even count's middle pair
    averaged in log space), ±10 % for ±15 %, and failed tasks without a published score left out."""
    ratios = [0.04, 0.5, 0.6, 1.0, 1.1, 1.14]  # middle pair 0.6 and 1.0: median 0.80 (in logs 0.77)
    rows = [{"protocol": "paper", "mode": "default", "status": "ok", "published": 1.0, "measured": r, "ratio": r}
            for r in ratios]
    rows += [{"protocol": "paper", "mode": "default", "status": "incorrect", "published": p, "measured": math.nan,
              "ratio": math.nan} for p in (2.0, math.nan, math.nan)]
    df = pd.DataFrame(rows).assign(tid=[f"L1_T{i:03d}" for i in range(1, 10)])
    (text,) = annotations(df).values()
    st = ratio_stats(df["ratio"])
    assert st["within"] == 3 and round(st["median_ratio"], 2) == 0.8  # the tables' numbers (±10 %: 2)
    assert text["hist"] == "n = 6\nmedian 0.80×\nwithin ±15%: 3 of 6"
    assert text["scatter"] == "6 compared, 3 failed"  # all three, as status_counts counts them
    assert status_counts(df).iloc[0]["failed"] == 3


def test_a_changed_table_is_caught(tmp_path):
    """The check itself: a summary.md whose median differs from scores.csv is reported."""
    res = ROOT / "results/h100"
    for name in ("scores.csv", "README.md"):
        (tmp_path / name).write_bytes((res / name).read_bytes())
    summary = (res / "summary.md").read_text()
    lines = summary.splitlines()
    row = lines[next(i for i, line in enumerate(lines) if MEDIAN in line) + 2]  # paper, default
    (tmp_path / "summary.md").write_text(summary.replace(row, row[: row.rstrip(" |").rfind(" ")] + " 9.99 |"))
    assert [w for w in disagreements(tmp_path) if w.startswith("summary.md paper default hist")]
