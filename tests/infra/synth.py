"""Synthesizing app.py's stack the way the tests need it: cdk-nag on, bundling off, findings captured."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# The test configuration: cdk.json as shipped, with shard retries short enough to run in moto.
TEST_CONTEXT: dict[str, Any] = {
    "shardRetry": {"maxAttempts": 2, "intervalSeconds": 1, "backoffRate": 1.0},
    # Template tests never bundle Lambda code (that needs pip and minutes; tests/infra/test_bundling.py).
    "aws:cdk:bundling-stacks": [],
}


@dataclass
class Synth:
    template: dict[str, Any]
    report: dict[str, Any] | None
    error: str | None
    stack: Any
    outdir: Path


def synthesize(context_overrides: dict[str, Any], outdir: Path) -> Synth:
    """Synthesize app.py's stack with cdk-nag on; a nag failure is captured, not raised."""
    import aws_cdk as cdk

    import app as cdk_app

    context = {**cdk_app.load_context(ROOT), **TEST_CONTEXT, **context_overrides}
    if outdir.exists():
        shutil.rmtree(outdir)
    application = cdk.App(context=context, outdir=str(outdir))
    # Environment-agnostic, as `cdk synth` without credentials: a developer's CDK_DEFAULT_* do not leak in.
    stack = cdk_app.build(application, environ={})
    error: str | None = None
    try:
        application.synth()
    except RuntimeError as exc:  # cdk-nag findings surface as "ValidationFailed"
        error = str(exc)
    template = json.loads((outdir / f"{stack.stack_name}.template.json").read_text())
    report_path = outdir / "validation-report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return Synth(template=template, report=report, error=error, stack=stack, outdir=outdir)
