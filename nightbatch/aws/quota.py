"""Capped counters on one item: reserve named amounts atomically under caps, release them once.

A reservation is a member attribute holding what it added (`q#batch_…` → {"queued_tokens": 120, …}) next to
running totals, all in one item, so a single conditional UpdateItem both checks the caps and records who
added what. That makes reserving and releasing idempotent per member without transactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nightbatch.aws.botoerrors import client_error
from nightbatch.aws.dynamo import Table, _conditional, _from_ddb, _to_ddb


def reserve(
    table: Table, pk: str, member: str, amounts: Mapping[str, int], caps: Mapping[str, int],
    *, entry: Mapping[str, Any] | None = None, fields: Mapping[str, Any] | None = None,
) -> bool:
    """Adds `amounts` to the totals under `member` unless a cap (> 0) would be passed.

    The member records {"add": amounts, **entry}; `fields` are set on the item as they are.

    True when reserved now or already reserved by an earlier call for the same member; False when over a cap.
    """
    names = {"#m": member}
    values: dict[str, Any] = {":entry": _to_ddb({**dict(entry or {}), "add": dict(amounts)})}
    sets = ["#m = :entry"]
    adds = []
    conds = ["attribute_not_exists(#m)"]
    for i, (attr, amount) in enumerate(amounts.items()):
        names[f"#a{i}"] = attr
        values[f":a{i}"] = amount
        adds.append(f"#a{i} :a{i}")
        cap = caps.get(attr, 0)
        if cap > 0:
            if amount > cap:
                return _has_member(table, pk, member)
            values[f":c{i}"] = cap - amount
            conds.append(f"(attribute_not_exists(#a{i}) OR #a{i} <= :c{i})")
    for j, (attr, value) in enumerate((fields or {}).items()):
        names[f"#f{j}"] = attr
        values[f":f{j}"] = _to_ddb(value)
        sets.append(f"#f{j} = :f{j}")
    expr = "SET " + ", ".join(sets)
    if adds:
        expr += " ADD " + ", ".join(adds)
    try:
        table.table.update_item(
            Key={"pk": pk}, UpdateExpression=expr, ConditionExpression=" AND ".join(conds),
            ExpressionAttributeNames=names, ExpressionAttributeValues=values,
        )
    except client_error() as e:
        if _conditional(e):
            return _has_member(table, pk, member)
        raise
    return True


def release(table: Table, pk: str, member: str, item: Mapping[str, Any] | None = None) -> bool:
    """Takes back what `member` added; False when it holds nothing (never reserved, or released already). `item`:
    the usage item, if read already (`release_all`)."""
    entry = (item if item is not None else table.get(pk) or {}).get(member)
    if not isinstance(entry, dict):
        return False
    names = {"#m": member}
    values: dict[str, Any] = {}
    adds = []
    for i, (attr, amount) in enumerate(dict(entry.get("add") or {}).items()):
        if isinstance(amount, int) and amount:
            names[f"#a{i}"] = attr
            values[f":a{i}"] = -amount
            adds.append(f"#a{i} :a{i}")
    expr = "REMOVE #m" + (" ADD " + ", ".join(adds) if adds else "")
    kwargs: dict[str, Any] = {
        "Key": {"pk": pk}, "UpdateExpression": expr, "ConditionExpression": "attribute_exists(#m)",
        "ExpressionAttributeNames": names,
    }
    if values:
        kwargs["ExpressionAttributeValues"] = values
    try:
        table.table.update_item(**kwargs)
    except client_error() as e:
        if _conditional(e):
            return False  # a concurrent release won
        raise
    return True


def release_all(table: Table, pk: str, names: Iterable[str]) -> None:
    """`release` of each member, the item read once (each release is still its own conditional write)."""
    item = table.get(pk) or {}
    for member in names:
        release(table, pk, member, item)


def members(item: Mapping[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    return {k: _from_ddb(v) for k, v in item.items() if k.startswith(prefix) and isinstance(v, dict)}


def _has_member(table: Table, pk: str, member: str) -> bool:
    item = table.get(pk)
    return item is not None and member in item
