"""SageMaker Training Jobs, the second GPU backend: the role jobs run as, and the workflow's RunShardSageMaker task.

A training job runs the worker image unchanged: SageMaker starts its ENTRYPOINT with the argument `train` (which the
worker accepts), or with `ContainerEntrypoint` when the deployment sends it (nightbatch/pipeline/training_jobs.py: the
fields Step Functions does not document for this integration are sent only once proven).
Its Environment carries what the worker needs to find the rest: the job inputs, the bucket and region, and the
key of the settings document Plan wrote (nightbatch/settings/document.py; SageMaker caps a value at 512
characters). Capacity fills in each attempt's name, instance type, managed Spot and stopping condition
(nightbatch/pipeline/training_jobs.py). CDK's SageMakerCreateTrainingJob cannot express Spot, MaxWait,
MaxPending, RetryStrategy or ContainerEntrypoint, hence a CustomState, as RunShard is.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.environment import settings_environment
from infra.gpu_compute import CONTAINER_CACHE_DIR, MODEL_CACHE_ENV, VLLM_CACHE_ENV
from nightbatch.pipeline.training_jobs import deployment_job_prefix, with_fields
from nightbatch.settings import JobInputs

# The caches (weights, vLLM's compile caches) go on the job's ML storage volume (VolumeSizeInGB; the instance
# store on NVMe types). SageMaker's container contract names the paths it mounts there: /opt/ml/input, model,
# output, checkpoints and code, each with a purpose (model/ and output/ are uploaded when the job ends), and /tmp,
# "scratch space", which nothing uploads or restores. /opt/ml/cache is no documented path.
CACHE_DIR = "/tmp/nightbatch-cache"
JOB_ENVIRONMENT = {MODEL_CACHE_ENV: f"{CACHE_DIR}/models",
                   **{k: v.replace(CONTAINER_CACHE_DIR, CACHE_DIR, 1) for k, v in VLLM_CACHE_ENV.items()}}
FAILURE_FILE = "/opt/ml/output/failure"  # SageMaker reports its first line as the job's FailureReason
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
# SageMaker publishes a training job's metrics (instance utilization, algorithm metrics) as the job's role, under
# this namespace; PutMetricData takes no resource, so the namespace is the limit (cloudwatch:namespace).
METRICS_NAMESPACE = "/aws/sagemaker/*"
# The managed rule Step Functions' `.sync` integration watches training jobs through.
SYNC_RULE = "StepFunctionsGetEventsForSageMakerTrainingJobsRule"


class TrainingJobs(Construct):
    """The role SageMaker runs the worker as (its bucket/table grants are the stack's, like the Batch job role's)."""

    def __init__(self, scope: Construct, id: str, *, image: ecr_assets.DockerImageAsset, volume_gib: int,
                 hf_token_secret: secretsmanager.ISecret | None, fields: tuple[str, ...] = ()) -> None:
        super().__init__(scope, id)
        self.image = image
        # The unlisted CreateTrainingJob fields this deployment sends (cdk.json `sagemakerFields`).
        self.fields = fields
        self.volume_gib = volume_gib
        self.hf_token_secret = hf_token_secret
        # Every job this deployment runs is named with it (Capacity reads it from `sagemaker_json`): the grants
        # below reach this deployment's jobs only, never another workload's.
        self.job_prefix = deployment_job_prefix(cdk.Stack.of(self).stack_name)
        self.job_role = iam.Role(self, "JobRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
                                 description="nightbatch GPU worker on SageMaker: its batch's objects and items only")
        image.repository.grant_pull(self.job_role)
        if hf_token_secret is not None:  # SageMaker cannot inject it: the worker reads it (job_environment.py)
            hf_token_secret.grant_read(self.job_role)
        stack = cdk.Stack.of(self)
        self.job_role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[stack.format_arn(service="logs", resource="log-group", resource_name=f"{LOG_GROUP}:*",
                                        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)]))
        self.job_role.add_to_policy(iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringLike": {"cloudwatch:namespace": METRICS_NAMESPACE}}))

    def task(self, scope: Construct, id: str, *, bucket_name: str) -> sfn.CustomState:
        return sfn.CustomState(scope, id, state_json=self.state_json(bucket_name))

    def state_json(self, bucket_name: str) -> dict[str, Any]:
        environment = {
            **settings_environment({"mode": "aws", "region": cdk.Aws.REGION, "bucket": bucket_name,
                                    "worker_failure_file": FAILURE_FILE,
                                    **({"worker_hf_token_secret": self.hf_token_secret.secret_name}
                                       if self.hf_token_secret is not None else {})}),
            **JOB_ENVIRONMENT,
            f"{JobInputs.env_name('batch_id')}.$": "$.batch_id",
            f"{JobInputs.env_name('shard_id')}.$": "$.shard_id",
            f"{JobInputs.env_name('settings_key')}.$": "$.capacity.settings_key",
            JobInputs.env_name("backend"): "sagemaker",
        }
        return {
            "Type": "Task",
            "Resource": f"arn:{cdk.Aws.PARTITION}:states:::sagemaker:createTrainingJob.sync",
            "Parameters": with_fields({
                "TrainingJobName.$": "$.capacity.job_name",
                "RoleArn": self.job_role.role_arn,
                "AlgorithmSpecification": {"TrainingImage": self.image.image_uri, "TrainingInputMode": "File"},
                "ResourceConfig": {
                    "InstanceType.$": "$.capacity.instance_type",
                    "InstanceCount": 1,
                    "VolumeSizeInGB": self.volume_gib,
                },
                "EnableManagedSpotTraining.$": "$.capacity.managed_spot",
                # Spot: MaxRuntime and MaxWait; on-demand: MaxRuntime, and MaxPending if turned on (Capacity's).
                "StoppingCondition.$": "$.capacity.stopping_condition",
                "OutputDataConfig": {"S3OutputPath.$": "$.capacity.output_uri"},
                "Environment": environment,
            }, self.fields),
            # The whole DescribeTrainingJob document would grow the iteration's state: keep two fields.
            "ResultSelector": {"TrainingJobName.$": "$.TrainingJobName",
                               "TrainingJobStatus.$": "$.TrainingJobStatus"},
            "ResultPath": "$.job",
        }

    def grant_describe(self, role: iam.IGrantable) -> None:
        """Reading a job's billable seconds (nightbatch/aws/sagemaker_reads.py)."""
        iam.Grant.add_to_principal(grantee=role, actions=["sagemaker:DescribeTrainingJob"],
                                   resource_arns=[self.jobs_arn])

    def grant_stop(self, role: iam.IGrantable) -> None:
        """The sweeper stops a cancelled or ended batch's jobs (nightbatch/aws/sagemaker_jobs.py);
        ListTrainingJobs takes no resource-level permission."""
        iam.Grant.add_to_principal(grantee=role, actions=["sagemaker:ListTrainingJobs"], resource_arns=["*"])
        iam.Grant.add_to_principal(grantee=role, actions=["sagemaker:StopTrainingJob"],
                                   resource_arns=[self.jobs_arn])

    @property
    def jobs_arn(self) -> str:
        """This deployment's training jobs only (every name starts with its prefix), not the account's others."""
        return cdk.Stack.of(self).format_arn(service="sagemaker", resource="training-job",
                                             resource_name=f"{self.job_prefix}*")

    def grant_run(self, role: iam.IGrantable) -> None:
        """What CDK's SageMakerCreateTrainingJob grants for `.sync` (a CustomState grants nothing itself)."""
        stack = cdk.Stack.of(self)
        jobs = self.jobs_arn
        iam.Grant.add_to_principal(grantee=role, actions=[
            "sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob",
            # `.sync` tags each job MANAGED_BY_AWS=STARTED_BY_STEP_FUNCTIONS (aws-cdk#32294).
            "sagemaker:AddTags"], resource_arns=[jobs])
        # As CDK's SageMakerCreateTrainingJob grants it: ListTags takes no resource-level permission.
        iam.Grant.add_to_principal(grantee=role, actions=["sagemaker:ListTags"], resource_arns=["*"])
        iam.Grant.add_to_principal(grantee=role, actions=["iam:PassRole"], resource_arns=[self.job_role.role_arn],
                                   conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}})
        iam.Grant.add_to_principal(grantee=role, actions=["events:PutTargets", "events:PutRule",
                                                          "events:DescribeRule"],
                                   resource_arns=[stack.format_arn(service="events", resource="rule",
                                                                   resource_name=SYNC_RULE)])
