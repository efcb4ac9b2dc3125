"""cfn-lint over the template, with the state machine's definition rendered so E3601 validates the ASL."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from cfnlint.api import ManualArgs, lint

from tests.infra.cfn import one_of_type, resolve

# W3005: CDK's redundant DependsOn on roles.
IGNORED = ["W3005"]


class _Names(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return key


def _rendered(template: dict[str, Any]) -> dict[str, Any]:
    rendered = copy.deepcopy(template)
    _, machine = one_of_type(rendered, "AWS::StepFunctions::StateMachine")
    machine["Properties"]["DefinitionString"] = resolve(
        machine["Properties"]["DefinitionString"], _Names(),
        lambda logical, attr: f"arn:aws:lambda:us-east-1:123456789012:function:{logical}",
    )
    assert isinstance(machine["Properties"]["DefinitionString"], str)
    return rendered


def _lint(template: dict[str, Any]) -> list[Any]:
    return list(lint(json.dumps(template), config=ManualArgs(regions=["us-east-1"], ignore_checks=IGNORED)))


# The default stack, the SageMaker backend's two shapes, and a model on an endpoint (tests/infra/conftest.py).
SYNTHS = {"batch": "synth", "both": "both_synth", "sagemaker": "sagemaker_synth", "endpoint": "endpoint_synth"}


@pytest.fixture(scope="module", params=sorted(SYNTHS))
def rendered(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _rendered(request.getfixturevalue(SYNTHS[request.param]).template)


def test_no_errors_or_warnings(rendered: dict[str, Any]) -> None:
    matches = _lint(rendered)
    assert [f"{m.rule.id} {m.message} at {m.path}" for m in matches] == []


def test_the_definition_is_really_checked(rendered: dict[str, Any]) -> None:
    broken = copy.deepcopy(rendered)
    _, machine = one_of_type(broken, "AWS::StepFunctions::StateMachine")
    asl = json.loads(machine["Properties"]["DefinitionString"])
    asl["States"]["Plan"]["Type"] = "Taskk"
    machine["Properties"]["DefinitionString"] = json.dumps(asl)
    assert "E3601" in {m.rule.id for m in _lint(broken)}
