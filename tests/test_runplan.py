"""The run's plan (l1bench.runplan.RunPlan) and what reruns in it (l1bench.staleness.Reruns),
as the rules ask them: the demo release on disk, an h100 release still to be downloaded, bad
input refused in one line, and each stale subject with its one marker."""

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from l1bench import fetch, plan, staleness
from l1bench.runplan import RunPlan

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "config/config.yaml").read_text())
DEMO_RELEASE = ROOT / "config/demo/optimized_cuda_code/demo.json"


class W(SimpleNamespace):
    """A job's wildcards, as Snakemake gives them (attributes and items())."""

    def items(self):
        return vars(self).items()


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def demo(tmp_path, **config):
    return RunPlan(CONFIG | {"device": "demo", "results_dir": str(tmp_path / "results")} | config)


def test_the_demo_plan_loads_its_release_and_selects_every_task(tmp_path, at_root):
    run = demo(tmp_path, modes=["default", "torch_compile"])
    res = f"{tmp_path}/results/demo"
    assert (run.results, run.backend, run.is_demo) == (res, "cpu", True)
    assert run.logs == f"logs/{str(tmp_path).strip('/')}/results/demo"
    assert len(run.tids) == len(run.all_tids) == len(run.release) == 11 and run.tids[0] == "L1_T001"
    assert run.fingerprint == hashlib.sha256(DEMO_RELEASE.read_bytes()).hexdigest()
    assert run.release_checksums() == {"release": None, "cuda_graph": None, "cudnn": None}
    assert run.evaluation_results()[:2] == [f"{res}/build/L1_T001.json", f"{res}/build/L1_T002.json"]
    assert len(run.evaluation_results()) == 11 * (1 + 1 + 2)
    assert run.result_path("time", W(protocol="paper", mode="cudnn", tid="L2_T001")) == (
        f"{res}/time/paper/cudnn/L2_T001.json"
    )
    assert run.result_path("check", W(tid="L2_T001")) == f"{res}/check/L2_T001.json"
    assert run.timeout("gpu_section") == 10 and run.evaluation_threads == 1
    assert run.all_targets() == run.task_paths("check") + run.task_paths("time") + run.report_outputs()


def test_the_rules_callables_apply_the_plan_to_a_job(tmp_path, at_root):
    run = demo(tmp_path, protocol="both", gpu_slots=None)
    job = W(protocol="strict", mode="torch_compile", tid="L3_T001")
    assert run.time_priority(job) == plan.time_priority("strict", "torch_compile", "L3_T001")
    assert run.check_priority(job) == plan.check_priority("L3_T001", run.modes)
    assert run.build_priority(job) == 31 and run.compile_slots(job) == 1
    assert run.strict_params(job) == plan.strict_params("strict", CONFIG["strict"])
    assert run.ext_dir(job) == f"{run.results}/build/ext/L3_T001"
    assert run.evaluation_params("check")["release"] == run.fingerprint
    assert run.gpu_slots(job) == 1  # no bound on the run's GPU slots


def test_a_release_still_to_be_downloaded_plans_kernelbenchs_tasks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = RunPlan(CONFIG | {"device": "h100"}, gpu_slots=SimpleNamespace(value=8))
    assert run.release is None and len(run.all_tids) == 250 and run.backend == "cuda"
    assert run.fingerprint == fetch.PINNED_SHA256["optimized_cuda_code/h100.json"]
    assert run.gpu_slots_total == 8 and run.evaluation_threads == 0
    assert run.release_inputs()["release"].startswith("resources/cuda-l1/")


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({"release_dir": "nope"}, "release_dir=nope: no such folder"),
        ({"levels": [3], "tasks": []}, "config: the task selection (levels, tasks) matches no task of the release"),
        ({"slice_reports": ["nope.yaml"]}, "config slice_reports: nope.yaml: no such file"),
        ({"results_dir": "README.md"}, "results_dir=README.md: README.md is a file, not a folder"),
        ({"results_dir": "README.md/mine"}, "results_dir=README.md/mine: README.md is a file, not a folder"),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path, at_root, config, error):
    with pytest.raises(plan.PlanError) as err:
        demo(tmp_path, **config)
    assert str(err.value).startswith(error) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- what reruns


def write(path, record):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record))
    return str(path)


