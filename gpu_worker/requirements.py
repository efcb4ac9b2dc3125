"""The worker image's Python requirements: the core dependencies plus the `worker` extra of pyproject.toml.

Standard library only: the image build runs it (`python3 requirements.py pyproject.toml`) before anything of
nightbatch is installed, and scripts/check-worker-deps resolves the same list together with the CUDA vLLM.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

WORKER_EXTRA = "worker"


def worker_requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project.get("optional-dependencies", {}).get(WORKER_EXTRA, [])]


if __name__ == "__main__":
    print("\n".join(worker_requirements(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))))
