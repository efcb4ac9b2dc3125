"""The users' own buckets (docs/USER_BUCKETS.md): a batch's input read in place from an `s3://bucket/key` object
or an `s3://bucket/prefix/` of JSONL objects, and its output and error files copied under an `s3://` prefix, each
only where the deployment's allow-list grants it (cdk.json `userBuckets` -> settings `user_input_buckets`,
`user_output_prefixes`, and the IAM grants of the same buckets: infra/user_buckets.py).

The input is not copied: its file item lists the objects (key, size), Validate indexes byte ranges of them and the
shards read those ranges where they are (layout.InputSource `in_place`). The bytes are the user's: deleting the
file deletes the item only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nightbatch import layout
from nightbatch.errors import InvalidRequestError
from nightbatch.ids import new_file_id
from nightbatch.settings import Settings
from nightbatch.storage import BlobStore
from nightbatch.storage.botoerrors import client_error
from nightbatch.storage.parts import PartStore
from nightbatch.storage.records import FileRecord

if TYPE_CHECKING:
    from nightbatch.files.service import FileService
    from nightbatch.wire import FileObject

INPUT_PARAM = "nightbatch.input_uri"
OUTPUT_PARAM = "nightbatch.output_uri"
OUTPUT_NAMES = {"output": "output.jsonl", "error": "errors.jsonl"}


def parse_uri(uri: Any, param: str) -> tuple[str, str]:
    """`s3://bucket/key` -> (bucket, key); a 400 naming `param` for anything else."""
    if not isinstance(uri, str) or not uri.startswith("s3://") or len(uri) > 1024:
        raise InvalidRequestError(f"Invalid '{param}': expected an 's3://bucket/key' URI.", param=param,
                                  code="invalid_value")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket or "*" in uri:
        raise InvalidRequestError(f"Invalid '{param}': expected an 's3://bucket/key' URI, not '{uri[:200]}'.",
                                  param=param, code="invalid_value")
    return bucket, key


def names(raw: str) -> list[str]:
    """A comma-separated allow-list setting, as its entries."""
    return [x.strip() for x in raw.split(",") if x.strip()]


def check_input_uri(settings: Settings, uri: Any) -> tuple[str, str]:
    bucket, key = parse_uri(uri, INPUT_PARAM)
    if bucket not in names(settings.files.user_input_buckets):
        raise InvalidRequestError(
            f"Invalid '{INPUT_PARAM}': bucket '{bucket}' is not one this deployment may read batch inputs from "
            "(cdk.json userBuckets; docs/USER_BUCKETS.md).", param=INPUT_PARAM, code="bucket_not_allowed")
    return bucket, key


def check_output_uri(settings: Settings, uri: Any) -> tuple[str, str]:
    """(bucket, prefix ending in "/"), under one of the allow-listed output prefixes."""
    bucket, key = parse_uri(uri, OUTPUT_PARAM)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    for allowed in names(settings.files.user_output_prefixes):
        a_bucket, a_key = parse_uri(allowed, "user_output_prefixes")
        if a_bucket == bucket and prefix.startswith(a_key):
            return bucket, prefix
    raise InvalidRequestError(
        f"Invalid '{OUTPUT_PARAM}': '{uri[:200]}' is not under an s3:// prefix this deployment may write batch "
        "outputs to (cdk.json userBuckets; docs/USER_BUCKETS.md).", param=OUTPUT_PARAM, code="bucket_not_allowed")


def check_uri_options(options: dict[str, Any], settings: Settings) -> None:
    """The batch's `nightbatch.input_uri` / `output_uri`, checked at create (nightbatch/batches/options.py)."""
    if "input_uri" in options:
        check_input_uri(settings, options["input_uri"])
    if "output_uri" in options:
        check_output_uri(settings, options["output_uri"])


def output_location(uri: str, batch_id: str) -> str:
    """Where the batch's files land: `<output_uri>/<batch_id>/` (output.jsonl, errors.jsonl)."""
    bucket, prefix = parse_uri(uri, OUTPUT_PARAM)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    return f"s3://{bucket}/{prefix}{batch_id}/"


def input_objects(blobs: BlobStore, settings: Settings, bucket: str, key: str) -> list[tuple[str, int]]:
    """The input's objects in key order: the object `key`, or every non-empty object under a prefix (a key
    that is empty or ends in "/")."""
    store = blobs.in_bucket(bucket)
    uri = f"s3://{bucket}/{key}"
    try:
        if key and not key.endswith("/"):
            size = store.size(key)
            found = [(key, size)] if size else []
        else:
            found = [(k, n) for k, n in PartStore(store).sizes(key).items() if n > 0 and not k.endswith("/")]
    except client_error() as e:
        raise InvalidRequestError(f"Invalid '{INPUT_PARAM}': '{uri[:200]}' cannot be read by this deployment "
                                  f"({e.response.get('Error', {}).get('Code', 'error')}).",
                                  param=INPUT_PARAM, code="invalid_value") from e
    if not found:
        raise InvalidRequestError(f"Invalid '{INPUT_PARAM}': there is no non-empty object at '{uri[:200]}' (a "
                                  "prefix ends in '/').", param=INPUT_PARAM, code="invalid_value")
    limit = settings.files.max_user_input_objects
    if len(found) > limit:
        raise InvalidRequestError(f"Invalid '{INPUT_PARAM}': '{uri[:200]}' holds {len(found)} objects; at most "
                                  f"{limit} are allowed per batch.", param=INPUT_PARAM, code="invalid_value")
    return sorted(found)


def register_input(files: FileService, tenant: str, uri: str) -> FileObject:
    """A `batch` file over the URI's objects, read in place: OpenAI's file object (filename: the URI, bytes: their
    total), no bytes stored and none counted against the tenant's storage."""
    bucket, key = check_input_uri(files.settings, uri)
    objects = input_objects(files.blobs, files.settings, bucket, key)
    return files.register(
        tenant, file_id=new_file_id(), key="", size=sum(n for _, n in objects), filename=uri[:255],
        purpose="batch", extra={"source_bucket": bucket,
                                "source_objects": [{"key": k, "bytes": n} for k, n in objects]})


def source_parts(rec: FileRecord) -> list[layout.InputPart]:
    """The objects of a file read in place, as the parts the shards read through."""
    return [layout.InputPart(key=str(o["key"]), bytes=int(o["bytes"]), bucket=rec.source_bucket or "")
            for o in rec.source_objects or []]


def copy_outputs(blobs: BlobStore, location: str, keys: dict[str, str]) -> None:
    """Server-side copies of the batch's written files ({kind: key} of our bucket) under `location`."""
    bucket, prefix = parse_uri(location, OUTPUT_PARAM)
    for kind, key in keys.items():
        blobs.copy_to(key, bucket, prefix + OUTPUT_NAMES[kind])
