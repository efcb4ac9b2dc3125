"""The README's configuration table lists every Settings field with its default, in declaration order, and
every `make` target it mentions exists. Run this file as a script to print the table (existing descriptions
kept, new fields marked TODO)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from nightbatch.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ROW = re.compile(r"^\| `(NIGHTBATCH_[A-Z0-9_]+)` \| `([^`]*)` \| (.*) \|$")


def env_name(field: str) -> str:
    return f"NIGHTBATCH_{field.upper()}"


def render_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    return str(value)


def documented() -> dict[str, tuple[str, str]]:
    """variable -> (default, description) for each settings row of the README."""
    rows = {}
    for line in README.read_text().splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def settings_table() -> str:
    rows = documented()
    lines = ["| variable | default | what it sets |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        var = env_name(name)
        description = rows.get(var, ("", "TODO: describe"))[1]
        lines.append(f"| `{var}` | `{render_default(field.default)}` | {description} |")
    return "\n".join(lines)


def test_every_setting_is_documented_with_its_default() -> None:
    rows = documented()
    expected = [(env_name(n), render_default(f.default)) for n, f in Settings.model_fields.items()]
    actual = [(var, default) for var, (default, _) in rows.items()]
    assert actual == expected, (
        "README.md's configuration table is out of date with nightbatch/settings.py. Replace it with the output "
        "of `python tests/docs/test_readme.py` (and describe any TODO rows):\n\n" + settings_table()
    )


def test_readme_make_targets_exist() -> None:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    mentioned = set(re.findall(r"\bmake ([a-z][a-z-]*)", README.read_text()))
    assert mentioned, "the README should tell people which make targets to run"
    assert mentioned <= targets, mentioned - targets


def test_readme_names_the_seed_compat_setting() -> None:
    text = README.read_text()
    assert "NIGHTBATCH_SEED_COMPAT_FILE_GET=false" in text
    assert "GET /v1/files/{output_file_id}" in text


if __name__ == "__main__":
    print(settings_table())
