"""L11: the `limits` context sets runtime limits only, never secrets, safety switches or the stack's wiring."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config import FORBIDDEN_LIMITS, DeployConfig
from infra.environment import settings_environment
from nightbatch.settings import SETTINGS, Settings, nest
from tests.infra.synth import ROOT

CDK_JSON: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]


@pytest.mark.parametrize("name", ["allow_private_targets", "api_keys", "api_key", "link_secret",
                                  "api_keys_secret", "bucket", "hour_seconds"])
def test_secrets_and_switches_are_refused(name: str) -> None:
    value = True if name == "allow_private_targets" else 1.0 if name == "hour_seconds" else "x"
    with pytest.raises(ValidationError, match="may not be set here"):
        DeployConfig.from_context({**CDK_JSON, "limits": {name: value}}.get)


def test_real_limits_are_still_accepted() -> None:
    c = DeployConfig.from_context({**CDK_JSON, "limits": {"max_requests_per_batch": 10,
                                                          "public_base_url": "https://x.example"}}.get)
    assert c.limits["max_requests_per_batch"] == 10
    assert not set(CDK_JSON["limits"]) & set(FORBIDDEN_LIMITS)


def test_limits_are_setting_names_whatever_section_reads_them() -> None:
    # The names of the variables (NIGHTBATCH_LIMIT_QUEUED_TOKENS -> limit_queued_tokens), as before the sections;
    # a section's own field name is not a setting name.
    limits = {"limit_queued_tokens": 5, "worker_poll_seconds": 2.5, "link_ttl_seconds": 60}
    c = DeployConfig.from_context({**CDK_JSON, "limits": limits}.get)
    settings = Settings.model_validate(nest(c.limits))
    assert (settings.limits.queued_tokens, settings.worker.poll_seconds, settings.links.ttl_seconds) == (5, 2.5, 60)
    assert settings_environment(c.limits)["NIGHTBATCH_LIMIT_QUEUED_TOKENS"] == "5"
    with pytest.raises(ValidationError, match="not settings"):
        DeployConfig.from_context({**CDK_JSON, "limits": {"queued_tokens": 5}}.get)
    assert set(FORBIDDEN_LIMITS) <= set(SETTINGS)
