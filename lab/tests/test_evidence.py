"""The pages of lab/evidence are what the lab's tools make of the result trees packed beside them
(trees.tar.xz): the run-to-run spreads (l1lab spread) and the throughput page (l1lab stagetimes)."""

import tarfile
from pathlib import Path

import pytest

from l1lab import spread, stagetimes

EVIDENCE = Path(__file__).resolve().parents[1] / "evidence"

#: spread page -> (first, second) trees of trees.tar.xz
SPREADS = {
    "spread-release-h100.md": ("release-h100-r1/h100", "release-h100-r2/h100"),
    "spread-h200-concurrent.md": ("h200-c1/h100", "h200-c2/h100"),
    "spread-h200-one-at-a-time.md": ("h200-c1/h100", "h200-s1/h100"),
}


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    out = tmp_path_factory.mktemp("trees")
    with tarfile.open(EVIDENCE / "trees.tar.xz") as tgz:
        tgz.extractall(out, filter="data")
    return out


def _without_paths(text: str) -> list[str]:
    """The page's lines but the one naming the two trees (where they were unpacked)."""
    return [line for line in text.splitlines() if " tasks timed in both `" not in line]


@pytest.mark.parametrize("page", sorted(SPREADS))
def test_each_spread_page_is_remade_from_its_trees(trees, page):
    first, second = SPREADS[page]
    rr = spread.run_to_run(trees / first, trees / second)
    made = spread.render_run_to_run(rr, str(trees / first), str(trees / second))
    assert _without_paths(made) == _without_paths((EVIDENCE / page).read_text())


def test_the_release_spread_is_the_one_the_readme_quotes(trees):
    rr = spread.run_to_run(trees / "release-h100-r1/h100", trees / "release-h100-r2/h100")
    assert (rr["within"], rr["n"]) == (176, 180)
    assert round(100 * rr["median"], 1) == 1.2


def test_the_throughput_page_is_remade_from_its_tree(trees):
    made = stagetimes.report(trees / "slice41-h200/h100", str(trees / "slice41-h200/samples"), bullet="* ")
    page = (EVIDENCE / "throughput-slice41-h200.md").read_text()
    assert page.endswith(made + "\n")
    assert "* first start to last finish 415 s" in made


def test_the_draw_cost_page_is_remade_from_the_side_by_side_tree(tmp_path, monkeypatch):
    """drawcost-h100-v9.md: the workflow's first pass of the timing-version-9 side by side
    (published_harness/evidence/2026-12-06-h100-v9.tar.xz) and the h100 release."""
    import os

    from l1lab import drawcost

    release_dir = Path(os.environ.get("L1_RELEASE_DIR") or EVIDENCE.parents[2] / "shared" / "cuda-l1")
    release = release_dir / "optimized_cuda_code" / "h100.json"
    if not release.is_file():
        pytest.skip("real release data not available (set L1_RELEASE_DIR)")
    with tarfile.open(EVIDENCE.parent / "published_harness/evidence/2026-12-06-h100-v9.tar.xz") as tgz:
        tgz.extractall(tmp_path, filter="data")
    (tmp_path / "results/h100").symlink_to(EVIDENCE.parents[1] / "results/h100")  # the committed tables' tree
    monkeypatch.chdir(tmp_path)
    drawcost.main(["--release", str(release), "--tree", "results/sbs-wf1/h100", "--timed", "results/h100",
                   "--out", "page.md"])
    assert (tmp_path / "page.md").read_text() == (EVIDENCE / "drawcost-h100-v9.md").read_text()
