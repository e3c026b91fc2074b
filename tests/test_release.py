"""Parsing, normalisation, selection and split of CUDA-L1 releases."""

import json
from collections import Counter

import pytest

from l1bench import release as rel
from l1bench import split

NO_CODE_WITH_SCORES = [
    "1/8", "1/30", "1/38", "1/66", "1/75", "1/80", "2/3", "2/45", "2/52",
    "2/75", "2/100", "3/3", "3/7", "3/23", "3/36", "3/38", "3/47",
]  # fmt: skip

REF = "import torch\nclass Model(torch.nn.Module):\n    pass\n"


def flat_line(**over):
    row = {
        "level_id": 1,
        "task_id": 1,
        "ref_code": REF,
        "custom_code": "class ModelNew: pass",
        "cuda_graph_code": None,
        "cudnn_code": None,
        "score_default": 2.0,
        "score_torch_compile_default": 1.5,
        "score_torch_compile_reduce_overhead": None,
        "score_cuda_graph": None,
        "score_cudnn": None,
    }
    row.update(over)
    return json.dumps(row)


def write(tmp_path, text, name="h100.json"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ----------------------------------------------------------------- real release files


def test_h100_counts(release_dir):
    tasks = rel.load_release(release_dir / "optimized_cuda_code/h100.json")
    assert len(tasks) == 250
    assert Counter(t.level for t in tasks) == {1: 100, 2: 100, 3: 50}
    assert Counter(t.code_status for t in tasks) == {"ok": 210, "no_code": 40}
    assert Counter(t.custom_missing for t in tasks) == {None: 210, "null": 23, "None": 17}
    none_string = sorted(
        (t.level, t.task) for t in tasks if t.custom_missing == "None"
    )
    assert none_string == sorted(rel.parse_task_selector(s) for s in NO_CODE_WITH_SCORES)
    # "None" tasks keep their published scores; null ones have none
    for t in tasks:
        if t.custom_missing == "None":
            assert t.published["default"] is not None
        if t.custom_missing == "null":
            assert t.published["default"] is None


@pytest.mark.parametrize("device", rel.GPU_DEVICES)
def test_every_device_file_and_baselines_parse(release_dir, device):
    base = {
        "cuda_graph": release_dir / "more_baselines/cuda_graph.json",
        "cudnn": release_dir / "more_baselines/cudnn.json",
    }
    tasks = rel.load_release(release_dir / f"optimized_cuda_code/{device}.json", base)
    assert len(tasks) == 250
    assert sum("cudnn" not in t.baselines for t in tasks) == 0
    assert sum("cuda_graph" not in t.baselines for t in tasks) <= 1


def test_baselines_fill_missing_code(tmp_path):
    p = write(tmp_path, flat_line(cuda_graph_code=None) + "\n")
    b = write(tmp_path, json.dumps({"level_id": "1", "task_id": "1", "code": "graph"}) + "\n", "cg.json")
    (t,) = rel.load_release(p, {"cuda_graph": b})
    assert t.baselines == {"cuda_graph": "graph"}


# ----------------------------------------------------------------- normalisation


@pytest.mark.parametrize("code,kind", [(None, "null"), ("None", "None"), ("  ", "empty"), ("", "empty")])
def test_missing_custom_code_means_no_code(tmp_path, code, kind):
    (t,) = rel.parse_flat(write(tmp_path, flat_line(custom_code=code)))
    assert t.code_status == "no_code"
    assert t.custom_missing == kind
    assert t.published["default"] == 2.0  # published scores are kept


def test_string_ids_and_scores_are_accepted(tmp_path):
    (t,) = rel.parse_flat(write(tmp_path, flat_line(level_id="2", task_id="7", score_default="1.25")))
    assert (t.level, t.task, t.tid) == (2, 7, "L2_T007")
    assert t.published["default"] == 1.25


# ----------------------------------------------------------------- bad input: one line naming file, line, field


def bad(tmp_path, text):
    p = write(tmp_path, text)
    with pytest.raises(rel.ReleaseError) as exc:
        rel.load_release(p)
    msg = str(exc.value)
    assert "\n" not in msg
    assert str(p) in msg
    return msg


def test_truncated_line(tmp_path):
    msg = bad(tmp_path, flat_line() + "\n" + flat_line(task_id=2)[:-30] + "\n")
    assert ":2:" in msg and "invalid JSON" in msg


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"ref_code": "abc', "(Unterminated string starting at column 14)"),
        ('{"level": 1} x', "(Extra data at column 14)"),
        ('{"level" 1}', "(Expecting ':' delimiter at column 10)"),
    ],
)
def test_invalid_json_names_the_column_once(tmp_path, line, why):
    msg = bad(tmp_path, line + "\n")
    assert msg.endswith(f":1: invalid JSON {why}") and " at at " not in msg


