"""The workflow's task functions (Validate, Plan, Finalize), called by Step Functions' Lambdas and locally."""

from nightbatch.pipeline.finalize import finalize_batch
from nightbatch.pipeline.models import BatchTaskInput, FinalizeOutput, PlanOutput, ValidateOutput
from nightbatch.pipeline.plan import plan_batch
from nightbatch.pipeline.validate import validate_batch

__all__ = [
    "BatchTaskInput", "FinalizeOutput", "PlanOutput", "ValidateOutput", "finalize_batch", "plan_batch",
    "validate_batch",
]
