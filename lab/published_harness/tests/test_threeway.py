"""The three-way page (unpinned, pinned, workflow) and the random sample it runs on."""

import json
from pathlib import Path

import pytest

from published_harness import sample, threeway
from published_harness.tests.test_compare import write

# tid: (a1, a2, b1, b2, c1, c2): unpinned harness, pinned harness, workflow
SCORES = {
    "L1_T091": (1.00, 1.02, 1.30, 1.28, 1.29, 1.31),  # host-bound: pinning moves the harness +28 %, c/a beyond
    "L2_T050": (3.00, 3.05, 3.02, 3.01, 3.03, 2.99),  # GPU-bound: all agree
    "L3_T042": (2.0, 2.6, 2.1, 2.2, 2.4, 2.5),  # +7 % against a, whose own spread is 30 %
}


def timed(score: float, launch_us: float | None) -> dict:
    res = {"status": "ok", "score": score, "ref_ms": [[0.1] * 10], "custom_ms": [[0.1 / score] * 10]}
    if launch_us is not None:
        res["host_timing"] = {"launch_median_us": {"ref": launch_us, "custom": 5.0}}
    return res


@pytest.fixture()
def trees(tmp_path):
    names = ("a1", "a2", "b1", "b2", "c1", "c2")
    roots = {n: tmp_path / n for n in names}
    for tid, scores in SCORES.items():
        for name, score in zip(names, scores, strict=True):
            if name.startswith("c"):
                write(roots[name], tid, timed(score, 95.0 if tid == "L1_T091" else 10.0), {"status": "pass"})
            else:
                write(roots[name], tid, {"status": "ok", "score": score, "harness": "published", "verdict": "pass"})
    for name in names:  # one task found incorrect by every arm
        write(roots[name], "L1_T069", {"status": "incorrect", "score": None, "harness": "published"})
    return roots


def read(trees, *names):
    return [threeway.compare.read_pass(trees[n], "default") for n in names]


def test_rows_hold_each_arms_spread_and_the_three_gaps(trees):
    passes = {"a": read(trees, "a1", "a2"), "b": read(trees, "b1", "b2"), "c": read(trees, "c1", "c2")}
    bound = threeway.host_bound([trees["c1"], trees["c2"]], "default")
    row = {r["tid"]: r for r in threeway.rows(passes, bound=bound)}
    t091 = row["L1_T091"]
    assert t091["host_bound"] and t091["bound_sides"] == ["ref"] and t091["shares"]["ref"] == pytest.approx(0.95)
    assert t091["c/a"] == pytest.approx(1.30 / 1.01 - 1) and t091["c/a_beyond"] is True
    assert t091["c/b"] == pytest.approx(1.30 / 1.29 - 1) and t091["c/b_beyond"] is False
    assert t091["b/a_beyond"] is True
    assert not row["L2_T050"]["host_bound"] and row["L2_T050"]["c/a_beyond"] is False
    assert row["L3_T042"]["a_spread"] == pytest.approx(0.3) and row["L3_T042"]["c/a_beyond"] is False
    assert row["L1_T069"]["c/a"] is None and row["L1_T069"]["statuses"]["a"] == ["incorrect", "incorrect"]


def test_the_page_splits_by_host_bound_and_marks_gaps_beyond_the_spreads(trees, tmp_path):
    out = tmp_path / "THREE_WAY.md"
    args = ["--unpinned", str(trees["a1"]), str(trees["a2"]), "--pinned", str(trees["b1"]), str(trees["b2"]),
            "--workflow", str(trees["c1"]), str(trees["c2"]), "--line", "* seed 1", "--out", str(out)]
    assert threeway.main(args) == 0
    text = out.read_text()
    assert text.splitlines()[2:5] == ["* a: the published harness's CPU affinity: not recorded.",
                                      "* b: the published harness's CPU affinity: not recorded.", "* seed 1"]
    summary = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert summary["all"].startswith("| all | 4 |") and "| 2 of 3 |" in summary["all"]
    assert summary["host-bound"].startswith("| host-bound | 1 |") and "L1_T091" in summary["host-bound"]
    assert "| ref (0.95 / 0.07) |" in text and "**+29 %**" in text


def test_a_call_cut_short_gives_the_page_of_the_passes_that_ran(trees, tmp_path):
    """A deadline can leave a pass unrun (no tree) and the workflow's arm not reached: the page says
    which passes did not run and puts tasks without a workflow result in a group of their own
    instead of counting them as not host-bound."""
    out = tmp_path / "THREE_WAY.md"
    gone = tmp_path / "never"
    args = ["--unpinned", str(trees["a1"]), str(gone / "a2"), "--pinned", str(trees["b1"]), str(gone / "b2"),
            "--workflow", str(gone / "c1"), str(gone / "c2"), "--out", str(out)]
    assert threeway.main(args) == 0
    text = out.read_text()
    assert f"* c (workflow): not run: {gone / 'c1'}, {gone / 'c2'}." in text
    assert f"* a (published, unpinned): not run: {gone / 'a2'}." in text
    summary = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert summary["not host-bound"].startswith("| not host-bound | 0 |")
    assert summary["no workflow result"].startswith("| no workflow result | 4 |")
    assert "| L1_T091 | — (— / —) | 1.00 |" in text

