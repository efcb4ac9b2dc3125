"""A process builds its Settings once, at its entry point, and hands them down: no module below reads the
environment for settings on its own (the Lambdas through nightbatch/wiring.py, the worker in
gpu_worker/main.py, the CLI commands and the local stack in theirs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILDS = re.compile(r"\bget_settings\(\)|(?<![\w.])Settings\(|Settings\.from_names\(|\bJobInputs\(")
ENTRY_POINTS = {
    "nightbatch/wiring.py",  # default_services(): every Lambda
    "gpu_worker/main.py",  # the worker container: its settings and its job's inputs
    "nightbatch/local/stack.py",  # `nightbatch local`
    "nightbatch/cli/keys.py",  # `nightbatch keys`
    "nightbatch/cli/connection.py",  # the API commands' server and key
}


def test_only_entry_points_build_settings() -> None:
    builders = set()
    for package in ("nightbatch", "functions", "gpu_worker", "infra"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith("nightbatch/settings/") and BUILDS.search(path.read_text()):
                builders.add(rel)
    assert builders == ENTRY_POINTS
