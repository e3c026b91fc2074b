"""Stalled timed calls in paper-protocol results: found, rescored without, flagged when they matter."""

import json

import pytest

from l1bench import aggregate as agg
from l1bench.timing import stalls

PARAMS = {"outer_trials": 7, "early_stop_below": 0.3}
FAST = [0.030, 0.031, 0.029, 0.030, 0.030]


def paper_result(ref_ms, custom_ms, **extra):
    trials = [sum(r) / len(r) / (sum(c) / len(c)) for r, c in zip(ref_ms, custom_ms, strict=False)]
    return {"kind": "time", "protocol": "paper", "mode": "default", "status": "ok", "params": PARAMS,
            "score": sum(trials) / len(trials), "ref_ms": ref_ms, "custom_ms": custom_ms} | extra


def test_rescore_drops_the_pairs_that_hold_a_stalled_call():
    ref = [list(FAST), list(FAST)]
    cus = [[0.015, 0.015, 8.2, 0.015, 0.015], [0.015] * 5]  # one 8.2 ms stall, custom side
    info = stalls.rescore(ref, cus)
    assert info["stalled_calls"] == 1 and info["max_stall_ms"] == pytest.approx(8.185)
    first = (0.030 + 0.031 + 0.030 + 0.030) / 4 / 0.015  # pair 3 dropped
    second = sum(FAST) / 5 / 0.015
    assert info["trial_scores_without"] == pytest.approx([first, second])
    assert info["score_without"] == pytest.approx((first + second) / 2)
    assert stalls.rescore([], []) is None


def test_a_slow_kernel_is_not_a_stall():
    """A 10 ms call 4 ms slower than usual is not 3x its median: not counted."""
    info = stalls.rescore([[10.0, 10.1, 14.0, 10.0]], [[5.0, 5.0, 5.1, 5.0]])
    assert info["stalled_calls"] == 0
    assert stalls.stalled([0.03, 1.2], 0.03) == [False, True]
    assert stalls.stalled([0.03, 0.5], 0.03) == [False, False]  # 16x, but not 1 ms more


def test_the_flag_names_a_stall_that_caused_the_early_stop():
    res = paper_result([list(FAST)], [[0.015, 0.015, 0.015, 8.2, 0.015]])
    assert res["score"] < 0.3  # what the harness's formula made of it: early stop after trial 1
    reason, info = stalls.outlier_flag(res)
    assert "the early stop after trial 1 (score < 0.3) came from them" in reason
    assert "1 timed call(s) stalled by up to 8.2 ms" in reason and info["score_without"] > 1.9


def test_the_flag_needs_a_stall_that_moves_the_score():
    quiet = paper_result([list(FAST)] * 7, [[0.015] * 5] * 7)
    assert stalls.outlier_flag(quiet) is None
    # one stall in 7 trials of 20 ms calls: 3x and 1 ms more, but the score moves by < 10 %
    slow = paper_result([[20.0] * 5] * 7, [[10.0] * 4 + [31.0]] + [[10.0] * 5] * 6)
    assert stalls.rescore(slow["ref_ms"], slow["custom_ms"])["stalled_calls"] == 1
    assert stalls.outlier_flag(slow) is None
    stalled = paper_result([list(FAST)] * 7, [[0.015, 4.2, 0.015, 0.015, 0.015]] + [[0.015] * 5] * 6)
    assert stalls.outlier_flag(stalled) is not None
    assert stalls.outlier_flag(stalled | {"protocol": "strict"}) is None
    assert stalls.outlier_flag(stalled | {"status": "incorrect"}) is None


def test_aggregate_flags_and_rescores_paper_results(tmp_path):
    meta = tmp_path / "tasks/L1_T001/meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"tid": "L1_T001", "level": 1, "task": 1, "device": "h100",
                                "published": {"default": 2.0}}))
    stalled_trial = [0.015, 4.2, 0.015, 0.015, 0.015]
    res = paper_result([list(FAST)] * 7, [stalled_trial] * 2 + [[0.015] * 5] * 5, tid="L1_T001")
    time = tmp_path / "time/paper/default/L1_T001.json"
    time.parent.mkdir(parents=True)
    time.write_text(json.dumps(res))
    df = agg.load_results([meta], [], [time])
    row = df.iloc[0]
    assert row["flags"] == stalls.FLAG and row["stalled_calls"] == 2
    assert row.score_without_stalls == pytest.approx(2.0, rel=0.02) and row.measured < 1.5
    sens = agg.stall_sensitivity(df).iloc[0]
    assert (sens.measured_agree, sens.without_agree, sens.stalled) == (0, 1, 1)
    assert "`TIMING_OUTLIER`" in agg.render_summary_markdown(df)
    row = next(ln for ln in agg.render_summary_markdown(df).splitlines() if ln.startswith("| Default "))
    assert [c.strip() for c in row.split("|")[3:5]] == ["1", "0 → 1"]


def test_flagged_results_lists_the_files_to_retime(tmp_path):
    stalled = paper_result([list(FAST)] * 7, [[0.015, 4.2, 0.015, 0.015, 0.015]] * 2 + [[0.015] * 5] * 5)
    quiet = paper_result([list(FAST)] * 7, [[0.015] * 5] * 7)
    for mode, res in (("default", stalled), ("cudnn", quiet)):
        (tmp_path / "time/paper" / mode).mkdir(parents=True)
        (tmp_path / "time/paper" / mode / "L1_T001.json").write_text(json.dumps(res))
    assert stalls.flagged_results(tmp_path) == [str(tmp_path / "time/paper/default/L1_T001.json")]


def test_aggregate_flags_host_bound_paper_results_and_says_what_the_flag_means(tmp_path):
    """HOST_BOUND from a result's launches (a side launching for >= 80 % of its timed call);
    not on results without launches, on strict ones or on failed ones; the flags' sentence
    names it only where a row carries it."""
    def write(tid, launch_us, proto="paper", status="ok"):
        meta = tmp_path / f"tasks/{tid}/meta.json"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"tid": tid, "level": 1, "task": int(tid[-3:]), "device": "h100",
                                    "published": {"default": 2.0}}))
        res = paper_result([list(FAST)] * 7, [[0.015] * 5] * 7, tid=tid) | {"status": status, "protocol": proto}
        if launch_us is not None:
            res["host_timing"] = {"launch_median_us": {"ref": 5, "custom": launch_us}}
        time = tmp_path / f"time/{proto}/default/{tid}.json"
        time.parent.mkdir(parents=True, exist_ok=True)
        time.write_text(json.dumps(res))
        return meta, time

    files = [write("L1_T001", 14), write("L1_T002", 2), write("L1_T003", None),
             write("L1_T004", 14, proto="strict"), write("L1_T005", 14, status="incorrect")]
    df = agg.load_results([m for m, _ in files], [], [t for _, t in files])
    flags = {(r.tid, r.protocol): r.flags for r in df.itertuples()}
    assert flags[("L1_T001", "paper")] == "HOST_BOUND"
    assert not any(flags[(t, p)] for t, p in [("L1_T002", "paper"), ("L1_T003", "paper"), ("L1_T004", "strict"),
                                              ("L1_T005", "paper")])
    text = agg.render_summary_markdown(df)
    assert "`HOST_BOUND`: a side's median launch is at least 80% of its median timed call" in text
    assert "a published score of such a task also carries the random order of its timed pairs" in text
    assert "| `HOST_BOUND` " in text
    assert "`HOST_BOUND`: a side's" not in agg.render_summary_markdown(df[df.tid != "L1_T001"])
