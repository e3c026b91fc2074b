"""What the workflow plans (l1bench.plan): paths, inputs and parameters of its rules, computed
from the config and the selection given as arguments (l1bench.runplan.RunPlan applies them to a
run: tests/test_runplan.py)."""

import hashlib
from pathlib import Path

import pytest
import yaml

from l1bench import fetch, modes, plan
from l1bench import release as rel
from l1bench.results import builds_extensions, no_worker_needed

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "config/config.yaml").read_text())
ALL_MODES = list(modes.NAMES)
TIDS = ["L1_T001", "L2_T003"]


def touch(path, text="{}\n"):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


# --------------------------------------------------------------------------- the selection


def test_protocols_modes_and_strict_modes_of_a_config():
    assert plan.protocols("both") == ["paper", "strict"]
    assert plan.protocols("paper") == ["paper"]
    assert plan.protocols("strict") == ["strict"]
    # the release's order, whatever the config's
    assert plan.modes(["cudnn", "default", "torch_compile"]) == ["default", "torch_compile", "cudnn"]
    assert plan.modes(reversed(CONFIG["modes"])) == CONFIG["modes"]  # the config's in the record's order
    assert plan.strict_modes(ALL_MODES, None) == ALL_MODES
    assert plan.strict_modes(ALL_MODES, []) == ALL_MODES
    assert plan.strict_modes(ALL_MODES, ["cudnn", "default"]) == ["default", "cudnn"]
    # a strict mode the run does not time is not timed strictly
    assert plan.strict_modes(["default"], ["cudnn", "default"]) == ["default"]


def test_the_task_index_selection_and_tasks_without_code():
    class T:
        def __init__(self, level, task, missing=False):
            self.level, self.task, self.custom_missing = level, task, missing

    release = [T(1, 1), T(1, 2, missing=True), T(2, 5)]
    assert plan.task_index(release) == [(1, 1), (1, 2), (2, 5)]
    kernelbench = plan.task_index(None)
    assert len(kernelbench) == 250 and kernelbench[0] == (1, 1) and kernelbench[-1] == (3, 50)
    assert plan.no_code_tids(release) == {"L1_T002"}
    assert plan.no_code_tids(None) == set()
    ids = plan.task_index(release)
    assert plan.selected_tids(ids, [1, 2, 3], []) == ["L1_T001", "L1_T002", "L2_T005"]
    assert plan.selected_tids(ids, [2], []) == ["L2_T005"]
    assert plan.selected_tids(ids, [1, 2], ["2/5", "1/1"]) == ["L1_T001", "L2_T005"]
    with pytest.raises(plan.PlanError, match="matches no task of the release"):
        plan.selected_tids(ids, [3], [])
    with pytest.raises(rel.ReleaseError, match="not in the release"):
        plan.selected_tids(ids, [1], ["3/9"])


# --------------------------------------------------------------------------- the release


def test_where_the_release_is_and_its_checksums():
    commit = CONFIG["upstream"]["commit"]
    assert plan.release_root(True, "my-demo", commit) == "my-demo"  # a demo release of the user's
    assert plan.release_root(True, None, commit) == plan.DEMO_RELEASE
    assert plan.release_root(False, "../shared/cuda-l1", commit) == "../shared/cuda-l1"
    assert plan.release_root(False, None, commit) == f"resources/cuda-l1/{commit}"
    assert plan.release_inputs("config/demo", "demo", True) == {"release": "config/demo/optimized_cuda_code/demo.json"}
    assert plan.release_inputs("rel", "h100", False) == {
        "release": "rel/optimized_cuda_code/h100.json",
        "cuda_graph": "rel/more_baselines/cuda_graph.json",
        "cudnn": "rel/more_baselines/cudnn.json",
    }
    path = plan.release_path("h100")
    assert path == "optimized_cuda_code/h100.json"
    assert plan.expected_sha256(path, False, {}) == fetch.PINNED_SHA256[path]
    assert plan.expected_sha256(path, False, {path: "ab" * 32}) == "ab" * 32
    assert plan.expected_sha256(path, True, {path: "ab" * 32}) is None
    assert plan.expected_sha256("optimized_cuda_code/nope.json", False, {}) is None


