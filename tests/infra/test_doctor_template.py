"""`nightbatch doctor --template` on the template this app synthesizes: it finds what the stack reserves and the
compute environments it will create (the shapes CDK writes), so the account is checked before the first deploy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nightbatch.cli.doctor.prerequisites import template_environments, template_outputs
from tests.cli.doctor.conftest import aws  # noqa: F401  (a fixture)
from tests.cli.doctor.test_doctor_prerequisites import account, checked
from tests.infra.synth import ROOT

CDK_JSON: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]


@pytest.mark.usefixtures("aws")
def test_the_doctor_reads_the_synthesized_template(template: dict[str, Any], tmp_path: Path) -> None:
    environments = template_environments(template)
    assert sorted(ce.spot for ce in environments) == [False, True]
    assert all(set(ce.instance_types) == set(CDK_JSON["gpuInstanceTypes"]) for ce in environments)
    assert all(ce.max_vcpus >= 4 * CDK_JSON["maxGpus"] for ce in environments)
    assert template_outputs(template)["ReservedConcurrency"] == "121"
    found = checked(tmp_path, account(lambda_quota=10, unreserved=10), template)
    [lam] = found["Lambda"]
    assert lam.status == "failed" and "the stack reserves 121" in lam.detail and "--desired-value 221" in lam.remedy
    assert len(found["GPU quota"]) == 2 and [c.status for c in found["Spot role"]] == ["failed"]
