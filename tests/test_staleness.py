"""What reruns is decided in one place, read-only, from what each result records
(l1bench.staleness)."""

import json
from pathlib import Path

import pytest

from l1bench import release as rel
from l1bench import staleness

PAPER = {"seed": 42, "outer_trials": 7}
BUILD = {"construct_on_cpu": True, "cuda_arch_list": "", "max_jobs": 2}
SNIPPETS = {"ref": "r" * 64, "custom": "c" * 64}


def expected(kind, protocol, mode, paper=PAPER, build=BUILD):
    if kind == "build":
        return {"params": staleness.build_params(build)}
    return {"params": dict(paper), "settings": {"strict": {"min_reps": 10}} if protocol == "strict" else {}}


def write(res, rel_path, **fields):
    path = Path(res) / rel_path
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = Path(rel_path).parts
    base = {"kind": parts[0], "tid": Path(rel_path).stem, "status": "ok", "snippet_sha256": dict(SNIPPETS)}
    if parts[0] == "time":
        base |= {"protocol": parts[1], "mode": parts[2], "timing_version": staleness.TIMING_VERSION}
    base["params"] = staleness.build_params(BUILD) if parts[0] == "build" else dict(PAPER)
    base.update(fields)
    path.write_text(json.dumps(base))
    return path


def tree(tmp_path):
    res = tmp_path / "results/demo"
    build = write(res, "build/L1_T001.json")
    check = write(res, "check/L1_T001.json", settings={},
                  upstream_sha256=staleness.sha256_bytes(build.read_bytes()))
    time = write(res, "time/paper/default/L1_T001.json", settings={},
                 upstream_sha256=staleness.sha256_bytes(check.read_bytes()))
    return res, build, check, time


def judge(res, tasks=None, **kw):
    tasks = {"L1_T001": dict(SNIPPETS)} if tasks is None else tasks
    return staleness.Judge(res, tasks, "f" * 64, kw.pop("expected", expected), **kw)


def test_results_that_match_the_plan_are_current(tmp_path):
    res, build, check, time = tree(tmp_path)
    j = judge(res)
    assert [j.reason(p) for p in (build, check, time)] == [None, None, None]
    assert j.reason(res / "time/paper/default/L1_T002.json") is None  # missing: Snakemake plans it


def test_a_task_code_change_makes_its_results_stale_and_no_other_task(tmp_path):
    res, build, check, time = tree(tmp_path)
    other = write(res, "build/L1_T002.json")
    j = judge(res, {"L1_T001": SNIPPETS | {"custom": "d" * 64}, "L1_T002": dict(SNIPPETS)})
    assert j.reason(build) == "task code changed in the release (custom)"
    assert j.reason(check) == j.reason(build)
    assert j.reason(other) is None


def test_a_build_change_makes_its_check_and_time_stale_and_speed_settings_do_not(tmp_path):
    res, build, check, time = tree(tmp_path)
    j = judge(res, expected=lambda k, p, m: expected(k, p, m, build=BUILD | {"cuda_arch_list": "9.0"}))
    assert j.reason(build) == "protocol parameters changed (cuda_arch_list)"
    assert j.reason(check).startswith("its build is stale (protocol parameters changed")
    assert j.reason(time).startswith("its check is stale (its build is stale")
    j = judge(res, expected=lambda k, p, m: expected(k, p, m, build=BUILD | {"max_jobs": 16}))
    assert j.reason(build) is None


def test_a_protocol_parameter_makes_checks_and_times_stale(tmp_path):
    res, build, check, time = tree(tmp_path)
    j = judge(res, expected=lambda k, p, m: expected(k, p, m, paper=PAPER | {"outer_trials": 5}))
    assert j.reason(build) is None
    assert j.reason(check) == "protocol parameters changed (outer_trials)"
    assert j.reason(time) == "protocol parameters changed (outer_trials)"


def test_the_timing_version_and_the_earlier_stage_are_compared(tmp_path):
    res, build, check, time = tree(tmp_path)
    old = write(res, "time/paper/cudnn/L1_T001.json", timing_design=5)
    assert judge(res).reason(old) == f"timed by timing version 5, current is {staleness.TIMING_VERSION}"
    for design in (4, 7):  # results of earlier versions, whatever their field, are stale
        again = write(res, "time/paper/cudnn/L1_T001.json", timing_design=design)
        assert judge(res).reason(again) == f"timed by timing version {design}, current is {staleness.TIMING_VERSION}"
    assert judge(res).reason(write(res, "time/paper/cudnn/L1_T001.json", timing_version=7)).startswith("timed by")
    assert judge(res).reason(write(res, "time/paper/cudnn/L1_T001.json")) is None
    build.write_text(build.read_text().replace('"ok"', '"failed"'))  # remade since the check
    assert judge(res).reason(check) == "its build result changed since"
    build.unlink()
    assert judge(res).reason(check) == "its build result is to be made"
    assert judge(res, forced=lambda: {"check_task"}).reason(time) == "its check is forced"
    on_gpu = write(res, "check/L1_T001.json", params=dict(PAPER) | {"inputs_on_device": True})
    assert judge(res).reason(on_gpu).startswith("inputs drawn on the GPU")


