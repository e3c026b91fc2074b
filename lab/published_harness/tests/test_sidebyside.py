"""The block driver: task order, alternating segments, the deadline, continuing earlier trees."""

import json
from pathlib import Path

import pytest

from published_harness import run, sidebyside
from published_harness.tests.test_run import write_release


def test_the_issues_tasks_come_first_then_the_rest_of_the_list():
    listed = ["L1_T001", "L1_T012", "L2_T001", "L3_T044"]
    assert sidebyside.ordered_tasks(["L2_T001", "L9_T009", "L1_T012"], listed, None) == [
        "L2_T001", "L1_T012", "L1_T001", "L3_T044"]
    assert sidebyside.ordered_tasks(["L2_T001"], listed, 2) == ["L2_T001", "L1_T001"]
    assert sidebyside.selector("L1_T012") == "1/12"


def test_the_first_harness_alternates_between_blocks():
    assert sidebyside.segment_order(0) == [("pub", 1), ("wf", 1), ("pub", 2), ("wf", 2)]
    assert sidebyside.segment_order(1) == [("wf", 1), ("pub", 1), ("wf", 2), ("pub", 2)]
    assert sidebyside.segment_order(1, (2,)) == [("wf", 2), ("pub", 2)]


def test_with_a_pinned_arm_the_arm_that_goes_first_rotates():
    arms = sidebyside.ARMS_PINNED
    assert sidebyside.segment_order(0, (1,), arms) == [("pub", 1), ("pin", 1), ("wf", 1)]
    assert sidebyside.segment_order(1, (1,), arms) == [("pin", 1), ("wf", 1), ("pub", 1)]
    assert sidebyside.segment_order(2, (1, 2), arms)[:3] == [("wf", 1), ("pub", 1), ("pin", 1)]
    assert sidebyside.segment_order(3, (1,), arms) == sidebyside.segment_order(0, (1,), arms)
    assert set(sidebyside.trees("r/s", arms).values()) == {f"r/s-{h}{p}" for h in arms for p in (1, 2)}


def test_the_estimate_learns_from_what_segments_took():
    est = sidebyside.Estimate({"pub_task": 10.0, "pub_build": 30.0, "wf_call": 10.0, "wf_task": 5.0,
                               "wf_build": 40.0})
    assert est.seconds("pub", 3, 1, True) == 60.0 and est.seconds("pub", 3, 1, False) == 30.0
    assert est.seconds("wf", 2, 1, True) == 60.0
    est.record("pub", 3, 0, False, 60.0)  # twice the prior
    assert est.seconds("pub", 3, 0, False) == 60.0 and est.seconds("wf", 2, 0, True) == 20.0


@pytest.fixture()
def setup(tmp_path):
    release = write_release(tmp_path / "h100.json")
    args = sidebyside.parse_args(["--deadline", "1000", "--tasks", "1/1,1/2,1/3,1/5", "--first", "L1_T005",
                                  "--block", "2", "--release", str(release), "--prefix", str(tmp_path / "r" / "sbs"),
                                  "--log-dir", str(tmp_path / "logs")])
    clock = {"t": 0.0}
    calls, pinned = [], []

    def write(tree, blk):
        for tid in blk:
            path = run.result_path(tree, "h100", "default", tid)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"status": "ok", "score": 1.0}))

    def pub(blk, tree, args, deadline, log, cpus=None):
        calls.append(("pub", tree.rsplit("-", 1)[1], tuple(blk)))
        pinned.append((tree.rsplit("-", 1)[1], cpus))
        clock["t"] += 100.0 * len(blk)
        write(tree, blk)

    def wf(blk, all_tids, tree, args, deadline, log):
        calls.append(("wf", tree.rsplit("-", 1)[1], tuple(blk)))
        assert all_tids == ["L1_T005", "L1_T001", "L1_T002", "L1_T003"]
        clock["t"] += 50.0
        write(tree, blk)

    pub.seen_cpus = pinned  # (tree's arm and pass, the CPUs it was pinned to)
    return args, clock, calls, {"pub": pub, "wf": wf}


def test_blocks_alternate_and_stop_before_one_that_does_not_fit(setup, tmp_path):
    args, clock, calls, runners = setup
    # one task a block; the fakes take 100 s a task (published) and 50 s a call (workflow), far
    # above the priors: the estimate learns it (factors 3 and ~1.4 by block 4), so at t = 900
    # block 4 asks ~130 s with 100 s left and is not started
    args.block, args.deadline = 1, 1000
    timeline = sidebyside.drive(args, runners, now=lambda: clock["t"])
    assert calls[:8] == [("pub", "pub1", ("L1_T005",)), ("wf", "wf1", ("L1_T005",)), ("pub", "pub2", ("L1_T005",)),
                         ("wf", "wf2", ("L1_T005",)), ("wf", "wf1", ("L1_T001",)), ("pub", "pub1", ("L1_T001",)),
                         ("wf", "wf2", ("L1_T001",)), ("pub", "pub2", ("L1_T001",))]
    assert len(calls) == 12 and clock["t"] == 900
    assert timeline[-1] == {"block": 4, "note": timeline[-1]["note"]} and "100 s left" in timeline[-1]["note"]
    tsv = (tmp_path / "logs" / "timeline.tsv").read_text().splitlines()
    assert tsv[0].startswith("block\tharness\tpass") and len(tsv) == 1 + 12