def test_a_release_on_disk_is_loaded_checked_or_refused(tmp_path):
    demo = ROOT / "config/demo/optimized_cuda_code/demo.json"
    files = {"release": str(demo)}
    tasks = plan.load_release_files(files, {"release": None})
    assert len(tasks) == 11 and (tasks[0].level, tasks[0].task) == (1, 1)
    sha = hashlib.sha256(demo.read_bytes()).hexdigest()
    assert len(plan.load_release_files(files, {"release": sha})) == 11
    with pytest.raises(fetch.FetchError, match="does not match the pinned"):
        plan.load_release_files(files, {"release": "0" * 64})
    # not on disk (yet): None, the release is fetched and split by the rules
    assert plan.load_release_files({"release": str(tmp_path / "nope.json")}, {}) is None
    # a baseline missing beside the release
    two = {"release": str(demo), "cuda_graph": touch(tmp_path / "cg.json", ""), "cudnn": str(tmp_path / "cudnn.json")}
    with pytest.raises(plan.PlanError, match=r"cudnn\.json: not found \(a release folder holds"):
        plan.load_release_files(two, {})
    bad = {"release": touch(tmp_path / "bad.json", "not json\n")}
    with pytest.raises(rel.ReleaseError):
        plan.load_release_files(bad, {})


# --------------------------------------------------------------------------- result paths


def test_paths_of_each_stage_for_a_selection():
    assert plan.task_paths("R", "meta", TIDS) == ["R/tasks/L1_T001/meta.json", "R/tasks/L2_T003/meta.json"]
    assert plan.task_paths("R", "build", TIDS) == ["R/build/L1_T001.json", "R/build/L2_T003.json"]
    assert plan.task_paths("R", "check", TIDS) == ["R/check/L1_T001.json", "R/check/L2_T003.json"]
    # per protocol, per mode, per task, in that order
    assert plan.task_paths("R", "time", TIDS, ["paper"], ["default", "cudnn"], ["default", "cudnn"]) == [
        "R/time/paper/default/L1_T001.json",
        "R/time/paper/default/L2_T003.json",
        "R/time/paper/cudnn/L1_T001.json",
        "R/time/paper/cudnn/L2_T003.json",
    ]


def test_time_paths_of_both_protocols_with_strict_modes():
    # h100_full: both protocols, strict for default mode only
    paths = plan.task_paths("R", "time", ["L1_T001"], ["paper", "strict"], ALL_MODES, ["default"])
    assert paths == [f"R/time/paper/{m}/L1_T001.json" for m in ALL_MODES] + ["R/time/strict/default/L1_T001.json"]
    # strict alone: only its modes
    assert plan.task_paths("R", "time", ["L1_T001"], ["strict"], ALL_MODES, ["default", "cudnn"]) == [
        "R/time/strict/default/L1_T001.json",
        "R/time/strict/cudnn/L1_T001.json",
    ]
    # a narrower choice of modes, still within each protocol's
    only = ["cudnn", "torch_compile"]
    assert plan.task_paths("R", "time", ["L1_T001"], ["paper", "strict"], ALL_MODES, ["default", "cudnn"], only) == [
        "R/time/paper/cudnn/L1_T001.json",
        "R/time/paper/torch_compile/L1_T001.json",
        "R/time/strict/cudnn/L1_T001.json",
    ]
    # a mode the run does not time is not planned, even when asked for
    assert plan.task_paths("R", "time", ["L1_T001"], ["paper"], ["default"], ["default"], ["cudnn"]) == []
    assert plan.task_paths("R", "time", ["L1_T001"], [], ALL_MODES, ALL_MODES) == []


