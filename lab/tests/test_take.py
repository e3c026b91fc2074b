"""python -m l1lab take: one results tree and its run's logs out of a device run's results.tgz."""

import io
import tarfile

import pytest

from l1lab import take

NEW, OLD = "20261205T020000", "20261205T010000"


def _tgz(path, files: dict, links=()):
    with tarfile.open(path, "w:gz") as tgz:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tgz.addfile(info, io.BytesIO(data))
        for name, target in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tgz.addfile(info)
    return path


@pytest.fixture
def archive(tmp_path):
    """What device_run.sh packs: the run's tree, a carried committed tree, two runs' logs."""
    return _tgz(tmp_path / "results.tgz", {
        "results/d7-c1/h100/README.md": "tables",
        "results/d7-c1/h100/check/L1_T001.json": "{}",
        "results/d7-c1/h100/time/paper/default/L1_T001.json": '{"score": 2}',
        "results/d7-c1/h100/build/L1_T001.json": "{}",
        "results/d7-c1/h100/build/ext/L1_T001/x.so": "binary",
        "results/d7-c1/h100/tasks/L1_T001/custom.py": "code",
        "results/d7-c1/h100/tmp/scratch": "x",
        "results/h100/check/L1_T002.json": "{}",
        f"logs/snakemake-{OLD}.log": "first run",
        f"logs/snakemake-{NEW}.log": "second run",
        f"logs/samples/gpu-{NEW}.csv": "gpu",
        f"logs/samples/cpus-{NEW}.txt": "cpus",
        f"logs/samples/cpu-{OLD}.txt": "cpu",
        "logs/other.log": "not a run log",
    }, links=[("results/d7-c1/h100/check/L1_T009.json", "/etc/passwd")])


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_takes_the_tree_without_extensions_snippets_scratch_or_links(archive, tmp_path):
    dest = tmp_path / "spread" / "c1" / "h100"
    counts = take.take(archive, "results/d7-c1/h100", dest)
    assert _files(dest) == ["README.md", "build/L1_T001.json", "check/L1_T001.json",
                            "time/paper/default/L1_T001.json"]
    assert (dest / "time/paper/default/L1_T001.json").read_text() == '{"score": 2}'
    assert counts == {"files": 4, "logs": 0}
    assert _files(dest.parent) == [f"h100/{f}" for f in _files(dest)]  # no temporary folder left


def test_takes_the_newest_calls_logs_or_all(archive, tmp_path):
    runs = tmp_path / "runs" / "c2"
    take.take(archive, "results/d7-c1/h100", tmp_path / "t", runs=runs)
    assert _files(runs) == [f"cpus-{NEW}.txt", f"gpu-{NEW}.csv", f"snakemake-{NEW}.log"]
    every = tmp_path / "runs" / "all"
    take.take(archive, "results/d7-c1/h100", tmp_path / "t", runs=every, all_logs=True)
    assert len(_files(every)) == 5 and (every / f"snakemake-{OLD}.log").read_text() == "first run"


def test_replaces_an_existing_tree_whole(archive, tmp_path):
    dest = tmp_path / "c1" / "h100"
    (dest / "time").mkdir(parents=True)
    (dest / "time" / "stale.json").write_text("old run")
    take.take(archive, "results/d7-c1/h100/", dest)  # a trailing slash is the same tree
    assert not (dest / "time" / "stale.json").exists()
    assert (dest / "check" / "L1_T001.json").exists()
    assert [p.name for p in dest.parent.iterdir()] == ["h100"]


def test_a_missing_tree_names_the_trees_in_the_archive(archive, tmp_path):
    dest = tmp_path / "c1" / "h100"
    with pytest.raises(take.TakeError) as e:
        take.take(archive, "results/d7-c2/h100", dest)
    assert str(e.value) == (f"{archive}: no results tree results/d7-c2/h100 "
                            "(results trees in it: results/d7-c1/h100, results/h100)")
    assert not dest.parent.exists()


def test_a_member_that_leaves_its_folder_is_refused(tmp_path):
    bad = _tgz(tmp_path / "bad.tgz", {"results/x/h100/check/../../../../evil": "x"})
    with pytest.raises(take.TakeError, match="leaves its folder"):
        take.take(bad, "results/x/h100", tmp_path / "dest")
    assert not (tmp_path / "evil").exists()


def test_cli_says_what_is_wrong_in_one_line(tmp_path, capsys):
    assert take.main([str(tmp_path / "none.tgz"), "results/x/h100", str(tmp_path / "d")]) == 1
    assert capsys.readouterr().err == f"take: {tmp_path / 'none.tgz'}: archive not found\n"
    (tmp_path / "junk.tgz").write_text("not a tar")
    assert take.main([str(tmp_path / "junk.tgz"), "results/x/h100", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"take: {tmp_path / 'junk.tgz'}: not a readable tar archive") and err.count("\n") == 1


def test_cli_reports_counts(archive, tmp_path, capsys):
    dest, runs = tmp_path / "d", tmp_path / "r"
    assert take.main([str(archive), "results/d7-c1/h100", str(dest), "--runs", str(runs)]) == 0
    assert capsys.readouterr().out == f"{dest}: 4 files from {archive}:results/d7-c1/h100; 3 log files in {runs}\n"


def test_tree_logs_are_the_calls_that_wrote_the_tree(tmp_path):
    """A slice finished over two runs on a node that ran another experiment first: the two
    runs whose Snakemake logs name the tree, not the other one, and not only the newest."""
    first, second, other = "20261205T091806", "20261205T092750", "20261205T091032"
    tgz = _tgz(tmp_path / "results.tgz", {
        "results/slice41-h100/h100/check/L1_T001.json": "{}",
        f"logs/snakemake-{other}.log": "output: results/d7-c1/h100/check/L1_T001.json",
        f"logs/snakemake-{first}.log": "output: results/slice41-h100/h100/check/L1_T001.json",
        f"logs/snakemake-{second}.log": "output: results/slice41-h100/h100/time/paper/default/L1_T001.json",
        f"logs/samples/gpu-{other}.csv": "gpu",
        f"logs/samples/gpu-{first}.csv": "gpu",
        f"logs/samples/gpu-{second}.csv": "gpu",
    })
    runs = tmp_path / "runs"
    counts = take.take(tgz, "results/slice41-h100/h100", tmp_path / "t", runs=runs, tree_logs=True)
    assert _files(runs) == [f"gpu-{first}.csv", f"gpu-{second}.csv", f"snakemake-{first}.log",
                            f"snakemake-{second}.log"]
    assert counts["logs"] == 4
    # a prefix of another tree's name is not that tree
    assert take.calls_naming(tarfile.open(tgz), tarfile.open(tgz).getnames(), "results/slice41-h1") == set()
