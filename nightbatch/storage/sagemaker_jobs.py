"""SageMaker adapter: the sweeper lists the deployment's running training jobs and stops those whose batch no
longer wants them (the twin of batch_jobs.py; the reads for the doctor and Finalize are sagemaker_reads.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

IN_PROGRESS = "InProgress"


class TrainingJobStops:
    def __init__(self, *, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix  # the deployment's job-name prefix (nightbatch/pipeline/training_jobs.py)

    def in_progress(self, limit: int) -> Iterator[str]:
        """The names of at most `limit` InProgress jobs whose name contains the prefix, oldest first."""
        paginator = self.client.get_paginator("list_training_jobs")
        seen = 0
        for page in paginator.paginate(NameContains=self.prefix, StatusEquals=IN_PROGRESS, SortBy="CreationTime",
                                       SortOrder="Ascending", PaginationConfig={"PageSize": min(100, limit)}):
            for summary in page.get("TrainingJobSummaries", []):
                name = str(summary.get("TrainingJobName", ""))
                if not name.startswith(self.prefix):  # NameContains matches anywhere in the name
                    continue
                yield name
                seen += 1
                if seen >= limit:
                    return

    def stop(self, name: str) -> None:
        self.client.stop_training_job(TrainingJobName=name)
