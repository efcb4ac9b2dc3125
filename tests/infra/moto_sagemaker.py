"""`sagemaker:createTrainingJob.sync` on moto's Step Functions interpreter, with the worker run as the job's container.

moto 5.2.5 lists sagemaker among the services its interpreter does not run ("Unsupported sync callback
procedure"), and its SageMaker backend is born Completed and drops Environment and RetryStrategy. Here:
- `patch_state_task` adds a state-task service for `sagemaker`: CreateTrainingJob with every parameter botocore's
  model knows (moto drops parameters not on a service's list), the MANAGED_BY_AWS tag `.sync` adds, a `.sync`
  resolver polling DescribeTrainingJob (a Failed/Stopped job fails the task with States.TaskFailed and the
  description as Cause, datetimes as epoch milliseconds), API errors as `SageMaker.<code>Exception`.
- `patch_training_jobs` makes CreateTrainingJob refuse a name used before (AWS: ResourceInUse, forever), keeps
  the Environment, and runs the job: the real worker, `python -m gpu_worker`, in a subprocess whose environment
  is the job's Environment alone (its /opt/ml and /tmp paths mapped into a directory per job), started as SageMaker
  starts it (the request's ContainerEntrypoint, else the image's ENTRYPOINT with the argument `train`), reaching moto
  through a ThreadedMotoServer that shares this process's backends. It ends Completed, or Failed with the FailureReason
  the worker wrote to its failure file.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.session
import pytest

ROOT = Path(__file__).resolve().parents[2]
# The worker image's ENTRYPOINT, as gpu_worker/Dockerfile sets it.
IMAGE_ENTRYPOINT: list[str] = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", (
    ROOT / "gpu_worker" / "Dockerfile").read_text(), re.MULTILINE)[1])
_TRAINING = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateTrainingJob")
CREATE_TRAINING_JOB_PARAMETERS = set(_TRAINING.input_shape.members)


@dataclass
class TrainingJobRecord:
    name: str
    env: dict[str, str]
    instance_type: str
    managed_spot: bool
    stopping_condition: dict[str, int]
    entrypoint: list[str] | None = None  # the request's ContainerEntrypoint
    status: str = "InProgress"
    failure_reason: str = ""
    output: str = ""

    @property
    def shard_id(self) -> str:
        return self.env.get("NIGHTBATCH_SHARD_ID", "")


@dataclass
class TrainingJobs:
    """What happened to the training jobs of a run, and how the test wants them to go."""

    endpoint_url: str = ""
    engine: str = ""
    jobs: list[TrainingJobRecord] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)  # CreateTrainingJob as the state machine sent it
    # Before a job runs: an API error code to refuse CreateTrainingJob with (e.g. ResourceLimitExceeded).
    refuse: Callable[[TrainingJobRecord], str | None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def patch_state_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import ClientError
    from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import CustomErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task_factory
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import ResourceCondition
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
        StateTaskServiceCallback,
    )
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
    from moto.stepfunctions.parser.asl.utils.boto_client import boto_client_for
    from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

    class StateTaskServiceSageMaker(StateTaskServiceCallback):
        def __init__(self) -> None:
            # WaitForTaskToken too: moto's callback base reads the task token's endpoint even for `.sync`.
            super().__init__(supported_integration_patterns={ResourceCondition.Sync,
                                                             ResourceCondition.WaitForTaskToken})

        def _get_supported_parameters(self) -> set[str] | None:
            return CREATE_TRAINING_JOB_PARAMETERS if self.resource.api_action.lower() == "createtrainingjob" else None

        def _from_error(self, env: Any, ex: Exception) -> Any:
            if not isinstance(ex, ClientError):
                return super()._from_error(env=env, ex=ex)
            # As Step Functions names them: the API's error code with `Exception` (SageMaker's model drops it).
            code = ex.response["Error"]["Code"]
            name = f"SageMaker.{code if code.endswith('Exception') else code + 'Exception'}"
            return FailureEvent(env=env, error_name=CustomErrorName(name), event_type=HistoryEventType.TaskFailed,
                                event_details=EventDetails(taskFailedEventDetails=TaskFailedEventDetails(
                                    error=name, cause=ex.response["Error"]["Message"],
                                    resource=self._get_sfn_resource(),
                                    resourceType=self._get_sfn_resource_type())))

        def _eval_service_task(self, env: Any, resource_runtime_part: Any, normalised_parameters: dict[str, Any],
                               state_credentials: Any) -> None:
            client = boto_client_for(region=resource_runtime_part.region, service="sagemaker",
                                     state_credentials=state_credentials)
            tags = [*normalised_parameters.pop("Tags", []),
                    {"Key": "MANAGED_BY_AWS", "Value": "STARTED_BY_STEP_FUNCTIONS"}]
            response = client.create_training_job(**normalised_parameters, Tags=tags)
            response.pop("ResponseMetadata", None)
            env.stack.append(response)

        def _build_sync_resolver(self, env: Any, resource_runtime_part: Any, normalised_parameters: dict[str, Any],
                                 state_credentials: Any) -> Callable[[], Any]:
            client = boto_client_for(region=resource_runtime_part.region, service="sagemaker",
                                     state_credentials=state_credentials)
            name = normalised_parameters["TrainingJobName"]
            env.stack.pop()

            def resolve() -> dict[str, Any] | None:
                job = _epoch_millis(client.describe_training_job(TrainingJobName=name))
                job.pop("ResponseMetadata", None)
                if job["TrainingJobStatus"] in ("InProgress", "Stopping"):
                    return None
                if job["TrainingJobStatus"] == "Completed":
                    return dict(job)
                error = StatesErrorNameType.StatesTaskFailed.to_name()
                raise FailureEventException(FailureEvent(
                    env=env, error_name=StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed),
                    event_type=HistoryEventType.TaskFailed,
                    event_details=EventDetails(taskFailedEventDetails=TaskFailedEventDetails(
                        resource=self._get_sfn_resource(), resourceType=self._get_sfn_resource_type(),
                        error=error, cause=to_json_str(job)))))

            return resolve

    original = state_task_factory.state_task_service_for

    def service_for(service_name: str) -> Any:
        return StateTaskServiceSageMaker() if service_name == "sagemaker" else original(service_name)

    monkeypatch.setattr(state_task_factory, "state_task_service_for", service_for)


def _epoch_millis(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _epoch_millis(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_epoch_millis(v) for v in node]
    if isinstance(node, datetime.datetime):
        return int(node.timestamp() * 1000)
    return node


def patch_training_jobs(monkeypatch: pytest.MonkeyPatch, jobs: TrainingJobs) -> None:
    from moto.sagemaker.exceptions import ResourceInUseException, SagemakerClientError
    from moto.sagemaker.responses import SageMakerResponse

    create = SageMakerResponse.create_training_job

    def create_training_job(self: Any) -> Any:
        name = self._get_param("TrainingJobName")
        backend = self.sagemaker_backend
        with jobs.lock:
            jobs.requests.append(dict(self._get_params()))
            if name in backend.training_jobs:
                raise ResourceInUseException(f"Training job names must be unique within an AWS account and region, "
                                             f"and a training job with this name already exists ({name})")
            record = TrainingJobRecord(
                name=name, env=dict(self._get_param("Environment") or {}),
                instance_type=self._get_param("ResourceConfig")["InstanceType"],
                managed_spot=bool(self._get_param("EnableManagedSpotTraining")),
                stopping_condition=dict(self._get_param("StoppingCondition")),
                entrypoint=(self._get_param("AlgorithmSpecification") or {}).get("ContainerEntrypoint"))
            jobs.jobs.append(record)
        refused = jobs.refuse(record) if jobs.refuse is not None else None
        if refused:
            record.status = "Refused"
            error = SagemakerClientError(refused, f"simulated: {refused} for {record.instance_type}")
            raise error
        result = create(self)
        job = backend.training_jobs[name]
        job.environment = record.env
        job.training_job_status = job.secondary_status = "InProgress"
        _run_container(record, jobs)
        job.training_job_status = job.secondary_status = record.status
        if record.failure_reason:
            job.failure_reason = record.failure_reason
        return result

    monkeypatch.setattr(SageMakerResponse, "create_training_job", create_training_job)


def _run_container(record: TrainingJobRecord, jobs: TrainingJobs) -> None:
    """The worker as SageMaker starts the image (`python3 -m gpu_worker train`, or the job's ContainerEntrypoint)
    with the job's Environment and nothing else of the deployment's settings but the test's engine."""
    with tempfile.TemporaryDirectory(prefix="sagemaker-job-") as root:
        # SageMaker's paths (/opt/ml, its /tmp scratch on the job's volume) in a directory of this job's own.
        env = {k: root + v if v.startswith(("/opt/ml/", "/tmp/")) else v for k, v in record.env.items()}
        env.update(PATH=os.environ.get("PATH", ""), PYTHONPATH=str(ROOT), AWS_ENDPOINT_URL=jobs.endpoint_url,
                   AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                   NIGHTBATCH_WORKER_ENGINE=jobs.engine)
        command = record.entrypoint or [*IMAGE_ENTRYPOINT, "train"]
        command = [sys.executable if part == "python3" else part for part in command]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=root)
        record.output = done.stdout[-2000:] + done.stderr[-4000:]
        if done.returncode == 0:
            record.status = "Completed"
            return
        record.status = "Failed"
        failure = Path(env.get("NIGHTBATCH_WORKER_FAILURE_FILE", ""))
        record.failure_reason = (failure.read_text().strip() if failure.is_file()
                                 else f"AlgorithmError: exited {done.returncode}")


