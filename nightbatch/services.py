"""The composition of use cases a caller (API, tasks, local stack) is handed."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from nightbatch.assembly import AssemblyService, UploadJobs
from nightbatch.batches import BatchService, Workflow
from nightbatch.files import FileService
from nightbatch.settings import Settings, get_settings
from nightbatch.storage import Adapters, make_adapters
from nightbatch.storage.stepfunctions import StepFunctionsWorkflow
from nightbatch.uploads import UploadService, build_upload_services


@dataclass
class Services:
    settings: Settings
    adapters: Adapters
    files: FileService
    batches: BatchService
    uploads: UploadService
    assembly: AssemblyService


def build_services(
    adapters: Adapters, workflow: Workflow | None = None, upload_jobs: UploadJobs | None = None
) -> Services:
    settings = adapters.settings
    if workflow is None:
        workflow = StepFunctionsWorkflow(
            client=adapters.stepfunctions, state_machine_arn=settings.state_machine_arn
        )
    files = FileService(settings=settings, blobs=adapters.blobs, table=adapters.table)
    batches = BatchService(settings=settings, table=adapters.table, files=files, workflow=workflow)
    uploads, assembly = build_upload_services(adapters, files, upload_jobs)
    return Services(settings=settings, adapters=adapters, files=files, batches=batches, uploads=uploads,
                    assembly=assembly)


@lru_cache(maxsize=1)
def default_services() -> Services:
    """The services of a Lambda or worker process: AWS adapters and the Step Functions workflow."""
    return build_services(make_adapters(get_settings()))
