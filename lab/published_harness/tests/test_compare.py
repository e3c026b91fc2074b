"""The side-by-side page: spreads, gaps, the ±15 % rule widened by a harness's own spread, causes."""

import json
from pathlib import Path

import pytest

from published_harness import compare

# tid: (published pass 1, pass 2, workflow pass 1, pass 2)
SCORES = {
    "L1_T012": (18.48, 18.68, 31.44, 33.98),  # +76 %: outside, its cause given
    "L1_T040": (8.46, 8.48, 9.46, 10.04),  # +15.1 %: outside (both spreads below 15 %), no cause
    "L2_T040": (2.46, 2.53, 2.49, 2.49),  # 0 %: agrees
    "L3_T020": (4.0, 5.0, 5.5, 5.4),  # +21 %, but the published harness moved 25 % itself: agrees
}


def write(root: Path, tid: str, res: dict, check: dict | None = None) -> None:
    path = root / "h100" / "time" / "paper" / "default" / f"{tid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tid": tid, "mode": "default", **res}))
    if check is not None:
        (root / "h100" / "check").mkdir(parents=True, exist_ok=True)
        (root / "h100" / "check" / f"{tid}.json").write_text(json.dumps({"tid": tid, **check}))


@pytest.fixture()
def trees(tmp_path):
    roots = [tmp_path / n for n in ("pub1", "pub2", "wf1", "wf2")]
    for tid, scores in SCORES.items():
        for i, (root, score) in enumerate(zip(roots, scores, strict=True)):
            pub = i < 2
            res = {"status": "ok", "score": score, "ref_ms_mean": 2.0 if pub else 3.0,
                   "custom_ms_mean": 1.0, "harness": "published" if pub else None, "verdict": "pass" if pub else None}
            if tid == "L1_T012" and pub:
                res["extension_failures"] = [{"extension": "diagonal_matmul_cuda", "error": "not declared"}]
            write(root, tid, res, None if pub else {"status": "pass", "flags": [{"flag": "SAME_STORAGE"}]})
    # scored by the workflow only: the published harness found it incorrect
    for i, root in enumerate(roots):
        if i < 2:
            write(root, "L2_T001", {"status": "incorrect", "score": None, "harness": "published", "verdict": "fail"})
        else:
            write(root, "L2_T001", {"status": "ok", "score": 1.3}, {"status": "pass"})
    return roots


def test_rows_hold_both_harnesses_scores_spreads_and_gap(trees):
    table = compare.rows([compare.read_pass(r, "default") for r in trees[:2]],
                         [compare.read_pass(r, "default") for r in trees[2:]], {"L1_T012": "fallback timed"})
    row = {r["tid"]: r for r in table}
    t012 = row["L1_T012"]
    assert t012["gap"] == pytest.approx((31.44 + 33.98) / (18.48 + 18.68) - 1)
    assert t012["published_spread"] == pytest.approx(0.2 / 18.48)
    assert t012["agrees"] is False and t012["cause"] == "fallback timed"
    assert t012["ext_published"] == ["diagonal_matmul_cuda"] and t012["ext_workflow"] == []
    assert t012["ref_x"] == pytest.approx(1.5) and t012["custom_x"] == pytest.approx(1.0)
    assert t012["flags"] == ["SAME_STORAGE"] and t012["verdict_workflow"] == "pass"
    assert row["L1_T040"]["agrees"] is False  # +15.1 %, both spreads below it
    assert row["L3_T020"]["agrees"] is True and row["L3_T020"]["allowed"] == pytest.approx(0.25)
    assert row["L2_T001"]["agrees"] is None and row["L2_T001"]["verdict_published"] == "fail"


def test_the_summary_counts_agreement_causes_and_verdicts(trees):
    table = compare.rows([compare.read_pass(r, "default") for r in trees[:2]],
                         [compare.read_pass(r, "default") for r in trees[2:]], {"L1_T012": "fallback timed"})
    s = compare.summary(table)
    assert (s["n"], s["agree"], s["within_tol"]) == (4, 2, 1)
    assert s["outside_explained"] == ["L1_T012"] and s["outside_unexplained"] == ["L1_T040"]
    assert (s["verdicts_same"], s["verdicts_n"]) == (4, 5) and s["scored_by_one"] == ["L2_T001"]
    assert s["done"] is False


def test_done_needs_ninety_percent_and_a_cause_for_every_other_task():
    def row(tid, gap, cause=""):
        return {"tid": tid, "agrees": abs(gap) <= 0.15, "gap": gap, "cause": cause, "verdict_published": None,
                "verdict_workflow": None, "published_spread": None, "workflow_spread": None,
                "published_mean": 1.0, "workflow_mean": 1.0 + gap}

    nine = [row(f"L1_T00{i}", 0.01) for i in range(9)]
    assert compare.summary(nine + [row("L2_T001", -0.28, "persistent output buffer")])["done"] is True
    assert compare.summary(nine + [row("L2_T001", -0.28)])["done"] is False
    assert compare.summary(nine[:8] + [row("L2_T001", -0.28, "x"), row("L2_T002", 0.3, "y")])["done"] is False


