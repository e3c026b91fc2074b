"""The published-harness runner on the CPU: a stub harness with eval_eval_cuda.py's entry point
and functions stands in for the real one (which needs CUDA past its first step); the real file,
where it is at hand, runs up to its laziness check."""

import json
import os
from pathlib import Path

import pytest

from published_harness import run

HERE = Path(__file__).resolve().parent
STUB = HERE / "stub_eval_cuda.py"
REF = "Model = object\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"
EXTENSIONS = """
from torch.utils.cpp_extension import load_inline
good = load_inline(name="good_ext", cpp_sources="", cuda_sources="ok")
try:
    bad = load_inline(name="bad_ext", cpp_sources="", cuda_sources="BROKEN", extra_cuda_cflags=["-O3"])
except Exception:
    bad = None
SPEED = 3.0
"""
CUSTOM = {
    1: EXTENSIONS,
    2: "WRONG = True\n",
    3: "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    4: None,
    5: "RAISE_IN_TIMING = True\n",
    6: "import time\nwhile 1:\n    time.sleep(1)\n",
}


def write_release(path: Path) -> Path:
    lines = [json.dumps({"level_id": 1, "task_id": n, "ref_code": REF, "custom_code": code, "cuda_graph_code": None,
                         "cudnn_code": REF, "score_default": 2.0}) for n, code in CUSTOM.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def result(root, tid, mode="default"):
    return json.loads(run.result_path(root, "h100", mode, tid).read_text())


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Tasks 1-5 through the stub harness, each in its own process (one run of the tool)."""
    tmp = tmp_path_factory.mktemp("pub")
    release = write_release(tmp / "h100.json")
    out = tmp / "results" / "pub1"
    run.main(["--release", str(release), "--harness", str(STUB), "--any-harness", "--tasks", "1/1,1/2,1/3,1/4,1/5",
              "--modes", "default,cuda_graph", "--out", str(out), "--timeout", "60"])
    return out


def test_a_scored_task_keeps_its_trial_scores_and_every_pairs_times(tree):
    res = result(tree, "L1_T001")
    assert res["status"] == "ok" and res["harness"] == "published" and res["verdict"] == "pass"
    # the stub's custom model is 3 × (1 + 0.01 × trial) times faster in outer trial `trial`
    assert res["trial_scores"] == pytest.approx([3.0 * (1 + 0.01 * t) for t in range(7)])
    assert res["score"] == pytest.approx(3.0 * 1.03)
    assert len(res["ref_ms"]) == 7 and all(len(r) == 10 for r in res["ref_ms"])
    # the pairs are split by who ran first: the reference's times are the stub's, in order
    assert res["ref_ms"][0] == pytest.approx([1.0 + 0.01 * i for i in range(10)])
    assert res["custom_ms"][2] == pytest.approx([(1.0 + 0.01 * i) / (3.0 * 1.02) for i in range(10)], rel=1e-4)
    assert res["n_timings"] == 70 and res["params"]["outer_trials"] == 7
    assert len(res["ref_first"][0]) == 10 and set(sum(res["ref_first"], [])) == {True, False}


def test_each_inline_extension_is_recorded_built_or_not(tree):
    res = result(tree, "L1_T001")
    ext = {e["extension"]: e for e in res["extensions"]}
    # the custom code is executed 10 times: load, laziness, correctness, 7 outer trials
    assert ext["good_ext"]["ok"] and ext["good_ext"]["built"] == ext["good_ext"]["calls"] == 10
    assert not ext["bad_ext"]["ok"] and ext["bad_ext"]["failed"] == 10
    assert ext["bad_ext"]["error"] == "main.cpp:4:1: error: 'bad_ext_kernel' was not declared in this scope"
    assert ext["bad_ext"]["flags"]["extra_cuda_cflags"] == ["-O3"]
    assert res["extension_failures"] == [{"extension": "bad_ext", "error": ext["bad_ext"]["error"]}]
    assert [f["flag"] for f in res["flags"]] == ["EXTENSION_BUILD_FAILED"]


def test_failures_get_the_workflows_statuses_and_the_harnesss_message(tree):
    wrong, crashed, no_code, raised = (result(tree, t) for t in ("L1_T002", "L1_T003", "L1_T004", "L1_T005"))
    assert (wrong["status"], wrong["verdict"], wrong["harness_error"]) == (
        "incorrect", "fail", "Value mismatch to the original model")
    assert crashed["status"] == "crashed" and crashed["score"] is None and crashed["verdict"] is None
    assert no_code["status"] == "no_code"
    assert raised["status"] == "runtime_error" and "illegal memory access" in raised["reason"]
    assert raised["verdict"] == "pass"  # its correctness check passed before the timed call raised


def test_a_mode_without_its_baseline_is_not_run_and_one_with_it_is(tree):
    assert result(tree, "L1_T001", "cuda_graph")["status"] == "no_baseline"
    assert result(tree, "L1_T001", "cuda_graph")["harness_setup"] == "cuda_graph"


def test_the_trees_logs_keep_no_release_code(tree):
    logs = tree / "h100" / "harness_logs" / "default" / "L1_T001"
    assert not (logs / "job.json").exists()
    assert all("code" not in r for r in run.read_jsonl(logs / "harness_log.jsonl"))
    assert run.read_jsonl(logs / "harness_log.jsonl")[-1]["done"]


def test_a_hanging_task_is_killed_and_recorded_and_existing_results_are_kept(tmp_path, capsys, monkeypatch):
    release = write_release(tmp_path / "h100.json")
    monkeypatch.chdir(tmp_path)
    out = "pub"  # a relative tree: the child runs in its log folder
    run.main(["--release", str(release), "--harness", str(STUB), "--any-harness", "--tasks", "1/6,1/4",
              "--out", str(out), "--timeout", "3"])
    res = result(out, "L1_T006")
    assert res["status"] == "timeout" and res["reason"] == "ran past 3 s"
    run.main(["--release", str(release), "--harness", str(STUB), "--any-harness", "--tasks", "1/6",
              "--out", str(out), "--timeout", "3"])
    assert "L1_T006 default: result exists, kept" in capsys.readouterr().out


def test_a_harness_with_another_hash_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="is not the pinned"):
        run.harness_file(STUB, tmp_path)


def test_statuses_from_the_harnesss_messages():
    lazy = [{"event": "lazy", "ok": False, "error": "Output is LazyTensor"}]
    assert run.status_of("Output is LazyTensor, not standard torch.Tensor", lazy) == "lazy"
    assert run.status_of("Custom model compilation failed", []) == "load_error"
    assert run.status_of("Custom model compilation failed", [{"event": "extension", "ok": False}]) == "compile_error"
    assert run.status_of("Error during validation: Torch not compiled with CUDA enabled", lazy) == "unsupported"
    assert run.status_of("Original model compilation failed: Syntax Error", []) == "baseline_error"
    assert run.verdict_of(lazy, "lazy") == "fail" and run.verdict_of([], "load_error") is None


def test_an_early_stopped_task_keeps_its_one_trial():
    job = {"tid": "L1_T009", "mode": "default", "harness_sha256": "x", "setup": "vanilla"}
    events = [{"event": "start", "t": 1.0}, {"event": "correctness", "ok": True},
              {"event": "trial", "score": 0.2, "ref_ms": [1.0], "custom_ms": [5.0], "seed": 42},
              {"event": "returned", "value": 0}]
    log = [{"score": 0.2, "scores": [0.2], "std": 0.0, "done": True}]
    res = run.record_from(job, events, log, {"returncode": 0, "timed_out": False, "wall_s": 1.0}, 60)
    assert (res["status"], res["score"], res["trial_scores"]) == ("ok", 0.2, [0.2])


REAL = [Path(p) for p in (os.environ.get("L1_PUBLISHED_HARNESS", ""), ".release/eval/eval_cuda.py",
                          "../shared/cuda-l1/eval/eval_cuda.py") if p]


@pytest.mark.skipif(not any(p.is_file() for p in REAL), reason="the published eval_cuda.py is not at hand")
def test_the_real_harness_loads_a_demo_task_and_stops_at_its_laziness_check_without_cuda(tmp_path):
    """On the CPU the real harness loads both models (its step 1) and then stops: its laziness
    check moves inputs with ``.cuda()``, so its correctness and timing paths need a GPU."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: this checks the CPU path")
    harness, digest = run.harness_file(next(p for p in REAL if p.is_file()), tmp_path)
    tasks = run.load_tasks(Path(__file__).resolve().parents[3] / "config/demo/optimized_cuda_code/demo.json")
    res = run.run_task(tasks["L1_T001"], "default", tmp_path / "pub", "demo", harness, digest, 120)
    assert [(s["event"], s.get("caller"), s["ok"]) for s in res["steps"][:2]] == [
        ("execute", "eval_pipeline", True), ("execute", "eval_pipeline", True)]
    assert res["status"] == "unsupported" and "CUDA" in res["reason"] and res["verdict"] is None
