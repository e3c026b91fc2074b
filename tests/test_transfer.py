"""The cross-release page on synthetic release trees (l1bench.aggregate.transfer)."""

import math

import pandas as pd
import pytest

from l1bench.aggregate import transfer as tr

H100 = "NVIDIA H100 80GB HBM3"


def _tree(rows, gpu=H100):
    """A scores.csv frame: (tid, status, published, measured) in the paper protocol's default
    mode, with a strict row that the page must not read."""
    out = []
    for tid, status, published, measured in rows:
        check = {"ok": "pass", "no_code": "no_code"}.get(status, status)
        timed = gpu if status == "ok" else None
        base = {"tid": tid, "status": status, "published": published, "check_status": check, "gpu": timed}
        out.append(base | {"mode": "default", "protocol": "paper", "measured": measured})
        out.append(base | {"mode": "default", "protocol": "strict", "measured": 100.0 if measured else None})
    return pd.DataFrame(out)


TREES = {
    "h100": _tree(
        [("L1_T001", "ok", 2.5, 2.0), ("L1_T002", "ok", 2.0, 2.0), ("L1_T003", "incorrect", 3.0, None),
         ("L1_T004", "ok", 1.5, 1.2)]
    ),
    "a100": _tree([("L1_T001", "ok", 4.0, 3.0), ("L1_T002", "ok", 1.5, 2.1), ("L1_T003", "ok", 1.2, 1.5)]),
    "l40": _tree(
        [("L1_T001", "ok", 1.1, 1.0), ("L1_T002", "no_code", 1.3, None), ("L1_T003", "ok", 2.0, 0.9),
         ("L1_T004", "ok", 1.0, 1.3)]
    ),
    "3090": _tree([("L1_T001", "ok", 9.0, 9.0)], gpu="NVIDIA GeForce RTX 3090"),
}  # fmt: skip


