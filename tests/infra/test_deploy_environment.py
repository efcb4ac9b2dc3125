"""Deploying into the caller's account: no placeholder account, environment-agnostic by default, offline synth,
and an SES sender that several stages share."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import app as cdk_app
from infra.config import DeployConfig
from tests.infra.cfn import of_type
from tests.infra.synth import ROOT, Synth, synthesize
from tests.support.node import NODE, pinned_version

CDK_JSON: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]
# Twelve digits standing alone (an ARN's ":123456789012:", a quoted id), not a run of digits inside a hex asset
# hash such as "…fdfb19a109749514989a2f…" (which would fail the test by chance whenever the assets change).
ACCOUNT_ID = re.compile(r"(?<![0-9A-Za-z])\d{12}(?![0-9A-Za-z])")


def _config(**overrides: Any) -> DeployConfig:
    return DeployConfig.from_context({**CDK_JSON, **overrides}.get)


def test_the_account_pattern_skips_asset_hashes() -> None:
    assert ACCOUNT_ID.search('"arn:aws:iam::123456789012:role/x"') and ACCOUNT_ID.search('"123456789012"')
    assert not ACCOUNT_ID.search("assets:06a06b641ce2590f25538fdfb19a109749514989a2f2f1d625acc777731af")


def test_no_account_is_shipped() -> None:
    tracked = subprocess.run(["git", "ls-files", "cdk.json", "cdk.context.json", "app.py"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert "cdk.context.json" not in tracked
    for name in ("cdk.json", "app.py"):
        assert not ACCOUNT_ID.search((ROOT / name).read_text()), name
    assert "account" not in CDK_JSON and "region" not in CDK_JSON


@pytest.mark.parametrize(("context", "environ", "expected"), [
    ({}, {}, None),
    ({}, {"CDK_DEFAULT_ACCOUNT": "111122223333", "CDK_DEFAULT_REGION": "eu-west-1"},
     ("111122223333", "eu-west-1")),
    ({"account": "444455556666", "region": "us-west-2"},
     {"CDK_DEFAULT_ACCOUNT": "111122223333", "CDK_DEFAULT_REGION": "eu-west-1"}, ("444455556666", "us-west-2")),
    ({"region": "us-west-2"}, {"CDK_DEFAULT_ACCOUNT": "111122223333", "CDK_DEFAULT_REGION": "eu-west-1"},
     ("111122223333", "us-west-2")),
])
def test_explicit_context_wins_then_the_cli_s_defaults_then_agnostic(
        context: dict[str, str], environ: dict[str, str], expected: tuple[str, str] | None) -> None:
    env = cdk_app.stack_environment(_config(**context), environ)
    assert (None if env is None else (env.account, env.region)) == expected


def test_default_template_is_environment_agnostic(synth: Synth) -> None:
    text = json.dumps(synth.template)
    assert not ACCOUNT_ID.search(text), ACCOUNT_ID.findall(text)[:3]
    assert '"us-east-1' not in text
    subnets = of_type(synth.template, "AWS::EC2::Subnet").values()
    assert all("Fn::GetAZs" in json.dumps(s["Properties"]["AvailabilityZone"]) for s in subnets)
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    assert "missing" not in manifest, manifest.get("missing")


def _offline_environment(outdir: Path) -> dict[str, str]:
    """The process environment of a machine with no AWS credentials, as `cdk synth` would run app.py."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "CDK_")) and k not in ("PYTHONPATH",)}
    env.update({
        "PYTHONPATH": str(ROOT),
        "AWS_CONFIG_FILE": str(outdir / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(outdir / "no-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "CDK_OUTDIR": str(outdir),
        # What the CLI passes with `cdk synth --no-staging`-like runs: the Lambda asset is not built here
        # (tests/infra/test_lambda_asset.py builds and runs it).
        "CDK_CONTEXT_JSON": json.dumps({"aws:cdk:bundling-stacks": []}),
    })
    return env


@pytest.mark.slow
def test_app_synthesizes_offline_without_credentials(tmp_path: Path) -> None:
    outdir = tmp_path / "cdk.out"
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=_offline_environment(outdir),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((outdir / "manifest.json").read_text())
    assert "missing" not in manifest
    [stack] = [a for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"]
    assert stack["environment"] == "aws://unknown-account/unknown-region"
    template = json.loads((outdir / "nightbatch-prod.template.json").read_text())
    assert not ACCOUNT_ID.search(json.dumps(template))


SENDER = {"senderEmail": "batches@mail.example.com", "allowedDomains": ["example.com"]}


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Synth, Synth]]:
    yield tuple(  # type: ignore[misc]
        synthesize({"stage": stage, "notifications": {**SENDER, "senderIdentity": "example.com"}, "nag": False},
                   tmp_path_factory.mktemp(stage) / "cdk.out")
        for stage in ("dev", "prod"))


# Properties that name a resource within the account and region (an inline PolicyName or a MetricName does not).
_NAME_KEYS = {"BucketName", "TableName", "TopicName", "QueueName", "RoleName", "LogGroupName", "StateMachineName",
              "ComputeEnvironmentName", "JobQueueName", "JobDefinitionName", "DashboardName", "AlarmName",
              "EmailIdentity", "Name", "KeyAlias", "AliasName", "SchedulingPolicyName", "LaunchTemplateName"}


def _physical_names(template: dict[str, Any]) -> set[tuple[str, str, str]]:
    """Literal names a resource is given in the template (a second stack with the same one would collide)."""
    names = set()
    for resource in template["Resources"].values():
        for key, value in resource.get("Properties", {}).items():
            # API Gateway allows several APIs of one name.
            if key in _NAME_KEYS and isinstance(value, str) and resource["Type"] != "AWS::ApiGatewayV2::Api":
                names.add((resource["Type"], key, value))
    return names


def test_two_stages_with_the_same_sender_deploy_side_by_side(two_stages: tuple[Synth, Synth]) -> None:
    dev, prod = two_stages
    for synth in two_stages:
        types = [r["Type"] for r in synth.template["Resources"].values()]
        assert "AWS::SES::EmailIdentity" not in types  # the existing identity is used, not created
        assert types.count("AWS::SES::ConfigurationSet") == 1
    assert _physical_names(dev.template) & _physical_names(prod.template) == set()


class _Names(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return key


def _ses_resources(template: dict[str, Any]) -> list[str]:
    from tests.infra.cfn import resolve

    found = []
    for policy in of_type(template, "AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if "ses:SendEmail" in actions:
                found += [str(resolve(r, _Names(), lambda logical, attr: f"{logical}.{attr}"))
                          for r in statement["Resource"]]
    return found


def test_notify_may_send_through_the_named_identity(two_stages: tuple[Synth, Synth]) -> None:
    resources = _ses_resources(two_stages[0].template)
    assert "arn:aws:ses:us-east-1:123456789012:identity/example.com" in resources
    assert "arn:aws:ses:us-east-1:123456789012:identity/batches@mail.example.com" in resources


@pytest.mark.parametrize("notifications", [
    {"senderEmail": "a@example.com", "senderIdentity": "other.com"},
    {"senderEmail": "a@example.com", "senderIdentity": "b@example.com"},
    {"senderIdentity": "example.com"},
    {"createSenderIdentity": True},
])
def test_identity_must_cover_the_sender(notifications: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="notifications"):
        _config(notifications=notifications)


def test_identity_defaults_to_the_address_and_a_parent_domain_covers_it() -> None:
    assert _config(notifications={"senderEmail": "a@example.com"}).notifications.identity == "a@example.com"
    assert _config(notifications=SENDER | {"senderIdentity": "example.com"}).notifications.identity == "example.com"


def test_the_project_pins_and_documents_a_node_the_cdk_supports() -> None:
    """aws-cdk-lib supports Node 22 and 24 (20 is end-of-life, and it says so on every synth): the Makefile installs
    one of them, DEPLOY.md asks for them, the tests run jsii on it, and nothing silences the warning."""
    assert int(pinned_version().split(".")[0]) in (22, 24)
    deploy = (ROOT / "docs" / "DEPLOY.md").read_text()
    [row] = [line for line in deploy.splitlines() if line.startswith("| Node")]
    assert row.startswith("| Node 22 or 24 ") and "20 " not in row.split("|")[1]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    silenced = [p for p in tracked if (ROOT / p).is_file() and p != "tests/infra/test_deploy_environment.py"
                and "JSII_SILENCE_WARNING_END_OF_LIFE" in (ROOT / p).read_text(errors="ignore")]
    assert silenced == []
    if NODE.is_file():  # `make node` ran (make test runs it)
        assert os.environ.get("JSII_NODE") == str(NODE)
        version = subprocess.run([str(NODE), "--version"], capture_output=True, text=True, check=True).stdout
        assert version.strip() == f"v{pinned_version()}"
