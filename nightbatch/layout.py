"""The hand-off contract: every S3 key we make, and every record that crosses between steps.

Validate writes segments and their index, Plan the shard specs and the Map's manifest, the worker its
checkpoints, one accounting record per attempt and the done marker; Finalize reads them all. Each is written
and read only through this module (a test greps for key literals elsewhere). Keys are built from ids we
minted, never from user strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter

if TYPE_CHECKING:  # infra/ reads the prefixes without the AWS adapters
    from nightbatch.storage import BlobStore as Blobs

# <seq:06d>-<attempt hex>.jsonl; the attempt part keeps a zombie attempt from overwriting another's object.
CHECKPOINT_RE = re.compile(r"^(\d{6,})-([0-9a-f]+)\.jsonl$")
DONE_NAME = "_done.json"
ACCOUNTING_RE = re.compile(r"^acct-([0-9a-f]+)\.json$")
# The dashboard's chart: cumulative counts over time, beside the checkpoints (gpu_worker.checkpoints).
PROGRESS_RE = re.compile(r"^progress-([0-9a-f]+)\.json$")
# The top-level prefixes; infra/ scopes IAM grants and lifecycle rules to them.
FILES_PREFIX = "files/"
BATCHES_PREFIX = "batches/"
UPLOADS_PREFIX = "uploads/"


# -- keys ----------------------------------------------------------------------------------------------------


def file_key(file_id: str) -> str:
    return f"{FILES_PREFIX}{file_id}"


def upload_prefix(upload_id: str) -> str:
    return f"{UPLOADS_PREFIX}{upload_id}/"


def parts_prefix(upload_id: str) -> str:
    return f"{upload_prefix(upload_id)}parts/"


def part_key(upload_id: str, part_id: str) -> str:
    return f"{parts_prefix(upload_id)}{part_id}"


def batch_prefix(batch_id: str) -> str:
    return f"{BATCHES_PREFIX}{batch_id}/"


def segments_prefix(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}segments/"


def segment_key(batch_id: str, n: int) -> str:
    return f"{segments_prefix(batch_id)}{n:06d}.jsonl"


def segment_index_key(batch_id: str) -> str:
    return f"{segments_prefix(batch_id)}index.json"


def shard_key(batch_id: str, shard_id: str) -> str:
    return f"{batch_prefix(batch_id)}shards/{shard_id}.json"


def manifest_key(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}manifest.json"


def all_results_prefix(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}results/"


def results_prefix(batch_id: str, shard_id: str) -> str:
    return f"{all_results_prefix(batch_id)}{shard_id}/"


def checkpoint_key(prefix: str, seq: int, attempt: str) -> str:
    return f"{prefix}{seq:06d}-{attempt}.jsonl"


def is_checkpoint(prefix: str, key: str) -> bool:
    return CHECKPOINT_RE.match(key[len(prefix):]) is not None


def done_key(batch_id: str, shard_id: str) -> str:
    """The done marker beside the shard's results."""
    return results_prefix(batch_id, shard_id) + DONE_NAME


def accounting_key(prefix: str, attempt: str) -> str:
    return f"{prefix}acct-{attempt}.json"


CAPACITY_PREFIX = "capacity-"


def capacity_key(prefix: str, attempt: int) -> str:
    """Capacity's decision for one attempt of a shard (nightbatch.pipeline.capacity)."""
    return f"{prefix}{CAPACITY_PREFIX}{attempt:02d}.json"


def progress_key(prefix: str, attempt: str) -> str:
    return f"{prefix}progress-{attempt}.json"


def output_key(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}output.jsonl"


def error_key(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}errors.jsonl"


# -- records -------------------------------------------------------------------------------------------------


class SegmentEntry(BaseModel):
    """One segment Validate wrote: its key, how many lines, their estimated tokens (Plan groups by these)."""

    key: str
    lines: int
    est: int
    group: int = 0  # prefix group (nightbatch/pipeline/prefixes.py); 0: lines in input order
    model: str = ""  # the lines' `body.model` (a served model or a LoRA adapter); "": the batch's model


