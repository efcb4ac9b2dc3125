"""Sweeper Lambda (scheduled): re-drives batches left in `validating` when StartExecution failed."""

from __future__ import annotations

from typing import Any

from nightbatch.pipeline.sweep import sweep
from nightbatch.services import default_services


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return sweep(default_services())