def test_results_on_disk_are_those_of_known_tasks_in_their_folders(tmp_path):
    res = tmp_path / "results/h100"
    good = [
        touch(res / "check/L1_T001.json"),
        touch(res / "check/L3_T050.json"),
        touch(res / "time/paper/default/L1_T001.json"),
        touch(res / "time/strict/cudnn/L2_T003.json"),
        touch(res / "time/paper/torch_compile/L1_T001.json"),
    ]
    for stray in (
        "check/L1_T001.json.tmp",
        "check/L1_T1.json",
        "check/L9_T001.json",  # not a task of the release
        "check/notes.json",
        "time/other/default/L1_T001.json",  # not a protocol
        "time/paper/eager/L1_T001.json",  # not a mode
        "time/paper/default/sub/L1_T001.json",
        "time/paper/default/L1_T001.log",
        "build/L1_T001.json",
    ):
        touch(res / stray)
    known = ["L1_T001", "L2_T003", "L3_T050"]
    assert plan.results_on_disk(str(res), "check", known) == sorted(good[:2])
    assert plan.results_on_disk(str(res), "time", known) == sorted(good[2:])
    assert plan.results_on_disk(str(res), "check", ["L1_T001"]) == [good[0]]
    assert plan.results_on_disk(str(tmp_path / "none"), "time", known) == []


def test_the_selection_comes_first_then_the_other_results_on_disk(tmp_path):
    res = tmp_path / "r"
    on_disk = [touch(res / "check/L1_T001.json"), touch(res / "check/L1_T002.json")]
    selected = [str(res / "check/L1_T009.json"), on_disk[1]]
    known = ["L1_T001", "L1_T002", "L1_T009"]
    assert plan.with_results_on_disk(str(res), "check", selected, known) == selected + [on_disk[0]]
    assert plan.existing(selected + on_disk) == [on_disk[1], on_disk[0], on_disk[1]]


# --------------------------------------------------------------------------- the tables