class ShardSpec(BaseModel):
    """`shards/<shard_id>.json`, written by Plan, read by the worker and Finalize."""

    model_config = ConfigDict(extra="ignore")

    version: int = 1
    batch_id: str
    shard_id: str
    endpoint: str
    model: str
    segments: list[str]
    lines: int
    est_tokens: int = 0
    # Lines per `body.model` when they name more than `model` (its LoRA adapters); empty: all are `model`.
    models: dict[str, int] = {}


class ShardItem(BaseModel):
    """One item of the shard manifest that the Distributed Map iterates."""

    version: Literal[1] = 1
    batch_id: str
    shard_id: str
    # AWS: the ARN of the batch model's Batch job definition (empty locally).
    job_definition: str = ""
    # The shard's estimated tokens, so Capacity can weigh the remaining work from the manifest alone.
    est_tokens: int | None = None


class AttemptRecord(BaseModel):
    """`acct-<attempt>.json`: one attempt's GPU time, written whether or not it finished (Spot time counts)."""

    model_config = ConfigDict(extra="ignore")

    attempt: str = ""
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    finished: bool = False
    phases: dict[str, Any] = {}  # nightbatch.phases: when each phase of the attempt ended
    shard_id: str = ""  # filled in on read, from the key


class DoneMarker(BaseModel):
    """`_done.json`: every line of the shard has a result. Token totals cover every attempt."""

    model_config = ConfigDict(extra="ignore")

    lines: int
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 1


_SEGMENTS = TypeAdapter(list[SegmentEntry])
_MANIFEST = TypeAdapter(list[ShardItem])


# -- writers and readers -------------------------------------------------------------------------------------


def write_segment_index(blobs: Blobs, batch_id: str, entries: list[SegmentEntry]) -> None:
    blobs.put_bytes(segment_index_key(batch_id), _SEGMENTS.dump_json(entries))


def read_segment_index(blobs: Blobs, batch_id: str) -> list[SegmentEntry]:
    raw = blobs.get_bytes(segment_index_key(batch_id))
    return _SEGMENTS.validate_json(raw) if raw else []


def write_shard(blobs: Blobs, spec: ShardSpec) -> None:
    blobs.put_bytes(shard_key(spec.batch_id, spec.shard_id), spec.model_dump_json().encode())


def read_shard(blobs: Blobs, batch_id: str, shard_id: str) -> ShardSpec | None:
    raw = blobs.get_bytes(shard_key(batch_id, shard_id))
    if raw is None:
        return None
    spec = ShardSpec.model_validate_json(raw)
    if spec.batch_id != batch_id or spec.shard_id != shard_id:
        raise ValueError(f"{shard_key(batch_id, shard_id)} describes {spec.batch_id}/{spec.shard_id}")
    return spec


def write_manifest(blobs: Blobs, batch_id: str, items: list[ShardItem]) -> str:
    key = manifest_key(batch_id)
    blobs.put_bytes(key, _MANIFEST.dump_json(items), content_type="application/json")
    return key


def read_manifest(blobs: Blobs, batch_id: str) -> list[ShardItem]:
    raw = blobs.get_bytes(manifest_key(batch_id))
    return _MANIFEST.validate_json(raw) if raw else []


def write_attempt(blobs: Blobs, prefix: str, record: AttemptRecord) -> None:
    blobs.put_bytes(accounting_key(prefix, record.attempt), record.model_dump_json().encode(),
                    content_type="application/json")


def attempt_keys(blobs: Blobs, prefix: str) -> list[str]:
    return [k for k in blobs.list_keys(prefix) if ACCOUNTING_RE.match(k.rsplit("/", 1)[-1])]


def read_attempts(blobs: Blobs, prefixes: Iterable[str]) -> Iterator[AttemptRecord]:
    for prefix in prefixes:
        for key in attempt_keys(blobs, prefix):
            rec = AttemptRecord.model_validate_json(blobs.get_bytes(key) or b"{}")
            rec.shard_id = key.rsplit("/", 2)[-2]
            yield rec


def write_done(blobs: Blobs, batch_id: str, shard_id: str, marker: DoneMarker) -> None:
    blobs.put_bytes(done_key(batch_id, shard_id), marker.model_dump_json().encode(),
                    content_type="application/json")
