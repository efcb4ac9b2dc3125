"""Plan's hand-off to the worker and Finalize: each shard's spec (layout.shard_key) and the manifest the
Distributed Map iterates (layout.manifest_key).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter

from nightbatch.files.sources import InputSource
from nightbatch.layout import manifest_key, shard_key
from nightbatch.shards.index import SegmentEntry, SegmentIndex

if TYPE_CHECKING:  # the records are read without the AWS adapters
    from nightbatch.aws import BlobStore as Blobs


class ShardSpec(BaseModel):
    """A shard (layout.shard_key), written by Plan, read by the worker and Finalize (through shards/lines.py).

    Version 2: `indexes` (LineIndex keys) into `input`. Version 1 (0.1.x; reading it may go in 0.3): `segments`, copies
    of the lines in segment_line form."""

    model_config = ConfigDict(extra="ignore")

    version: int = 1
    batch_id: str
    shard_id: str
    endpoint: str
    model: str
    segments: list[str] = []
    indexes: list[str] = []
    input: InputSource | None = None
    lines: int
    est_tokens: int = 0
    # Lines per `body.model` when they name more than `model` (its LoRA adapters); empty: all are `model`.
    models: dict[str, int] = {}
    # The batch's tenant: what the worker may read on its behalf (nightbatch/tenancy/scope.py). "": a spec
    # planned before specs named it; the worker reads the batch's tenant instead.
    tenant: str = ""


class ShardItem(BaseModel):
    """One item of the shard manifest that the Distributed Map iterates."""

    version: Literal[1] = 1
    batch_id: str
    shard_id: str
    # AWS: the ARN of the batch model's Batch job definition (empty locally).
    job_definition: str = ""
    # The shard's estimated tokens, so Capacity can weigh the remaining work from the manifest alone.
    est_tokens: int | None = None
    # The shard's lines (its spec's), so Finalize and the partial results read a spec only for its unrun lines.
    lines: int | None = None
    # Where Plan sends the shard first: the model's endpoint, else its `gpuBackend`; with `both` Capacity may move
    # it to SageMaker.
    backend: Literal["batch", "sagemaker", "endpoint"] = "batch"
    # The model's `gpuBackend` allows a move to SageMaker when Batch cannot place the shard.
    fallback: bool = False
    # An endpoint shard's GPU backend, where Capacity moves it when the endpoint cannot finish it in its window;
    # "": none (a model without weights of its own).
    gpu_fallback: Literal["", "batch", "sagemaker"] = ""


_MANIFEST = TypeAdapter(list[ShardItem])


def shard_spec(index: SegmentIndex, segments: list[SegmentEntry], *, batch_id: str, shard_id: str,
               endpoint: str = "", model: str = "") -> ShardSpec:
    """The shard over `segments` of `index`: version 2 when the index points into the input; over a version 1
    index (Validate of 0.1.x), version 1, its segments being copies."""
    keys = [s.key for s in segments]
    spec = ShardSpec(batch_id=batch_id, shard_id=shard_id, endpoint=endpoint, model=model,
                     lines=sum(s.lines for s in segments), est_tokens=sum(s.est for s in segments))
    if index.input is not None:
        spec.version, spec.indexes, spec.input = 2, keys, index.input
    else:
        spec.segments = keys
    return spec


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


