"""The l1bench package as installed: its command, ``python -m l1bench.X``, and the one line a
workflow run without it stops with."""

import importlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import copy_workflow, run

from l1bench import cli

ROOT = Path(__file__).resolve().parents[1]
NOT_INSTALLED = (
    "the l1bench package is not installed: run `pip install -e .` in this repository "
    "(offline: see docs/running.md)"
)


def test_the_command_is_installed():
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="l1bench")
    assert script.value == "l1bench.cli:main"


@pytest.mark.parametrize("tool", sorted(cli.TOOLS))
def test_each_subcommand_runs_its_modules_main(tool, capsys):
    """``l1bench TOOL --help`` is the module's own argument parser, named after the command."""
    assert callable(importlib.import_module(f"l1bench.{tool}").main)
    if tool == "extensions":  # no options: its one argument is the results folder
        return
    with pytest.raises(SystemExit) as stop:
        cli.main([tool, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: l1bench {tool} ")


def test_a_subcommand_gets_the_rest_of_the_command_line(tmp_path, capsys):
    (tmp_path / "time/paper/default").mkdir(parents=True)
    assert cli.main(["stalls", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_an_unknown_or_missing_tool_lists_the_tools(capsys):
    assert cli.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("l1bench: unknown tool 'nope'") and all(t in err for t in cli.TOOLS)
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0 and "l1bench TOOL" in capsys.readouterr().out


def test_python_m_still_runs_each_tool():
    for module in ("l1bench.stalls", "l1bench"):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=False)
        assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr


def test_without_the_package_the_workflow_stops_with_one_line(tmp_path):
    """Snakemake itself is there, l1bench is not (None in sys.modules: its import fails as when
    it is not installed): the run stops at once, with one line saying what to do."""
    copy_workflow(tmp_path)
    code = (
        "import sys; sys.modules['l1bench'] = None; sys.argv[0] = 'snakemake';"
        "from snakemake.cli import main; main()"
    )
    proc = run([sys.executable, "-c", code, "-n", "--config", "device=demo"], tmp_path, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == NOT_INSTALLED
    assert "Traceback" not in proc.stdout + proc.stderr


def test_no_code_puts_itself_on_sys_path():
    """The package is found because it is installed, never by a path added at run time."""
    files = [ROOT / "Snakefile", *ROOT.glob("rules/*.smk"), *ROOT.glob("scripts/*.py"),
             *ROOT.glob("src/l1bench/*.py"), *ROOT.glob("tests/*.py")]
    pattern = re.compile(r"sys\.path\.(insert|append|extend)")
    found = [f"{p.relative_to(ROOT)}" for p in files if p.name != Path(__file__).name and pattern.search(p.read_text())]
    assert found == []
