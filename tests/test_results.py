"""l1bench.results: the one definition of a result, its statuses and flags, and of which jobs
need a worker."""

import json
from pathlib import Path

import pytest
from helpers import ROOT

from l1bench import preflight
from l1bench.aggregate import conventions as agg_conventions
from l1bench.aggregate import slices as agg_slices
from l1bench.aggregate import stats as agg_stats
from l1bench.job import stamped
from l1bench.results import (
    AGREEMENT,
    BROKEN_STATUSES,
    FAILED_STATUSES,
    NOT_RUN_STATUSES,
    Flag,
    NoWorker,
    Status,
    TaskResult,
    carried_forward,
    no_worker_needed,
    stage_result,
)

H100 = ROOT / "results" / "h100"


def committed_results() -> list[Path]:
    return sorted(
        [*H100.glob("build/L*_T*.json"), *H100.glob("check/L*_T*.json"), *H100.glob("time/*/*/L*_T*.json")]
    )


def test_every_committed_result_has_a_known_status_and_flags():
    """Every build, check and time result of results/h100 has a :class:`Status` and its flags
    are :class:`Flag` names."""
    paths = committed_results()
    kinds = {p.relative_to(H100).parts[0] for p in paths}
    assert kinds == {"build", "check", "time"} and len(paths) > 1000
    for path in paths:
        data = json.loads(path.read_text())
        assert Status(data["status"]) == data["status"], path
        for f in data.get("flags", []):
            assert Flag(f["flag"]) == f["flag"], path


def _old_result(job, status, reason="", **extra):
    """A result as the worker made it before TaskResult (reason already one line)."""
    out = {"kind": job["kind"], "tid": job["tid"], "status": status, "reason": reason}
    for key in ("mode", "protocol"):
        if job.get(key):
            out[key] = job[key]
    if job["kind"] == "time":
        out.update(score=None, score_std=None, n_timings=0)
    if job["kind"] in ("check", "time"):
        out["flags"] = []
    out.update(extra)
    return out


@pytest.mark.parametrize(
    "job, status, extra",
    [
        ({"kind": "build", "tid": "L1_T001"}, "ok", {"build_s": 0.0, "extensions": []}),
        ({"kind": "build", "tid": "L1_T001"}, "no_code", {}),
        ({"kind": "check", "tid": "L1_T002"}, "pass", {"trials_passed": 5, "flags": [{"flag": "X", "reason": "r"}]}),
        ({"kind": "check", "tid": "L1_T002"}, "lazy", {"lock_held_s": 1.0}),
        ({"kind": "time", "tid": "L1_T003", "mode": "cudnn", "protocol": "strict"}, "ok", {"score": 2.0}),
        ({"kind": "time", "tid": "L1_T003", "mode": "default", "protocol": "paper"}, "crashed", {"n_timings": 3}),
        ({"kind": "time", "tid": "L1_T003", "mode": "", "protocol": None}, "incorrect", {}),
    ],
)
def test_the_job_stamps_the_same_dict_as_the_worker_made_before(job, status, extra):
    """What a stage found (plain data, through the worker's JSON or not) stamped where the job
    enters is the result the worker stamped itself before."""
    found = stage_result(status, "why", **extra)
    assert "kind" not in found and "tid" not in found  # no job below the job's entry
    old = _old_result(job, status, "why", **extra)
    for new in (stamped(job, found), stamped(job, json.loads(json.dumps(found)))):
        assert new == old and list(new) == list(old)  # same keys, same order
        assert type(new["status"]) is str and json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True)


def test_a_reason_is_one_line_once_stamped():
    found = stage_result("runtime_error", "first line\n  second " + "x" * 400)
    reason = stamped({"kind": "check", "tid": "L1_T001"}, found)["reason"]
    assert "\n" not in reason and len(reason) == 300 and reason.startswith("first line second x")


