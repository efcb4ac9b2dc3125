"""The workflow's steps (Validate, Plan, Capacity, Finalize, the sweeper), called by Step Functions' Lambdas and
locally, and the estimate: a dry run of Validate and Plan for the API.

Loaded on first use (PEP 562): importing one module of the package (the API imports `nightbatch.pipeline.estimate`)
does not import Validate, Plan and Finalize with it (API cold import, issue #17).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nightbatch.pipeline.finalize import finalize_batch
    from nightbatch.pipeline.payloads import BatchTaskInput, FinalizeOutput, PlanOutput, ValidateOutput
    from nightbatch.pipeline.plan import plan_batch
    from nightbatch.pipeline.validate import validate_batch

_WHERE = {
    "BatchTaskInput": "payloads", "FinalizeOutput": "payloads", "PlanOutput": "payloads", "ValidateOutput": "payloads",
    "finalize_batch": "finalize", "plan_batch": "plan", "validate_batch": "validate",
}

__all__ = [
    "BatchTaskInput", "FinalizeOutput", "PlanOutput", "ValidateOutput", "finalize_batch", "plan_batch",
    "validate_batch",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
