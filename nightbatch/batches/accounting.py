"""The records the GPU worker writes beside a shard's results for what the batch cost: one per attempt
(AttemptRecord: GPU time, written whether or not the attempt finished) and the done marker (DoneMarker: every line
has a result; the totals of every attempt). Priced by cost.py; read by Finalize and the dashboard's batch page.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from nightbatch.layout import ACCOUNTING_RE, accounting_key, done_key

if TYPE_CHECKING:  # the records are read without the AWS adapters
    from nightbatch.aws import BlobStore


class AttemptRecord(BaseModel):
    """One attempt's GPU time (layout.accounting_key), written whether or not it finished (Spot time counts)."""

    model_config = ConfigDict(extra="ignore")

    attempt: str = ""
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    finished: bool = False
    phases: dict[str, Any] = {}  # nightbatch.phases: when each phase of the attempt ended
    # Where the attempt ran (gpu_worker/host.py), so Finalize prices it: AWS Batch at EC2 prices, SageMaker at
    # ml.* prices, an endpoint's runner at the runner's (its server's GPUs are nobody's new instance); the instance
    # type and training job name when the host says (SageMaker does).
    backend: Literal["batch", "sagemaker", "endpoint"] = "batch"
    instance_type: str = ""
    training_job: str = ""
    # The results this attempt made durable and their tokens (batch.nightbatch.cost reports an endpoint's).
    lines: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    shard_id: str = ""  # filled in on read, from the key


class DoneMarker(BaseModel):
    """The shard's done marker (layout.done_key): every line of the shard has a result. Token totals cover every
    attempt."""

    model_config = ConfigDict(extra="ignore")

    lines: int
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 1


def write_attempt(blobs: BlobStore, prefix: str, record: AttemptRecord) -> None:
    blobs.put_bytes(accounting_key(prefix, record.attempt), record.model_dump_json().encode(),
                    content_type="application/json")


def attempt_keys(blobs: BlobStore, prefix: str, listed: Iterable[str] | None = None) -> list[str]:
    """The attempt records under `prefix`; `listed`: its keys, if listed already (else listed here)."""
    keys = blobs.list_keys(prefix) if listed is None else (k for k in listed if k.startswith(prefix))
    return [k for k in keys if ACCOUNTING_RE.fullmatch(k.rsplit("/", 1)[-1])]


def read_attempts(blobs: BlobStore, prefixes: Iterable[str], listed: Iterable[str] | None = None) -> Iterator[
        AttemptRecord]:
    keys = None if listed is None else list(listed)
    for prefix in prefixes:
        for key in attempt_keys(blobs, prefix, keys):
            rec = AttemptRecord.model_validate_json(blobs.get_bytes(key) or b"{}")
            rec.shard_id = key.rsplit("/", 2)[-2]
            yield rec


def write_done(blobs: BlobStore, batch_id: str, shard_id: str, marker: DoneMarker) -> None:
    blobs.put_bytes(done_key(batch_id, shard_id), marker.model_dump_json().encode(),
                    content_type="application/json")
