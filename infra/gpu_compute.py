"""GPU compute: a public-subnet VPC, AWS Batch Spot-then-on-demand GPU environments, the worker job definition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_batch as batch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from infra.gpu_catalog import GPU_SHAPES, job_resources

# The host directory the model cache lives in (the instance-store NVMe when the type has one), and where
# the container sees it. The worker reads the container path from NIGHTBATCH_MODEL_CACHE.
HOST_CACHE_DIR = "/mnt/nightbatch-cache"
CONTAINER_CACHE_DIR = "/cache"
MODEL_CACHE_ENV = "NIGHTBATCH_MODEL_CACHE"
HF_TOKEN_ENV = "HF_TOKEN"
# vLLM's caches (torch.compile artifacts, CUDA graphs' inductor/triton kernels, streamer assets) on the NVMe cache,
# so a second job on the same host skips compilation (vLLM's docs: the torch.compile cache may be reused on a host).
VLLM_CACHE_ENV = {
    "VLLM_CACHE_ROOT": f"{CONTAINER_CACHE_DIR}/vllm",
    "TORCHINDUCTOR_CACHE_DIR": f"{CONTAINER_CACHE_DIR}/torchinductor",
    "TRITON_CACHE_DIR": f"{CONTAINER_CACHE_DIR}/triton",
}

# The worker image's own ignore file, an allow-list (BuildKit reads it at build time; CDK does not, so it is
# passed as the asset's exclude: the staged context and the asset hash cover exactly what the image needs).
WORKER_DOCKERIGNORE = "gpu_worker/Dockerfile.dockerignore"


def worker_image_excludes(repo_root: Path) -> list[str]:
    lines = (repo_root / WORKER_DOCKERIGNORE).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def worker_image_asset(scope: Construct, id: str, repo_root: Path) -> ecr_assets.DockerImageAsset:
    """The worker image: its hash (hence a rebuild and push) follows only the files the ignore file lets in."""
    return ecr_assets.DockerImageAsset(
        scope, id,
        directory=str(repo_root),
        file="gpu_worker/Dockerfile",
        platform=ecr_assets.Platform.LINUX_AMD64,
        exclude=worker_image_excludes(repo_root),
        ignore_mode=cdk.IgnoreMode.DOCKER,
    )


# Formats and mounts the first instance-store NVMe as the model cache; without one the cache is on the root EBS.
_MOUNT_CACHE = f"""set -euo pipefail
mkdir -p {HOST_CACHE_DIR}
dev=$(lsblk -dpno NAME,MODEL | awk '/Instance Storage/ {{print $1; exit}}')
if [ -n "$dev" ] && ! mountpoint -q {HOST_CACHE_DIR}; then
  mkfs.xfs -f "$dev" && mount -o noatime "$dev" {HOST_CACHE_DIR}
