"""What a batch's input is made of, at the versions accepted: one object of ours, an Upload's parts until it is
composed, or a user's objects read in place. Recorded by Validate in the segment index and by Plan in each shard
spec (nightbatch/shards/); read through nightbatch/files/inputs.py, the one reader of those versions."""

from __future__ import annotations

from pydantic import BaseModel

from nightbatch.aws.records import FileRecord


class InputPart(BaseModel):
    key: str
    bytes: int
    bucket: str = ""  # "": the deployment's bucket; else a user's allow-listed bucket (files/user_buckets.py)
    # The version accepted (nightbatch/files/inputs.py): every read sends `etag` as If-Match and, in a versioned
    # bucket, reads `version_id`. Empty: a record 0.1.x wrote, read as it is now.
    etag: str = ""
    version_id: str = ""


class InputSource(BaseModel):
    """The input a batch's line indexes point into: `key` (files/<file_id>), `bytes` long, of ETag `etag`. An
    Upload not yet composed when Validate ran is read through `parts`, in order, until `key` holds all `bytes`
    (composition writes the same bytes at `key` before the parts go: nightbatch/files/assembly.py). `in_place`:
    the parts are objects of a user's bucket, read where they are for good (`key` is then empty), each a JSONL
    document of its own (a BOM at its start is dropped, its end ends a line)."""

    key: str
    bytes: int
    parts: list[InputPart] = []
    in_place: bool = False
    etag: str = ""  # of `key` (empty: not known when Validate ran, an Upload then in parts)


def source_parts(rec: FileRecord) -> list[InputPart]:
    """The objects of a file read in place (files/user_buckets.py), as the parts the shards read through, at the
    versions accepted."""
    return [InputPart(key=str(o["key"]), bytes=int(o["bytes"]), bucket=rec.source_bucket or "",
                      etag=str(o.get("etag") or ""), version_id=str(o.get("version_id") or ""))
            for o in rec.source_objects or []]
