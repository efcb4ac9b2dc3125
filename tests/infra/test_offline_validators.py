"""Offline validators of the synthesized stack, next to cdk-nag, cfn-lint and checkov, on the variants a deployment
can take (gpuBackend batch, sagemaker with and without the unlisted fields, both; and batch with SES, alarm e-mail
and user buckets): every state machine passes `asl-validator` (npm, installed with the project's Node by `make
node`), and every IAM policy passes `parliament` (PyPI, the dev extra). Each parliament finding that does not apply
is suppressed here with its reason, as checkov's are (tests/infra/test_checkov.py); anything else fails.

Both read the template as it deploys: Refs and Fn::GetAtt resolved to the ARNs the resources would have
(tests/infra/cfn.py `deployed`), so the ARN checks see real-looking ones.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.infra.cfn import deployed, of_type
from tests.infra.synth import Synth, synthesize
from tests.support.node import NODE, NODE_DIR

VARIANTS = ["synth", "sagemaker_synth", "sagemaker_fields_synth", "both_synth", "notifying_synth"]
ASL_VALIDATOR = NODE_DIR / "node_modules" / "asl-validator" / "dist" / "bin" / "asl-validator.js"
# The policy documents of each resource type (identity, trust and resource policies alike).
POLICY_DOCUMENTS = {
    "AWS::IAM::Policy": ("PolicyDocument",), "AWS::IAM::ManagedPolicy": ("PolicyDocument",),
    "AWS::IAM::Role": ("AssumeRolePolicyDocument",), "AWS::S3::BucketPolicy": ("PolicyDocument",),
    "AWS::SQS::QueuePolicy": ("PolicyDocument",), "AWS::SNS::TopicPolicy": ("PolicyDocument",),
    "AWS::KMS::Key": ("KeyPolicy",),
}
# (where, parliament's issue, the action it names or "") -> why this stack does not follow it.
SUPPRESSED: dict[tuple[str, str, str], str] = {
    ("AWS::IAM::Policy.PolicyDocument", "RESOURCE_MISMATCH", "batch:SubmitJob"):
        "parliament's copy of the Service Authorization Reference also lists `job` as a resource type of "
        "SubmitJob; AWS Batch's IAM guide scopes SubmitJob by job queue and job definition only (\"you must "
        "provide both job queue and job definition resource types\"), as the state machine's role does",
    ("AWS::IAM::Policy.PolicyDocument", "RESOURCE_MISMATCH", "states:DescribeExecution"):
        "DescribeExecution takes standard (`execution`) or Express (`express`) execution ARNs and parliament "
        "asks for both; the Distributed Map's child executions are standard, and CDK grants "
        "`execution:<machine>:*` as Step Functions' Distributed Map IAM guide does",
    ("AWS::IAM::Role.AssumeRolePolicyDocument", "MALFORMED", ""):
        "a trust policy says who may assume the role (Principal) and never has a Resource: parliament reads "
        "every document as an identity policy",
    ("AWS::KMS::Key.KeyPolicy", "RESOURCE_STAR", ""):
        "in a key policy, Resource \"*\" is the key the policy belongs to (KMS allows nothing else there); the "
        "roles that use the key are scoped by their own policies",
}


@pytest.fixture(scope="module")
def notifying_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Batch with SES e-mail, an alarm address and the users' own buckets: every optional grant present."""
    return synthesize({
        "notifications": {"senderEmail": "batches@example.com", "allowedDomains": ["*"],
                          "alarmEmail": "ops@example.com"},
        "userBuckets": {"read": ["my-prompts"], "write": ["s3://my-results/nightbatch/"],
                        "kmsKeys": ["arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-1234-5678-9abc-def012345678"]},
        "nag": False}, tmp_path_factory.mktemp("notifying") / "cdk.out")


@pytest.mark.parametrize("which", VARIANTS)
def test_every_state_machine_passes_asl_validator(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not (NODE.is_file() and ASL_VALIDATOR.is_file()):
        pytest.skip("asl-validator is not installed: run `make node` (.node/)")
    template = request.getfixturevalue(which).template
    machines = of_type(template, "AWS::StepFunctions::StateMachine")
    assert machines
    for logical, machine in machines.items():
        path = tmp_path / f"{logical}.asl.json"
        path.write_text(deployed(template, machine["Properties"]["DefinitionString"]))
        out = subprocess.run([str(NODE), str(ASL_VALIDATOR), "--json-path", str(path)], capture_output=True,
                             text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "is valid" in out.stdout


def _documents(resource: dict[str, Any]) -> list[tuple[str, Any]]:
    """(where, document) of every policy a resource holds, a role's inline policies included."""
    props = resource.get("Properties", {})
    found = [(f"{resource['Type']}.{key}", props[key]) for key in POLICY_DOCUMENTS.get(resource["Type"], ())
             if key in props]
    if resource["Type"] == "AWS::IAM::Role":
        found += [("AWS::IAM::Role.Policies", p["PolicyDocument"]) for p in props.get("Policies", [])]
    return found


def _subjects(finding: Any) -> list[str]:
    if finding.issue == "RESOURCE_MISMATCH":
        return sorted({d["action"] for d in finding.detail})
    return [""]


@pytest.mark.parametrize("which", VARIANTS)
def test_every_iam_policy_passes_parliament_beyond_the_reasoned_suppressions(
        which: str, request: pytest.FixtureRequest) -> None:
    parliament = pytest.importorskip("parliament", reason="parliament is not installed: `make venv` (dev extra)")
    template = request.getfixturevalue(which).template
    checked, unexplained = 0, []
    for logical, resource in template["Resources"].items():
        for where, document in _documents(resource):
            checked += 1
            for finding in parliament.analyze_policy_string(json.dumps(deployed(template, document))).findings:
                unexplained += [(logical, where, finding.issue, s, json.dumps(finding.detail)[:200])
                                for s in _subjects(finding) if (where, finding.issue, s) not in SUPPRESSED]
    assert checked > 20
    assert unexplained == []


def test_every_suppression_has_a_reason() -> None:
    assert all(len(reason) > 60 for reason in SUPPRESSED.values())
