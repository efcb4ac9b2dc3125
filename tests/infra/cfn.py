"""Resolving the intrinsic functions CDK leaves in a synthesized template, against a map of known values."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::StackName": "nightbatch-test",
}


class UnresolvedError(KeyError):
    """A Ref or GetAtt the caller did not provide a value for."""


def resolve(node: Any, refs: Mapping[str, str], attrs: Callable[[str, str], str]) -> Any:
    """Resolve Ref / Fn::GetAtt / Fn::Join / Fn::Select / Fn::Split / Fn::Sub (no variables map) recursively."""
    if isinstance(node, list):
        return [resolve(item, refs, attrs) for item in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((key, value),) = node.items()
        if key == "Ref":
            if value in PSEUDO:
                return PSEUDO[value]
            try:
                return refs[value]
            except KeyError:
                raise UnresolvedError(f"Ref {value}") from None
        if key == "Fn::GetAtt":
            logical, attr = value if isinstance(value, list) else value.split(".", 1)
            return attrs(logical, attr)
        if key == "Fn::Join":
            sep, parts = value
            return sep.join(str(p) for p in resolve(parts, refs, attrs))
        if key == "Fn::Select":
            index, items = value
            return resolve(items, refs, attrs)[int(index)]
        if key == "Fn::Split":
            sep, source = value
            return str(resolve(source, refs, attrs)).split(sep)
        if key == "Fn::Sub" and isinstance(value, str):
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(resolve({"Ref": m[1]}, refs, attrs)), value)
    return {k: resolve(v, refs, attrs) for k, v in node.items()}


def of_type(template: Mapping[str, Any], cfn_type: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == cfn_type}


def one_of_type(template: Mapping[str, Any], cfn_type: str, prefix: str = "") -> tuple[str, dict[str, Any]]:
    found = [(k, v) for k, v in of_type(template, cfn_type).items() if k.startswith(prefix)]
    assert len(found) == 1, f"expected one {cfn_type} {prefix}*, found {[k for k, _ in found]}"
    return found[0]


_PREFIX = f"arn:aws:{{}}:{PSEUDO['AWS::Region']}:{PSEUDO['AWS::AccountId']}"
# What Ref and Fn::GetAtt (…, "Arn") give for each resource type once deployed (logical id as its name), in the
# formats AWS documents: enough for tools that read ARNs (the ASL and IAM validators) to see real-looking ones.
_REF: dict[str, str] = {
    "AWS::SNS::Topic": _PREFIX.format("sns") + ":{}", "AWS::SQS::Queue": "https://sqs.us-east-1.amazonaws.com/"
    + PSEUDO["AWS::AccountId"] + "/{}", "AWS::SecretsManager::Secret": _PREFIX.format("secretsmanager") +
    ":secret:{}-AbCdEf", "AWS::StepFunctions::StateMachine": _PREFIX.format("states") + ":stateMachine:{}",
    "AWS::Batch::JobQueue": _PREFIX.format("batch") + ":job-queue/{}", "AWS::Batch::JobDefinition":
    _PREFIX.format("batch") + ":job-definition/{}:1", "AWS::Batch::ComputeEnvironment": _PREFIX.format("batch") +
    ":compute-environment/{}", "AWS::Batch::SchedulingPolicy": _PREFIX.format("batch") + ":scheduling-policy/{}",
    "AWS::KMS::Key": "{}-1234-5678", "AWS::Events::EventBus": "{}",
}
_ARN: dict[str, str] = {
    "AWS::S3::Bucket": "arn:aws:s3:::{}", "AWS::DynamoDB::GlobalTable": _PREFIX.format("dynamodb") + ":table/{}",
    "AWS::DynamoDB::Table": _PREFIX.format("dynamodb") + ":table/{}",
    "AWS::Lambda::Function": _PREFIX.format("lambda") + ":function:{}", "AWS::SQS::Queue":
    _PREFIX.format("sqs") + ":{}", "AWS::KMS::Key": _PREFIX.format("kms") + ":key/{}-1234-5678",
    "AWS::IAM::Role": f"arn:aws:iam::{PSEUDO['AWS::AccountId']}:role/{{}}", "AWS::Logs::LogGroup":
    _PREFIX.format("logs") + ":log-group:{}:*", "AWS::SNS::Topic": _PREFIX.format("sns") + ":{}",
    "AWS::Events::EventBus": _PREFIX.format("events") + ":event-bus/{}", "AWS::ApiGatewayV2::Api":
    _PREFIX.format("apigateway") + "::/apis/{}",
}


def deployed(template: Mapping[str, Any], node: Any) -> Any:
    """`node` with every Ref and Fn::GetAtt resolved to what the deployed resource would give."""
    types = {k: r["Type"] for k, r in template["Resources"].items()}

    class _Refs(dict[str, str]):
        def __missing__(self, logical: str) -> str:
            if logical not in types:
                raise UnresolvedError(f"Ref {logical}")
            return _REF.get(types[logical], "{}").format(logical)

    def attrs(logical: str, attr: str) -> str:
        kind = types.get(logical, "")
        if attr == "Arn" or attr.endswith("Arn"):
            return _ARN.get(kind, _REF.get(kind, _PREFIX.format(kind.split("::")[1].lower()) + ":{}")).format(logical)
        return f"{logical}-{attr}"

    return resolve(node, _Refs(), attrs)
