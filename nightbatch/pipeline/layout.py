"""Where a batch's working objects live in the bucket. Keys are built from ids we minted, never user strings."""

from __future__ import annotations


def batch_prefix(batch_id: str) -> str:
    return f"batches/{batch_id}/"


def segment_key(batch_id: str, n: int) -> str:
    return f"batches/{batch_id}/segments/{n:06d}.jsonl"


def segment_index_key(batch_id: str) -> str:
    return f"batches/{batch_id}/segments/index.json"


def shard_key(batch_id: str, shard_id: str) -> str:
    return f"batches/{batch_id}/shards/{shard_id}.json"


def manifest_key(batch_id: str) -> str:
    return f"batches/{batch_id}/manifest.json"


def results_prefix(batch_id: str, shard_id: str) -> str:
    return f"batches/{batch_id}/results/{shard_id}/"


def done_key(batch_id: str, shard_id: str) -> str:
    return f"batches/{batch_id}/results/{shard_id}/_done.json"


def output_key(batch_id: str) -> str:
    return f"batches/{batch_id}/output.jsonl"


def error_key(batch_id: str) -> str:
    return f"batches/{batch_id}/errors.jsonl"
