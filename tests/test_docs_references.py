"""Every reference in code and docs to a design section or a commit points at one that exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from tests.requires import missing

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    *ROOT.glob("pipeline/**/*.py"),
    *ROOT.glob("app/**/*.py"),
    *ROOT.glob("benchmarks/**/*.py"),
    *ROOT.glob("tests/**/*.py"),
    *ROOT.glob("docs/*.md"),
    ROOT / "README.md",
]
# A section cited as: design.md, "Section" (the name may wrap onto the next line).
CITATION = re.compile(r'design\.md,\s+"([^"]+)"')


def _sections(path: Path) -> set[str]:
    """Headings, each also without a trailing "(`module`)" (cited by its name alone)."""
    names = {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}
    return names | {re.sub(r"\s*\(`[^)]*\)$", "", name) for name in names}


def _text(path: Path) -> str:
    # Docstrings and comments wrap: join a wrapped line's continuation ("#" or indent).
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text())


def test_no_reference_to_a_design_file_the_repository_does_not_hold():
    this = Path(__file__).resolve()
    hits = [
        f"{p.relative_to(ROOT)}"
        for p in SOURCES
        if p.resolve() != this and "DESIGN.md" in p.read_text()
    ]
    assert hits == [], hits


def test_every_cited_design_section_exists():
    sections = _sections(ROOT / "docs" / "design.md")
    cited = {
        (str(p.relative_to(ROOT)), name)
        for p in SOURCES
        if p.resolve() != Path(__file__).resolve()
        for name in CITATION.findall(_text(p))
    }
    assert cited, "no citation found: the pattern is wrong"
    missing = sorted((where, name) for where, name in cited if name not in sections)
    assert missing == [], missing


# A commit cited by its abbreviated hash: 7-40 hex digits with a letter and a digit among them.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_every_commit_the_docs_cite_is_in_the_history():
    """A commit the docs name (a prototype, a measured revision) can be checked out from any
    clone of the repository: it is in the history of the checked-out branch, not only on a
    branch that was deleted or never shared."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        missing("git and a git clone of the repository: the history to look the commits up in")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        missing("a full clone (git fetch --unshallow): a shallow one holds part of the history")
    docs = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*.md")]
    cited = {(str(p.relative_to(ROOT)), h) for p in docs for h in COMMIT.findall(p.read_text())}
    assert cited, "no commit found: the pattern is wrong"
    unreachable = sorted(
        (where, commit)
        for where, commit in cited
        if _git("merge-base", "--is-ancestor", commit, "HEAD").returncode != 0
    )
    assert unreachable == [], unreachable