def test_without_the_release_on_disk_the_release_fingerprint_decides(tmp_path):
    res, build, check, time = tree(tmp_path)
    legacy = write(res, "build/L1_T003.json", snippet_sha256=None, release_fingerprint="f" * 64)
    assert judge(res, tasks={}).reason(legacy) is None
    legacy = write(res, "build/L1_T003.json", snippet_sha256=None, release_fingerprint="e" * 64)
    assert judge(res, tasks={}).reason(legacy) == "made from another release"


def test_hand_edited_snippets_are_named(tmp_path):
    task = rel.Task(level=1, task=1, ref_code="ref\n", custom_code="custom\n")
    folder = tmp_path / "tasks/L1_T001"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    (folder / "ref.py").write_text("ref\n")
    (folder / "custom.py").write_text("custom\n")
    j = judge(tmp_path)
    assert j.split_reason(tmp_path / "tasks", [task]) is None
    (folder / "custom.py").write_text("edited\n")
    j = judge(tmp_path)
    assert j.split_reason(tmp_path / "tasks", [task]) == "L1_T001/custom.py differs from the release: re-split from it"


def test_the_tables_are_stale_when_a_result_is_or_their_inputs_differ(tmp_path):
    res, build, check, time = tree(tmp_path)
    outputs = [res / "scores.csv"]
    outputs[0].write_text("x")
    record = res / "tables_inputs.json"
    record.write_text(json.dumps({"sha256": "abc"}))
    j = judge(res)
    assert j.tables_reason(outputs, [check, time], record, lambda: "abc") is None
    assert j.tables_reason(outputs, [check, time], record, lambda: "abd") == (
        "the results differ from those the tables were made from")
    missing = res / "time/paper/cudnn/L1_T001.json"
    assert j.tables_reason(outputs, [check, missing], record, lambda: "abc") == f"{missing} is to be made"
    stale = judge(res, expected=lambda k, p, m: expected(k, p, m, paper={"outer_trials": 5}))
    assert stale.tables_reason(outputs, [check], record, lambda: "abc") == f"{check} is stale"


@pytest.mark.parametrize(
    "ids, subset, match",
    [
        ([(1, t) for t in range(1, 100)] + [(2, t) for t in range(1, 101)], False,
         r"1 task\(s\) missing from levels \[1, 2\]: 1/100"),
        ([(1, t) for t in range(1, 101)] + [(4, 1)], False, "task ids outside KernelBench's levels: 4/1"),
        ([(1, t) for t in range(1, 50)], True, None),
        ([(1, t) for t in range(1, 101)], False, None),
    ],
)
def test_a_release_with_missing_tasks_stops_unless_a_subset_is_asked_for(ids, subset, match):
    tasks = [rel.Task(level=lv, task=tk, ref_code="r", custom_code="c") for lv, tk in ids]
    if match is None:
        staleness.check_release_complete(tasks, "h100.json", subset)
    else:
        with pytest.raises(rel.ReleaseError, match=match):
            staleness.check_release_complete(tasks, "h100.json", subset)


def test_a_job_refuses_a_snippet_whose_sha256_differs_from_the_release(tmp_path):
    """The job (l1bench.job) checks the task folder against the snippet hashes the plan passes:
    a hand-edited snippet never runs under the release's hash."""
    from l1bench.job import snippets_to_run
    from l1bench.snippet import sha256_text

    folder = tmp_path / "L1_T001"
    folder.mkdir()
    (folder / "ref.py").write_text("ref\n")
    (folder / "custom.py").write_text("custom\n")
    want = {"ref": sha256_text("ref\n"), "custom": sha256_text("custom\n")}
    assert snippets_to_run(folder, want) == want
    (folder / "custom.py").write_text("edited\n")
    with pytest.raises(SystemExit, match=r"custom\.py: differs from the release \(edited by hand\?\)"):
        snippets_to_run(folder, want)
