"""The API handler's cold import leaves out what only some requests need (issue #17: bench/cold_import).

Checked on sys.modules in a fresh interpreter, never on time: the modules below are imported when a request
first needs them, so a Lambda's init does not pay for them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Imported on first use, not by `import functions.api.handler`.
# Powertools: Parameters loads on the first secret read (nightbatch/aws/secrets.py); no Tracer in the API.
DEFERRED = ("boto3", "botocore", "s3transfer", "aws_lambda_powertools", "aws_xray_sdk")
# The workflow's steps: the API only needs the estimate's dry run (nightbatch.pipeline.estimate, .sizing).
DEFERRED_MODULES = ("nightbatch.pipeline.validate", "nightbatch.pipeline.plan", "nightbatch.pipeline.finalize")


def imported_by_handler() -> set[str]:
    code = "import sys, json, functions.api.handler; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_handler_import_defers_route_only_modules() -> None:
    modules = imported_by_handler()
    assert "functions.api.handler" in modules
    loaded = sorted(m for m in modules if m.split(".")[0] in DEFERRED or m in DEFERRED_MODULES)
    assert loaded == []
