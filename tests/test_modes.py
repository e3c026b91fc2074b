"""The evaluation modes are one record each (l1bench.modes): the config schema's enums, the
config's comments and the docs' key table name the record's modes, and what derives from the
record says what the record says."""

import re
from pathlib import Path

import yaml

from l1bench import modes, plan
from l1bench import release as rel
from l1bench.aggregate import conventions

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "config/schemas/config.schema.yaml").read_text())["properties"]


def test_the_schema_enums_are_the_records_modes():
    """The schema stays a static file that validates the config: a mode added to the record and
    not to both enums (modes, strict.modes), or left in them, fails here."""
    assert SCHEMA["modes"]["items"]["enum"] == list(modes.NAMES)
    assert SCHEMA["strict"]["properties"]["modes"]["items"]["enum"] == list(modes.NAMES)
    assert set(SCHEMA["modes"]["default"]) <= set(modes.NAMES)


def test_the_config_comments_and_the_docs_name_every_mode():
    config = (ROOT / "config/config.yaml").read_text()
    listed = re.search(r"((?:#   .*\n)+)modes:", config).group(1)  # the comment lines above modes:
    assert [line.split()[1] for line in listed.splitlines()] == list(modes.NAMES)
    assert set(yaml.safe_load(config)["modes"]) <= set(modes.NAMES)
    (row,) = [line for line in (ROOT / "docs/running.md").read_text().splitlines() if line.startswith("| `modes` |")]
    assert re.findall(r"`(\w+)`", row)[1:] == list(modes.NAMES)


def test_every_list_of_modes_derives_from_the_record():
    by = modes.BY_NAME
    assert len(by) == len(modes.MODES) and len({m.score_field for m in modes.MODES}) == len(modes.MODES)
    assert all(not (m.baseline and m.compile) for m in modes.MODES)  # a baseline snippet is timed eager
    assert set(plan.BASELINE_PATHS) == {m for m in by if by[m].baseline} == {"cuda_graph", "cudnn"}
    assert set(rel.SNIPPET_FILES) == {"ref", "custom", *plan.BASELINE_PATHS}
    assert [m for m in by if modes.compiles(m)] == ["torch_compile", "torch_compile_reduce_overhead"]
    assert [m for m in by if plan.serves_task_worker("time", m)] == ["default", "cuda_graph", "cudnn"]
    assert conventions.MODE_LABELS == {m.name: m.label for m in modes.MODES}
    assert [m for m, one in conventions.MISSING_AS_ONE.items() if not one] == ["cuda_graph", "cudnn"]
    assert not plan.serves_task_worker("time", "nope") and plan.modes(["cudnn", "default"]) == ["default", "cudnn"]


def test_the_worker_and_the_harness_take_their_modes_from_the_record():
    from l1bench.timing.harness import BASELINE_MODES
    from l1bench.worker.torch_hooks import COMPILE_MODES

    assert BASELINE_MODES == ("cuda_graph", "cudnn")
    assert COMPILE_MODES == {"torch_compile": "default", "torch_compile_reduce_overhead": "reduce-overhead"}
