"""checkov on the synthesized template, next to cdk-nag and cfn-lint: no failed check, every suppression reasoned.

checkov pins an older boto3 than the project's, so it lives in a venv of its own (`make checkov`:
`.venv-checkov/`, next to the project's venv) and runs as a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.infra.synth import ROOT, Synth

CHECKOV_VERSION = "3.3.30"
# Check id -> why this stack does not follow it. Anything not listed must pass.
SUPPRESSED: dict[str, str] = {
    "CKV_AWS_116": "No Lambda DLQ: Step Functions invokes the workflow Lambdas synchronously and its Retry/Catch "
                   "handle failures; the API is synchronous; the sweeper's schedule runs it again in 5 minutes; "
                   "the SQS-triggered Lambdas (deliver, compose) have their queue's DLQ.",
    "CKV_AWS_117": "No VPC: the Lambdas call only AWS APIs and public webhook targets (checked against private "
                   "ranges at every delivery); a VPC would add NAT gateways and cold-start latency for nothing.",
    "CKV_AWS_173": "Environment variables hold resource names and limits, encrypted at rest with the AWS-managed "
                   "key; the secrets (API keys, the link-signing key) come from Secrets Manager.",
    "CKV_AWS_149": "Secrets Manager encrypts with its AWS-managed key; a customer key adds cost and key policy "
                   "work without narrowing who can read (IAM grants decide that).",
    "CKV_AWS_158": "Log groups use CloudWatch's default encryption; logs carry ids only (nightbatch.logs masks "
                   "keys, secrets and link signatures), so a customer key buys nothing here.",
    "CKV_AWS_18": "No S3 server access logging: it needs a second bucket; API access is in the API's access "
                  "log and CloudTrail data events can be enabled per account.",
    "CKV_AWS_21": "No versioning: objects are named by id and never overwritten, and a deleted or expired file "
                  "must really be gone (versions would keep tenant data past its delete or expiry).",
    "CKV_AWS_27": "The queues use SQS-managed SSE (SqsManagedSseEnabled); this check only recognizes KMS keys.",
}


def checkov_binary() -> str | None:
    for candidate in (os.environ.get("NIGHTBATCH_CHECKOV"), str(ROOT / ".venv-checkov" / "bin" / "checkov"),
                      str(Path(sys.prefix).parent / ".venv-checkov" / "bin" / "checkov"), shutil.which("checkov")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="module", params=["synth", "both_synth", "endpoint_synth"])  # default; Batch+SageMaker; endpoint
def checkov_report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    synth: Synth = request.getfixturevalue(request.param)
    binary = checkov_binary()
    if binary is None:
        pytest.skip("checkov is not installed: run `make checkov` (its own venv, .venv-checkov/)")
    path = tmp_path_factory.mktemp("checkov") / "template.json"
    path.write_text(json.dumps(synth.template))
    out = subprocess.run(
        [binary, "-f", str(path), "--framework", "cloudformation", "--output", "json", "--quiet", "--compact",
         "--skip-check", ",".join(SUPPRESSED)],
        capture_output=True, text=True, timeout=600, check=False)
    report = json.loads(out.stdout)
    return report[0] if isinstance(report, list) else report


def test_checkov_finds_nothing_beyond_the_reasoned_suppressions(checkov_report: dict[str, Any]) -> None:
    assert checkov_report["summary"]["checkov_version"] == CHECKOV_VERSION
    assert checkov_report["summary"]["parsing_errors"] == 0
    failed = [(f["check_id"], f["resource"], f["check_name"]) for f in checkov_report["results"]["failed_checks"]]
    assert failed == []
    assert checkov_report["summary"]["passed"] > 200


def test_every_suppression_has_a_reason() -> None:
    assert all(len(reason) > 40 for reason in SUPPRESSED.values())
