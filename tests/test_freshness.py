"""Tables that match their inputs are not re-rendered for file dates alone (l1bench.freshness)."""

import os
from pathlib import Path

from l1bench import freshness

PARAMS = {"device": "demo", "ceiling": 10}


def setup(tmp_path):
    res = tmp_path / "results/demo"
    inputs = [res / "check/L1_T001.json", res / "time/paper/default/L1_T001.json"]
    for i, p in enumerate(inputs):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f'{{"status": "ok", "n": {i}}}')
    tables = [res / "scores.csv", res / "README.md"]
    for p in tables:
        p.write_text("table\n")
    record = res / freshness.RECORD
    freshness.write_record(record, res, inputs, PARAMS)
    tables.append(record)
    # as on a fresh clone: the inputs are newer than the tables made from them
    for p in tables:
        os.utime(p, (1_000_000, 1_000_000))
    return res, inputs, tables, record


def mtimes(paths):
    return [Path(p).stat().st_mtime for p in paths]


def test_tables_made_from_the_same_inputs_are_marked_current(tmp_path):
    res, inputs, tables, record = setup(tmp_path)
    assert freshness.mark_current(record, res, inputs, PARAMS, tables)
    assert min(mtimes(tables)) >= max(mtimes(inputs))
    assert not freshness.mark_current(record, res, inputs, PARAMS, tables)  # nothing newer now


def test_another_input_content_or_parameter_leaves_the_dates_alone(tmp_path):
    res, inputs, tables, record = setup(tmp_path)
    assert not freshness.mark_current(record, res, inputs, PARAMS | {"ceiling": 20}, tables)
    assert not freshness.mark_current(record, res, inputs[:1], PARAMS, tables)  # an input fewer
    inputs[1].write_text('{"status": "ok", "n": 7}')
    assert not freshness.mark_current(record, res, inputs, PARAMS, tables)
    assert mtimes(tables) == [1_000_000] * 3
    record.unlink()
    assert not freshness.mark_current(record, res, inputs, PARAMS, tables + [record])


def test_a_follower_is_marked_current_unless_its_own_input_changed(tmp_path):
    res, inputs, tables, record = setup(tmp_path)
    slice_md, tasks = res / "slices/s.md", tmp_path / "s.yaml"
    slice_md.parent.mkdir()
    for p, t in ((tasks, 500_000), (slice_md, 1_000_000)):
        p.write_text("x\n")
        os.utime(p, (t, t))
    edited, edited_tasks = res / "slices/e.md", tmp_path / "e.yaml"
    for p, t in ((edited, 1_000_000), (edited_tasks, 2_000_000)):
        p.write_text("x\n")
        os.utime(p, (t, t))
    assert freshness.mark_current(record, res, inputs, PARAMS, tables, {slice_md: [tasks], edited: [edited_tasks]})
    assert slice_md.stat().st_mtime > max(mtimes(tables))
    assert edited.stat().st_mtime == 1_000_000


def test_the_digest_is_that_of_paths_and_contents(tmp_path):
    res, inputs, _, _ = setup(tmp_path)
    a = freshness.digest(res, inputs, PARAMS)
    assert a == freshness.digest(res, list(reversed(inputs)), PARAMS)  # order does not matter
    os.utime(inputs[0], (5, 5))
    assert a == freshness.digest(res, inputs, PARAMS)  # dates do not either
