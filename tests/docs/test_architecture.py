"""docs/ARCHITECTURE.md tells the truth about the code: its floors are the import-graph test's FLOORS, every path
it names exists, and every S3 key it names is one nightbatch/layout.py builds. A move or a rename of a room fails
here until the page follows."""

from __future__ import annotations

import re
from pathlib import Path

from nightbatch import layout
from tests.test_import_graph import FLOORS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "ARCHITECTURE.md"


def _section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def test_the_floors_are_the_import_graph_tests() -> None:
    rows = [line for line in _section("The layout by noun").splitlines() if re.match(r"^\| \d+ \|", line)]
    floors = [tuple(_code_spans(row.split("|")[2])) for row in rows]
    expected = [tuple(room.removeprefix("nightbatch.") for room in floor) for floor in FLOORS]
    assert floors == expected


def test_every_path_it_names_exists() -> None:
    missing = []
    for span in _code_spans(PAGE.read_text()):
        if not re.fullmatch(r"[\w-]+(/[\w.-]+)*(\.\w+|/)", span):
            continue  # not a path: a name, a URL, a command
        if "/" not in span and not span.endswith((".py", ".json", ".toml", ".md")):
            continue  # a dotted name (jsonl.loads, batch.nightbatch.cost)
        if not any((base / span).exists() for base in (ROOT, ROOT / "nightbatch")):
            missing.append(span)
    assert missing == []


def test_every_key_it_names_is_layouts() -> None:
    keys = {span for span in _code_spans(_section("What each step hands the next")) if span.endswith("_key")}
    assert keys and {k for k in keys if not callable(getattr(layout, k, None))} == set()
