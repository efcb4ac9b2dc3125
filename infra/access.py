"""Who may touch what: the table actions each principal's code calls, the bucket prefixes the GPU worker reads and
writes, and the two grants every principal is given through (the stack wires them, infra/stack.py)."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from infra.storage import BATCHES_PREFIX, FILES_PREFIX, MODELS_PREFIX, UPLOADS_PREFIX, Storage
from nightbatch.layout import INPUT_TAG_KEY, INPUT_TAGS

_READ = ("s3:GetObject",)
_WRITE = ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")
# The table actions each principal's code calls (nightbatch/aws/dynamo.py and quota.py), and no more.
_GET, _QUERY, _PUT, _UPDATE, _DELETE = ("dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem",
                                        "dynamodb:UpdateItem", "dynamodb:DeleteItem")
TABLE_ACTIONS: dict[str, tuple[str, ...]] = {
    "api": (_GET, _QUERY, _PUT, _UPDATE, _DELETE),  # every resource's CRUD, keys, limits, idempotency
    "validate": (_GET, _UPDATE),  # batch and file items, queue quota
    "plan": (_GET, _UPDATE),
    "capacity": (_GET, _UPDATE),  # reads the batch's window and tenant, records a move to on-demand
    "finalize": (_GET, _UPDATE, _PUT),  # registers the output and error File items
    "notify": (_GET, _UPDATE, _PUT, _QUERY),  # events, deliveries; the tenant's endpoints by owner
    "deliver": (_GET, _UPDATE),
    "sweep": (_GET, _UPDATE, _PUT, _QUERY),  # open batches and Uploads by status; finalizes like Finalize
    "compose_upload": (_GET, _UPDATE),
    # The GPU worker: only `batch_*` items (dynamodb:LeadingKeys), read for cancel/expiry, live counters added.
    "worker": (_GET, _UPDATE),
}
# Only what the worker reads and writes: its shard definitions, segments, results and checkpoints, and the
# models/ weight cache (the first job of a Hugging Face model writes its weights through; later jobs stream them).
WORKER_PREFIXES = (BATCHES_PREFIX, MODELS_PREFIX)
# A shard is byte ranges of the batch's input (nightbatch/shards/lines.py): read-only, an Upload through
# its parts until it is composed, and only the objects Validate tagged as a batch's input (layout.INPUT_TAGS); the
# files its lines name as images are tagged alike (FileService.images), so they need no grant of their own. Which
# tenant's they are is the application's to check (the object's tenant tag, read through s3:GetObjectTagging on
# those objects only): IAM cannot tell the tenants apart, one role serves them all.
WORKER_INPUT_PREFIXES = (FILES_PREFIX, UPLOADS_PREFIX)
# Read: s3:GetObject only where the object carries the input tag (HEAD and ranged GETs alike).
INPUT_TAG_CONDITION = {"StringEquals": {f"s3:ExistingObjectTag/{INPUT_TAG_KEY}": INPUT_TAGS[INPUT_TAG_KEY]}}


def grant_objects(bucket: s3.IBucket, role: iam.IRole, prefixes: Sequence[str], *, write: bool,
                  list_only_prefixes: bool = False, inputs_only: bool = False) -> None:
    """`inputs_only`: reads limited to the objects tagged as a batch's input (INPUT_TAG_CONDITION)."""
    assert not (write and inputs_only), "the tag condition limits reads; a write must not depend on it"
    actions = [*_READ, *(_WRITE if write else ())]
    role.add_to_principal_policy(iam.PolicyStatement(
        actions=actions, resources=[bucket.arn_for_objects(f"{p}*") for p in prefixes],
        conditions=INPUT_TAG_CONDITION if inputs_only else None,
    ))
    # ListBucket turns a missing key into 404 rather than 403 on GetObject/HeadObject (the Lambdas rely on
    # that). `list_only_prefixes` limits listing to the granted prefixes (s3:prefix); such a principal must
    # test existence by listing (gpu_worker.runner), as a missing key may then answer 403.
    conditions = {"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}} if list_only_prefixes else None
    role.add_to_principal_policy(iam.PolicyStatement(
        actions=["s3:ListBucket"], resources=[bucket.bucket_arn], conditions=conditions,
    ))


def grant_object_tags(bucket: s3.IBucket, role: iam.IRole, prefixes: Sequence[str], *, read: bool,
                      write: bool, inputs_only: bool = False) -> None:
    """Reading (s3:GetObjectTagging) and setting (s3:PutObjectTagging, also what a PUT or copy carrying tags
    needs) object tags under `prefixes`: the API stores each object with its tenant's tag, Validate and
    composition mark a batch's input objects, and the worker reads an input's tenant before it uses it
    (`inputs_only`: of the objects tagged as a batch's input only, as its reads)."""
    assert not (write and inputs_only), "the tag condition limits reads"
    actions = [*(["s3:GetObjectTagging"] if read else []), *(["s3:PutObjectTagging"] if write else [])]
    role.add_to_principal_policy(iam.PolicyStatement(
        actions=actions, resources=[bucket.arn_for_objects(f"{p}*") for p in prefixes],
        conditions=INPUT_TAG_CONDITION if inputs_only else None))


def grant_table(storage: Storage, role: iam.IRole, actions: Sequence[str], *,
                leading_keys: Sequence[str] | None = None) -> None:
    table = storage.table
    resources = [table.table_arn]
    if _QUERY in actions:
        resources += [f"{table.table_arn}/index/{i}" for i in storage.index_names]
    conditions = ({"ForAllValues:StringLike": {"dynamodb:LeadingKeys": list(leading_keys)}}
                  if leading_keys else None)
    role.add_to_principal_policy(iam.PolicyStatement(actions=list(actions), resources=resources,
                                                     conditions=conditions))