def test_the_sample_is_the_seeds_draw_over_the_population(tmp_path):
    sizes = {"L1_T001": {"has_code": True, "m": 1.0}, "L1_T002": {"has_code": False, "m": 1.0},
             "L1_T003": {"has_code": True, "m": 50.0}, "L1_T004": {"has_code": True, "error": "x"},
             "L2_T005": {"has_code": True, "m": 2.0}, "L3_T006": {"has_code": True, "m": 0.1}}
    pool = sample.population(sizes, {"L1_T001"}, 10.0)
    assert pool == ["L2_T005", "L3_T006"]
    assert sample.draw(pool, 5, 7) == sorted(pool, key=lambda t: sample.draw(pool, 5, 7).index(t))
    assert sample.draw(pool, 1, 7) == sample.draw(list(reversed(pool)), 1, 7)  # order of the pool does not matter
    text = sample.render(["L2_T005", "L3_T006"], 7, 2, 10.0, "x/h100.json", "slice.yaml")
    assert 'tasks: ["2/5", "3/6"]' in text and "seed: 7" in text and "random.Random(7)" in text


def test_the_recorded_sample_is_what_its_seed_draws(tmp_path):
    """The committed h100 sample is the draw its header names, over the real release."""
    release = Path(__file__).resolve().parents[3] / ".." / "shared" / "cuda-l1" / "optimized_cuda_code" / "h100.json"
    import os

    release = Path(os.environ.get("L1_RELEASE_DIR", release.parents[1])) / "optimized_cuda_code" / "h100.json"
    if not release.exists():
        pytest.skip(f"no release at {release}")
    pytest.importorskip("torch")
    out = tmp_path / "s.yaml"
    sample.main(["--release", str(release), "--seed", "20261207", "--n", "22", "--max-m", "10", "--out", str(out)])
    committed = Path(__file__).resolve().parents[1] / "samples" / "h100-seed20261207.yaml"
    assert json.dumps(out.read_text().split("\n")[2:]) == json.dumps(committed.read_text().split("\n")[2:])


ARMS = ["--unpinned", "results/sbs-pub1", "results/sbs-pub2", "--pinned", "results/sbs-pin1", "results/sbs-pin2",
        "--workflow", "results/sbs-wf1", "results/sbs-wf2"]


def _head(page: str) -> tuple[str, list[str]]:
    """A committed page's title and its lines that the command gave (``--title``, ``--line``): the
    lines under the title that are not the arms' recorded affinity."""
    blocks = page.split("\n\n")
    return blocks[0].removeprefix("# "), [ln for ln in blocks[1].splitlines() if not ln.startswith(("* a:", "* b:"))]


def test_the_three_way_evidence_pages_are_what_the_tools_make_of_their_trees(tmp_path, monkeypatch):
    """evidence/THREE_WAY-2026-12-07-h100.md, its order-corrected page and PAIR_ORDER-2026-12-07-h100.md,
    made again from the trees packed in 2026-12-07-h100-threeway.tgz, are the committed pages: a pass
    added to the trees is not in the pages until they are made again. The title and the lines under
    it are the command's words (read from the page); every table is the tools'."""
    import tarfile

    from published_harness import pair_order

    evidence = Path(threeway.__file__).parent / "evidence"
    with tarfile.open(evidence / "2026-12-07-h100-threeway.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    monkeypatch.chdir(tmp_path)
    committed = (evidence / "THREE_WAY-2026-12-07-h100.md").read_text()
    title, lines = _head(committed)
    threeway.main([*ARMS, "--title", title, *(a for ln in lines for a in ("--line", ln)), "--out", "three.md"])
    assert (tmp_path / "three.md").read_text() == committed
    committed = (evidence / "THREE_WAY-2026-12-07-h100-order.md").read_text()
    pair_order.main([*ARMS, *(a for ln in _head(committed)[1] for a in ("--line", ln)), "--out", "order.md"])
    assert (tmp_path / "order.md").read_text() == committed
    runs = [a for a in ARMS if not a.startswith("--")]
    pair_order.main([*runs, "--out", "pairs.md"])
    committed = (evidence / "PAIR_ORDER-2026-12-07-h100.md").read_text()
    assert committed.endswith((tmp_path / "pairs.md").read_text())  # under a header of its own
