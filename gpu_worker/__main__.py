"""`python -m gpu_worker`: the worker container's command."""

from __future__ import annotations

import sys

from gpu_worker.main import main

# The guard matters: vLLM spawns its engine-core process, which re-imports __main__.
if __name__ == "__main__":
    sys.exit(main())
