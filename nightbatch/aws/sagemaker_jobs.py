"""SageMaker adapter: the sweeper lists the deployment's running training jobs and stops those whose batch no
longer wants them (the twin of batch_jobs.py; the reads for the doctor and Finalize are sagemaker_reads.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

IN_PROGRESS = "InProgress"
PAGE_SIZE = 100  # ListTrainingJobs' largest MaxResults


class TrainingJobStops:
    def __init__(self, *, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix  # the deployment's job-name prefix (nightbatch/pipeline/training_jobs.py)

    def in_progress(self) -> Iterator[str]:
        """The names of every InProgress job whose name starts with the prefix, oldest first, a page of 100 at a
        time (ListTrainingJobs' NextToken): the caller stops reading when it has no time for more."""
        paginator = self.client.get_paginator("list_training_jobs")
        for page in paginator.paginate(NameContains=self.prefix, StatusEquals=IN_PROGRESS, SortBy="CreationTime",
                                       SortOrder="Ascending", PaginationConfig={"PageSize": PAGE_SIZE}):
            for summary in page.get("TrainingJobSummaries", []):
                name = str(summary.get("TrainingJobName", ""))
                if name.startswith(self.prefix):  # NameContains matches anywhere in the name
                    yield name

    def stop(self, name: str) -> None:
        self.client.stop_training_job(TrainingJobName=name)