def test_a_short_deadline_starts_nothing(setup):
    args, clock, calls, runners = setup
    args.deadline = 100
    timeline = sidebyside.drive(args, runners, now=lambda: clock["t"])
    assert calls == [] and timeline[0]["note"].startswith("not started")


def test_the_estimate_starts_from_what_the_timeline_already_holds(setup, tmp_path):
    """A later pass or call of the same trees starts from the factors of the segments before it:
    fresh priors would start a block the node cannot finish before the deadline."""
    args, clock, calls, runners = setup
    args.block, args.deadline = 1, 100
    assert sidebyside.Estimate().seconds("pub", 1, 0, True) + sidebyside.Estimate().seconds("wf", 1, 0, True) < 100
    tsv = tmp_path / "logs" / "timeline.tsv"
    tsv.parent.mkdir(parents=True)
    tsv.write_text("block\tharness\tpass\ttasks\tstart\tend\tseconds\tnote\n"
                   "1\tpub\t1\tL1_T002\t0\t18\t18.0\t\n1\twf\t1\tL1_T002\t18\t90\t72.0\t\n")
    timeline = sidebyside.drive(args, runners, now=lambda: clock["t"])
    assert calls == [] and timeline[0]["note"].startswith("not started")


def test_a_pinned_arm_runs_the_published_harness_pinned_into_trees_of_its_own(setup):
    args, clock, calls, runners = setup
    args.deadline, args.pinned_cpus = 10_000, "15"
    sidebyside.drive(args, runners, now=lambda: clock["t"])
    assert len(calls) == 2 * 6 and {c[1] for c in calls} == {"pub1", "pin1", "wf1", "pub2", "pin2", "wf2"}
    assert set(runners["pub"].seen_cpus) == {("pub1", None), ("pub2", None), ("pin1", "15"), ("pin2", "15")}
    assert [c[1] for c in calls[6:9]] == ["pin1", "wf1", "pub1"]  # block 2 starts with the second arm
    calls.clear()
    sidebyside.drive(args, runners, now=lambda: clock["t"])
    assert calls == []


def test_tasks_done_in_all_four_trees_are_left_out(setup):
    args, clock, calls, runners = setup
    args.deadline = 10_000
    sidebyside.drive(args, runners, now=lambda: clock["t"])
    assert {c[2] for c in calls} == {("L1_T005", "L1_T001"), ("L1_T002", "L1_T003")}
    calls.clear()
    sidebyside.drive(args, runners, now=lambda: clock["t"])
    assert calls == []



def test_a_segment_cut_short_is_finished_alone_by_the_next_call(setup):
    """A deadline that stops the published harness's arm after some of a block's tasks leaves
    the other arms' results of the block standing: the next call runs only what each tree lacks."""
    args, clock, calls, runners = setup
    args.deadline, args.passes = 10_000, (1,)
    sidebyside.drive(args, runners, now=lambda: clock["t"])
    cut = run.result_path(args.prefix + "-pub1", "h100", "default", "L1_T003")
    cut.unlink()  # as if the deadline had stopped pub1 before its last task
    calls.clear()
    sidebyside.drive(args, runners, now=lambda: clock["t"])
    assert calls == [("pub", "pub1", ("L1_T003",))]

def test_the_workflow_call_names_the_blocks_targets_the_whole_list_and_extra_config(setup, monkeypatch, tmp_path):
    args, _, _, _ = setup
    args.wf_config = ["paper={outer_trials: 3}"]
    seen = {}

    class Proc:
        pid = 0

        def __init__(self, cmd, **kwargs):
            seen["cmd"] = cmd

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(sidebyside.subprocess, "Popen", Proc)
    with open(tmp_path / "wf.log", "w") as log:
        assert sidebyside.run_workflow(["L1_T002"], ["L1_T001", "L1_T002"], "results/sbs-wf1", args, 1e12, log) == 0
    cmd = seen["cmd"]
    at = cmd.index("--config")
    assert cmd[at - 1] == "results/sbs-wf1/h100/time/paper/default/L1_T002.json"
    assert cmd[at + 1:] == ["device=h100", "release_dir=.release", "results_dir=results/sbs-wf1",
                            'tasks=["1/1", "1/2"]', 'modes=["default"]', "paper={outer_trials: 3}"]


def test_a_call_without_tasks_continues_the_list_recorded_beside_the_trees(setup):
    """The first call records its ordered list; a later call that names no list runs that one,
    not the slice, and one that names a list runs it and records it."""
    args, clock, calls, runners = setup
    args.deadline = 10_000
    sidebyside.drive(args, runners, now=lambda: clock["t"])
    record = Path(f"{args.prefix}-tasks.txt")
    assert record.read_text().split() == ["L1_T005", "L1_T001", "L1_T002", "L1_T003"]
    record.write_text("L1_T002\nL1_T004\n")  # as if an earlier call had measured these two
    later = sidebyside.parse_args(["--deadline", "1", "--release", args.release, "--prefix", args.prefix])
    assert later.tasks is None and sidebyside.task_list(later) == ["L1_T002", "L1_T004"]
    named = sidebyside.parse_args(["--deadline", "1", "--release", args.release, "--prefix", args.prefix,
                                   "--tasks", "1/3", "--first", ""])
    assert sidebyside.task_list(named) == ["L1_T003"] and record.read_text().split() == ["L1_T003"]
