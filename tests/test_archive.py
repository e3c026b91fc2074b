"""Raw material packed out of results/ (l1bench.archive, config/archives.yaml, rules/reports.smk)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import yaml

from l1bench import archive
from l1bench.fetch import sha256_file

ROOT = Path(__file__).resolve().parents[1]


def _tree(root: Path) -> None:
    (root / "results/x/runs/call1").mkdir(parents=True)
    (root / "results/x/runs/call1/snakemake.log").write_text("log line\n")
    (root / "results/x/runs/gpu.csv").write_text("1,2\n")


def test_pack_is_reproducible_and_unpack_gives_the_same_files(tmp_path):
    _tree(tmp_path)
    a, b = tmp_path / "a.tar.xz", tmp_path / "b.tar.xz"
    sha, n = archive.pack(a, ["results/x/runs"], root=tmp_path)
    (tmp_path / "results/x/runs/gpu.csv").touch()  # a newer mtime changes nothing
    assert archive.pack(b, ["results/x/runs"], root=tmp_path) == (sha, 2) and n == 2
    out = tmp_path / "out"
    names = archive.unpack(a, sha, out)
    assert names == ["results/x/runs/call1/snakemake.log", "results/x/runs/gpu.csv"]
    assert (out / "results/x/runs/call1/snakemake.log").read_text() == "log line\n"
    assert not [p for p in out.iterdir() if p.name.startswith(".unpack-")]


def test_a_wrong_checksum_writes_nothing(tmp_path):
    _tree(tmp_path)
    sha, _ = archive.pack(tmp_path / "a.tar.xz", ["results/x/runs"], root=tmp_path)
    with pytest.raises(archive.ArchiveError, match=r"a\.tar\.xz: sha256 .* does not match"):
        archive.unpack(tmp_path / "a.tar.xz", "0" * 64, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(archive.ArchiveError, match=r"b\.tar\.xz: archive not found"):
        archive.check(tmp_path / "b.tar.xz", sha)


def test_unpack_refuses_members_outside_the_destination(tmp_path):
    evil = tmp_path / "evil.tar.xz"
    with tarfile.open(evil, "w:xz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 0
        tar.addfile(info)
    with pytest.raises(tarfile.OutsideDestinationError):
        archive.unpack(evil, sha256_file(evil), tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()


def test_packing_nothing_or_a_missing_path_is_one_clear_error(tmp_path):
    with pytest.raises(archive.ArchiveError, match="nope: no such file or folder"):
        archive.pack(tmp_path / "a.tar.xz", ["nope"], root=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(archive.ArchiveError, match="nothing to pack"):
        archive.pack(tmp_path / "a.tar.xz", ["empty"], root=tmp_path)


def test_holder_and_config_errors(tmp_path):
    entries = {"runs": {"unpacks": "results/isolation/runs"}}
    assert archive.holder("results/isolation/runs/c1", entries) == "runs"
    assert archive.holder("results/isolation/runs", entries) == "runs"
    assert archive.holder("results/isolation/runs2", entries) is None
    bad = tmp_path / "archives.yaml"
    bad.write_text("archives:\n  a: {archive: x.tar.xz, sha256: abc, unpacks: results/a}\n")
    with pytest.raises(archive.ArchiveError, match=r"archives.yaml: archive 'a' has no 'about'"):
        archive.read_config(bad)


def test_the_committed_archives_match_their_checksums_and_stay_out_of_git():
    entries = archive.read_config(ROOT / "config/archives.yaml")
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    for name, e in entries.items():
        assert sha256_file(ROOT / e["archive"]) == e["sha256"], name
        assert f"/{e['unpacks']}/" in ignored, f"{e['unpacks']} (unpacked from {name}) is not ignored by git"


def test_every_tree_a_lab_report_reads_is_committed_or_archived():
    reports = yaml.safe_load((ROOT / "config/reports.yaml").read_text())
    entries = archive.read_config(ROOT / "config/archives.yaml")
    trees = {t for pair in reports["spread_reports"].values() for t in pair}
    trees |= {t for pair in reports["isolation_figure"]["runs"].values() for t in pair}
    for tree in sorted(trees):
        assert archive.holder(tree, entries) or (ROOT / tree / "time").is_dir(), tree
