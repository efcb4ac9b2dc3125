"""The runner of endpoint shards: an AWS Batch Fargate job of a small image of the core (no CUDA, no vLLM), in the VPC
the operator names (cdk.json `endpointNetwork`), from which the models' endpoints are reachable.

Why Fargate on AWS Batch rather than Lambda: a shard runs for hours and keeps hundreds of requests in flight; Lambda's
15 minutes would cut every request in flight at each leg's end (the server's work for them is lost), start the
AIMD window from the bottom again each leg, and need a continuation loop in the state machine. A Batch job is the
GPU worker's own path — the same `python -m gpu_worker`, the same `submitJob.sync` task and Capacity's retries and
moves, SIGTERM draining and checkpoints — and costs the runner's 0.5 vCPU (about $0.02 an hour), nothing while idle.

Its role reaches only what a shard needs: the batches/ objects (its shard's definition, results and checkpoints),
the batch's input objects Validate tagged, the batch items, and the endpoints' API-key secrets — not the models/
weight cache the GPU worker writes through, nor any other secret.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_batch as batch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.gpu_compute import worker_image_excludes

RUNNER_DOCKERFILE = "gpu_worker/Dockerfile.runner"
RUNNER_CPU = 0.5  # vCPU: JSON in and out, checkpoints; the server does the inference
RUNNER_MEMORY_GIB = 1


def runner_image_asset(scope: Construct, id: str, repo_root: Path) -> ecr_assets.DockerImageAsset:
    """The runner image: the worker image's context (the same allow-list), built from a slim Python base."""
    return ecr_assets.DockerImageAsset(
        scope, id, directory=str(repo_root), file=RUNNER_DOCKERFILE, platform=ecr_assets.Platform.LINUX_AMD64,
        exclude=worker_image_excludes(repo_root), ignore_mode=cdk.IgnoreMode.DOCKER)


class EndpointRunner(Construct):
    """The Fargate compute environment and queue, the runner's job definition, its role and its network."""

    def __init__(self, scope: Construct, id: str, *, repo_root: Path, vpc_id: str, subnet_ids: Sequence[str],
                 security_group_ids: Sequence[str], assign_public_ip: bool, max_vcpus: int,
                 environment: Mapping[str, str], secrets: Sequence[str], job_timeout: cdk.Duration,
                 log_retention: logs.RetentionDays) -> None:
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        groups = list(security_group_ids)
        if not groups:
            # No ingress; egress to the endpoints and to the AWS APIs (through the VPC's NAT or endpoints).
            group = ec2.CfnSecurityGroup(
                self, "SecurityGroup", vpc_id=vpc_id,
                group_description="nightbatch endpoint runners: outbound to the model endpoints and AWS APIs only",
                security_group_egress=[ec2.CfnSecurityGroup.EgressProperty(
                    ip_protocol="-1", cidr_ip="0.0.0.0/0", description="endpoints and AWS APIs")])
            groups = [group.attr_group_id]
        environment_ce = batch.CfnComputeEnvironment(
            self, "Fargate", type="MANAGED", state="ENABLED",
            compute_resources=batch.CfnComputeEnvironment.ComputeResourcesProperty(
                type="FARGATE", maxv_cpus=max_vcpus, subnets=list(subnet_ids), security_group_ids=groups))
        self.queue = batch.JobQueue(
            self, "Queue", priority=1, compute_environments=[batch.OrderedComputeEnvironment(
                compute_environment=batch.FargateComputeEnvironment.from_fargate_compute_environment_arn(
                    self, "FargateRef", environment_ce.attr_compute_environment_arn),
                order=1)])
        self.image = runner_image_asset(self, "Image", repo_root)
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention,
                                       removal_policy=cdk.RemovalPolicy.DESTROY)
        self.job_role = iam.Role(self, "JobRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
                                 description="nightbatch endpoint runner: its batch's objects and items, the "
                                             "endpoints' API-key secrets")
        self.secret_arns = [self._secret_arn(stack, s) for s in secrets]
        if self.secret_arns:
            self.job_role.add_to_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                            resources=self.secret_arns))
        self.container = batch.EcsFargateContainerDefinition(
            self, "Container", image=ecs.ContainerImage.from_docker_image_asset(self.image), cpu=RUNNER_CPU,
            memory=cdk.Size.gibibytes(RUNNER_MEMORY_GIB), job_role=self.job_role, environment=dict(environment),
            assign_public_ip=assign_public_ip, fargate_platform_version=ecs.FargatePlatformVersion.LATEST,
            logging=ecs.LogDriver.aws_logs(stream_prefix="runner", log_group=self.log_group))
        # Retries are Capacity's (it reads the pace the runner left and decides: again on the endpoint, or the GPUs).
        self.job_definition = batch.EcsJobDefinition(self, "JobDefinition", container=self.container,
                                                     propagate_tags=True, timeout=job_timeout, retry_attempts=1)

    @staticmethod
    def _secret_arn(stack: cdk.Stack, secret: str) -> str:
        """A secret named by ARN as is; by name, every ARN Secrets Manager may give it (six random characters)."""
        if secret.startswith("arn:"):
            return secret
        return stack.format_arn(service="secretsmanager", resource="secret", resource_name=f"{secret}-??????",
                                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
