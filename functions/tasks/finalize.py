"""Finalize step Lambda."""

from __future__ import annotations

from typing import Any

from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.services import default_services


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return finalize_batch(BatchTaskInput.model_validate(event), default_services()).model_dump()
