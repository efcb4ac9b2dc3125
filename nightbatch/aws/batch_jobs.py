"""AWS Batch adapter: the sweeper lists the queue's jobs and cancels those whose batch no longer wants them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

UNSTARTED = ("SUBMITTED", "PENDING", "RUNNABLE")
ACTIVE = (*UNSTARTED, "STARTING", "RUNNING")


class BatchJobs:
    def __init__(self, *, client: Any, queue: str) -> None:
        self.client = client
        self.queue = queue

    def jobs(self, status: str) -> Iterator[dict[str, Any]]:
        paginator = self.client.get_paginator("list_jobs")
        for page in paginator.paginate(jobQueue=self.queue, jobStatus=status):
            yield from page.get("jobSummaryList", [])

    def cancel(self, job_id: str, reason: str) -> None:
        self.client.cancel_job(jobId=job_id, reason=reason)
