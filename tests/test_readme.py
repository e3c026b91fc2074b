"""Every number the README quotes about the results equals the tables'.

A quoted number carries a marker right after it, an HTML comment naming what it is
(``157 of 200<!--paper.default.within-->``; GitHub does not show comments). The expected value of
each name is computed here from ``results/h100/scores.csv`` (with the tables' own statistics: timing
versions, what was timed, agreement) and
from the run-to-run spread page and the side-by-side and three-way pages of the published harness. The README's
"What was measured" section may hold no number without a marker, apart from task ids, GPU and
release names, dates and the ±15 %, ½ and 2× thresholds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from l1bench.aggregate.markdown import fmt
from l1bench.aggregate.stats import (
    flag_counts,
    stall_sensitivity,
    status_counts,
    summary_table,
    timed_stats,
    timing_version_counts,
)
from l1bench.timing import TIMING_VERSION

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCORES = ROOT / "results/h100/scores.csv"
SECTION = "## What was measured"

#: A quoted value (optionally bold) followed by its marker.
CLAIM = re.compile(r"\**([^\s*<>()\[\]]+(?: of [\d,]+)?(?: %)?)\**<!--([\w.:-]+)-->")
#: Numbers a section may hold without a marker.
ALLOWED = re.compile(
    r"\]\([^)]*\)"  # link targets
    r"|L\d_T\d{3}|CUDA-L1"  # task ids, the system's name
    r"|\bH[12]00\b|80GB|\bh100\b"  # GPU and release names
    r"|\d{4}-\d{2}-\d{2}"  # dates
    r"|±15 %|\b2×"  # thresholds
)


def spread_page() -> Path:
    """The run-to-run spread page of the whole release on one H100 that the README links."""
    link = re.search(r"\]\(([^)\s]*spread-release-h100\.md)\)", README.read_text())
    assert link, "README links no run-to-run spread page (spread-release-h100.md)"
    return ROOT / link.group(1)


def expected() -> dict[str, str]:
    """name -> the value the tables give it, written as the README writes it."""
    df = pd.read_csv(SCORES)
    counts = status_counts(df)
    tids = df.drop_duplicates("tid")
    gpu = df["gpu"].mode()[0]
    out = {
        "gpu": gpu.removeprefix("NVIDIA ").split()[0],
        "first_date": df["started"].dropna().min()[:10],
        "last_date": df["finished"].dropna().max()[:10],
        "tasks": str(df["tid"].nunique()),
        "scores": f"{counts['measured'].sum():,}",
        "missing": str(counts["missing"].sum()),
        "checks.pass": str((tids["check_status"] == "pass").sum()),
        "no_code": str((tids["check_status"] == "no_code").sum()),
    }
    for r in stall_sensitivity(df).itertuples(index=False):
        out[f"paper.{r.mode}.within"] = f"{r.measured_agree} of {r.compared}"
        out[f"paper.{r.mode}.median"] = fmt(r.measured_median)
        for published in (True, False):
            table = summary_table(df, r.mode, "paper", published=published, levels=[])
            out[f"paper.{r.mode}.mean.{'published' if published else 'measured'}"] = fmt(table.at["Mean", "All"])
    versions = timing_version_counts(df)
    out["timing.version"] = ", ".join(str(v) for v, _, _ in versions)
    for v, n, _ in versions:
        out[f"timing.v{v}.scores"] = f"{n:,}"
    out["timing.current"] = str(TIMING_VERSION)
    for r in timed_stats(df):  # what was timed, per paper mode
        if r["protocol"] != "paper":
            continue
        key = f"timed.{r['mode']}"
        out[f"{key}.scores"] = str(r["scores"])
        host_bound = r["groups"]["host_bound"]["scores"]
        out[f"{key}.host_bound"] = "unrecorded" if r["unrecorded"] == r["scores"] else str(host_bound)
        for group, g in r["groups"].items():
            out.setdefault(f"{key}.{group}", str(g["scores"]))  # host-bound: as above
            out[f"{key}.{group}.within"] = f"{g['within']} of {g['compared']}"
            out[f"{key}.{group}.median"] = fmt(g["median_ratio"])
    for flag, c in flag_counts(df)[1].items():
        out[f"flag.{flag}"] = str(c["any"])
    for r in df[(df["protocol"] == "paper") & (df["mode"] == "default")].itertuples(index=False):
        out[f"{r.tid}.published"] = fmt(r.published)
        out[f"{r.tid}.measured"] = fmt(r.measured)
    pages = re.findall(r"\]\(([^)\s]*SIDE_BY_SIDE[^)\s]*\.md)\)", README.read_text())
    assert pages, "README links no side-by-side page of the published harness"
    for i, page in enumerate(pages):  # sbs.agree, then sbs2.agree, ... in the order the README links them
        agree = re.search(r"\*\*(\d+ of \d+) tasks \([\d.]+ %\) agree\*\*", (ROOT / page).read_text())
        out[f"sbs{i + 1 if i else ''}.agree"] = agree.group(1)
    link = re.search(r"\]\(([^)\s]*THREE_WAY[^)\s]*\.md)\)", README.read_text())
    assert link, "README links no three-way page of the published harness"
    lines = (ROOT / link.group(1)).read_text().splitlines()
    head = next(r for r in lines if r.startswith("| tasks |")).split("|")
    row = next(r for r in lines if r.startswith("| all |")).split("|")
    out["threeway.agree"] = row[head.index(" c/a within ±15 % ")].strip()  # the harness as a user runs it
    page = spread_page().read_text()
    versions = sorted(set(re.findall(r"timing version (\d+)", page.split("\n* all ")[0])))
    out["spread.version"] = " and ".join(versions)
    out["spread.within"] = re.search(r"within ±15 %: \*\*(\d+ of \d+)\*\*", page).group(1)
    out["spread.median"] = re.search(r"median \*\*([\d.]+ %)\*\*", page).group(1)
    return out


def claims(text: str) -> list[tuple[str, str]]:
    """(name, value) of every marked number in ``text``."""
    return [(name, value) for value, name in CLAIM.findall(text)]


def measured_section(text: str) -> str:
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end > 0 else None]


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text()


def test_every_marked_number_equals_the_tables(readme):
    found = claims(readme)
    assert len(found) >= 10, "the README marks too few of its numbers"
    want = expected()
    wrong = [f"{name}: README {value!r}, tables {want.get(name)!r}" for name, value in found if want.get(name) != value]
    assert not wrong, "README numbers that differ from the tables:\n" + "\n".join(wrong)


def test_the_measured_section_quotes_no_unmarked_number(readme):
    section = CLAIM.sub(" ", measured_section(readme))
    left = re.findall(r"[^\s]*\d[^\s]*", ALLOWED.sub(" ", section))
    assert not left, f"numbers without a marker in {SECTION!r}: {left}"


def test_a_changed_number_is_caught(readme):
    # the check itself: the README with one marked value changed no longer matches
    name, value = claims(readme)[0]
    changed = readme.replace(f"{value}<!--{name}-->", f"{value}9<!--{name}-->", 1)
    want = expected()
    assert any(want.get(n) != v for n, v in claims(changed))