@pytest.mark.parametrize(
    "gpu,release",
    [
        (H100, "h100"),
        ("NVIDIA H200", "h100"),  # the H100's chip
        ("NVIDIA H20", "h20"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA L40S", "l40"),
        ("NVIDIA GeForce RTX 3090", "3090"),
        ("Tesla V100-SXM2-32GB", None),
        (None, None),
    ],
)
def test_the_release_tuned_for_a_gpus_family(gpu, release):
    assert tr.native_release(gpu) == release


def test_a_release_measured_elsewhere_is_called_a_transfer():
    assert tr.transfer_note("a100", H100) == f"published on A100, measured on {H100}: a transfer, not a reproduction"
    assert tr.transfer_note("h100", "NVIDIA H200").startswith("published on H100, measured on NVIDIA H200")
    assert tr.transfer_note("l40", "NVIDIA L40S") is not None  # another model of the family
    assert tr.transfer_note("h100", H100) is None and tr.transfer_note("3090", "NVIDIA GeForce RTX 3090") is None
    assert tr.transfer_note("h20", "NVIDIA H200") is not None  # H20 is not H200
    assert tr.transfer_note("a100", None) is None  # nothing measured


def test_scores_statuses_and_the_fastest_release():
    here = {r: df for r, df in TREES.items() if r != "3090"}
    scores, status = tr.score_table(here)
    assert list(scores.columns) == ["h100", "a100", "l40"]
    assert status.at["L1_T004", "a100"] == "missing" and math.isnan(scores.at["L1_T004", "a100"])
    assert status.at["L1_T002", "l40"] == "no_code"
    assert scores.at["L1_T001", "a100"] == 3.0  # the paper row, not the strict one
    assert tr.fastest(scores).to_dict() == {"L1_T001": "a100", "L1_T002": "a100", "L1_T003": "a100", "L1_T004": "l40"}


def test_how_often_another_release_beats_the_native_code():
    scores, _ = tr.score_table({r: df for r, df in TREES.items() if r != "3090"})
    beat = tr.beats_native(scores, "h100")
    # L1_T003: h100's code is incorrect, so not compared; the wins on L1_T002 and L1_T004 are within 15 %
    assert beat == {"compared": 3, "faster": 3, "clearly_faster": 1, "per_release": {"a100": (2, 2), "l40": (1, 2)}}
    assert tr.beats_native(scores, "h20") is None


def test_rank_correlation_of_published_and_measured():
    same = _tree([(f"L1_T00{i}", "ok", float(i), float(i) * 0.5) for i in range(1, 6)])
    reverse = _tree([(f"L1_T00{i}", "ok", float(i), 10.0 - i) for i in range(1, 6)])
    assert tr.spearman(same) == (pytest.approx(1.0), 5)
    assert tr.spearman(reverse) == (pytest.approx(-1.0), 5)
    rho, n = tr.spearman(_tree([("L1_T001", "ok", 1.0, 1.0), ("L1_T002", "incorrect", 2.0, None)]))
    assert math.isnan(rho) and n == 1


def test_tasks_whose_verdict_differs():
    checks = tr.checks_table({r: df for r, df in TREES.items() if r != "3090"})
    differ = tr.verdicts_differ(checks)
    assert list(differ.index) == ["L1_T003"]  # L1_T002: no code in l40 is not a verdict
    assert differ.loc["L1_T003"].tolist() == ["incorrect", "pass", "pass"]


def test_the_page_names_the_gpus_and_what_is_missing():
    page = tr.render(TREES, "figures/transfer.png")
    assert f"on one GPU, **{H100}**" in page
    assert f"published on A100, measured on {H100}: a transfer, not a reproduction" in page
    assert "Releases not measured: h20." in page
    assert "measured on another GPU than the page's" in page  # the 3090 tree, on its own GPU
    assert "Another release's code is faster in **3 of 3** tasks (1 by more than 15%)" in page
    assert "| L1_T001 | 2.00" in page and "**3.00**" in page
    assert "9.00" not in page  # the 3090 tree is not compared
    assert "![" in page and "(figures/transfer.png)" in page


def test_one_tree_only_says_there_is_nothing_to_compare():
    page = tr.render({"h100": TREES["h100"]})
    assert "Releases not measured: a100, h20, l40, 3090." in page
    assert "nothing to rank yet" in page and "not measured beside another release yet" in page
    assert "None among the releases measured here." in page
    assert "**" not in page.split("## Per task")[1]  # no fastest release to mark


def test_no_tree_at_all(tmp_path):
    page = tr.render(tr.load_trees([tmp_path / "h100" / "scores.csv"]))
    assert "**none yet**" in page and "Releases not measured: h100, a100, h20, l40, 3090." in page


def test_main_reads_the_trees_and_writes_page_and_figure(tmp_path):
    for release in ("h100", "a100"):
        (tmp_path / release).mkdir()
        TREES[release].to_csv(tmp_path / release / "scores.csv", index=False)
    out, fig = tmp_path / "transfer.md", tmp_path / "figures" / "transfer.png"
    scores = [str(tmp_path / r / "scores.csv") for r in ("h100", "a100", "demo")]
    assert tr.main(["--out", str(out), "--figure", str(fig), *scores]) == 0
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = out.read_text()
    assert "(figures/transfer.png)" in page and "Releases not measured: h20, l40, 3090." in page


def test_a_tree_measured_on_several_gpus_names_each_ones_scores():
    """While a tree is re-timed on the release's own GPU, the note counts the scores of each GPU:
    the majority's GPU alone would pass for all of them."""
    df = pd.DataFrame({"gpu": ["NVIDIA H200"] * 3 + [H100] * 2 + ["NVIDIA H200"], "measured": [1.0] * 5 + [None]})
    assert tr.tree_transfer_note("h100", df) == (
        f"published on H100, measured 3 of 5 scores on NVIDIA H200: a transfer, not a reproduction; "
        f"the other 2 on its own GPU ({H100})")
    assert tr.tree_transfer_note("a100", df) == (
        f"published on A100, measured 3 of 5 scores on NVIDIA H200, 2 of 5 scores on {H100}: "
        "a transfer, not a reproduction")
    one = df[df["gpu"] == H100]
    assert tr.tree_transfer_note("h100", one) is None
    assert tr.tree_transfer_note("a100", one) == tr.transfer_note("a100", H100)


def test_the_release_tables_say_where_published_and_where_measured():
    """The committed h100 tree says where it was published and on which GPUs its scores were
    measured, in summary.md and README.md."""
    from pathlib import Path

    from l1bench import aggregate as agg

    df = pd.read_csv(Path(__file__).parents[1] / "results" / "h100" / "scores.csv")
    note = tr.tree_transfer_note("h100", df)
    line = f"**{note[0].upper()}{note[1:]}.**"
    assert "NVIDIA H200: a transfer, not a reproduction" in line
    assert line in agg.render_summary_markdown(df, note)
    assert line not in agg.render_summary_markdown(df)
    report = agg.render_report(df, {"device": "h100", "transfer": note}, [], {})
    assert line in report.split("## Environment")[0] and "| transfer" not in report


def test_the_page_names_per_release_the_tasks_that_pass_only_at_the_looser_tolerance(tmp_path):
    """From each tree's check results (min_tolerance per trial, beside its scores.csv): pass rates
    at 1e-2 and 1e-4 and the tasks that pass at 1e-2 only."""
    import json

    checks = {  # release: {tid: (status, min_tolerance per trial)}
        "h100": {"L1_T001": ("pass", [1e-6, 2e-6]), "L1_T002": ("pass", [3e-3, 1e-6]), "L1_T003": ("incorrect", [0.5])},
        "a100": {"L1_T001": ("pass", [1e-6]), "L1_T002": ("pass", [1e-5]), "L1_T003": ("pass", [5e-5])},
        "l40": {"L1_T001": ("pass", None)},  # checked before the record existed
    }  # fmt: skip
    for release, tasks in checks.items():
        (tmp_path / release / "check").mkdir(parents=True)
        TREES[release].to_csv(tmp_path / release / "scores.csv", index=False)
        for tid, (status, trials) in tasks.items():
            res = {"tid": tid, "status": status, "min_tolerance": trials, "params": {"correctness_trials": 2}}
            (tmp_path / release / "check" / f"{tid}.json").write_text(json.dumps(res))
    out = tmp_path / "transfer.md"
    scores = [str(tmp_path / r / "scores.csv") for r in checks]
    assert tr.main(["--out", str(out), "--figure", str(tmp_path / "t.png"), *scores]) == 0
    section = out.read_text().split("## Tasks that pass only at the looser tolerance")[1].split("\n## ")[0]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in section.splitlines() if line.startswith("| ") and "Release" not in line}
    assert rows["h100"] == ["2/3 (66.7%)", "1/3 (33.3%)", "1", "L1_T002"]
    assert rows["a100"] == ["3/3 (100.0%)", "3/3 (100.0%)", "0", "none"]
    assert rows["l40"][0].startswith("not recorded") and rows["l40"][2:] == ["–", "–"]


def test_the_figure_says_which_timing_version_made_its_scores(tmp_path, monkeypatch):
    from l1bench.aggregate import figures
    from l1bench.timing import TIMING_VERSION as V

    titles = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: titles.append(fig._suptitle.get_text()))
    trees = {r: TREES[r].assign(timing_version=V - 5) for r in ("h100", "a100")}
    tr.plot(trees, tmp_path / "t.png")
    tr.plot({}, tmp_path / "none.png")
    assert titles[0].split("\n")[1] == f"6 scores at timing version {V - 5}, {H100} (stale); current timing version {V}"
    assert "\n" not in titles[1]  # no score: no second line
