#!/usr/bin/env python3
"""CDK entry point: reads the stage's configuration from the context and synthesizes the nightbatch stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.config import DeployConfig
from infra.stack import NightbatchStack

ROOT = Path(__file__).resolve().parent


def load_context(root: Path = ROOT) -> dict[str, Any]:
    """cdk.json's context plus cdk.context.json, for synths outside the CLI (tests, `python app.py`).

    The CLI passes the same values itself; `cdk.App()` alone reads neither file.
    """
    context: dict[str, Any] = dict(json.loads((root / "cdk.json").read_text()).get("context", {}))
    cached = root / "cdk.context.json"
    if cached.exists():
        context.update(json.loads(cached.read_text()))
    return context


def build(app: cdk.App) -> NightbatchStack:
    config = DeployConfig.from_context(app.node.try_get_context)
    env = cdk.Environment(account=config.account, region=config.region) if config.account else None
    stack = NightbatchStack(app, f"nightbatch-{config.stage}", config=config, repo_root=ROOT, env=env)
    if app.node.try_get_context("nag") not in (False, "false"):
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return stack


if __name__ == "__main__":
    app = cdk.App(context=load_context())
    build(app)
    app.synth()
