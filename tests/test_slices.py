"""A task selection measured next to published (l1bench.aggregate.slices), and the tables'
RUN_SPREAD flag from a run-to-run spread list: pure functions on small tables."""

import pandas as pd
import pytest

from l1bench import aggregate as agg
from l1bench.aggregate import slices


def _row(tid, mode, status="ok", measured=None, published=None, protocol="paper", flags=""):
    return {
        "tid": tid,
        "mode": mode,
        "protocol": protocol,
        "status": status,
        "measured": measured,
        "published": published,
        "flags": flags,
        "check_status": "pass" if status == "ok" else status,
    }


def test_tid_of_accepts_both_spellings_and_rejects_others():
    assert slices.tid_of("1/9") == "L1_T009"
    assert slices.tid_of("L3_T044") == "L3_T044"
    with pytest.raises(ValueError, match="expected LEVEL/TASK"):
        slices.tid_of("nine")


def test_agreement_counts_only_tasks_with_both_scores():
    df = pd.DataFrame(
        [
            _row("L1_T001", "default", measured=1.1, published=1.0),  # within 15 %
            _row("L1_T002", "default", measured=2.0, published=1.0),  # outside
            _row("L1_T003", "default", measured=1.0, published=None),  # no published score
            _row("L1_T004", "default", status="incorrect", published=3.0),
        ]
    )
    ag = slices.agreement(df, tol=0.15).iloc[0]
    assert (ag.compared, ag.within) == (2, 1)
    assert ag.share == pytest.approx(0.5)
    assert ag.median_ratio == pytest.approx(1.55)


def test_slice_report_shows_status_scores_flags_and_missing_tasks():
    df = pd.DataFrame(
        [
            _row("L1_T001", "default", measured=2.0, published=1.5, flags="SAME_STORAGE;DEGENERATE_TASK"),
            _row("L1_T001", "default", measured=1.9, published=1.5, protocol="strict", flags="DEGENERATE_TASK"),
            _row("L1_T009", "default", status="lazy", published=25.0),
        ]
    )
    text = slices.slice_report(df, ["L1_T001", "L1_T009", "L2_T005"], title="t")
    line = next(x for x in text.splitlines() if x.startswith("| L1_T001"))
    assert "2.00 (1.50)" in line and "1.90 (1.50)" in line
    assert line.count("DEGENERATE_TASK") == 1 and "SAME_STORAGE" in line
    assert "| L1_T009 | lazy" in text
    assert "No result at all for: L2_T005" in text


def test_cli_reports_a_bad_task_file_in_one_line(tmp_path, capsys):
    bad = tmp_path / "tasks.yaml"
    bad.write_text("modes: [default]\n")
    csv = tmp_path / "scores.csv"
    pd.DataFrame([_row("L1_T001", "default", measured=1.0, published=1.0)]).to_csv(csv, index=False)
    assert slices.main([str(csv), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slices:") and "no 'tasks:' list" in err and "\n" not in err


def test_run_spread_flags_a_task_that_moved_in_two_pairs_or_more():
    """The spread list (``l1lab spread spreads``, config/curation/<device>/run_spread.json)
    flags RUN_SPREAD on the paper default row of a task over the tolerance in two pairs."""
    note = {"mode": "default", "protocol": "paper", "tol": 0.15,
            "tasks": {"L1_T001": {"pairs": 3, "over": 2, "max_rel_diff": 0.2},
                      "L1_T002": {"pairs": 3, "over": 1, "max_rel_diff": 0.2}}}
    df = pd.DataFrame([
        {"tid": "L1_T001", "mode": "default", "protocol": "paper", "status": "ok", "flags": ""},
        {"tid": "L1_T001", "mode": "default", "protocol": "strict", "status": "ok", "flags": ""},
        {"tid": "L1_T001", "mode": "cudnn", "protocol": "paper", "status": "ok", "flags": ""},
        {"tid": "L1_T002", "mode": "default", "protocol": "paper", "status": "ok", "flags": ""},
    ])
    assert list(agg.add_spread_flags(df, note)["flags"]) == ["RUN_SPREAD", "", "", ""]
    assert agg.add_spread_flags(df, {}).equals(df)
