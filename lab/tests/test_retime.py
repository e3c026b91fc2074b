"""Re-timing a task list into a results tree of its own, and its results taken back
(l1lab.retime); the tree's run report leaves the copied results out (l1lab.stagetimes)."""

import json

import pytest


def test_retime_prepare_copies_a_task_lists_build_and_check_results(tmp_path):
    from l1lab import retime

    src, dest, ext_from = tmp_path / "src", tmp_path / "dest", tmp_path / "other"
    for stage in ("build", "check"):
        (src / stage).mkdir(parents=True)
        for tid in ("L1_T001", "L1_T002"):
            (src / stage / f"{tid}.json").write_text("{}")
    (src / "reference_scan.json").write_text("{}")
    (ext_from / "build/ext/L1_T001/mod").mkdir(parents=True)
    (ext_from / "build/ext/L1_T001/mod/mod.so").write_text("x")
    counts = retime.prepare(src, dest, ["L1_T001"], ext_from)
    assert counts == {"build": 1, "check": 1, "ext": 1}
    assert (dest / "check/L1_T001.json").exists() and not (dest / "check/L1_T002.json").exists()
    assert (dest / "reference_scan.json").exists() and (dest / "build/ext/L1_T001/mod/mod.so").read_text() == "x"
    assert retime.prepare(src, dest, ["L1_T001"], ext_from) == {"build": 0, "check": 0, "ext": 0}  # kept
    # checks only (builds then run as build jobs), and every checked task by default
    assert retime.checked_tasks(src) == ["L1_T001", "L1_T002"]
    assert retime.prepare(src, tmp_path / "d2", retime.checked_tasks(src), stages=("check",)) == {
        "build": 0, "check": 2, "ext": 0}
    assert not (tmp_path / "d2/build").exists()
    with pytest.raises(ValueError, match="unknown stage"):
        retime.prepare(src, tmp_path / "d3", ["L1_T001"], stages=("time",))


def test_a_prepared_tree_lists_what_was_copied_and_its_run_report_leaves_that_out(tmp_path):
    """retime prepare lists the results it copied (prepared.json, merged over runs); the run
    report of the tree (stagetimes) leaves them out of its stages and span, which are this run's
    own, and still counts each copied check's missing time results."""
    from l1lab import retime, stagetimes

    def put(path, kind, started, finished, tid="L1_T001", **extra):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"kind": kind, "tid": tid, "provenance": {
            "started": f"2026-12-05T10:{started}+00:00", "finished": f"2026-12-05T10:{finished}+00:00"}} | extra))

    src, dest = tmp_path / "c1", tmp_path / "c2"
    for tid in ("L1_T001", "L1_T002"):
        put(src / f"build/{tid}.json", "build", "00:00", "01:00", tid)  # the first run's builds
    assert retime.prepare(src, dest, ["L1_T001"], stages=("build",))["build"] == 1
    assert retime.prepare(src, dest, ["L1_T002"], stages=("build",))["build"] == 1
    assert retime.prepared(dest) == {"build/L1_T001.json", "build/L1_T002.json"}
    assert retime.prepared(tmp_path / "nothing") == set()
    # this run: its checks and time results, 10 minutes later
    put(dest / "check/L1_T001.json", "check", "10:00", "10:20")
    put(dest / "check/L1_T002.json", "check", "10:00", "10:20", "L1_T002")
    put(dest / "time/paper/default/L1_T001.json", "time", "10:20", "10:40", mode="default", protocol="paper")
    rows = list(stagetimes.results(dest))
    assert sum(bool(r.get(stagetimes.PREPARED_KEY)) for r in rows) == 2
    stats = stagetimes.collect(rows)
    assert "build" not in stats and stagetimes.overall(stats)["span_s"] == 40
    report = stagetimes.report(dest)
    assert "first start to last finish 40 s" in report
    assert "1 of 2" in report and "L1_T002" in report  # a copied check still expects its time result
    # a time result kept from the first run (--keep-version: already of that version) is not this
    # run's: neither its stage nor its stalled call
    put(src / "time/paper/cudnn/L1_T001.json", "time", "02:00", "02:30", mode="cudnn", protocol="paper",
        status="ok", timing_design=7, ref_ms=[[1.0] * 9 + [9.0]], custom_ms=[[1.0] * 10])
    assert retime.prepare(src, dest, ["L1_T001"], stages=("build",), keep_version=7)["time"] == 1
    report = stagetimes.report(dest)
    assert "time:paper:cudnn" not in report.split("\n\n")[0] and "first start to last finish 40 s" in report
    assert "no paper-protocol timings" in report and "busiest" not in report


def test_retime_adopt_replaces_each_re_timed_result_and_keeps_the_others(tmp_path):
    from l1lab import retime

    new, old = tmp_path / "retime/h100", tmp_path / "h100"

    def put(root, rel, **res):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(res, indent=1) + "\n")
    put(old, "time/paper/default/L1_T001.json", status="ok", score=1.0, timing_design=1)
    put(old, "time/paper/default/L1_T002.json", status="ok", score=2.0, timing_design=1)
    put(new, "time/paper/default/L1_T001.json", status="ok", score=1.5, timing_design=4)
    put(new, "time/strict/default/L1_T001.json", status="crashed", timing_design=None)
    put(new, "time/paper/cudnn/L1_T002.json", status="ok", score=3.0, timing_design=3)
    counts = retime.adopt(new, old, version=4)
    assert counts == {"adopted": 2, "skipped": 1, "paper/default": 1, "strict/default": 1}
    adopted = "time/paper/default/L1_T001.json"
    assert (old / adopted).read_text() == (new / adopted).read_text()
    assert json.loads((old / "time/paper/default/L1_T002.json").read_text())["score"] == 2.0  # not re-timed: kept
    assert not (old / "time/paper/cudnn/L1_T002.json").exists()  # another version: skipped
    # a later re-timing starts from what is already of the version, and unscored results
    put(old, "time/paper/cudnn/L1_T001.json", status="no_code")
    (old / "check").mkdir()
    (old / "check/L1_T001.json").write_text("{}")
    counts = retime.prepare(old, tmp_path / "again", ["L1_T001", "L1_T002"], stages=("check",), keep_version=4)
    assert counts == {"build": 0, "check": 1, "ext": 0, "time": 3}
    assert sorted(p.relative_to(tmp_path / "again").as_posix() for p in (tmp_path / "again/time").rglob("*.json")) == [
        "time/paper/cudnn/L1_T001.json", "time/paper/default/L1_T001.json", "time/strict/default/L1_T001.json"]
    (new / "time/paper/default/L1_T009.json").write_text("{not json")
    with pytest.raises(ValueError, match="L1_T009.json: not a result"):
        retime.adopt(new, old)
