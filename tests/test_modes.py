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
    """What derives from the record says what the record says (for any mode added), and the
    published modes are as CUDA-L1 defines them."""
    by = modes.BY_NAME
    assert list(by) == list(modes.NAMES) and all(not (m.baseline and m.compile) for m in modes.MODES)
    assert set(plan.BASELINE_PATHS) == {m for m in by if by[m].baseline}
    assert set(rel.SNIPPET_FILES) == {"ref", "custom", *plan.BASELINE_PATHS}
    assert {m for m in by if plan.serves_task_worker("time", m)} == {m for m in by if not modes.compiles(m)}
    assert conventions.MODE_LABELS == {m.name: m.label for m in modes.MODES}
    assert conventions.MISSING_AS_ONE == {m.name: not m.baseline for m in modes.MODES}
    assert not plan.serves_task_worker("time", "nope") and plan.modes(["cudnn", "default"]) == ["default", "cudnn"]
    published = {"default": ("score_default", "Default", None, None),
                 "torch_compile": ("score_torch_compile_default", "Torch Compile", None, "default"),
                 "torch_compile_reduce_overhead": ("score_torch_compile_reduce_overhead", "Torch Compile RO", None,
                                                   "reduce-overhead"),
                 "cuda_graph": ("score_cuda_graph", "CUDA Graph", "cuda_graph_code", None),
                 "cudnn": ("score_cudnn", "cuDNN", "cudnn_code", None)}
    assert {m: (by[m].score_field, by[m].label, by[m].baseline, by[m].compile) for m in published} == published


def test_the_worker_and_the_harness_take_their_modes_from_the_record():
    from l1bench.timing.harness import BASELINE_MODES
    from l1bench.worker.torch_hooks import COMPILE_MODES

    assert BASELINE_MODES == tuple(m.name for m in modes.MODES if m.baseline)
    assert COMPILE_MODES == {m.name: m.compile for m in modes.MODES if m.compile}