fi
chmod 0777 {HOST_CACHE_DIR}"""


@dataclass(frozen=True)
class ModelJob:
    """What a model's job definition is built from (infra/config.py's DeployedModel, flattened)."""

    name: str
    instance_types: Sequence[str]
    gpus: int
    shared_memory_gib: int


def construct_id(model_name: str) -> str:
    return "Job" + "".join(c for c in model_name.title() if c.isalnum())


class GpuCompute(Construct):
    """VPC (public subnets, no NAT), Batch compute environments and queue, the worker image, a job definition
    per model."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        repo_root: Path,
        models: Sequence[ModelJob],
        max_gpus: int,
        spot: bool,
        on_demand: bool,
        root_volume_gib: int,
        root_volume_throughput: int,
        root_volume_iops: int,
        runnable_timeout: cdk.Duration,
        spot_runnable_timeout: cdk.Duration,
        share_weights: Mapping[str, float],
        share_decay_seconds: int,
        compute_reservation: int,
        job_timeout: cdk.Duration,
        environment: Mapping[str, str],
        hf_token_secret_name: str | None,
        log_retention: logs.RetentionDays,
        use_batch: bool = True,
    ) -> None:
        super().__init__(scope, id)
        self.compute_environments: dict[str, batch.ManagedEc2EcsComputeEnvironment] = {}
        self.queues: dict[str, batch.JobQueue] = {}
        self.containers: dict[str, batch.EcsEc2ContainerDefinition] = {}
        self.job_definitions: dict[str, batch.EcsJobDefinition] = {}
        self._worker(repo_root, hf_token_secret_name, log_retention)
        if not use_batch:  # every model runs on SageMaker (infra/training_jobs.py): no VPC, hosts or queues
            return
        instance_types = list(dict.fromkeys(t for m in models for t in m.instance_types))
        self._network(log_retention)
        self._host_template(root_volume_gib, root_volume_throughput, root_volume_iops)
        # Fair share between tenants (share id = tenant) on both queues; a queue created without a policy can never
        # get one, so it is there from the start (AWS Batch User Guide, "Fair-share scheduling policies").
        self.scheduling_policy = batch.FairshareSchedulingPolicy(
            self, "FairShare", share_decay=cdk.Duration.seconds(share_decay_seconds),
            compute_reservation=compute_reservation,
            shares=[batch.Share(share_identifier=t, weight_factor=w) for t, w in share_weights.items()],
        )
        for kind in [k for k, on in (("spot", spot), ("on-demand", on_demand)) if on]:
            self._capacity(kind, instance_types, max_gpus,
                           spot_runnable_timeout if kind == "spot" else runnable_timeout)
        for model in models:
            self._job_definition(model, environment, job_timeout)

    def _network(self, log_retention: logs.RetentionDays) -> None:
        # Public subnets only: GPU hosts pull images and weights directly, and an idle VPC costs nothing.
        self.vpc = ec2.Vpc(
            self, "Vpc", max_azs=3, nat_gateways=0,
            subnet_configuration=[ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC,
                                                          cidr_mask=20)],
        )
        self.flow_logs = logs.LogGroup(self, "FlowLogs", retention=log_retention,
                                       removal_policy=cdk.RemovalPolicy.DESTROY)
        self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_logs),
                              traffic_type=ec2.FlowLogTrafficType.REJECT)

    def _host_template(self, volume_gib: int, throughput: int, iops: int) -> None:
        """The GPU hosts' launch template: the NVMe model cache mounted, IMDSv2, an encrypted gp3 root volume."""
        user_data = ec2.UserData.for_linux()
        user_data.add_commands(_MOUNT_CACHE)
        multipart = ec2.MultipartUserData()  # Batch accepts launch-template user data only in MIME form
        multipart.add_part(ec2.MultipartBody.from_user_data(user_data))
        self.launch_template = ec2.LaunchTemplate(
            self, "HostTemplate",
            user_data=multipart,
            require_imdsv2=True,
            block_devices=[ec2.BlockDevice(
                device_name="/dev/xvda",
                # Throughput/IOPS above gp3's baseline: the image pull and unpack of every new host is bound by them.
                volume=ec2.BlockDeviceVolume.ebs(volume_gib, volume_type=ec2.EbsDeviceVolumeType.GP3,
                                                 throughput=throughput, iops=iops,
                                                 encrypted=True, delete_on_termination=True),
            )],
        )

    def _capacity(self, kind: str, instance_types: Sequence[str], max_gpus: int,
                  capacity_wait: cdk.Duration) -> None:
        """One compute environment and its queue per capacity type (a job cannot choose its compute environment
        inside one queue): the workflow submits to Spot first and moves a batch to on-demand
        (nightbatch/pipeline/capacity.py)."""
        # maxGpus GPUs' worth of vCPUs, and never less than the largest host (a lower cap leaves its jobs RUNNABLE
        # with COMPUTE_ENVIRONMENT_MAX_RESOURCE).
        per_gpu = max(GPU_SHAPES[t].vcpus // GPU_SHAPES[t].gpus for t in instance_types)
        max_vcpus = max(max_gpus * per_gpu, max(GPU_SHAPES[t].vcpus for t in instance_types))
        ce_id, queue_id = ("Spot", "SpotQueue") if kind == "spot" else ("OnDemand", "OnDemandQueue")
        ce = batch.ManagedEc2EcsComputeEnvironment(
            self, ce_id, spot=kind == "spot",
            allocation_strategy=(batch.AllocationStrategy.SPOT_PRICE_CAPACITY_OPTIMIZED if kind == "spot"
                                 else batch.AllocationStrategy.BEST_FIT_PROGRESSIVE),
            vpc=self.vpc,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            instance_types=[ec2.InstanceType(t) for t in instance_types],
            use_optimal_instance_classes=False,
            images=[batch.EcsMachineImage(image_type=batch.EcsMachineImageType.ECS_AL2023_NVIDIA)],
            minv_cpus=0,  # idle costs nothing
            maxv_cpus=max_vcpus,
            launch_template=self.launch_template,
            update_to_latest_image_version=True,
        )
        self.compute_environments[kind] = ce
        # Jobs that can never be placed (no capacity, or a misconfiguration) end instead of waiting forever.
        # A Spot job waiting past its bound comes back to the workflow, which resubmits it on-demand.
        self.queues[kind] = batch.JobQueue(
            self, queue_id,
            compute_environments=[batch.OrderedComputeEnvironment(compute_environment=ce, order=1)],
            scheduling_policy=self.scheduling_policy,
            job_state_time_limit_actions=[
                batch.JobStateTimeLimitAction(
                    max_time=capacity_wait,
                    reason=batch.JobStateTimeLimitActionsReason.INSUFFICIENT_INSTANCE_CAPACITY,
                ),
                batch.JobStateTimeLimitAction(
                    max_time=cdk.Duration.minutes(10),
                    reason=batch.JobStateTimeLimitActionsReason.COMPUTE_ENVIRONMENT_MAX_RESOURCE),
                batch.JobStateTimeLimitAction(
                    max_time=cdk.Duration.minutes(10),
                    reason=batch.JobStateTimeLimitActionsReason.JOB_RESOURCE_REQUIREMENT),
            ],
        )

    def _worker(self, repo_root: Path, hf_token_secret_name: str | None, log_retention: logs.RetentionDays) -> None:
        """What every model's job shares: the image, the log group, the role and the Hugging Face token."""
        self.image = worker_image_asset(self, "WorkerImage", repo_root)
        self.log_group = logs.LogGroup(self, "WorkerLogs", retention=log_retention,
                                       removal_policy=cdk.RemovalPolicy.DESTROY)
        self.job_role = iam.Role(self, "JobRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
                                 description="nightbatch GPU worker: its batch's objects and items only")
        self.container_secrets: dict[str, batch.Secret] = {}
        self.hf_token_secret: secretsmanager.ISecret | None = None
        if hf_token_secret_name:
            self.hf_token_secret = secretsmanager.Secret.from_secret_name_v2(self, "HfToken", hf_token_secret_name)
            # Injected by ECS from Secrets Manager; huggingface_hub reads HF_TOKEN itself.
            self.container_secrets[HF_TOKEN_ENV] = batch.Secret.from_secrets_manager(self.hf_token_secret)

    def _job_definition(self, model: ModelJob, environment: Mapping[str, str], job_timeout: cdk.Duration) -> None:
        vcpus, memory_gib = job_resources(model.instance_types, model.gpus)
        cid = construct_id(model.name)
        container = batch.EcsEc2ContainerDefinition(
            self, f"{cid}Worker",
            image=ecs.ContainerImage.from_docker_image_asset(self.image),
            cpu=vcpus,
            memory=cdk.Size.gibibytes(memory_gib),
            gpu=model.gpus,
            job_role=self.job_role,
            environment={**environment, MODEL_CACHE_ENV: f"{CONTAINER_CACHE_DIR}/models", **VLLM_CACHE_ENV},
            secrets=self.container_secrets or None,
            volumes=[batch.EcsVolume.host(name="model-cache", host_path=HOST_CACHE_DIR,
                                          container_path=CONTAINER_CACHE_DIR)],
            linux_parameters=batch.LinuxParameters(
                self, f"{cid}Linux", shared_memory_size=cdk.Size.gibibytes(model.shared_memory_gib),
                init_process_enabled=True),
            logging=ecs.LogDriver.aws_logs(stream_prefix="worker", log_group=self.log_group),
        )
        self.containers[model.name] = container
        self.job_definitions[model.name] = batch.EcsJobDefinition(
            self, cid,
            container=container,
            propagate_tags=True,
            timeout=job_timeout,
            retry_attempts=3,
            # First retry layer (docs/ARCHITECTURE.md, decision 3): a reclaimed Spot host reruns the job, anything else
            # ends it and lets the state machine decide.
            retry_strategies=[
                batch.RetryStrategy.of(batch.Action.RETRY, batch.Reason.SPOT_INSTANCE_RECLAIMED),
                batch.RetryStrategy.of(batch.Action.EXIT, batch.Reason.custom(on_reason="*")),
            ],
        )
