"""Tests for l1bench.fetch (against a local HTTP server) and the wheelhouse closure check."""

import functools
import hashlib
import http.server
import importlib.util
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

from l1bench import fetch
from l1bench.fetch import FetchError

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = b'{"hello": "world"}\n'
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """Serve ``tmp_path/srv`` on 127.0.0.1; yields ``(base_url, root)``."""
    root = tmp_path / "srv"
    (root / "optimized_cuda_code").mkdir(parents=True)
    (root / "optimized_cuda_code" / "h100.json").write_bytes(PAYLOAD)
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", root
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def test_download_ok(server, tmp_path):
    base, _ = server
    url = fetch.release_url("optimized_cuda_code/h100.json", base_url=base)
    dest = tmp_path / "out" / "h100.json"
    assert fetch.download(url, dest, sha256=PAYLOAD_SHA) == dest
    assert dest.read_bytes() == PAYLOAD
    assert fetch.sha256_file(dest) == PAYLOAD_SHA
    assert sorted(p.name for p in dest.parent.iterdir()) == ["h100.json"]


def test_download_without_checksum(server, tmp_path):
    base, _ = server
    dest = tmp_path / "h100.json"
    fetch.download(base + "optimized_cuda_code/h100.json", dest)
    assert dest.read_bytes() == PAYLOAD


def test_download_checksum_mismatch_leaves_nothing(server, tmp_path):
    base, _ = server
    url = base + "optimized_cuda_code/h100.json"
    out = tmp_path / "out"
    wrong = "0" * 64
    with pytest.raises(FetchError) as err:
        fetch.download(url, out / "h100.json", sha256=wrong, retries=0)
    msg = str(err.value)
    assert msg == f"checksum mismatch for {url}: expected {wrong}, got {PAYLOAD_SHA}"
    assert "\n" not in msg
    assert list(out.iterdir()) == []


def test_download_404_names_url(server, tmp_path):
    base, _ = server
    url = base + "optimized_cuda_code/nope.json"
    with pytest.raises(FetchError, match="404") as err:
        fetch.download(url, tmp_path / "out" / "nope.json", retries=2)
    assert url in str(err.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_download_unreachable_is_retried_then_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch.time, "sleep", lambda s: None)
    url = "http://127.0.0.1:9/x.json"  # discard port: connection refused
    with pytest.raises(FetchError, match="after 2 attempts") as err:
        fetch.download(url, tmp_path / "x.json", retries=1, timeout=5)
    assert url in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_download_without_name_resolution_fails_at_once(tmp_path, monkeypatch):
    """No network (the host name does not resolve): one attempt, not retries with waits."""
    import socket
    import urllib.error

    calls = []

    def no_dns(url, fileobj, timeout):
        calls.append(url)
        raise urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))

    monkeypatch.setattr(fetch, "_fetch_to", no_dns)
    monkeypatch.setattr(fetch.time, "sleep", lambda s: None)
    with pytest.raises(FetchError, match="Name or service not known"):
        fetch.download("https://example.invalid/x.json", tmp_path / "x.json", retries=2)
    assert len(calls) == 1 and list(tmp_path.iterdir()) == []


def test_verify_local(tmp_path):
    f = tmp_path / "h100.json"
    f.write_bytes(PAYLOAD)
    assert fetch.verify_local(f, PAYLOAD_SHA) == f
    with pytest.raises(FetchError) as err:
        fetch.verify_local(f, "a" * 64)
    msg = str(err.value)
    assert msg.startswith(f"{f}: sha256 {PAYLOAD_SHA} does not match the pinned {'a' * 64}")
    assert "release_sha256" in msg and "\n" not in msg
    with pytest.raises(FetchError, match="not found"):
        fetch.verify_local(tmp_path / "missing.json", PAYLOAD_SHA)


def test_release_url():
    assert fetch.release_url("optimized_cuda_code/h100.json") == (
        "https://raw.githubusercontent.com/deepreinforce-ai/CUDA-L1/"
        "51e8356bf844101cab2aeeca4bdff47ebb1953b8/optimized_cuda_code/h100.json"
    )
    assert fetch.release_url("a/b.json", repo="me/fork", commit="abc") == (
        "https://raw.githubusercontent.com/me/fork/abc/a/b.json"
    )
    assert fetch.release_url("a/b.json", base_url="http://h:1/x/") == "http://h:1/x/a/b.json"
    assert fetch.release_url("a/b.json", base_url="http://h:1/x") == "http://h:1/x/a/b.json"


