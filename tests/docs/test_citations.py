"""Every citation in the code, tests and docs points at something the repository has.

The forms a citation may take (docs/ARCHITECTURE.md, "How to cite"):
- a page: `docs/TENANCY.md` (any path ending in `.md`: from the repository root, beside the citing file, or in
  docs/);
- a decision: `docs/ARCHITECTURE.md, decision 7` (or `decisions 1 and 11`; in Markdown
  `[ARCHITECTURE.md](ARCHITECTURE.md), decision 7`); bare `decision 7` only inside docs/ARCHITECTURE.md;
- a section: `docs/LIFECYCLE.md "Batch lifecycle"` (or with a comma before the quoted heading), optionally a
  numbered point of it: `docs/ARCHITECTURE.md "The OpenAI wire contract", point 3`;
Markdown links, anchors included, are tests/docs/test_readme.py's to check.

The forms that pointed outside the repository fail: a section sign, a `reference/*.md` page, a page above the
repository (`../`), and "ARCHITECTURE" without `docs/ARCHITECTURE.md` (`ARCHITECTURE decision 7`).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("nightbatch", "gpu_worker", "functions", "infra", "tests", "docs", "bench", "scripts", "README.md",
           "Makefile", "pyproject.toml", "app.py")
SUFFIXES = {".py", ".md", ".toml", ".sh", ".html", ".js", ".css", ".json", ".txt", ".cfg", ".yml", ".yaml", ""}
ARCHITECTURE = "docs/ARCHITECTURE.md"
SELF = Path(__file__).resolve()
# Mentions of a page that are not citations: (citing file, page).
NOT_CITATIONS = {
    ("tests/infra/test_worker_image.py", "bench/README.md"),  # a path the image must not depend on, as data
}

# A path ending in .md, not inside a URL.
PAGE = re.compile(r"(?<![\w/.:-])((?:\.\./)*[\w-]+(?:/[\w.-]+)*\.md)\b")
DECISIONS = re.compile(r"ARCHITECTURE\.md(?:\]\([\w./]*ARCHITECTURE\.md\))?,? decisions? "
                       r"(\d+(?:(?:, | and | or )\d+)*)")
BARE_DECISION = re.compile(r"\bdecisions? (\d+(?:(?:, | and | or )\d+)*)")
SECTION = re.compile(r"((?:[\w-]+/)*[\w-]+\.md),? \"([^\"]+)\"(?:, point (\d+))?")
OLD_FORMS = (
    (re.compile("\N{SECTION SIGN}"), "a section sign: a section of a page outside the repository"),
    (re.compile(r"\breference/[\w-]+\.md"), "a reference/ page: not in the repository"),
    (re.compile(r"(?<![\w/.])ARCHITECTURE(?!\.md)(?=\s*(?:decision|\d|\"|:|\)))"),
     "ARCHITECTURE without docs/ARCHITECTURE.md"),
)


def _files() -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        paths = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found.extend(p for p in paths if p.suffix in SUFFIXES and "__pycache__" not in p.parts and p != SELF)
    return found


def _text(path: Path) -> str:
    try:
        return _joined(path.read_text())
    except UnicodeDecodeError:
        return ""


def _joined(raw: str) -> str:
    """The lines joined (a citation may wrap, in a comment too): a line break and the comment marker after it
    become one space."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#+[ \t]?|//[ \t]?|\*[ \t]?)?", " ", raw)


@cache
def _headings(page: Path) -> dict[str, str]:
    """heading text -> its section's text (up to the next heading of the same or a higher level)."""
    found: dict[str, str] = {}
    if not page.is_file():
        return found
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#+)\s+(.*?)\s*$", line)
        if not m:
            continue
        level, body = len(m.group(1)), []
        for after in lines[i + 1:]:
            n = re.match(r"^(#+)\s", after)
            if n and len(n.group(1)) <= level:
                break
            body.append(after)
        found[m.group(2)] = "\n".join(body)
    return found