def patch_stoppable_training_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """CreateTrainingJob leaves the job InProgress (moto's is born Completed) and StopTrainingJob (not in moto)
    moves an InProgress job to Stopping, as AWS does before Stopped; another status is AWS's ValidationException.
    No container runs: for tests of who stops which job."""
    from moto.core.responses import EmptyResult
    from moto.sagemaker.exceptions import ValidationError
    from moto.sagemaker.responses import SageMakerResponse

    create = SageMakerResponse.create_training_job

    def create_training_job(self: Any) -> Any:
        result = create(self)
        job = self.sagemaker_backend.training_jobs[self._get_param("TrainingJobName")]
        job.training_job_status, job.secondary_status = "InProgress", "Starting"
        return result

    def stop_training_job(self: Any) -> Any:
        name = self._get_param("TrainingJobName")
        job = self.sagemaker_backend.training_jobs.get(name)
        if job is None:
            raise ValidationError(message=f"Requested resource not found: training job {name}")
        if job.training_job_status != "InProgress":
            raise ValidationError(message=f"The request was rejected because the training job is in status "
                                          f"{job.training_job_status}.")
        job.training_job_status = job.secondary_status = "Stopping"
        return EmptyResult()

    monkeypatch.setattr(SageMakerResponse, "create_training_job", create_training_job)
    monkeypatch.setattr(SageMakerResponse, "stop_training_job", stop_training_job, raising=False)
