"""Versioned task inputs and outputs: a deploy during running executions must not break them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


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


class ShardItem(BaseModel):
    """One item of the shard manifest that the Distributed Map iterates."""

    version: Literal[1] = 1
    batch_id: str
    shard_id: str
    # AWS: the ARN of the batch model's Batch job definition (empty locally).
    job_definition: str = ""


class FinalizeOutput(BaseModel):
    version: Literal[1] = 1
    batch_id: str
    status: str
