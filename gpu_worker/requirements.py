"""An image's Python requirements: the core dependencies plus one extra of pyproject.toml — the GPU worker's
`worker` (by default), or the endpoint runner's `endpoint`.

Standard library only: the image build runs it (`python3 requirements.py pyproject.toml [extra]`) before anything of
nightbatch is installed, and scripts/check-worker-deps resolves the worker's list together with the CUDA vLLM.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

WORKER_EXTRA = "worker"
ENDPOINT_EXTRA = "endpoint"


def worker_requirements(pyproject: Path, extra: str = WORKER_EXTRA) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project.get("optional-dependencies", {}).get(extra, [])]


if __name__ == "__main__":
    print("\n".join(worker_requirements(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"),
                                        sys.argv[2] if len(sys.argv) > 2 else WORKER_EXTRA)))
