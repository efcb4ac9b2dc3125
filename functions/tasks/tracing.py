"""X-Ray for the task Lambdas: Powertools' Tracer, one per process.

The trace arrives from the API: its Lambda (active tracing) calls StartExecution, botocore forwards the
invocation's `_X_AMZN_TRACE_ID` as the `X-Amzn-Trace-Id` header, Step Functions (tracing enabled) continues the
trace and passes it to each task Lambda it invokes. Here each handler runs in a `## handler` subsegment
annotated with the batch id (X-Ray filter: `annotation.batch_id = "batch_…"`), and every AWS call is a
subsegment of it (botocore patched; http.client is not, so webhook requests carry no trace header to
receivers). Responses are not recorded. Outside Lambda (tests, `nightbatch local`) the Tracer disables itself.
"""

from __future__ import annotations

from aws_lambda_powertools.tracing import Tracer

tracer = Tracer(service="nightbatch", patch_modules=("botocore",))


def annotate_batch(batch_id: str | None) -> None:
    """Puts the batch id on the current handler's subsegment (searchable in X-Ray)."""
    if batch_id:
        tracer.put_annotation(key="batch_id", value=batch_id)
