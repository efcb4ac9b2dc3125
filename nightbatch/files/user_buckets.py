"""The users' own buckets (docs/USER_BUCKETS.md): a batch's input read in place from an `s3://bucket/key` object
or an `s3://bucket/prefix/` of JSONL objects, and its output and error files copied under an `s3://` prefix, each
only where the deployment's allow-list grants it (cdk.json `userBuckets` -> settings `user_input_buckets`,
`user_output_prefixes`, and the IAM grants of the same buckets: infra/user_buckets.py).

The input is not copied: its file item lists the objects (key, size), Validate indexes byte ranges of them and the
shards read those ranges where they are (an `in_place` InputSource, files/sources.py). The bytes are the user's:
deleting the file deletes the item only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nightbatch.aws import BlobStore
from nightbatch.aws.botoerrors import client_error
from nightbatch.aws.s3 import Version
from nightbatch.errors import InvalidRequestError
from nightbatch.ids import new_file_id
from nightbatch.settings import Settings
from nightbatch.tenancy.scope import S3Uri, Scope

if TYPE_CHECKING:
    from nightbatch.files.service import FileService
    from nightbatch.wire import FileObject

INPUT_PARAM = "nightbatch.input_uri"
OUTPUT_PARAM = "nightbatch.output_uri"
OUTPUT_NAMES = {"output": "output.jsonl", "error": "errors.jsonl"}


@dataclass(frozen=True)
class BatchUris:
    """A create's `nightbatch.input_uri` and `output_uri`, parsed and allowed for its tenant once
    (tenancy/scope.py), then handed to the create that uses them."""

    input: S3Uri | None = None  # an object or a prefix the tenant may read
    output: S3Uri | None = None  # a prefix the tenant may write under


def check_uri_options(options: dict[str, Any], scope: Scope) -> BatchUris:
    """The batch's `nightbatch.input_uri` / `output_uri`, checked at create for the calling tenant
    (nightbatch/batches/request.py)."""
    return BatchUris(
        input=scope.readable(options["input_uri"], INPUT_PARAM) if "input_uri" in options else None,
        output=scope.writable(options["output_uri"], OUTPUT_PARAM) if "output_uri" in options else None)


def output_location(output: S3Uri, batch_id: str) -> str:
    """Where the batch's files land: `<output_uri>/<batch_id>/` (output.jsonl, errors.jsonl)."""
    return f"{output}{batch_id}/"


def input_objects(blobs: BlobStore, settings: Settings, uri: S3Uri) -> list[dict[str, Any]]:
    """The input's objects in key order: the object `uri`, or every non-empty object under a prefix (a key that is
    empty or ends in "/"), each {"key", "bytes", "etag"} (the version accepted, nightbatch/files/inputs.py) and
    "version_id" where a HEAD gives one (a listing gives none: Validate's first read records it). A prefix is
    listed only up to one object past `max_user_input_objects` (empty ones and folder markers count too), so a
    huge prefix costs a page or two of listing, not the whole of it."""
    store = blobs.in_bucket(uri.bucket)
    limit = settings.files.max_user_input_objects
    found: list[dict[str, Any]] = []
    try:
        if not uri.is_prefix:
            head = store.head(uri.key)
            found = [pinned(uri.key, head)] if head and head["ContentLength"] else []
        else:
            for listed, obj in enumerate(store.list_objects(uri.key, page=min(1000, limit + 1)), start=1):
                if listed > limit:
                    raise InvalidRequestError(
                        f"Invalid '{INPUT_PARAM}': '{uri}' holds more than {limit} objects; at most {limit} are "
                        "allowed per batch.", param=INPUT_PARAM, code="invalid_value")
                key, size = str(obj["Key"]), int(obj["Size"])
                if size > 0 and not key.endswith("/"):
                    found.append({"key": key, "bytes": size, "etag": str(obj.get("ETag", ""))})
    except client_error() as e:
        raise InvalidRequestError(f"Invalid '{INPUT_PARAM}': '{uri}' cannot be read by this deployment "
                                  f"({e.response.get('Error', {}).get('Code', 'error')}).",
                                  param=INPUT_PARAM, code="invalid_value") from e
    if not found:
        raise InvalidRequestError(f"Invalid '{INPUT_PARAM}': there is no non-empty object at '{uri}' (a prefix "
                                  "ends in '/').", param=INPUT_PARAM, code="invalid_value")
    return found


def pinned(key: str, head: dict[str, Any]) -> dict[str, Any]:
    """An object as its HEAD describes it: its key, size and the version accepted."""
    version = Version()
    version.learn(head)
    out = {"key": key, "bytes": int(head["ContentLength"]), "etag": version.etag}
    return {**out, "version_id": version.version_id} if version.version_id else out


def register_input(files: FileService, tenant: str, where: S3Uri) -> FileObject:
    """A `batch` file over the objects at `where` (checked readable by the tenant: check_uri_options), read in
    place: OpenAI's file object (filename: the URI, bytes: their total), no bytes stored and none counted against
    the tenant's storage."""
    objects = input_objects(files.blobs, files.settings, where)
    return files.register(
        tenant, file_id=new_file_id(), key="", size=sum(int(o["bytes"]) for o in objects),
        filename=str(where)[:255], purpose="batch", extra={"source_bucket": where.bucket, "source_objects": objects})


def copy_outputs(blobs: BlobStore, scope: Scope, location: str, keys: dict[str, str]) -> None:
    """Server-side copies of the batch's written files ({kind: key} of our bucket) under `location`, which the
    batch's tenant must still be allowed to write (the allow-list may have changed since create)."""
    where = scope.writable(location, OUTPUT_PARAM)
    for kind, key in keys.items():
        blobs.copy_to(key, where.bucket, where.key + OUTPUT_NAMES[kind])