def test_pinned_table_shape():
    assert len(fetch.PINNED_SHA256) == 7
    for path, sha in fetch.PINNED_SHA256.items():
        assert path.endswith(".json") and len(sha) == 64 and int(sha, 16) >= 0


def test_pinned_sha256_matches_release(release_dir):
    for path, sha in fetch.PINNED_SHA256.items():
        assert fetch.sha256_file(release_dir / path) == sha, path
        fetch.verify_local(release_dir / path, sha)


# -- wheelhouse closure check -------------------------------------------------


@pytest.fixture(scope="module")
def wheelhouse():
    spec = importlib.util.spec_from_file_location("build_wheelhouse", ROOT / "scripts" / "build_wheelhouse.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_wheel(folder, name, version, requires=()):
    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA", meta)


def test_missing_requirements(tmp_path, wheelhouse):
    _fake_wheel(tmp_path, "alpha", "1.0", [
        "beta>=2",                                   # satisfied
        "gamma==1.0",                                # missing
        "delta; extra == 'docs'",                    # extra: ignored
        "epsilon; sys_platform == 'win32'",          # false marker: ignored
        "zeta; python_version < '3.12'",             # false for cp312: ignored
    ])
    _fake_wheel(tmp_path, "Beta", "2.1", ["typing_extensions; python_version >= '3.12'"])
    assert sorted(wheelhouse.missing_requirements(tmp_path, "3.12")) == [
        "Beta 2.1 requires typing_extensions (not in wheelhouse)",
        "alpha 1.0 requires gamma==1.0 (not in wheelhouse)",
    ]
    _fake_wheel(tmp_path, "gamma", "1.1")
    _fake_wheel(tmp_path, "typing-extensions", "4.0")
    assert sorted(wheelhouse.missing_requirements(tmp_path, "3.12")) == [
        "alpha 1.0 requires gamma==1.0 (found 1.1)",
    ]


def test_pulp_is_left_out_unless_asked_for(tmp_path, wheelhouse, monkeypatch):
    """Snakemake requires pulp (its ILP scheduler, 16 MB); the profiles use the greedy one, so the
    wheelhouse leaves it out and its closure check does not miss it; --with-ilp brings it."""
    _fake_wheel(tmp_path, "snakemake", "9.0", ["pulp<3.4,>=2.3.1", "yte"])
    assert wheelhouse.missing_requirements(tmp_path, "3.12", ("pulp",)) == [
        "snakemake 9.0 requires yte (not in wheelhouse)"]
    assert len(wheelhouse.missing_requirements(tmp_path, "3.12")) == 2
    for profile in (ROOT / "profiles").glob("*/config.yaml"):
        assert "scheduler: greedy" in profile.read_text(), profile
    calls = []
    monkeypatch.setattr(
        wheelhouse.subprocess, "run", lambda cmd: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0)
    )
    monkeypatch.setattr(wheelhouse, "missing_requirements", lambda *a: [])
    for argv, with_pulp in (([], False), (["--with-ilp"], True)):
        calls.clear()
        assert wheelhouse.main(["--dest", str(tmp_path), *argv]) == 0
        assert any(a.startswith("pulp==") for a in calls[0]) is with_pulp


def test_the_wheelhouse_carries_what_builds_l1bench(tmp_path, wheelhouse, monkeypatch):
    """setuptools goes to build-tools/ (scripts/offline_install.sh builds the package with it on
    the node), not beside snakemake's wheels, and meets pyproject.toml's build-system."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    calls = []
    monkeypatch.setattr(
        wheelhouse.subprocess, "run", lambda cmd: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0)
    )
    assert wheelhouse.main(["--dest", str(tmp_path)]) == 0
    (tools,) = [c for c in calls if str(tmp_path / "build-tools") in c]
    assert tools[tools.index(str(tmp_path / "build-tools")) + 1:] == list(wheelhouse.BUILD_TOOLS)
    assert not [c for c in calls if c is not tools and any(a.startswith("setuptools") for a in c)]
    (pin,) = wheelhouse.BUILD_TOOLS
    (need,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert Requirement(need).specifier.contains(pin.split("==")[1])


def test_requirements_file_is_pinned(wheelhouse):
    reqs = wheelhouse.read_requirements(ROOT / "envs" / "requirements-gpu-node.txt")
    names = {r.split("==")[0] for r in reqs}
    assert all("==" in r for r in reqs)
    assert {"snakemake", "tabulate", "pyyaml", "greenlet", "immutables", "pydantic-core",
            "rpds-py", "sqlalchemy"} <= names
