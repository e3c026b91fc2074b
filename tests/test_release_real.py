"""The five upstream release files through the CPU stages: parse, split, static scans.

Every test reads the real release (``$L1_RELEASE_DIR``, default ``../shared/cuda-l1``) and skips
when it is absent (fails in CI: ``L1_REQUIRE_RELEASE=1``). The numbers are the release's own
(commit pinned in config/config.yaml).
"""

from collections import Counter
from pathlib import Path

import pytest

from l1bench import codescan, results, split, staleness
from l1bench import release as rel

#: Tasks with custom code, and how the others spell "no code" (null or the string "None").
CODE_COUNTS = {
    "h100": (210, {"null": 23, "None": 17}),
    "a100": (225, {"null": 9, "None": 16}),
    "h20": (219, {"null": 17, "None": 14}),
    "l40": (213, {"null": 20, "None": 17}),
    "3090": (197, {"null": 37, "None": 16}),
}

#: Custom code that times itself (codescan.SELF_TIMING), per release.
SELF_TIMED = {
    "h100": "L1_T001 L1_T006 L1_T013 L1_T017 L1_T057 L1_T060 L1_T070 L1_T077 L2_T074",
    "a100": "L1_T001 L1_T002 L1_T006 L1_T008 L1_T017 L1_T022 L1_T057 L1_T060 L1_T070 L1_T077 L2_T074",
    "h20": "L1_T001 L1_T006 L1_T008 L1_T013 L1_T017 L1_T057 L1_T060 L1_T063 L1_T070 L1_T077 L2_T074",
    "l40": "L1_T001 L1_T002 L1_T013 L1_T017 L1_T022 L1_T060 L1_T063 L1_T077 L2_T074",
    "3090": "L1_T001 L1_T013 L1_T017 L1_T060 L1_T063 L1_T070 L1_T077 L2_T074",
}

#: Custom code that compiles an extension (a build job with a worker and a builds slot).
EXTENSION_BUILDS = {"h100": 78, "a100": 79, "h20": 82, "l40": 75, "3090": 66}

#: Published modes with no score although the task has custom code (shown as "–", not as 1.00).
UNPUBLISHED = {
    "a100": {
        "torch_compile": "L1_T097 L2_T090 L3_T043",
        "cudnn": "L1_T015 L1_T097 L2_T051 L2_T090 L3_T043",
    },
    "3090": {"cudnn": "L3_T031"},
}


def _load(release_dir, device):
    base = {m: release_dir / f"more_baselines/{m}.json" for m in ("cuda_graph", "cudnn")}
    return rel.load_release(release_dir / f"optimized_cuda_code/{device}.json", base)


@pytest.fixture(scope="module")
def releases(release_dir):
    return {d: {t.tid: t for t in _load(release_dir, d)} for d in rel.GPU_DEVICES}


@pytest.mark.parametrize("device", rel.GPU_DEVICES)
def test_tasks_with_code_and_how_the_rest_are_marked(releases, device):
    tasks = releases[device]
    with_code, missing = CODE_COUNTS[device]
    assert len(tasks) == 250
    assert sum(t.code_status == "ok" for t in tasks.values()) == with_code
    assert Counter(t.custom_missing for t in tasks.values() if t.custom_missing) == missing
    for t in tasks.values():
        # "None" keeps the published score of code that was not released; null has none
        assert (t.published["default"] is not None) == (t.custom_missing != "null")


@pytest.mark.parametrize("device", rel.GPU_DEVICES)
def test_unpublished_modes_of_tasks_with_code(releases, device):
    expected = UNPUBLISHED.get(device, {})
    for mode, tids in expected.items():
        found = {tid for tid, t in releases[device].items() if t.custom_code and t.published[mode] is None}
        assert found == set(tids.split())


def test_references_and_baselines_are_the_same_in_every_release(releases):
    """One reference per task: the reference scan of one release holds for all five, and the
    cross-release page compares each release's code against the same baseline."""
    h100 = releases["h100"]
    for device in rel.GPU_DEVICES[1:]:
        for tid, t in releases[device].items():
            assert t.ref_code == h100[tid].ref_code, (device, tid)
            assert t.baselines == h100[tid].baselines, (device, tid)


@pytest.mark.parametrize("device", rel.GPU_DEVICES)
def test_split_then_static_scans(releases, device, tmp_path):
    tasks = list(releases[device].values())
    info = {"path": f"{device}.json", "sha256": "x"}
    assert len(split.split_release(tasks, tmp_path, device, info)) == 250
    assert staleness.Judge(tmp_path, None, "x", {}).split_reason(tmp_path, tasks) is None
    metas = sorted(tmp_path.glob("*/meta.json"))
    found = codescan.scan_tasks(metas)
    assert sorted(found) == SELF_TIMED[device].split()
    custom = [p.parent / "custom.py" for p in metas if (p.parent / "custom.py").exists()]
    assert len(custom) == CODE_COUNTS[device][0]
    builds = sum(results.builds_extensions(p.read_text()) for p in custom)
    assert builds == EXTENSION_BUILDS[device]


@pytest.mark.parametrize("device", rel.GPU_DEVICES[1:])
def test_every_release_tree_carries_the_h100_reference_scan(device):
    """The references are the same in every release (test above), so the CPU scan of them is
    too: each tree holds h100's scan and no run scans the same 250 references again (four
    of them run into the scan's timeout)."""
    root = Path(__file__).parents[1] / "results"
    assert (root / device / "reference_scan.json").read_bytes() == (root / "h100" / "reference_scan.json").read_bytes()


@pytest.mark.parametrize("required", [False, True])
def test_without_the_release_a_test_skips_or_in_ci_fails_naming_it(tmp_path, required):
    """conftest's release_dir: without the release, its tests skip with one reason naming the
    missing path; with L1_REQUIRE_RELEASE=1 (.ci/run) they fail with that line."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("L1_REQUIRE_RELEASE", "PYTEST_XDIST_WORKER")}
    env |= {"L1_RELEASE_DIR": str(tmp_path / "nowhere")} | ({"L1_REQUIRE_RELEASE": "1"} if required else {})
    test = f"{Path(__file__).parent / 'test_fetch.py'}::test_pinned_sha256_matches_release"
    proc = subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", "-n", "0"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    missing = f"the upstream release is missing: no {tmp_path / 'nowhere/optimized_cuda_code'} (set L1_RELEASE_DIR)"
    assert missing in out, out[-2000:]
    if required:
        assert proc.returncode == 1 and f"{missing}; L1_REQUIRE_RELEASE=1 requires it" in out
        assert "Traceback" not in out and "1 error" in out
    else:  # said once, at the end
        assert proc.returncode == 0 and f"1 skipped: {missing}" in out and out.count(missing) == 1
