"""Versioned task inputs and outputs: a deploy during running executions must not break them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from nightbatch.shards.spec import ShardItem

__all__ = ["BatchTaskInput", "FinalizeOutput", "PlanOutput", "ShardItem", "ValidateOutput"]


class BatchTaskInput(BaseModel):
    version: Literal[1] = 1
    batch_id: str


class ValidateOutput(BaseModel):
    version: Literal[1] = 1
    batch_id: str
    valid: bool


class PlanOutput(BaseModel):
    version: Literal[1] = 1
    batch_id: str
    manifest_bucket: str
    manifest_key: str
    shard_count: int
    # Shards running at once (the Map's MaxConcurrencyPath): max_gpus, or a SageMaker model's `max_jobs` if lower.
    max_concurrency: int = 1


class FinalizeOutput(BaseModel):
    version: Literal[1] = 1
    batch_id: str
    status: str
