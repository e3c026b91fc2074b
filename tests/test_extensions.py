"""The extension page (l1bench.extensions) says what the results ran on, from their provenance."""

import json

from l1bench import extensions


def put(root, rel, provenance):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tid": path.stem, "status": "ok", "provenance": provenance}))


def test_the_page_names_the_torch_the_results_ran_on(tmp_path):
    assert extensions.toolchain(tmp_path) == "the torch of these results (not recorded)"
    put(tmp_path, "check/L1_T001.json", {"torch": "2.13.0+cpu", "cuda": None})
    put(tmp_path, "time/paper/default/L1_T001.json", {"torch": "2.13.0+cpu", "cuda": None})
    put(tmp_path, "time/paper/default/L1_T002.json", {"torch": "2.11.0+cu130", "cuda": "13.0"})
    assert extensions.toolchain(tmp_path) == "torch 2.13.0+cpu without CUDA"  # most of them
    page = extensions.render(tmp_path, "demo", notes=None)
    assert "that torch 2.13.0+cpu without CUDA (what these results ran on) no longer offers" in page
    put(tmp_path, "time/paper/cudnn/L1_T002.json", {"torch": "2.11.0+cu130", "cuda": "13.0"})
    put(tmp_path, "time/paper/cuda_graph/L1_T002.json", {"torch": "2.11.0+cu130", "cuda": "13.0"})
    assert extensions.toolchain(tmp_path) == "torch 2.11.0+cu130 / CUDA 13.0"
