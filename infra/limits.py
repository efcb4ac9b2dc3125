"""Platform limits checked at synth: what CloudFormation or a service would only refuse at deploy or run time.

Values CloudFormation fills in at deploy (Ref, GetAtt, dynamic references) are counted at an upper bound, so a
template that passes here cannot exceed the limit once deployed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# Lambda: all environment variables of a function together (hard limit).
LAMBDA_ENVIRONMENT_LIMIT = 4096
# Step Functions: a state machine's definition (hard limit, 1 MiB).
STATE_MACHINE_DEFINITION_LIMIT = 1024 * 1024
# Upper bound of a value CloudFormation substitutes: names are ≤ 255 characters, ARNs and URLs of this stack's
# resources well under it; the one secret resolved into an environment (the link key) is 64 characters.
TOKEN_BOUND = 256
_PSEUDO_BOUNDS = {"AWS::AccountId": 12, "AWS::Region": 16, "AWS::Partition": 10, "AWS::URLSuffix": 16}
_DYNAMIC_REFERENCE = re.compile(r"\{\{resolve:[^}]*\}\}")


def bounded_size(value: Any) -> int:
    """Bytes of `value` once CloudFormation has resolved it, at most; `value` as the template holds it."""
    if isinstance(value, str):
        literal = _DYNAMIC_REFERENCE.sub("", value)
        return len(literal.encode()) + TOKEN_BOUND * len(_DYNAMIC_REFERENCE.findall(value))
    if isinstance(value, (int, float, bool)) or value is None:
        return len(json.dumps(value))
    if isinstance(value, list):
        return sum(bounded_size(item) for item in value)
    if isinstance(value, dict) and len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref":
            return _PSEUDO_BOUNDS.get(arg, TOKEN_BOUND)
        if key == "Fn::Join":
            separator, parts = arg
            return bounded_size(parts) + len(separator.encode()) * max(0, len(parts) - 1)
        if key.startswith("Fn::"):
            return TOKEN_BOUND
    return len(json.dumps(value).encode())


def environment_size(variables: Mapping[str, Any]) -> int:
    """Bounded bytes of a Lambda environment as Lambda counts it: every name and value."""
    return sum(len(name.encode()) + bounded_size(value) for name, value in variables.items())


def environment_problems(name: str, variables: Mapping[str, Any]) -> list[str]:
    size = environment_size(variables)
    if size <= LAMBDA_ENVIRONMENT_LIMIT:
        return []
    largest = sorted(variables, key=lambda k: -bounded_size(variables[k]))[:3]
    return [f"{name}: the Lambda environment may reach {size} bytes, over Lambda's {LAMBDA_ENVIRONMENT_LIMIT}-byte "
            f"limit (largest: {', '.join(largest)}); shorten the configuration (models, limits) that feeds them"]


def definition_problems(name: str, definition: Any) -> list[str]:
    size = bounded_size(definition)
    if size <= STATE_MACHINE_DEFINITION_LIMIT:
        return []
    return [f"{name}: the state machine definition may reach {size} bytes, over Step Functions' "
            f"{STATE_MACHINE_DEFINITION_LIMIT}-byte limit"]
