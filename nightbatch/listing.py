"""The `after` cursor of the list endpoints (the Anthropic wire's `before_id`/`after_id` too): an id of the
caller's own, read as its place in the listing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from nightbatch.aws import Table
from nightbatch.aws.records import ListedRecord
from nightbatch.errors import InvalidRequestError

L = TypeVar("L", bound=ListedRecord)


def after_sort_key(
    table: Table, kind: type[L], tenant: str, after: str | None, *, noun: str,
    belongs: Callable[[L], bool] | None = None, param: str = "after",
) -> str | None:
    """Where a page starts: after the tenant's own record `after` (None: from the start). Another tenant's id, an
    unknown one, or one outside the listing (`belongs`) is a 400 naming `param`, never a page of something else."""
    if not after:
        return None
    cursor = table.get_owned(kind, tenant, after)
    if cursor is None or (belongs is not None and not belongs(cursor)):
        raise InvalidRequestError(f"Invalid '{param}': no {noun} with id '{after}'.", param=param)
    return cursor.owner_sk
