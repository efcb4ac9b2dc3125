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