def _numbered(section: str) -> set[int]:
    return {int(m.group(1)) for m in re.finditer(r"^(\d+)\.\s", section, re.MULTILINE)}


def decisions() -> set[int]:
    return _numbered(_headings(ROOT / ARCHITECTURE).get("Decisions", ""))


def _resolve(page: str, citing: Path) -> Path | None:
    """The page a mention names: from the repository root, beside the citing file, or in docs/; None when the
    repository does not have it (a page above the repository included)."""
    for base in (ROOT, citing.parent, ROOT / "docs"):
        path = (base / page).resolve()
        if path.is_file() and path.is_relative_to(ROOT):
            return path
    return None


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def problems(path: Path, raw: str | None = None) -> list[str]:
    """What `path` (or `raw`, as if it were that file's text) cites that the repository does not have."""
    text = _text(path) if raw is None else _joined(raw)
    where = path.relative_to(ROOT)
    out: list[str] = []
    for pattern, why in OLD_FORMS:
        out.extend(f"{where}: {why}: ...{text[max(0, m.start() - 40):m.end() + 40]}..."
                   for m in pattern.finditer(text))
    for m in PAGE.finditer(text):
        page = _resolve(m.group(1), path)
        if (str(where), m.group(1)) in NOT_CITATIONS:
            continue
        if page is None:
            out.append(f"{where}: cites {m.group(1)}, which the repository does not have")
    for m in SECTION.finditer(text):
        page = _resolve(m.group(1), path)
        if page is None:
            continue  # said above
        sections = _headings(page)
        if m.group(2) not in sections:
            out.append(f"{where}: cites {m.group(1)} \"{m.group(2)}\", a section it does not have")
        elif m.group(3) and int(m.group(3)) not in _numbered(sections[m.group(2)]):
            out.append(f"{where}: cites point {m.group(3)} of {m.group(1)} \"{m.group(2)}\", which it does not have")
    cited = [(m.start(1), _numbers(m.group(1))) for m in DECISIONS.finditer(text)]
    if path == ROOT / ARCHITECTURE:
        cited += [(m.start(1), _numbers(m.group(1))) for m in BARE_DECISION.finditer(text)]
    else:
        starts = {start for start, _ in cited}
        out.extend(f"{where}: \"{m.group(0)}\" without docs/ARCHITECTURE.md" for m in BARE_DECISION.finditer(text)
                   if m.start(1) not in starts)
    known = decisions()
    out.extend(f"{where}: cites decision {n}, which docs/ARCHITECTURE.md does not have"
               for _, numbers in cited for n in numbers if n not in known)
    return out


def test_architecture_has_its_decisions_numbered_from_one() -> None:
    known = decisions()
    assert known and known == set(range(1, max(known) + 1))


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_citation_resolves(path: Path) -> None:
    assert problems(path) == []


def test_the_checks_catch_what_they_are_for() -> None:
    """Each form the checks exist for is caught, as if a page of docs/ said it."""
    citing = ROOT / "docs" / "_probe.md"
    bad = {
        "the contract \N{SECTION SIGN}2.3": "section sign",
        "see ../shared/reference/local-engines.md": "reference/",
        "(ARCHITECTURE decision 7)": "without docs/ARCHITECTURE.md",
        "docs/ARCHITECTURE.md, decision 999": "does not have",
        'docs/ARCHITECTURE.md "No such section"': "a section it does not have",
        "docs/NO_SUCH_PAGE.md": "does not have",
        "as decision 3 says": "without docs/ARCHITECTURE.md",
    }
    for text, why in bad.items():
        found = problems(citing, text)
        assert found and any(why in p for p in found), (text, found)
    assert problems(citing, 'docs/ARCHITECTURE.md, decision 1; docs/ARCHITECTURE.md "The layout by noun"; '
                    "[x](DEPLOY.md#configure); [ARCHITECTURE.md](ARCHITECTURE.md), decisions 2 and 3") == []
