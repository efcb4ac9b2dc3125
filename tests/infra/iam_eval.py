"""Reading a role's synthesized policy as IAM would (moto evaluates none): its statements, and whether they allow
an action on a resource with the request's condition keys.

The evaluator knows the condition operators the stack writes (StringEquals, StringLike, and their ForAllValues:
forms) and nothing else: a statement with any other condition fails the caller's test rather than being guessed.
A condition key the request does not carry makes the condition false (as IAM does for a missing key), so an
unknown object tag never grants a read.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from tests.infra.cfn import of_type, resolve

OPERATORS = ("StringEquals", "StringLike", "ForAllValues:StringEquals", "ForAllValues:StringLike")


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def statements_of_role(template: dict[str, Any], role: str) -> list[dict[str, Any]]:
    """Every statement of the inline policies attached to the role (logical id)."""
    return [st for policy in of_type(template, "AWS::IAM::Policy").values()
            if {"Ref": role} in policy["Properties"]["Roles"]
            for st in policy["Properties"]["PolicyDocument"]["Statement"]]


def role_of_handler(template: dict[str, Any], handler: str) -> str:
    fn = next(f for f in of_type(template, "AWS::Lambda::Function").values() if f["Properties"]["Handler"] == handler)
    return str(fn["Properties"]["Role"]["Fn::GetAtt"][0])


def _condition_holds(operator: str, key: str, wanted: Any, context: Mapping[str, Any]) -> bool:
    assert operator in OPERATORS, f"the evaluator does not know {operator}"
    if key not in context or context[key] is None:
        return False
    values = as_list(context[key])
    like = operator.endswith("StringLike")
    matches = [any(fnmatch.fnmatchcase(str(v), str(w)) if like else str(v) == str(w) for w in as_list(wanted))
               for v in values]
    return all(matches) if operator.startswith("ForAllValues:") else any(matches)


def allows(statements: list[dict[str, Any]], action: str, resource: str, context: Mapping[str, Any],
           arns: Mapping[str, str]) -> bool:
    """Do these Allow statements grant `action` on `resource` for a request carrying `context`'s keys?
    `arns`: logical id -> ARN of the resources the statements name through Fn::GetAtt (…, "Arn")."""
    for st in statements:
        if st.get("Effect", "Allow") != "Allow" or not any(
                fnmatch.fnmatchcase(action, a) for a in as_list(st["Action"])):
            continue
        resources = resolve(as_list(st["Resource"]), {}, lambda logical, attr: arns[logical]
                            if attr == "Arn" and logical in arns else f"{logical}.{attr}")
        if not any(fnmatch.fnmatchcase(resource, str(r)) for r in resources):
            continue
        if all(_condition_holds(op, key, wanted, context)
               for op, keys in st.get("Condition", {}).items() for key, wanted in keys.items()):
            return True
    return False
