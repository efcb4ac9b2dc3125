"""DynamoDB adapter over the one table: conditional writes, atomic counters, owner-ordered queries."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from nightbatch.aws.botoerrors import client_error
from nightbatch.aws.records import Record
from nightbatch.errors import NotFoundError, StorageConflictError, StorageItemTooLargeError

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

R = TypeVar("R", bound=Record)

OWNER_INDEX = "by_owner"
STATUS_INDEX = "by_status"


class Table:
    def __init__(self, *, resource: Any, name: str) -> None:
        self.table = resource.Table(name)
        self.name = name

    def put_new(self, item: Mapping[str, Any]) -> None:
        try:
            self.table.put_item(Item=_to_ddb(dict(item)), ConditionExpression="attribute_not_exists(pk)")
        except client_error() as e:
            if _conditional(e):
                raise StorageConflictError(str(item.get("pk"))) from e
            raise

    def put(self, item: Mapping[str, Any]) -> None:
        self.table.put_item(Item=_to_ddb(dict(item)))

    def get(self, pk: str, *, consistent: bool = True) -> dict[str, Any] | None:
        resp = self.table.get_item(Key={"pk": pk}, ConsistentRead=consistent)
        item = resp.get("Item")
        return _from_ddb(item) if item is not None else None

    def update(
        self,
        pk: str,
        *,
        set_: Mapping[str, Any] | None = None,
        add: Mapping[str, int] | None = None,
        set_if_absent: Mapping[str, Any] | None = None,
        remove: tuple[str, ...] = (),
        expect_in: Mapping[str, tuple[Any, ...]] | None = None,
        expect_absent: tuple[str, ...] = (),
        expect_at_most: Mapping[str, int] | None = None,
        must_exist: bool = True,
    ) -> dict[str, Any]:
        """One UpdateItem; raises StorageConflictError when a condition fails. Returns the new item."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        clauses: list[str] = []
        conds: list[str] = []

        def name(attr: str) -> str:
            key = f"#n{len(names)}"
            names[key] = attr
            return key

        def value(v: Any) -> str:
            key = f":v{len(values)}"
            values[key] = _to_ddb(v)
            return key

        sets = [f"{name(k)} = {value(v)}" for k, v in (set_ or {}).items()]
        sets += [f"{(n := name(k))} = if_not_exists({n}, {value(v)})" for k, v in (set_if_absent or {}).items()]
        if sets:
            clauses.append("SET " + ", ".join(sets))
        if add:
            clauses.append("ADD " + ", ".join(f"{name(k)} {value(v)}" for k, v in add.items()))
        if remove:
            clauses.append("REMOVE " + ", ".join(name(k) for k in remove))
        if must_exist:
            conds.append(f"attribute_exists({name('pk')})")
        for attr, allowed in (expect_in or {}).items():
            conds.append(f"{name(attr)} IN ({', '.join(value(v) for v in allowed)})")
        for attr in expect_absent:
            conds.append(f"attribute_not_exists({name(attr)})")
        for attr, most in (expect_at_most or {}).items():
            n = name(attr)
            conds.append(f"(attribute_not_exists({n}) OR {n} <= {value(most)})")
        kwargs: dict[str, Any] = {
            "Key": {"pk": pk},
            "UpdateExpression": " ".join(clauses),
            "ExpressionAttributeNames": names,
            "ReturnValues": "ALL_NEW",
        }
        if values:
            kwargs["ExpressionAttributeValues"] = values
        if conds:
            kwargs["ConditionExpression"] = " AND ".join(conds)
        try:
            resp = self.table.update_item(**kwargs)
        except client_error() as e:
            if _conditional(e):
                raise StorageConflictError(pk) from e
            if _too_large(e):
                raise StorageItemTooLargeError(pk) from e
            raise
        new: dict[str, Any] = _from_ddb(resp["Attributes"])
        return new

    def get_record(self, kind: type[R], pk: str | None, *, consistent: bool = True) -> R | None:
        """The record under `pk` if it is of `kind`; None otherwise (internal reads: no tenant to check)."""
        if not pk or not pk.startswith(kind.ID_PREFIX):
            return None
        return kind.load(self.get(pk, consistent=consistent))

    def get_owned(self, kind: type[R], tenant: str, record_id: str | None) -> R | None:
        """The tenant's record: another tenant's id is answered exactly like a missing one (None)."""
        rec = self.get_record(kind, record_id)
        return rec if rec is not None and rec.tenant == tenant else None

    def require_owned(self, kind: type[R], tenant: str, record_id: str, *, missing: str, param: str) -> R:
        """`get_owned`, or a 404 saying `missing` (the same for another tenant's id as for none at all)."""
        rec = self.get_owned(kind, tenant, record_id)
        if rec is None:
            raise NotFoundError(missing, param=param)
        return rec

    def put_record(self, rec: Record, *, new: bool = False) -> None:
        (self.put_new if new else self.put)(rec.to_item())

    def update_record(self, kind: type[R], pk: str, **kwargs: Any) -> R:
        """`update` of the record's own attributes (a misspelt one fails here rather than being stored),
        read back as the record."""
        _check_attributes(kind, kwargs)
        return kind.from_item(self.update(pk, **kwargs))

    def update_attributes(self, kind: type[Record], pk: str, **kwargs: Any) -> None:
        """`update_record` when the new record is not needed (nothing is read back or validated)."""
        _check_attributes(kind, kwargs)
        self.update(pk, **kwargs)

    def records(self, kind: type[R], owner: str, *, ascending: bool, after_sk: str | None = None,
                page_size: int = 100) -> Iterator[R]:
        """Every record of `kind` listed under `owner` (after `after_sk`), page after page."""
        for item in self.query_owner(owner, ascending=ascending, after_sk=after_sk, page_size=page_size):
            rec = kind.load(item)
            if rec is not None:
                yield rec

    def open_ids(self, status: str) -> Iterator[str]:
        """The pk of every item on the open-status index under `status` (read each with `get_record`)."""
        for key in self.query_open(status):
            yield str(key["pk"])

    def page(
        self, kind: type[R], owner: str, *, limit: int, ascending: bool = False, after_sk: str | None = None,
        keep: Callable[[R], bool] | None = None,
    ) -> tuple[list[R], bool]:
        """Up to `limit` records of one owner (after `after_sk`), and whether more follow."""
        out: list[R] = []
        for item in self.query_owner(owner, ascending=ascending, after_sk=after_sk, page_size=min(limit + 1, 1000)):
            rec = kind.load(item)
            if rec is None or (keep is not None and not keep(rec)):
                continue
            if len(out) == limit:
                return out, True
            out.append(rec)
        return out, False

    def delete(self, pk: str) -> None:
        self.table.delete_item(Key={"pk": pk})

    def query_owner(
        self, owner: str, *, ascending: bool, after_sk: str | None = None, page_size: int = 100
    ) -> Iterator[dict[str, Any]]:
        """Items of one owner ordered by `owner_sk`, strictly after `after_sk` in that order."""
        from boto3.dynamodb.conditions import Key

        cond = Key("owner").eq(owner)
        if after_sk is not None:
            cond = cond & (Key("owner_sk").gt(after_sk) if ascending else Key("owner_sk").lt(after_sk))
        return self._query({
            "IndexName": OWNER_INDEX,
            "KeyConditionExpression": cond,
            "ScanIndexForward": ascending,
            "Limit": page_size,
        })

    def query_open(self, status: str, *, page_size: int = 100) -> Iterator[dict[str, Any]]:
        from boto3.dynamodb.conditions import Key

        return self._query({
            "IndexName": STATUS_INDEX,
            "KeyConditionExpression": Key("open_status").eq(status),
            "Limit": page_size,
        })

    def _query(self, kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Every item the query matches, page after page."""
        while True:
            resp = self.table.query(**kwargs)
            for item in resp.get("Items", []):
                yield _from_ddb(item)
            start = resp.get("LastEvaluatedKey")
            if not start:
                return
            kwargs["ExclusiveStartKey"] = start


def create_table(client: Any, name: str) -> None:
    """Creates the table as infra/ does (used by the local stack and tests against moto)."""
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "owner", "AttributeType": "S"},
            {"AttributeName": "owner_sk", "AttributeType": "S"},
            {"AttributeName": "open_status", "AttributeType": "S"},
            {"AttributeName": "created_sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": OWNER_INDEX,
                "KeySchema": [
                    {"AttributeName": "owner", "KeyType": "HASH"},
                    {"AttributeName": "owner_sk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": STATUS_INDEX,
                "KeySchema": [
                    {"AttributeName": "open_status", "KeyType": "HASH"},
                    {"AttributeName": "created_sk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    )


def _check_attributes(kind: type[Record], kwargs: Mapping[str, Any]) -> None:
    known = {*kind.model_fields, *kind.DERIVED}
    named: set[str] = set()
    for arg in ("set_", "add", "set_if_absent", "expect_in", "expect_at_most", "remove", "expect_absent"):
        named.update(kwargs.get(arg) or ())
    unknown = sorted(named - known)
    if unknown:
        raise ValueError(f"{kind.__name__} has no attribute {', '.join(map(repr, unknown))}")


def _conditional(e: ClientError) -> bool:
    return str(e.response.get("Error", {}).get("Code")) == "ConditionalCheckFailedException"


def _too_large(e: ClientError) -> bool:
    err = e.response.get("Error", {})
    return str(err.get("Code")) == "ValidationException" and "size" in str(err.get("Message", "")).lower()


def _to_ddb(v: Any) -> Any:
    if isinstance(v, float):
        return Decimal(repr(v))
    if isinstance(v, dict):
        return {k: _to_ddb(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_to_ddb(x) for x in v]
    return v


def _from_ddb(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, dict):
        return {k: _from_ddb(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_ddb(x) for x in v]
    return v
