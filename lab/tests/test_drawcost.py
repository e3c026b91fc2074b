"""python -m l1lab drawcost: input sizes from the references on the meta device, the fit of lock
time against them, and the release's projection."""

import json

import pytest

from l1lab import drawcost

REF = """
import torch
def get_inputs():
    return [torch.randn({shape}), 3]
"""


def _release(path, tasks):
    """tasks: (level, task, shape, has_code)."""
    lines = [
        json.dumps({"level_id": lv, "task_id": tk, "ref_code": REF.format(shape=shape),
                    "custom_code": "x" if code else ""})
        for lv, tk, shape, code in tasks
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _time(tree, tid, lock, status="ok"):
    f = tree / f"time/paper/default/{tid}.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"tid": tid, "status": status, "lock_held_s": lock, "timing_version": 9,
                             "provenance": {"gpu": "GPU X", "finished": "2026-12-06T10:00:00+00:00"}}))


def test_sizes_come_from_the_meta_device_and_a_broken_reference_is_named(tmp_path):
    release = _release(tmp_path / "r.json", [(1, 1, "100000, 100000", True), (1, 2, "1000, 1000", False)])
    extra = [{"level_id": 2, "task_id": 3, "ref_code": "import einopsx", "custom_code": "y"},
             {"level_id": 2, "task_id": 4, "ref_code": REF.format(shape="2, 5"), "custom_code": "None"}]
    release.write_text(release.read_text() + "".join(json.dumps(e) + "\n" for e in extra))
    sizes = drawcost.input_elements(release)
    assert sizes["L1_T001"] == {"has_code": True, "m": 10_000.0}  # 10^10 elements: never drawn
    assert sizes["L1_T002"] == {"has_code": False, "m": 1.0}
    assert "ModuleNotFoundError" in sizes["L2_T003"]["error"] and sizes["L2_T003"]["has_code"]
    assert sizes["L2_T004"] == {"has_code": False, "m": 1e-05}  # "None": no code, as the workflow reads it


def test_the_fit_and_the_projection(tmp_path):
    release = _release(tmp_path / "r.json", [(1, 1, "1000, 1000", True), (1, 2, "3000, 1000", True),
                                             (1, 3, "20000, 1000", True), (1, 4, "5, 5", False)])
    tree = tmp_path / "tree"
    _time(tree, "L1_T001", 1.5)  # 1 M elements
    _time(tree, "L1_T002", 2.5)  # 3 M
    _time(tree, "L1_T003", 99.0, status="incorrect")  # left out
    locks, made = drawcost.lock_times(tree)
    assert locks == {"L1_T001": 1.5, "L1_T002": 2.5} and made == {"GPU X, 2026-12-06, timing version 9"}
    assert drawcost.fit([(1.0, 1.5), (3.0, 2.5)]) == pytest.approx((1.0, 0.5))
    assert drawcost.ok_tids(tree) == {"L1_T001", "L1_T002"}
    page = drawcost.report(drawcost.input_elements(release), locks, made, "tree", "default", ("tree", {"L1_T002"}))
    # 3 tasks with code, 1 + 3 + 20 M elements: 3 * 1.0 + 0.5 * 24 = 15 s; the 20 M one holds 11 s
    assert "lock held = **1.00 s + 0.500 s per million input elements**" in page
    assert "code: 3 tasks, 24 M input elements in all (median 3.00 M): **15 s per mode**; the 1 above 10 M " \
        "elements hold 11 s of it (73 %)" in page
    # the timed ones only: L1_T002, 1.0 + 0.5 * 3
    assert "result in `tree` (the others stop at the check): 1 tasks, 3 M input elements in all (median 3.00 M): " \
        "**2 s per mode**" in page


def test_a_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two tasks"):
        drawcost.fit([(1.0, 2.0), (1.0, 3.0)])
