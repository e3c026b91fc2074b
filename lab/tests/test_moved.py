"""What moved between two results trees (l1lab.moved), on small synthetic trees."""

import json
import re

import pytest

from l1lab import moved


def _time(root, tid, ref, custom, status="ok", version=9, gpu="GPU B", launch=None, outer=7, **extra):
    """A paper default-mode time result: ``ref``/``custom`` one mean call per outer trial (10 calls
    each), the score the mean of the trials' ratios; ``launch``: (ref, custom) median launches in ms."""
    d = root / "time" / "paper" / "default"
    d.mkdir(parents=True, exist_ok=True)
    trials = [r / c for r, c in zip(ref, custom, strict=True)]
    res = {"status": status, "score": sum(trials) / len(trials) if status == "ok" else None,
           "trial_scores": trials, "params": {"outer_trials": outer}, "timing_version": version,
           "ref_ms": [[r] * 10 for r in ref], "custom_ms": [[c] * 10 for c in custom],
           "provenance": {"gpu": gpu}, "flags": []} | extra
    if launch:
        res["host_timing"] = {"launch_median_us": {"ref": launch[0] * 1000, "custom": launch[1] * 1000}}
    (d / f"{tid}.json").write_text(json.dumps(res))


@pytest.fixture
def trees(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    seven = [1.0] * 7
    _time(old, "L1_T001", [2.0] * 7, seven, version=4, gpu="GPU A")
    _time(new, "L1_T001", [1.5] * 7, seven, launch=(1.4, 0.2))  # the reference got faster: host-bound ref
    _time(old, "L1_T002", [2.0] * 7, seven, version=4, gpu="GPU A")
    _time(new, "L1_T002", [2.0] * 7, [0.5] * 7, launch=(0.1, 0.1))  # the custom code got faster, GPU-bound
    _time(old, "L1_T003", [2.0] * 7, [1.0] * 6 + [20.0], version=4, gpu="GPU A")  # one slow trial: 1.73
    _time(new, "L1_T003", [2.0] * 7, seven)  # 2.0: the calls did not move, the trials did
    _time(old, "L1_T004", [2.0] * 7, seven, version=4, gpu="GPU A")
    _time(new, "L1_T004", [2.1] * 7, seven)  # within ±15 %
    _time(old, "L1_T005", [2.0] * 7, seven, version=4, gpu="GPU A")
    _time(new, "L1_T005", [2.0] * 7, seven, status="incorrect")
    _time(old, "L1_T006", [2.0] * 7, seven, version=4, gpu="GPU A")  # only in the old tree
    return old, new


def test_each_task_names_the_side_that_moved_and_what_its_trials_did(trees):
    result = moved.compare(*(moved.load(t, "paper", ["default"])["default"] for t in trees))
    rows = {r["tid"]: r for r in result["rows"]}
    assert sorted(rows) == ["L1_T001", "L1_T002", "L1_T003", "L1_T004"]
    assert [tid for tid, r in rows.items() if r["moved"]] == ["L1_T001", "L1_T002", "L1_T003"]
    assert rows["L1_T001"]["side"] == "reference" and rows["L1_T001"]["ref"] == pytest.approx(0.75)
    assert rows["L1_T001"]["bound"] == "host-bound" and rows["L1_T001"]["sides"] == "ref"
    assert rows["L1_T002"]["side"] == "custom" and rows["L1_T002"]["bound"] == "GPU-bound"
    assert rows["L1_T003"]["side"] == "neither" and rows["L1_T003"]["notes"] == "old: a slow custom trial (20.0×)"
    assert rows["L1_T004"]["bound"] == "not recorded" and not rows["L1_T004"]["moved"]
    assert result["changed"] == [("L1_T005", "ok", "incorrect")]


def test_a_slow_trial_and_an_early_stop_are_named():
    res = {"ref_ms": [[1.0] * 10] * 6 + [[3.0] * 10], "custom_ms": [[1.0] * 10] * 7, "trial_scores": [1] * 7,
           "params": {"outer_trials": 7}}
    assert moved.notes(res) == ["a slow reference trial (3.0×)"]
    stopped = {"ref_ms": [[0.2] * 10], "custom_ms": [[1.0] * 10], "trial_scores": [0.2], "params": {"outer_trials": 7}}
    assert moved.notes(stopped) == ["early stop (1 of 7 trials)"]
    assert moved.median_ms(res, "ref") == 1.0  # one slow trial does not move the side's call
    assert moved.median_ms({"ref_ms_mean": 2.5}, "ref") == 2.5  # calls not recorded


def test_the_page_heads_with_each_trees_versions_and_gpus(trees, tmp_path):
    out = tmp_path / "moved.md"
    assert moved.main([str(trees[0]), str(trees[1]), "--modes", "default", "--out", str(out)]) == 0
    page = out.read_text()
    assert "* old: `" in page and "6 scores (version 4: 6); GPU A: 6" in page
    assert "4 scores (version 9: 4); GPU B: 4" in page
    assert re.search(r"\| all +\| 4 +\| 1 +\| 2 +\| 1 +\|", page)  # scored in both, within, up, down
    assert "Moved, by the side whose call carries the move: reference 1, custom 1, neither 1." in page
    assert page.index("| L1_T002") < page.index("| L1_T001") < page.index("| L1_T003")  # largest move first
    assert "Status changed: L1_T005 ok → incorrect." in page


def test_a_tree_that_is_not_there_is_an_error(tmp_path, trees):
    with pytest.raises(SystemExit):
        moved.main([str(tmp_path / "nope"), str(trees[1])])
