"""The users' own buckets (docs/USER_BUCKETS.md): cdk.json `userBuckets`, the settings it sets and the IAM it grants.

`read`: buckets or prefixes batch inputs and images may be read from in place (`nightbatch.input_uri`); `write`:
`s3://bucket/prefix/` the output and error files may be copied under (`nightbatch.output_uri`); either may give
each tenant a prefix of its own with a `{tenant}` segment; `kmsKeys`: the KMS keys of those buckets' objects. The
same lists become the settings the API checks at create (nightbatch/tenancy/scope.py), so a batch can name exactly
what the roles may touch, and nothing of any other bucket is granted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_iam as iam
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nightbatch.tenancy.scope import TENANT_SEGMENT, AllowEntry, parse_entry

# Who touches the user's objects: the API lists and heads the input at create; Validate reads it; the worker
# reads its shards' ranges; Finalize (and the sweeper's inline Finalize) read unrun lines and copy the outputs.
LISTERS = ("api", "validate")
READERS = ("api", "validate", "finalize", "sweep", "worker")
WRITERS = ("finalize", "sweep")


class UserBuckets(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # Entries as nightbatch/tenancy/scope.py reads them: a bucket name (the whole bucket, shared by every tenant),
    # `s3://bucket/prefix/` (shared), or a prefix with one `{tenant}` segment (each tenant its own expansion).
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    kms_keys: tuple[str, ...] = Field((), alias="kmsKeys")

    @field_validator("read")
    @classmethod
    def _readable(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_entry("read", e, bare=True) for e in entries)

    @field_validator("write")
    @classmethod
    def _writable(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_entry("write", e, bare=False) for e in entries)

    @field_validator("kms_keys")
    @classmethod
    def _keys(cls, arns: tuple[str, ...]) -> tuple[str, ...]:
        bad = [a for a in arns if not re.fullmatch(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+", a)]
        if bad:
            raise ValueError(f"userBuckets.kmsKeys: {bad} are not KMS key ARNs")
        return arns

    @property
    def settings(self) -> dict[str, str]:
        """What the API and the pipeline check a batch's URIs against (nightbatch/tenancy/scope.py)."""
        values = {"user_input_buckets": ",".join(self.read), "user_output_prefixes": ",".join(self.write)}
        return {k: v for k, v in values.items() if v}

    @property
    def shared(self) -> list[str]:
        """The entries every tenant shares (no `{tenant}` segment): what `nightbatch doctor` and the docs warn of."""
        return [e for e in (*self.read, *self.write) if not parse_entry(e).per_tenant]

    @property
    def read_arns(self) -> list[str]:
        """The objects the readers get (a `{tenant}` segment as `*`)."""
        return sorted({_arn(parse_entry(e)) for e in self.read})

    @property
    def write_arns(self) -> list[str]:
        return sorted({_arn(parse_entry(e)) for e in self.write})

    def grant(self, roles: Mapping[str, iam.IRole], workers: list[iam.IRole]) -> None:
        """Exactly the listed buckets and prefixes, to the principals whose code touches them (`roles` by
        principal name, TABLE_ACTIONS' keys; `workers`: the GPU worker's roles). A `{tenant}` segment is granted
        as `*`: IAM cannot tell the tenants apart (one role serves them all), the application does
        (nightbatch/tenancy/scope.py, docs/TENANCY.md)."""
        by_name: dict[str, list[iam.IRole]] = {**{n: [r] for n, r in roles.items()}, "worker": workers}

        def add(names: tuple[str, ...], actions: list[str], resources: list[str],
                conditions: dict[str, Any] | None = None) -> None:
            for role in (r for n in names for r in by_name[n]):
                role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=resources,
                                                                 conditions=conditions))

        read = [parse_entry(e) for e in self.read]
        if read:
            # GetObjectVersion: an input in a versioned bucket is read at the version its batch accepted
            # (nightbatch/files/inputs.py).
            add(READERS, ["s3:GetObject", "s3:GetObjectVersion"], self.read_arns)
            whole = sorted({e.bucket for e in read if not e.prefix})
            if whole:
                add(LISTERS, ["s3:ListBucket"], [f"arn:aws:s3:::{b}" for b in whole])
            for bucket in sorted({e.bucket for e in read if e.prefix and e.bucket not in whole}):
                prefixes = sorted({_wild(e.prefix) + "*" for e in read if e.bucket == bucket})
                add(LISTERS, ["s3:ListBucket"], [f"arn:aws:s3:::{bucket}"],
                    {"StringLike": {"s3:prefix": prefixes}})
        if self.write:
            add(WRITERS, ["s3:PutObject", "s3:AbortMultipartUpload"], self.write_arns)
        if self.kms_keys:
            add(tuple(n for n in READERS if n not in WRITERS), ["kms:Decrypt"], list(self.kms_keys))
            add(WRITERS, ["kms:Decrypt", "kms:GenerateDataKey"], list(self.kms_keys))


def _entry(kind: str, entry: str, *, bare: bool) -> str:
    """An entry checked by the one parser (nightbatch/tenancy/scope.py), in its normal form."""
    if not bare and not entry.startswith("s3://"):
        raise ValueError(f"userBuckets.{kind}: {entry!r} is not an s3://bucket/prefix/ URI")
    try:
        parsed = parse_entry(entry)
    except ValueError as e:
        raise ValueError(f"userBuckets.{kind}: {e}") from None
    return parsed.bucket if bare and not entry.startswith("s3://") else str(parsed)


def _wild(prefix: str) -> str:
    return prefix.replace(TENANT_SEGMENT, "*")


def _arn(entry: AllowEntry) -> str:
    return f"arn:aws:s3:::{entry.bucket}/{_wild(entry.prefix)}*"
