"""Every reference in code and docs to a design section points at one that exists."""

from __future__ import annotations

import re
from pathlib import Path

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