def test_status_and_flag_are_their_strings():
    assert Status.OK == "ok" and "ok" in {Status.OK} and Status.OK in {"ok"} and {"ok": 1}[Status.OK] == 1
    assert f"{Status.NO_CODE}" == str(Status.NO_CODE) == "no_code"
    assert f"`{Flag.TIMING_OUTLIER}`" == "`TIMING_OUTLIER`" and ";".join([Flag.LAZY, "X"]) == "LAZY;X"
    assert json.dumps({"status": Status.PASS, "flag": Flag.LAZY}) == '{"status": "pass", "flag": "LAZY"}'
    with pytest.raises(ValueError):
        TaskResult("check", "L1_T001", "no_such_status")


def test_one_vocabulary():
    """The statuses and flags the modules use are the enums' (and the groups are disjoint)."""
    assert {s.value for s in FAILED_STATUSES | NOT_RUN_STATUSES} <= {s.value for s in Status}
    assert not FAILED_STATUSES & NOT_RUN_STATUSES
    assert set(Status) - FAILED_STATUSES - NOT_RUN_STATUSES == {Status.OK, Status.PASS}
    assert agg_conventions.FAILED_STATUSES is FAILED_STATUSES and agg_conventions.NOT_RUN_STATUSES is NOT_RUN_STATUSES
    assert BROKEN_STATUSES <= FAILED_STATUSES
    assert agg_stats.AGREEMENT == agg_slices.agreement.__defaults__[0] == AGREEMENT == 0.15
    assert agg_conventions.status_class(Status.NO_CODE) == agg_conventions.status_class("no_code") == "not_run"
    assert agg_conventions.status_class("crashed") == "failed" and agg_conventions.status_class("ok") == "measured"


@pytest.mark.parametrize(
    "kind, facts, why",
    [
        ("build", {}, None),
        ("build", {"has_code": False}, NoWorker.NO_CODE),
        ("build", {"builds_extensions": False}, NoWorker.NOTHING_TO_BUILD),
        ("build", {"builds_extensions": True}, None),
        ("build", {"builds_extensions": None}, None),  # no custom file: the worker decides
        ("build", {"has_code": False, "builds_extensions": False}, NoWorker.NO_CODE),
        ("build", {"given_up": True}, NoWorker.GAVE_UP),
        ("build", {"builds_extensions": False, "given_up": True}, NoWorker.NOTHING_TO_BUILD),
        ("build", {"upstream_status": "compile_error"}, None),  # a build has no earlier stage
        ("check", {}, None),
        ("check", {"upstream_status": "ok"}, None),
        ("check", {"upstream_status": "compile_error"}, NoWorker.UPSTREAM),
        ("check", {"upstream_status": "no_code"}, NoWorker.UPSTREAM),
        ("check", {"upstream_status": "pass"}, NoWorker.UPSTREAM),  # a check's build is "ok"
        ("check", {"builds_extensions": False}, None),  # only builds: nothing to build
        ("check", {"has_code": False, "upstream_status": "compile_error"}, NoWorker.NO_CODE),
        ("check", {"upstream_status": "incorrect", "given_up": True}, NoWorker.UPSTREAM),
        ("check", {"given_up": True}, NoWorker.GAVE_UP),
        ("time", {"upstream_status": "pass"}, None),
        ("time", {"upstream_status": "ok"}, NoWorker.UPSTREAM),
        ("time", {"upstream_status": "incorrect"}, NoWorker.UPSTREAM),
        ("time", {"upstream_status": "pass", "given_up": True}, NoWorker.GAVE_UP),
        ("time", {"has_code": False, "given_up": True}, NoWorker.NO_CODE),
    ],
)
def test_which_jobs_need_a_worker(kind, facts, why):
    assert no_worker_needed(kind, **facts) is why
    # facts given as functions: the same decision
    assert no_worker_needed(kind, **{k: (lambda v=v: v) for k, v in facts.items()}) is why


def test_facts_are_read_only_when_they_decide():
    def never():
        raise AssertionError("read although the decision was made")

    assert no_worker_needed("time", has_code=False, upstream_status=never, given_up=never) is NoWorker.NO_CODE
    assert no_worker_needed("build", builds_extensions=False, given_up=never) is NoWorker.NOTHING_TO_BUILD
    why = no_worker_needed("check", builds_extensions=never, upstream_status="lazy", given_up=never)
    assert why is NoWorker.UPSTREAM


