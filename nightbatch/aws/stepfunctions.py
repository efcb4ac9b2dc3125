"""Step Functions adapter: one standard-workflow execution per batch, named after the batch id."""

from __future__ import annotations

import json
import logging
from typing import Any

from nightbatch.aws.botoerrors import botocore_error, client_error

log = logging.getLogger(__name__)


class StepFunctionsWorkflow:
    def __init__(self, *, client: Any, state_machine_arn: str) -> None:
        self.client = client
        self.arn = state_machine_arn

    def start(self, batch_id: str) -> None:
        # The execution name makes a retried start a no-op instead of a second run.
        try:
            self.client.start_execution(
                stateMachineArn=self.arn, name=batch_id,
                input=json.dumps({"version": 1, "batch_id": batch_id}),
            )
        except client_error() as e:
            code = e.response.get("Error", {}).get("Code")
            if code == "ExecutionAlreadyExists":
                return
            # Left in `validating`; the sweeper re-drives it.
            log.error("start_execution failed", extra={"batch_id": batch_id, "code": code})
        except botocore_error():
            # Connection and parameter errors too: a 500 here would make the SDK retry the create and
            # make a second batch, while this one already exists and the sweeper will re-drive it.
            log.exception("start_execution failed", extra={"batch_id": batch_id})