def aggregate_case(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = "results/h100"
    all_tids = ["L1_T001", "L1_T002", "L1_T003", "L2_T001"]
    tids = ["L1_T002", "L1_T001"]
    check = plan.task_paths(res, "check", tids)
    time = plan.task_paths(res, "time", tids, ["paper"], ["default"], ["default"])
    touch(f"{res}/check/L1_T001.json")
    touch(f"{res}/time/paper/default/L1_T001.json")
    touch(f"{res}/check/L2_T001.json")  # outside the selection
    touch(f"{res}/time/strict/default/L1_T003.json")  # outside the selection
    return res, tids, all_tids, check, time


def test_aggregate_inputs_plan_every_result_of_the_selection(tmp_path, monkeypatch):
    res, tids, all_tids, check, time = aggregate_case(tmp_path, monkeypatch)
    got = plan.aggregate_inputs(res, "h100", tids, all_tids, check, time, False)
    assert got["check"] == [f"{res}/check/L1_T002.json", f"{res}/check/L1_T001.json", f"{res}/check/L2_T001.json"]
    assert got["time"] == [
        f"{res}/time/paper/default/L1_T002.json",
        f"{res}/time/paper/default/L1_T001.json",
        f"{res}/time/strict/default/L1_T003.json",
    ]
    # meta of the selection and of every result on disk, in the release's order
    assert got["meta"] == [f"{res}/tasks/{t}/meta.json" for t in all_tids]
    assert got["scan"] == [f"{res}/reference_scan.json"]
    assert got["extension_failures"] == [] and got["withdrawn_flags"] == []
    assert got["run_spread"] == []
    assert list(got) == ["meta", "check", "time", "scan", "extension_failures", "withdrawn_flags", "run_spread"]


def test_aggregate_only_reads_what_is_on_disk(tmp_path, monkeypatch):
    res, tids, all_tids, check, time = aggregate_case(tmp_path, monkeypatch)
    got = plan.aggregate_inputs(res, "h100", tids, all_tids, check, time, True)
    assert got["check"] == [f"{res}/check/L1_T001.json", f"{res}/check/L2_T001.json"]
    assert got["time"] == [f"{res}/time/paper/default/L1_T001.json", f"{res}/time/strict/default/L1_T003.json"]
    # the selection's meta even without a result (split_release is cheap and CPU-only)
    assert got["meta"] == [f"{res}/tasks/{t}/meta.json" for t in all_tids]
    assert got["scan"] == []
    touch(f"{res}/reference_scan.json")
    touch("config/curation/h100/withdrawn_flags.json")
    touch("config/curation/h100/run_spread.json")
    got = plan.aggregate_inputs(res, "h100", ["L1_T002"], all_tids, [], [], True)
    assert got["meta"] == [f"{res}/tasks/{t}/meta.json" for t in ("L1_T001", "L1_T002", "L1_T003", "L2_T001")]
    assert got["scan"] == [f"{res}/reference_scan.json"]
    assert got["withdrawn_flags"] == ["config/curation/h100/withdrawn_flags.json"]
    assert got["run_spread"] == ["config/curation/h100/run_spread.json"]
    assert got["extension_failures"] == []
    # another device's curation is not this one's
    assert plan.aggregate_inputs(res, "a100", [], all_tids, [], [], True)["withdrawn_flags"] == []


def test_all_targets_report_outputs_and_what_the_tables_follow(tmp_path):
    reports = plan.report_outputs("R", ["s41"])
    assert reports == [
        "R/scores.csv",
        "R/summary.md",
        "R/per_task.md",
        "R/README.md",
        "R/extension_failures.md",
        "R/figures/measured_vs_published.png",
        "R/figures/ratio_hist.png",
        "R/slices/s41.md",
    ]
    assert plan.report_outputs("R", []) == reports[:-1]
    assert plan.all_targets(["c"], ["t"], reports, False) == ["c", "t", *reports]
    assert plan.all_targets(["c"], ["t"], reports, True) == reports
    path = touch(tmp_path / "slices/h100_slice41.yaml", "tasks: []\n")
    assert plan.slice_reports([path]) == {"h100_slice41": path}
    assert plan.slice_reports([]) == {}
    with pytest.raises(plan.PlanError, match=r"^config slice_reports: nope\.yaml: no such file$"):
        plan.slice_reports([path, "nope.yaml"])
    assert plan.curation("h100", "x.json") == "config/curation/h100/x.json"


# --------------------------------------------------------------------------- the evaluation jobs


def test_timeouts_are_capped_for_the_demo():
    t = CONFIG["timeouts"]
    assert {k: plan.timeout(t, k, False) for k in ("build", "check", "time", "gpu_section")} == {
        "build": 1800,
        "check": 900,
        "time": 1800,
        "gpu_section": 180,
    }
    assert {k: plan.timeout(t, k, True) for k in ("build", "check", "time", "gpu_section")} == {
        "build": 90,
        "check": 90,
        "time": 90,
        "gpu_section": 10,
    }
    # a cap only lowers
    small = {"build": 5, "gpu_section": 3, "demo": 90, "demo_section": 10}
    assert plan.timeout(small, "build", True) == 5 and plan.timeout(small, "gpu_section", True) == 3


def test_evaluation_params_per_stage_and_protocol():
    cfg = dict(CONFIG)
    assert plan.evaluation_params("build", "sha", cfg) == {"release": "sha", "build": cfg["build"]}
    paper = {"release": "sha", "paper": cfg["paper"]}
    assert plan.evaluation_params("time", "sha", cfg) == paper
    assert plan.evaluation_params("check", "sha", cfg) == paper
    for protocol in ("strict", "both"):
        got = plan.evaluation_params("check", "sha", cfg | {"protocol": protocol})
        assert got["detectors"] == cfg["detectors"] | {"seed": 42, "atol": 0.01, "rtol": 0.01}
        assert plan.evaluation_params("time", "sha", cfg | {"protocol": protocol}) == paper
    assert "seed" not in cfg["detectors"]  # the config is not changed


def test_check_and_time_params_hold_no_timing_key():
    """The committed results' params hashes stay: check and time params are the release and the
    paper protocol's (plus the detectors'), whatever the mode; builds take their own."""
    cfg = dict(CONFIG)
    assert "timing" not in cfg
    paper = {"release": "sha", "paper": cfg["paper"]}
    assert plan.evaluation_params("check", "sha", cfg) == paper
    assert plan.evaluation_params("time", "sha", cfg) == paper
    assert plan.evaluation_params("build", "sha", cfg) == {"release": "sha", "build": cfg["build"]}


def test_the_task_worker_serves_the_checks_and_the_eager_time_jobs():
    assert plan.serves_task_worker("check", None)
    assert all(plan.serves_task_worker("time", m) for m in ("default", "cuda_graph", "cudnn"))
    assert not plan.serves_task_worker("time", "torch_compile")
    assert not plan.serves_task_worker("time", "torch_compile_reduce_overhead")
    assert not plan.serves_task_worker("build", None)


def test_the_timing_version_and_the_version_older_results_record():
    from l1bench import timing
    from l1bench.results import timing_version

    assert timing.TIMING_VERSION == 9
    assert timing_version({"timing_version": 7}) == 7 and timing_version({"timing_design": 4}) == 4
    assert timing_version({}) is None


def test_time_job_priorities_compile_slots_and_strict_params():
    check_priority = plan.check_priority("L1_T001")
    assert check_priority == plan.check_priority() == plan.CHECK_PRIORITY == 9
    for mode in ALL_MODES:
        # a strict step the task worker serves follows its paper steps (below)
        assert plan.time_priority("strict", mode) == (10 if modes.BY_NAME[mode].task_worker else 5)
        assert plan.time_priority("paper", mode) > check_priority
    assert plan.time_priority("paper", "torch_compile") == 12
    assert plan.time_priority("paper", "torch_compile_reduce_overhead") == 12
    assert plan.time_priority("paper", "default") == 10
    assert plan.time_priority("paper", "cudnn") == 10
    assert [plan.compile_slots(m) for m in ("default", "torch_compile", "torch_compile_reduce_overhead")] == [0, 1, 1]
    assert plan.compile_slots("cuda_graph") == plan.compile_slots("cudnn") == 0
    strict = CONFIG["strict"] | {"modes": ["default"]}
    assert plan.strict_params("paper", strict) is None
    got = plan.strict_params("strict", strict)
    assert "modes" not in got and got == {
        k: v for k, v in CONFIG["strict"].items() if k not in ("modes", "verify_outputs")
    }
    # verify_outputs is a parameter once it is on (results made without it keep theirs)
    assert CONFIG["strict"]["verify_outputs"] == 0 and "verify_outputs" not in got
    assert plan.strict_params("strict", strict | {"verify_outputs": 3})["verify_outputs"] == 3


def test_gpu_evaluation_jobs_take_no_core():
    """On a GPU `gpu` slots bound the check and time jobs in flight, not --cores (which would
    run them one at a time under the main command's --cores 1); the CPU demo's jobs compute."""
    assert plan.evaluation_threads(is_demo=False) == 0
    assert plan.evaluation_threads(is_demo=True) == 1


def test_a_build_that_compiles_takes_a_builds_slot_instead_of_a_core():
    compiling = {"L1_T001"}
    assert plan.build_threads("L1_T001", compiling, is_demo=False) == 0  # capped by `builds`
    assert plan.build_threads("L1_T002", compiling, is_demo=False) == 1  # compiles nothing
    assert plan.build_threads("L1_T002", None, is_demo=False) == 0  # release not parsed: every build compiles
    assert plan.build_threads("L1_T001", compiling, is_demo=True) == 1


def test_level_3_checks_and_compile_jobs_go_first():
    """A level-3 task's check outranks every time job, and its compile-mode jobs every other
    job but builds: their code generation is the run's longest (the slice's tail)."""
    l3, l2 = "L3_T015", "L2_T012"
    others = [plan.time_priority(p, m, t) for p in ("paper", "strict") for m in ALL_MODES for t in (l2, l3)]
    compile_l3 = [plan.time_priority("paper", m, l3) for m in ALL_MODES if modes.compiles(m)]
    assert plan.check_priority(l3) > max(o for o in others if o not in compile_l3)
    assert min(compile_l3) > plan.check_priority(l3) > plan.time_priority("paper", "torch_compile", l2)
    assert plan.time_priority("paper", "default", l3) == plan.time_priority("paper", "default", l2) == 10
    assert plan.time_priority("strict", "torch_compile", l3) == 5
    assert plan.check_priority(l2) == plan.CHECK_PRIORITY


def test_level_3_checks_go_first_only_when_the_run_times_a_compile_mode():
    """Without a torch.compile mode a level-3 check is a check like any other (below the time
    jobs, so a task is timed as soon as it is checked); with one, or when the modes are not
    given, it keeps its boost."""
    l3 = "L3_T015"
    eager = ["default", "cuda_graph", "cudnn"]
    assert plan.check_priority(l3, eager) == plan.CHECK_PRIORITY
    assert plan.check_priority(l3, eager) < min(plan.time_priority("paper", m, l3) for m in eager)
    assert plan.check_priority(l3, eager + ["torch_compile_reduce_overhead"]) == plan.check_priority(l3) > 10
    assert plan.check_priority("L2_T012", ALL_MODES) == plan.CHECK_PRIORITY


def test_build_slots_only_for_builds_that_start_a_worker():
    """A build takes a `builds` slot exactly when it starts a worker to compile an extension
    (the decision of no_worker_needed); one that compiles nothing, torch.compile or Triton at
    construction included (its build job starts no worker), takes none: it must not queue
    behind nvcc. Every build takes one while the release is not parsed."""
    make = lambda n, code: rel.Task(level=1, task=n, ref_code="ref", custom_code=code)  # noqa: E731
    tasks = [
        make(1, "from torch.utils.cpp_extension import load_inline\nmod = load_inline(name='x')"),
        make(2, "from torch.utils import cpp_extension\nmod = cpp_extension.load(name='x', sources=[])"),
        make(3, "self.f = torch.compile(m)"),
        make(4, "import triton"),
        make(5, "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 2"),
        make(6, None),
    ]
    compiling = plan.extension_build_tids(tasks)
    assert compiling == {"L1_T001", "L1_T002"}
    assert [plan.build_slots(t.tid, compiling) for t in tasks] == [1, 1, 0, 0, 0, 0]
    for t in tasks[:5]:  # a slot exactly for the builds that need a worker
        why = no_worker_needed("build", builds_extensions=builds_extensions(t.custom_code))
        assert (why is None) == (plan.build_slots(t.tid, compiling) == 1)
    assert plan.extension_build_tids(None) is None
    assert plan.build_slots("L1_T005", None) == 1


def test_level_3_builds_first():
    assert plan.build_priority("L3_T001") == 31 > plan.build_priority("L2_T001") == plan.build_priority("L1_T001") == 30
    assert plan.build_priority("L1_T001") > plan.check_priority("L3_T001")
    assert plan.build_priority("L1_T001") > max(plan.time_priority("paper", m, "L3_T001") for m in ALL_MODES)


def test_a_served_strict_step_comes_right_after_its_paper_steps():
    """A strict step the task worker serves takes the served paper steps' priority, so its
    task's worker is still up when it runs (at 5 it came after the worker's idle exit); the
    compile modes keep theirs."""
    for mode in ("default", "cuda_graph", "cudnn"):
        paper = plan.time_priority("paper", mode, "L2_T012")
        assert plan.time_priority("strict", mode, "L2_T012") == paper == 10
    for mode in ("torch_compile", "torch_compile_reduce_overhead"):
        assert plan.time_priority("strict", mode, "L3_T015") == 5
        assert plan.time_priority("paper", mode, "L3_T015") == 14
    assert plan.time_priority("strict", "default", "L2_T012") > plan.check_priority("L2_T012")


def test_a_job_that_ran_out_of_memory_beside_others_takes_every_gpu_slot():
    """plan.gpu_slots: 1 slot, or the run's every slot once an attempt ran out of GPU memory
    beside other jobs; no bound (None) or one slot: 1. Snakemake's Resource objects carry .value."""
    from types import SimpleNamespace

    shared = [{"kind": "infra", "out_of_memory": True, "gpu_shared": True}]
    alone = [{"kind": "infra", "out_of_memory": True, "gpu_shared": False}]
    assert plan.gpu_slots([], 32) == 1 and plan.gpu_slots(alone, 32) == 1
    assert plan.gpu_slots([{"kind": "crash"}], 32) == 1
    assert plan.gpu_slots(shared, 32) == 32 and plan.gpu_slots(shared, SimpleNamespace(value=8)) == 8
    assert plan.gpu_slots(shared, None) == 1 and plan.gpu_slots(shared, 1) == 1
