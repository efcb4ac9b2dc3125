"""cdk-nag AwsSolutions: no unacknowledged finding, every acknowledgement used and justified."""

from __future__ import annotations

from typing import Any

import pytest

from infra import nag
from tests.infra.synth import Synth, synthesize


def _plugin(report: dict[str, Any] | None) -> dict[str, Any]:
    assert report is not None, "cdk-nag did not run"
    (plugin,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    return dict(plugin)


def _unacknowledged(synth: Synth) -> list[str]:
    plugin = _plugin(synth.report)
    return [f"{v['ruleName']} at {[c['constructPath'] for c in v['violatingConstructs']]}"
            for v in plugin["violations"]]


def test_no_unacknowledged_findings(synth: Synth) -> None:
    assert _unacknowledged(synth) == [], synth.error
    assert synth.error is None
    assert _plugin(synth.report)["conclusion"] == "success"


@pytest.mark.parametrize("which", ["synth", "both_synth", "sagemaker_synth", "endpoint_synth"])
def test_every_acknowledgement_has_a_reason_and_matches_a_finding(which: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(which)
    suppressed = _plugin(synth.report)["suppressedViolations"]
    acknowledged = {s["acknowledgedId"].removeprefix("AwsSolutions::") for s in suppressed}
    for item in suppressed:
        assert len(item["reason"]) >= 40, item["ruleName"]
    declared = {**nag.RULES, **nag.iam_findings(synth.stack)}
    assert set(declared) == acknowledged, "stale or missing acknowledgements"
    assert all(len(reason) >= 40 for reason in declared.values())


@pytest.mark.slow
def test_other_configuration_also_passes(tmp_path_factory: pytest.TempPathFactory) -> None:
    """S3 and gated HF weights, e-mail on (identity created here), Spot only: config-dependent grants."""
    variant = synthesize({
        "account": None, "region": None, "stage": "dev",
        "models": [{"name": "llama", "source": "s3://my-weights/llama/8b/"},
                   {"name": "gated", "source": "hf:meta-llama/Llama-3.1-8B-Instruct", "tokenSecret": "nb/hf"}],
        "notifications": {"senderEmail": "batch@example.com", "allowedDomains": ["example.com"],
                          "alarmEmail": "ops@example.com", "createSenderIdentity": True},
        "capacity": {"spot": True, "onDemand": False},
    }, tmp_path_factory.mktemp("variant") / "cdk.out")
    assert _unacknowledged(variant) == [], variant.error
    resources = variant.template["Resources"].values()
    types = [r["Type"] for r in resources]
    assert types.count("AWS::Batch::ComputeEnvironment") == 1
    assert "AWS::SES::ConfigurationSet" in types and "AWS::SES::EmailIdentity" in types
    for job in (r for r in resources if r["Type"] == "AWS::Batch::JobDefinition"):
        assert [s["Name"] for s in job["Properties"]["ContainerProperties"]["Secrets"]] == ["HF_TOKEN"]
