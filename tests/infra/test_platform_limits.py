"""Platform limits checked at synth: Lambda environments (4 KB) and the state machine definition (1 MiB)."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_lambda as lambda_

from infra.lambdas import LambdaFunction
from infra.limits import (
    LAMBDA_ENVIRONMENT_LIMIT,
    STATE_MACHINE_DEFINITION_LIMIT,
    TOKEN_BOUND,
    bounded_size,
    definition_problems,
    environment_size,
)
from tests.infra.cfn import of_type, one_of_type


def test_every_lambda_environment_fits_with_room(template: dict[str, Any]) -> None:
    sizes = {logical: environment_size(fn["Properties"]["Environment"]["Variables"])
             for logical, fn in of_type(template, "AWS::Lambda::Function").items()}
    assert len(sizes) >= 8
    # Room for a few more models or limits: the biggest is under three quarters of the limit.
    assert max(sizes.values()) < LAMBDA_ENVIRONMENT_LIMIT * 3 // 4, sizes


def test_deploy_time_values_count_at_their_bound() -> None:
    assert bounded_size("abc") == 3
    assert bounded_size({"Ref": "Bucket"}) == TOKEN_BOUND and bounded_size({"Ref": "AWS::AccountId"}) == 12
    assert bounded_size({"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":x"]]}) == 4 + 10 + 2
    assert bounded_size("{{resolve:secretsmanager:arn:SecretString:::}}") == TOKEN_BOUND


def test_an_oversized_environment_fails_the_synth(tmp_path: Any) -> None:
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "TooBig")
    LambdaFunction(stack, "Fn", code=lambda_.Code.from_inline("def handler(e, c): pass"), handler="index.handler",
                   description="too big", timeout=cdk.Duration.seconds(3),
                   environment={"NIGHTBATCH_MODELS_JSON": "m" * 3000, "NIGHTBATCH_BUCKET": "b"})
    stack_fn = stack.node.find_child("Fn")
    stack_fn.add_environment("NIGHTBATCH_LIMITS", "l" * 1100)  # added later: still counted
    with pytest.raises(RuntimeError, match=r"over Lambda's 4096-byte limit \(largest: NIGHTBATCH_MODELS_JSON"):
        app.synth()


def test_state_machine_definition_is_well_under_its_limit(template: dict[str, Any]) -> None:
    _, machine = one_of_type(template, "AWS::StepFunctions::StateMachine")
    size = bounded_size(machine["Properties"]["DefinitionString"])
    assert size < STATE_MACHINE_DEFINITION_LIMIT // 64, size  # under 16 KiB
    assert definition_problems("m", machine["Properties"]["DefinitionString"]) == []
    assert definition_problems("m", "x" * (STATE_MACHINE_DEFINITION_LIMIT + 1))
