"""Lambda's account concurrency, which a stack's reserved concurrency comes out of.

AWS keeps `UNRESERVED_MINIMUM` of an account's concurrent executions (its quota `QUOTA_CODE`) unreserved: a
function's ReservedConcurrentExecutions that would leave less is refused, and the deploy fails. New accounts
start with a quota far below what established ones have (1,000). The stack checks its reservations against the
quota its configuration states (infra/stack.py); `nightbatch doctor` against the account's real one.
"""

from __future__ import annotations

UNRESERVED_MINIMUM = 100
QUOTA_CODE = "L-B99A9384"  # Service Quotas → AWS Lambda → "Concurrent executions"
QUOTA_NAME = "Concurrent executions"
# The stack output (and synthesized template output) that states what the stack reserves in all.
STACK_OUTPUT = "ReservedConcurrency"


def reservable(concurrent_executions: int) -> int:
    """How much of an account's concurrency functions may reserve in all."""
    return max(0, concurrent_executions - UNRESERVED_MINIMUM)


def quota_request(desired: int, region: str) -> str:
    return (f"`aws service-quotas request-service-quota-increase --service-code lambda --quota-code {QUOTA_CODE} "
            f"--desired-value {desired} --region {region}`")
