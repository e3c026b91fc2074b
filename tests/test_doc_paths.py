"""Every path the docs name exists: README.md, docs/*.md, lab/README.md, and the comments of
config/*.yaml and profiles/*/config.yaml.

A path is a link target, or a token that starts with one of the repository's top-level entries
(``src/…``, ``scripts/…``, ``config/…``), with an entry of the naming file's folder
(``evidence/…`` in lab/README.md) or with a folder of the package (``gpu/gpulock.py`` in
docs/architecture.md); it is looked for in the repository, the naming file's folder and
``src/l1bench``. A link target is looked for only where it points (the naming file's folder).

Not checked: templates (``<device>``, ``{…}``, ``*``, ``…``, ``$``), absolute paths and paths
outside the repository (``../shared/cuda-l1``), what git ignores (made by a run: ``logs/``,
``results/demo/``), the results trees the docs' example commands write (:data:`RUN_TREES`), and
a section whose heading starts with "History": there a doc names what is gone, on purpose.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "l1bench"
#: Results trees the docs' example commands write, never committed: ``results_dir=results/mine``
#: (README, docs/running.md, docs/rerun-policy.md), two runs compared (``results/r1``,
#: ``results/r2``), and a tree of ``lab/repeat_runs.sh`` (lab/README.md).
RUN_TREES = ("results/mine", "results/r1", "results/r2", "results/spread-c2")
#: A token: what lies between spaces, code marks, quotes, brackets, commas, semicolons and "=".
TOKEN = re.compile(r"[^\s`'\"()\[\]<>,;=|]+")
LINK = re.compile(r"\]\(([^)\s]+)\)")
TEMPLATE = re.compile(r"[<>{}*…$]")
HEADING = re.compile(r"^(#+)\s+(.*)$")


def named_files() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "lab" / "README.md",
        *sorted(ROOT.glob("config/*.yaml")),
        *sorted(ROOT.glob("profiles/*/config.yaml")),
    ]


def without_history(markdown: str) -> str:
    """The text without its history sections (a heading that starts with "History", to the next
    heading of its level or above)."""
    kept, history_level = [], None
    fenced = False
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        heading = None if fenced else HEADING.match(line)
        if heading and history_level is not None and len(heading.group(1)) <= history_level:
            history_level = None
        if heading and heading.group(2).lower().startswith("history"):
            history_level = len(heading.group(1))
        if history_level is None:
            kept.append(line)
    return "\n".join(kept)


def yaml_comments(text: str) -> str:
    """The comments of a YAML file (what follows a ``#`` that starts a line or follows a space)."""
    return "\n".join(m.group(1) for line in text.splitlines() if (m := re.search(r"(?:^|\s)#(.*)$", line)))


def _clean(token: str) -> str:
    return token.split("#", 1)[0].rstrip(".:!?")


def candidates(text: str, folder: Path) -> list[tuple[str, bool]]:
    """(path, is a link target) of every path ``text`` names, as written (see the module's doc)."""
    roots = {p.name for p in ROOT.iterdir()} | {p.name for p in folder.iterdir()}
    roots |= {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    found = [(_clean(t), True) for t in LINK.findall(text)]
    for token in TOKEN.findall(text):
        path = _clean(token)
        first = path.split("/", 1)[0]
        if "/" in path and first in roots and not TEMPLATE.search(token):
            found.append((path, False))
    return [(p, link) for p, link in found if p and not TEMPLATE.search(p) and "://" not in p
            and not p.startswith(("/", "mailto:"))]


def _exists(path: str, folder: Path, link: bool) -> bool | None:
    """Whether ``path`` exists (None: outside the repository, not checked)."""
    bases = [folder] if link else [ROOT, folder, PACKAGE]
    for base in bases:
        target = (base / path).resolve()
        if not target.is_relative_to(ROOT):
            return None
        if target.exists():
            return True
    return False


def ignored(path: str) -> bool:
    """Whether git ignores ``path`` (relative to the repository) as a file or a folder: made by a
    run, never committed."""
    path = path.rstrip("/")
    proc = subprocess.run(["git", "check-ignore", "--no-index", path, f"{path}/"], cwd=ROOT, capture_output=True,
                          check=False)
    return proc.returncode == 0


def missing_paths(name: str, text: str, folder: Path) -> list[str]:
    """The paths ``text`` (of the file ``name`` in ``folder``) names that do not exist."""
    missing = []
    for path, link in candidates(text, folder):
        if any(path.removeprefix("./") == t or path.removeprefix("./").startswith(f"{t}/") for t in RUN_TREES):
            continue
        if _exists(path, folder, link) is False:
            where = (folder if link else ROOT) / path
            if not ignored(str(where.resolve().relative_to(ROOT))):
                missing.append(f"{name}: {path}")
    return list(dict.fromkeys(missing))


def test_every_path_the_docs_name_exists():
    missing = []
    for path in named_files():
        text = path.read_text()
        text = yaml_comments(text) if path.suffix == ".yaml" else without_history(text)
        missing += missing_paths(str(path.relative_to(ROOT)), text, path.parent)
    assert not missing, "paths named that do not exist:\n" + "\n".join(missing)


def test_the_check_finds_a_path_that_is_gone():
    """It sees a moved module in a comment and a link to nowhere, and leaves alone a history
    section, a template, a run's tree and what git ignores."""
    text = (
        "# each holds a lock (src/l1bench/gpulock.py) around GPU work\n"
        "See [the page](evidence/nowhere.md) and `src/l1bench/gpu/gpulock.py`.\n"
        "Results in `results/<device>/tasks/`, `results/mine/h100/`, logs in `logs/demo/x.log`.\n"
        "## History: what moved\n\n`config/reports.yaml` was deleted.\n\n## Running\n\n`scripts/gone.py`\n"
    )
    got = missing_paths("doc", without_history(text), ROOT / "docs")
    assert got == ["doc: evidence/nowhere.md", "doc: src/l1bench/gpulock.py", "doc: scripts/gone.py"]
    assert missing_paths("c", yaml_comments("cores: 16  # see src/l1bench/gpulock.py\n"), ROOT) == [
        "c: src/l1bench/gpulock.py"]
