"""What a run made in pieces cost (l1lab.cost), on a small synthetic tree."""

import json

import pytest

from l1lab import cost


def _result(root, kind, tid, start, seconds, lock, mode=None):
    """A result of ``kind`` whose step started ``start`` s after 12:00 UTC and ran ``seconds``."""
    folder = root / kind if kind != "time" else root / "time" / "paper" / mode
    folder.mkdir(parents=True, exist_ok=True)
    at = lambda s: f"2026-12-08T12:{int(s) // 60:02d}:{int(s) % 60:02d}+00:00"  # noqa: E731
    res = {"kind": kind, "tid": tid, "status": "ok", "lock_held_s": lock,
           "provenance": {"started": at(start), "finished": at(start + seconds)}}
    if mode:
        res |= {"mode": mode, "protocol": "paper"}
    (folder / f"{tid}.json").write_text(json.dumps(res))


def test_stretches_split_where_steps_are_far_apart():
    assert cost.stretches([(0, 10), (5, 20), (700, 710)], gap_s=600) == [(0, 20), (700, 710)]
    assert cost.stretches([(0, 10), (500, 510)], gap_s=600) == [(0, 510)]
    assert cost.wall([(0, 10), (5, 20), (700, 710)], gap_s=600) == 30


def test_the_page_gives_each_stage_its_lock_wall_and_pieces(tmp_path):
    _result(tmp_path, "build", "L1_T001", 0, 60, 0.0)
    _result(tmp_path, "check", "L1_T001", 60, 20, 5.0)
    _result(tmp_path, "time", "L1_T001", 80, 40, 10.0, mode="default")
    _result(tmp_path, "time", "L1_T002", 3000, 60, 30.0, mode="default")  # a second piece, 48 min later
    out = tmp_path / "cost.md"
    assert cost.main([str(tmp_path), "--out", str(out), "--title", "Cost"]) == 0
    page = out.read_text()
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in page.splitlines()
            if r.startswith("| ") and "stage" not in r}
    assert rows["build"] == ["1", "0", "60", "0%", "1"]
    assert rows["check"] == ["1", "5", "20", "25%", "1"]
    assert rows["paper default"] == ["2", "40", "100", "40%", "2"]  # 40 s + 60 s of wall in two pieces
    assert rows["the run"] == ["4", "45", "180", "25%", "2"]  # 0-120 s and 3000-3060 s
    assert "* piece 1: 2026-12-08 12:00 UTC, 120 s, 3 steps" in page
    assert "* piece 2: 2026-12-08 12:50 UTC, 60 s, 1 step" in page


def test_the_projection_sets_each_paper_stage_s_ok_lock_beside_the_fit_for_the_same_tasks(tmp_path):
    _result(tmp_path, "check", "L1_T001", 0, 20, 5.0)
    _result(tmp_path, "time", "L1_T001", 20, 40, 10.0, mode="default")
    _result(tmp_path, "time", "L1_T002", 60, 10, 3.0, mode="default")
    _result(tmp_path, "time", "L1_T003", 70, 10, 9.0, mode="default")  # not sized: left out of both
    sizes = {"L1_T001": {"m": 10.0}, "L1_T002": {"m": 0.0}, "L1_T003": {"error": "no meta"}}
    page = cost.page(cost.collect(cost.results(tmp_path)), projection=(sizes, 1.0, 0.5))
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in page.splitlines()
            if r.startswith("| ") and "stage" not in r}
    assert rows["paper default"][-2:] == ["13 (2)", "7"]  # 10 + 3 s measured; (1 + 5) + (1 + 0) s projected
    assert rows["check"][-2:] == ["—", "—"]
    assert rows["the run"][-2:] == ["—", "—"]
    assert "1.00 s + 0.500 s per million input elements" in page


def test_release_and_fit_go_together(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cost.main([str(tmp_path), "--fit", "0.33,0.453"])
    assert "--release and --fit go together" in capsys.readouterr().err