def test_missing_field(tmp_path):
    row = json.loads(flat_line())
    del row["ref_code"]
    msg = bad(tmp_path, json.dumps(row) + "\n")
    assert ":1:" in msg and "'ref_code'" in msg and "missing" in msg


def test_mistyped_field(tmp_path):
    msg = bad(tmp_path, flat_line(task_id=[3]) + "\n")
    assert ":1:" in msg and "'task_id'" in msg


def test_mistyped_score(tmp_path):
    msg = bad(tmp_path, flat_line() + "\n" + flat_line(task_id=2, score_cudnn="fast") + "\n")
    assert ":2:" in msg and "'score_cudnn'" in msg


def test_mistyped_code(tmp_path):
    msg = bad(tmp_path, flat_line(custom_code=12) + "\n")
    assert "'custom_code'" in msg


def test_duplicate_task(tmp_path):
    msg = bad(tmp_path, flat_line() + "\n" + flat_line() + "\n")
    assert ":2:" in msg and "duplicate" in msg and "level_id=1, task_id=1" in msg


def test_missing_file(tmp_path):
    with pytest.raises(rel.ReleaseError, match="file not found"):
        rel.load_release(tmp_path / "nope.json")


def test_unknown_device():
    with pytest.raises(rel.ReleaseError, match="unknown device 'v100'"):
        rel.check_device("v100")


# ----------------------------------------------------------------- selection


def test_select_tasks():
    ids = [(1, 1), (1, 2), (2, 1), (3, 5)]
    assert rel.select_tasks(ids) == ids
    assert rel.select_tasks(ids, levels=[1]) == [(1, 1), (1, 2)]
    assert rel.select_tasks(ids, tasks=["2/1", "3/5"]) == [(2, 1), (3, 5)]
    assert rel.select_tasks(ids, levels=[3], tasks=["2/1", "3/5"]) == [(3, 5)]
    assert rel.select_tasks(ids, tasks=["L2_T001", "3/5"]) == [(2, 1), (3, 5)]  # as the tables name tasks
    with pytest.raises(rel.ReleaseError, match="not in the release: 9/9, L1_T003$"):
        rel.select_tasks(ids, tasks=["9/9", "1/1", "L1_T003"])  # named as written
    for bad in ("12", "L1_12", "1/x", "l1_t001"):
        with pytest.raises(rel.ReleaseError, match="LEVEL/TASK"):
            rel.select_tasks(ids, tasks=[bad])


def test_task_id_roundtrip():
    assert rel.task_id(1, 12) == "L1_T012"
    assert rel.parse_task_id("L3_T050") == (3, 50)


# ----------------------------------------------------------------- split


def test_split_writes_folders_atomically(tmp_path):
    p = write(tmp_path, flat_line() + "\n" + flat_line(task_id=2, custom_code="None") + "\n")
    tasks = rel.load_release(p)
    out = tmp_path / "tasks"
    split.split_release(tasks, out, "h100", {"path": "x", "sha256": "y"})
    assert sorted(x.name for x in out.iterdir()) == ["L1_T001", "L1_T002"]
    meta = json.loads((out / "L1_T001/meta.json").read_text())
    assert meta["published"]["default"] == 2.0
    assert set(meta["snippets"]) == {"ref", "custom"}
    assert (out / "L1_T001/custom.py").read_text() == "class ModelNew: pass"
    meta2 = json.loads((out / "L1_T002/meta.json").read_text())
    assert meta2["code_status"] == "no_code" and not (out / "L1_T002/custom.py").exists()
    # rewriting a task that lost its code leaves no stale custom.py
    tasks[0].custom_code = None
    split.split_release(tasks, out, "h100", {"path": "x", "sha256": "y"})
    assert not (out / "L1_T001/custom.py").exists()
    assert not [x for x in out.iterdir() if x.name.startswith(".")]
