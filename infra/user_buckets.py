"""The users' own buckets (docs/USER_BUCKETS.md): cdk.json `userBuckets`, the settings it sets and the IAM it grants.

`read`: buckets batch inputs may be read from in place (`nightbatch.input_uri`); `write`: `s3://bucket/prefix/`
the output and error files may be copied under (`nightbatch.output_uri`); `kmsKeys`: the KMS keys of those
buckets' objects. The same lists become the settings the API checks at create, so a batch can name exactly what
the roles may touch, and nothing of any other bucket is granted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aws_cdk import aws_iam as iam
from pydantic import BaseModel, ConfigDict, Field, field_validator

BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
# Who touches the user's objects: the API lists and heads the input at create; Validate reads it; the worker
# reads its shards' ranges; Finalize (and the sweeper's inline Finalize) read unrun lines and copy the outputs.
LISTERS = ("api", "validate")
READERS = ("api", "validate", "finalize", "sweep", "worker")
WRITERS = ("finalize", "sweep")


class UserBuckets(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    kms_keys: tuple[str, ...] = Field((), alias="kmsKeys")

    @field_validator("read")
    @classmethod
    def _buckets(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in names if not BUCKET_RE.match(n)]
        if bad:
            raise ValueError(f"userBuckets.read: {bad} are not bucket names")
        return names

    @field_validator("write")
    @classmethod
    def _prefixes(cls, uris: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for uri in uris:
            bucket, _, key = uri.removeprefix("s3://").partition("/")
            if not uri.startswith("s3://") or not BUCKET_RE.match(bucket) or "*" in key:
                raise ValueError(f"userBuckets.write: {uri!r} is not an s3://bucket/prefix/ URI")
            out.append(f"s3://{bucket}/{key.rstrip('/') + '/' if key.strip('/') else ''}")
        return tuple(out)

    @field_validator("kms_keys")
    @classmethod
    def _keys(cls, arns: tuple[str, ...]) -> tuple[str, ...]:
        bad = [a for a in arns if not re.match(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+$", a)]
        if bad:
            raise ValueError(f"userBuckets.kmsKeys: {bad} are not KMS key ARNs")
        return arns

    @property
    def settings(self) -> dict[str, str]:
        """What the API and the pipeline check a batch's URIs against (nightbatch/files/user_buckets.py)."""
        values = {"user_input_buckets": ",".join(self.read), "user_output_prefixes": ",".join(self.write)}
        return {k: v for k, v in values.items() if v}

    def grant(self, roles: Mapping[str, iam.IRole], workers: list[iam.IRole]) -> None:
        """Exactly the listed buckets and prefixes, to the principals whose code touches them (`roles` by
        principal name, TABLE_ACTIONS' keys; `workers`: the GPU worker's roles)."""
        by_name: dict[str, list[iam.IRole]] = {**{n: [r] for n, r in roles.items()}, "worker": workers}

        def add(names: tuple[str, ...], actions: list[str], resources: list[str]) -> None:
            for role in (r for n in names for r in by_name[n]):
                role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=resources))

        if self.read:
            add(READERS, ["s3:GetObject"], [f"arn:aws:s3:::{b}/*" for b in self.read])
            add(LISTERS, ["s3:ListBucket"], [f"arn:aws:s3:::{b}" for b in self.read])
        if self.write:
            add(WRITERS, ["s3:PutObject", "s3:AbortMultipartUpload"],
                [f"arn:aws:s3:::{uri.removeprefix('s3://')}*" for uri in self.write])
        if self.kms_keys:
            add(tuple(n for n in READERS if n not in WRITERS), ["kms:Decrypt"], list(self.kms_keys))
            add(WRITERS, ["kms:Decrypt", "kms:GenerateDataKey"], list(self.kms_keys))