def settings(forcerun=(), forceall=False, triggers=("MTIME",)):
    """Snakemake's DAG settings as staleness.forced_rules reads them."""
    return SimpleNamespace(forcerun=list(forcerun), forceall=forceall,
                           rerun_triggers=[SimpleNamespace(name=t) for t in triggers])


@pytest.fixture
def stale_check(tmp_path, at_root):
    """The demo plan, L1_T001 built, its check made with other protocol parameters."""
    run = demo(tmp_path, modes=["default"], tasks=["1/1", "1/2"])
    write(f"{run.results}/build/L1_T001.json", {"kind": "build", "tid": "L1_T001"})
    check = write(f"{run.results}/check/L1_T001.json",
                  {"kind": "check", "tid": "L1_T001", "params": {"outer_trials": 99}})
    return run, check


def test_a_stale_result_has_its_reason_and_one_marker(stale_check):
    run, check = stale_check
    reruns = staleness.Reruns(run)
    assert reruns.subject(check) == "check/L1_T001"
    assert reruns.reason("check/L1_T001") == "protocol parameters changed (outer_trials)"
    assert reruns.reason("build/L1_T001") is None and reruns.reason("time/paper/default/L1_T001") is None
    marker = reruns.marker("check/L1_T001")
    assert marker.startswith(f"{run.results}/stale/check/L1_T001.") and len(Path(marker).suffixes[-2]) == 13
    assert reruns.with_marker({"build": "b"}, "check/L1_T001") == {"build": "b", "stale": marker}
    assert reruns.with_marker({"x": "y"}, "build/L1_T001") == {"x": "y"}
    assert reruns.markers() == [marker]  # the tables are missing: made anyway, not stale
    assert reruns.job_runs(check, "check_task") and not reruns.job_runs(f"{run.results}/build/L1_T001.json",
                                                                         "build_task")
    assert reruns.job_runs(f"{run.results}/check/L1_T002.json", "check_task")  # missing
    write(check, {"kind": "check", "tid": "L1_T001", "params": {"outer_trials": 98}})
    assert staleness.Reruns(run).marker("check/L1_T001") != marker  # decided on other content


def test_the_results_after_a_stale_one_are_stale_and_a_forced_rule_makes_them(stale_check, capsys):
    run, check = stale_check
    time = write(f"{run.results}/time/paper/default/L1_T001.json",
                 {"kind": "time", "tid": "L1_T001", "protocol": "paper", "mode": "default"})
    reruns = staleness.Reruns(run)
    assert reruns.reason("time/paper/default/L1_T001").startswith("its check is stale (protocol parameters")
    assert len(reruns.markers()) == 2
    forced = staleness.Reruns(run, lambda: settings(forcerun=["build_task", "aggregate_results"]))
    assert forced.reason("check/L1_T001") == "protocol parameters changed (outer_trials)"
    assert forced.forced == {"build_task", "aggregate_results"}
    assert forced.reason("tables") == "aggregate_results is forced" and forced.tables_made()
    assert forced.markers()[-1] == forced.marker("tables")
    assert capsys.readouterr().err == ""
    assert staleness.Reruns(run, lambda: settings(forceall=True, triggers=("MTIME", "PARAMS"))).forced == {
        "build_task", "check_task", "time_task", "scan_references"}
    assert "note: --rerun-triggers params can redo results" in capsys.readouterr().err
    assert staleness.forced_rules(None) == set()  # --lint: no run
    Path(forced.marker("tables")).parent.mkdir(parents=True)
    forced.clear_markers()
    assert not Path(f"{run.results}/stale").exists() and Path(time).exists()


def test_a_hand_edited_task_folder_is_the_split_marker(tmp_path, at_root):
    from l1bench import split

    run = demo(tmp_path)
    split.split_release(run.release[:2], Path(run.results) / "tasks", run.device, {"path": run.release_path})
    reruns = staleness.Reruns(run)
    assert reruns.reason("tasks") is None and reruns.markers() == []
    custom = Path(f"{run.results}/tasks/L1_T002/custom.py")
    custom.write_text(custom.read_text() + "# edited\n")
    reruns = staleness.Reruns(run)
    assert reruns.reason("tasks") == "L1_T002/custom.py differs from the release: re-split from it"
    assert reruns.markers() == [reruns.marker("tasks"), *run.task_paths("meta", tids=run.all_tids)]
    assert reruns.with_marker({}, "tasks") == {"stale": reruns.marker("tasks")}
