"""Run-to-run spread pages and spread lists (l1lab.spread): pure functions on small trees."""

import json

import pytest

from l1lab import spread


def _write_time(root, tid, score, trials=7, status="ok", **extra):
    d = root / "time" / "paper" / "default"
    d.mkdir(parents=True, exist_ok=True)
    res = {"status": status, "score": score, "trial_scores": [score] * trials, "params": {"outer_trials": 7}} | extra
    (d / f"{tid}.json").write_text(json.dumps(res))


def test_run_to_run_reports_median_max_and_separates_early_stops(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write_time(a, "L1_T001", 1.0)
    _write_time(b, "L1_T001", 1.1)  # 10 %
    _write_time(a, "L1_T002", 2.0)
    _write_time(b, "L1_T002", 2.0)  # 0 %
    _write_time(a, "L1_T003", 0.25, trials=1)  # stopped early in the first run
    _write_time(b, "L1_T003", 2.25)  # 800 %
    _write_time(a, "L1_T004", 1.0)  # only in one folder: not compared
    rr = spread.run_to_run(a, b)
    assert rr["n"] == 3
    assert rr["median"] == pytest.approx(0.1)
    assert rr["max"] == pytest.approx(8.0)
    assert (rr["n_full"], rr["max_full"]) == (2, pytest.approx(0.1))
    text = spread.render_run_to_run(rr, "a", "b")
    assert text.index("L1_T003") < text.index("L1_T001")  # largest difference first
    assert rr["within"] == 2 and "within ±15 %: **2 of 3**" in text


def test_run_to_run_without_stalled_pairs(tmp_path):
    """A first run whose score came from one stalled call agrees once that pair is left out."""
    a, b = tmp_path / "a", tmp_path / "b"
    fast, custom = [0.03] * 5, [0.015] * 5
    stalled = [0.015, 8.2, 0.015, 0.015, 0.015]
    _write_time(a, "L1_T001", 0.04, trials=1, ref_ms=[fast], custom_ms=[stalled])
    _write_time(b, "L1_T001", 2.0, ref_ms=[fast] * 7, custom_ms=[custom] * 7)
    rr = spread.run_to_run(a, b)
    row = rr["rows"][0]
    assert row["stalled_calls"] == 1 and row["rel_diff"] == pytest.approx(49.0)
    assert row["rel_diff_without_stalls"] == pytest.approx(0.0, abs=1e-9)
    assert rr["max_without_stalls"] == pytest.approx(0.0, abs=1e-9)
    assert "without the timed pairs holding a call stalled" in spread.render_run_to_run(rr, "a", "b")
    # 1 of the first run's 10 timed calls stalled (100 per 1000), none of the second's 70
    assert rr["stalled_per_1000"] == [pytest.approx(100.0), 0.0]


def test_call_times_of_two_runs_apart_from_their_scores(tmp_path):
    """The second run's timed calls all 10 % slower (first calls 50 % slower on the custom side):
    the scores agree, the call-time medians show it; single-call trials are left out."""
    a, b = tmp_path / "a", tmp_path / "b"
    ref, custom = [[0.5] + [0.2] * 4] * 3, [[0.3] + [0.1] * 4] * 3
    _write_time(a, "L1_T001", 2.0, ref_ms=ref, custom_ms=custom)
    _write_time(b, "L1_T001", 2.0, ref_ms=[[x * 1.1 for x in t] for t in ref],
                custom_ms=[[0.45] + [0.11] * 4] * 3)
    _write_time(a, "L1_T002", 1.0, ref_ms=[[0.2]], custom_ms=[[0.2]])  # no steady state: left out
    _write_time(b, "L1_T002", 1.0, ref_ms=[[0.2]], custom_ms=[[0.2]])
    rr = spread.run_to_run(a, b)
    ct = rr["call_times"]
    assert rr["median"] == 0 and ct["ref_steady"]["n"] == 1
    assert ct["ref_first"]["median"] == pytest.approx(1.1) and ct["ref_steady"]["median"] == pytest.approx(1.1)
    assert ct["custom_first"]["median"] == pytest.approx(1.5) and ct["custom_steady"]["median"] == pytest.approx(1.1)
    assert "custom 1.500× first call, 1.100× the others" in spread.render_run_to_run(rr, "a", "b")


def test_the_spread_apart_for_gpu_bound_and_host_bound_tasks(tmp_path, capsys):
    """A task whose custom side is launch-bound in one run counts as host-bound; one whose
    results do not record launches is unknown; the CPU probe's ratio is the median over the
    tasks whose two results ran it. Old results (no launches, no probe) get neither line nor
    column."""
    a, b = tmp_path / "a", tmp_path / "b"
    calls = {"ref_ms": [[1.0] * 4], "custom_ms": [[0.1] * 4]}

    def ht(custom_us, probe=None):
        return {"host_timing": {"launch_median_us": {"ref": 50, "custom": custom_us},
                                **({"probe": {"median_us": probe}} if probe else {})}}

    _write_time(a, "L1_T001", 10.0, **calls, **ht(20, probe=20.0))  # GPU-bound in both: 1 %
    _write_time(b, "L1_T001", 10.1, **calls, **ht(20, probe=17.0))
    _write_time(a, "L1_T002", 10.0, **calls, **ht(20, probe=20.0))  # custom launch-bound in the second: 30 %
    _write_time(b, "L1_T002", 13.0, **calls, **ht(95, probe=15.0))
    _write_time(a, "L1_T003", 10.0, **calls)  # no launches recorded: unknown
    _write_time(b, "L1_T003", 10.5, **calls)
    rr = spread.run_to_run(a, b)
    rows = {r["tid"]: r for r in rr["rows"]}
    assert [rows[t]["host_bound"] for t in ("L1_T001", "L1_T002", "L1_T003")] == [[], ["custom"], None]
    assert rr["bound"]["unknown"] == 1
    assert rr["bound"]["gpu"] == {"n": 1, "median": pytest.approx(0.01), "max": pytest.approx(0.01), "within": 1}
    assert rr["bound"]["host"] == {"n": 1, "median": pytest.approx(0.3), "max": pytest.approx(0.3), "within": 0}
    assert rr["probe_ratio"] == {"n": 2, "median": pytest.approx((0.85 + 0.75) / 2)}
    text = spread.render_run_to_run(rr, "a", "b", with_targets=True)
    assert ("GPU-bound on both sides 1: median 1.0 %, max 1.0 %, 1 within ±15 %; host-bound 1: median 30.0 %, "
            "max 30.0 %, 0 within ±15 %; 1 whose results do not record their launches") in text
    assert "targets over the GPU-bound tasks only: median ≤ 5 %: met (1.0 %); ≥ 90 % within ±15 %: met (1 of 1" in text
    assert "second run over first (median over 2 tasks): 0.800×" in text
    assert "| Host-bound side" in text and "| custom " in text and "0.75×" in text
    for c in (a, b):
        (c / "time" / "paper" / "default" / "L1_T001.json").unlink()
        (c / "time" / "paper" / "default" / "L1_T002.json").unlink()
    text = spread.render_run_to_run(spread.run_to_run(a, b), "a", "b")
    assert "bounds the timed calls" not in text and "CPU probe" not in text and "Host-bound side" not in text


def test_targets_of_two_runs_met_and_not(tmp_path):
    """The run-to-run targets, each on its own: median, share within ±15 %, stalls."""
    rr = {"n": 20, "within": 18, "median": 0.05, "stalled_per_1000": [0.5, 0.0], "tol": 0.15}
    assert [ok for *_, ok in spread.targets(rr)] == [True, True, True]
    assert spread.render_targets(rr).endswith("**all met**")
    assert [ok for *_, ok in spread.targets(rr | {"median": 0.051})] == [False, True, True]
    assert [ok for *_, ok in spread.targets(rr | {"within": 17})] == [True, False, True]
    assert [ok for *_, ok in spread.targets(rr | {"stalled_per_1000": [0.0, 0.51]})] == [True, True, False]
    line = spread.render_targets(rr | {"within": 17})
    assert "≥ 90 % within ±15 %: NOT met (17 of 20, 85 %)" in line and line.endswith("**not all met**")
    assert [ok for *_, ok in spread.targets({"n": 0, "within": 0, "median": None})] == [False, False, False]


def test_the_targets_line_is_opt_in(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _write_time(a, "L1_T001", 1.0)
    _write_time(b, "L1_T001", 1.02)
    assert spread.main(["repeat", str(a), str(b)]) == 0
    assert "run-to-run targets" not in capsys.readouterr().out
    assert spread.main(["repeat", str(a), str(b), "--targets"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[7].startswith("* the run-to-run targets") and out[7].endswith("**all met**")


def test_each_run_says_its_gpu_and_timing_version_and_targets_are_not_judged_across_gpus(tmp_path, capsys):
    """Two trees timed on different GPU models: the page says so, and the run-to-run targets
    (two runs on one GPU) are not judged, however close the scores."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    h200 = {"provenance": {"gpu": "NVIDIA H200"}, "timing_design": 4}  # the older key
    h100 = {"provenance": {"gpu": "NVIDIA H100 80GB HBM3"}, "timing_version": 7}
    _write_time(a, "L1_T001", 1.0, **h200)
    _write_time(b, "L1_T001", 1.0, **h100)
    _write_time(c, "L1_T001", 1.0, **h200)
    rr = spread.run_to_run(a, b)
    assert rr["machines"] == [{"gpus": ["NVIDIA H200"], "versions": [4]},
                              {"gpus": ["NVIDIA H100 80GB HBM3"], "versions": [7]}]
    assert spread.same_gpu(rr) is False
    assert [ok for *_, ok in spread.targets(rr)] == [False, False, False]
    assert spread.main(["repeat", str(a), str(b), "--targets"]) == 0
    out = capsys.readouterr().out
    assert ("* measured on: first NVIDIA H200, timing version 4; second NVIDIA H100 80GB HBM3, timing version 7 "
            "(**different GPUs**") in out
    assert "run-to-run targets: **not judged** (the runs timed on different GPUs)" in out
    # the same GPU model: judged as before, and no warning
    assert spread.main(["repeat", str(a), str(c), "--targets"]) == 0
    out = capsys.readouterr().out
    assert "first NVIDIA H200, timing version 4; second NVIDIA H200, timing version 4\n" in out
    assert "**all met**" in out and "different GPUs" not in out
    # results without provenance say nothing, and are judged
    rr = spread.run_to_run(tmp_path / "x", tmp_path / "y")
    assert spread.same_gpu(rr) is None and spread.render_machines(rr) is None


def test_spreads_count_per_task_how_often_its_score_moved(tmp_path, capsys):
    """Three pairs: L1_T001 moves 20 % in two of them, L1_T002 in none; a pair across GPUs is
    refused; the JSON note flags only tasks over the tolerance in two pairs (tables)."""
    trees = {name: tmp_path / name for name in ("a", "b", "c", "d", "x")}
    for name, (s1, s2) in {"a": (1.0, 2.0), "b": (1.2, 2.02), "c": (1.0, 2.0), "d": (1.0, 2.0),
                           "x": (1.0, 2.0)}.items():
        gpu = {"provenance": {"gpu": "NVIDIA H100 80GB HBM3" if name == "x" else "NVIDIA H200"}}
        _write_time(trees[name], "L1_T001", s1, **gpu)
        _write_time(trees[name], "L1_T002", s2, **gpu)
    _write_time(trees["d"], "L1_T001", 1.2, provenance={"gpu": "NVIDIA H200"})
    note = spread.spread_list([(trees["a"], trees["b"]), (trees["a"], trees["c"]), (trees["c"], trees["d"])])
    assert note["tasks"] == {"L1_T001": {"pairs": 3, "over": 2, "max_rel_diff": 0.2},
                             "L1_T002": {"pairs": 3, "over": 0, "max_rel_diff": 0.01}}
    with pytest.raises(ValueError, match="different GPUs"):
        spread.spread_list([(trees["a"], trees["x"])])
    assert spread.main(["spreads", str(trees["a"]), str(trees["b"]), str(trees["a"])]) == 2
    assert "pairs are needed" in capsys.readouterr().err
    assert spread.main(["spreads", str(trees["a"]), str(trees["b"])]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"]["L1_T001"]["over"] == 1