def test_the_three_callers_agree(tmp_path):
    """l1bench.job (the result it writes without a worker), the workflow's GPU guard
    (preflight.decided_without_gpu) and the worker's carried-forward result decide alike."""
    from l1bench.job import without_worker

    res = tmp_path / "results/h100"
    task = res / "tasks/L1_T001"
    task.mkdir(parents=True)
    (task / "meta.json").write_text(json.dumps({"snippets": {"ref": {"file": "ref.py", "sha256": "a"},
                                                             "custom": {"file": "custom.py", "sha256": "b"}}}))
    build = res / "build/L1_T001.json"
    build.parent.mkdir(parents=True)
    check_out = res / "check/L1_T001.json"
    job = {"kind": "check", "tid": "L1_T001", "task_dir": str(task), "build_result": str(build)}
    for status, decided in (("ok", False), ("compile_error", True), ("no_code", True)):
        build.write_text(json.dumps({"kind": "build", "status": status, "reason": "r"}))
        got = without_worker(job, [], 0)
        assert (got is not None) == decided == preflight.decided_without_gpu(check_out, res)
        assert (carried_forward(job) is not None) == decided
        if decided:
            assert got["status"] == status and got["provenance"]["worker"] is False
    # given up after 2 broken attempts (the build is fine)
    broken = [{"when": "2026-12-01T00:00:00+00:00", "kind": "timeout", "error": "timed out after 9 s"}] * 2
    build.write_text(json.dumps({"kind": "build", "status": "ok", "reason": ""}))
    assert without_worker(job, broken, 2)["status"] == "timeout"
    assert without_worker(job, broken, 3) is None
    # no custom code: decided from meta.json (the job, the worker) or the release (the guard)
    (task / "meta.json").write_text(json.dumps({"snippets": {"ref": {"file": "ref.py", "sha256": "a"}}}))
    assert without_worker(job, [], 0)["status"] == "no_code"
    assert preflight.decided_without_gpu(check_out, res, no_code_tids={"L1_T001"})
    # a build without extensions needs no worker; with one, it does
    bjob = {"kind": "build", "tid": "L1_T001", "task_dir": str(task)}
    (task / "meta.json").write_text(json.dumps({"snippets": {"custom": {"file": "custom.py", "sha256": "b"}}}))
    (task / "custom.py").write_text("class ModelNew:\n    pass\n")
    assert without_worker(bjob, [], 0)["reason"].endswith("nothing to build")
    (task / "custom.py").write_text("from torch.utils.cpp_extension import load_inline\n")
    assert without_worker(bjob, [], 0) is None


def test_each_results_tree_has_its_own_job_logs():
    from l1bench.io import logs_dir

    assert logs_dir("results/h100") == "logs/h100"  # the default tree: unchanged
    assert logs_dir("results/spread/s1/h100") == "logs/spread/s1/h100"
    assert logs_dir("results/retime/h100") != logs_dir("results/h100")
    assert logs_dir("/tmp/x/h100") == "logs/tmp/x/h100"
    assert logs_dir("../elsewhere/h100") == "logs/elsewhere/h100"


def test_every_list_of_stages_derives_from_the_record():
    """One record a stage (results.STAGES): the order, the rules, the earlier stages, the GPU's."""
    from l1bench import failed, hooks, lastline, staleness
    from l1bench.results import STAGES, UPSTREAM

    assert [s.rule for s in STAGES] == list(lastline.EVALUATION_RULES) == ["build_task", "check_task", "time_task"]
    assert failed.STAGES == ("build", "check", "time")
    assert UPSTREAM == {"check": ("build", Status.OK), "time": ("check", Status.PASS)}
    assert staleness.EVALUATION_RULES == (*lastline.EVALUATION_RULES, "scan_references")
    assert preflight.WHY["build_task"] == "broke (timeout, crash)"
    on_gpu = "broke (timeout, crash, CUDA fault, out of memory)"
    assert preflight.WHY["check_task"] == preflight.WHY["time_task"] == on_gpu
    planned = [("build_task", ["b"]), ("check_task", ["c"]), ("time_task", ["t"]), ("aggregate_results", ["a"])]
    assert hooks.gpu_job_outputs(planned) == (["c", "t"], {"b", "c", "t", "a"})