def test_the_page_and_figure_are_written(trees, tmp_path):
    causes = tmp_path / "causes.yaml"
    causes.write_text("L1_T012: >-\n  the extension never builds;\n  the fallback is timed\n")
    out, fig = tmp_path / "page" / "SIDE.md", tmp_path / "page" / "side.png"
    compare.main(["--published", str(trees[0]), str(trees[1]), "--workflow", str(trees[2] / "h100"), str(trees[3]),
                  "--causes", str(causes), "--out", str(out), "--figure", str(fig)])
    text = out.read_text()
    assert "**2 of 4 tasks (50.0 %) agree**" in text and "**not met**" in text
    assert "| L1_T012 | 18.48 / 18.68 | 1.1 % | 31.44 / 33.98 | 8.1 % | +76 % | **no** |" in text
    assert "the extension never builds; the fallback is timed |" in text
    assert "| L2_T001 | incorrect / incorrect |" in text
    assert fig.stat().st_size > 0 and "![published against workflow](side.png)" in text


V8_TITLE = ("The published harness beside the workflow at timing version 8: 14 tasks of the slice, default mode, "
            "one H100, 2026-12-06")
V9_TITLE = ("The published harness beside the workflow at timing version 9: default mode, NVIDIA H100 80GB HBM3, "
            "2026-12-06")


NODE2_TITLE = ("The published harness beside the workflow at timing version 9 on a second node: default mode, "
               "NVIDIA H100 80GB HBM3, 2026-12-06, one pass")
TWO_PASSES = (["results/sbs-pub1", "results/sbs-pub2"], ["results/sbs-wf1", "results/sbs-wf2"])
NODE2 = (["results/sbs-node2-pub1"], ["results/sbs-node2-wf1"])


@pytest.mark.parametrize("version, causes, title, trees", [("v8", "causes-v8.yaml", V8_TITLE, TWO_PASSES),
                                                           ("v9", None, V9_TITLE, TWO_PASSES),
                                                           ("v9-node2", None, NODE2_TITLE, NODE2)])
def test_an_evidence_page_is_what_compare_makes_of_its_trees(tmp_path, monkeypatch, version, causes, title, trees):
    """evidence/SIDE_BY_SIDE-2026-12-06-h100-<version>.md, made again from the packed trees by the
    command in evidence/NOTES.md, is the committed page."""
    import tarfile

    evidence = Path(compare.__file__).parent / "evidence"
    with tarfile.open(evidence / f"2026-12-06-h100-{version}.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "page.md"
    extra = ["--causes", str(evidence.parent / causes)] if causes else []
    compare.main(["--published", *trees[0], "--workflow", *trees[1], *extra, "--title", title, "--out", str(page),
                  "--figure", str(tmp_path / f"side_by_side-2026-12-06-h100-{version}.png")])
    assert page.read_text() == (evidence / f"SIDE_BY_SIDE-2026-12-06-h100-{version}.md").read_text()


def test_the_page_says_first_whether_the_published_harness_was_pinned(trees, tmp_path):
    def page():
        out = tmp_path / "SIDE.md"
        compare.main(["--published", str(trees[0]), str(trees[1]), "--workflow", str(trees[2]), str(trees[3]),
                      "--out", str(out)])
        return out.read_text().splitlines()

    assert page()[2] == "The published harness's CPU affinity: not recorded."
    for root in trees[:2]:
        for path in (root / "h100" / "time" / "paper" / "default").glob("*.json"):
            res = json.loads(path.read_text())
            path.write_text(json.dumps(res | {"provenance": {"cpus": [15]}}))
    assert page()[2] == ("The published harness ran pinned to CPU 15 (each process's affinity, as recorded); "
                         "a user runs it unpinned.")
    for root in trees[:2]:
        for path in (root / "h100" / "time" / "paper" / "default").glob("*.json"):
            res = json.loads(path.read_text())
            path.write_text(json.dumps(res | {"provenance": {"cpus": list(range(16)), "cpu_count": 16}}))
    assert page()[2] == "The published harness ran unpinned, as a user runs it: each process could use all 16 CPUs."
    assert compare.affinity([{"t": {"cpus": [8, 9, 10, 15], "cpu_count": 16}}]) == (
        "the published harness ran pinned to CPUs 8–10, 15 (each process's affinity, as recorded); "
        "a user runs it unpinned")
