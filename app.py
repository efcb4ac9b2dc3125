#!/usr/bin/env python3
"""CDK entry point: reads the stage's configuration from the context and synthesizes the nightbatch stack."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.config import DeployConfig
from infra.stack import NightbatchStack

ROOT = Path(__file__).resolve().parent


def load_context(root: Path = ROOT) -> dict[str, Any]:
    """cdk.json's context plus cdk.context.json, for synths outside the CLI (tests, `python app.py`).

    The CLI passes the same values itself; `cdk.App()` alone reads neither file. cdk.context.json is not
    shipped: the CLI writes it (the AZ lookup) on the first synth of a stack bound to an account.
    """
    context: dict[str, Any] = dict(json.loads((root / "cdk.json").read_text()).get("context", {}))
    cached = root / "cdk.context.json"
    if cached.exists():
        context.update(json.loads(cached.read_text()))
    return context


def stack_environment(config: DeployConfig, environ: Mapping[str, str] = os.environ) -> cdk.Environment | None:
    """Where the stack deploys: an explicit `account`/`region` in the context wins, else the CDK CLI's
    CDK_DEFAULT_ACCOUNT/CDK_DEFAULT_REGION (the caller's credentials), else environment-agnostic.

    Environment-agnostic synthesizes offline with no credentials; CloudFormation fills in the account and
    region at deploy time (the VPC then spans two AZs, `Fn::GetAZs`).
    """
    account = config.account or environ.get("CDK_DEFAULT_ACCOUNT") or None
    region = config.region or environ.get("CDK_DEFAULT_REGION") or None
    if account is None and region is None:
        return None
    return cdk.Environment(account=account, region=region)


def build(app: cdk.App, environ: Mapping[str, str] = os.environ) -> NightbatchStack:
    config = DeployConfig.from_context(app.node.try_get_context)
    env = stack_environment(config, environ)
    stack = NightbatchStack(app, f"nightbatch-{config.stage}", config=config, repo_root=ROOT, env=env)
    if app.node.try_get_context("nag") not in (False, "false"):
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return stack


if __name__ == "__main__":
    app = cdk.App(context=load_context())
    build(app)
    app.synth()
