"""Deployment configuration: the CDK context (`cdk.json`, `-c key=value`) parsed once into a frozen model."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.endpoint_network import EndpointNetwork
from infra.gpu_catalog import GPU_SHAPES
from infra.gpu_fit import GpuNeeds
from infra.user_buckets import UserBuckets
from nightbatch.models.spec import ModelSpec
from nightbatch.settings import SETTINGS, Settings, nest

# Context keys this app reads; anything else in the context belongs to the CDK itself.
CONTEXT_KEYS = (
    "stage",
    "account",
    "region",
    "models",
    "gpuInstanceTypes",
    "capacity",
    "gpuBackend",
    "maxGpus",
    "shardRetry",
    "runnableTimeoutMinutes",
    "spotRunnableMinutes",
    "capacityMarginMinutes",
    "fairShare",
    "finalizeMarginHours",
    "workerVolumeGiB",
    "workerVolumeThroughputMiBps",
    "workerVolumeIops",
    "limits",
    "notifications",
    "alarms",
    "api",
    "logRetentionDays",
    "concurrency",
    "retainData",
    "lambdaBundling",
    "userBuckets",
    "sagemakerFields",
    "endpointNetwork",
)


# Settings `limits` may not set: secrets (CloudFormation parameters and Lambda environments are readable by
# anyone with describe rights; the stack keeps secrets in Secrets Manager), the safety switch for private
# webhook targets, resource wiring the stack sets itself, and development-only knobs.
FORBIDDEN_LIMITS: dict[str, str] = {
    **dict.fromkeys(("api_keys", "api_key", "link_secret", "api_keys_secret"), "a secret"),
    "allow_private_targets": "lets webhooks reach the VPC and loopback; never in AWS",
    **dict.fromkeys(("mode", "region", "bucket", "table", "state_machine_arn", "topic_arn", "job_queue",
                     "webhook_queue_url", "upload_queue_url", "models_json", "worker_engine", "email_sender",
                     "email_configuration_set", "base_url", "event_bus", "user_input_buckets",
                     "user_output_prefixes", "endpoint_job_queue", "endpoint_job_definition"),
                    "set by the stack"),
    **dict.fromkeys(("hour_seconds", "upload_compose_delay_seconds"), "development only"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


GpuBackend = Literal["batch", "sagemaker", "both"]


class ModelFleet(_Strict):
    """How a model's AWS Batch job definition is shaped (deployment-only keys of a `models` entry)."""

    # Overrides the deployment's `gpuBackend` for this model.
    gpu_backend: GpuBackend | None = Field(None, alias="gpuBackend")

    # Instance types its jobs may run on; empty: the deployment's `gpuInstanceTypes`.
    instance_types: tuple[str, ...] = Field((), alias="instanceTypes")
    # /dev/shm of the container (tensor-parallel workers exchange data through it); 0: 2 GiB + 4 GiB per extra GPU.
    shared_memory_gib: int = Field(0, alias="sharedMemoryGiB", ge=0)
    # Weights in GPU memory; 0: from the parameter count the name or source states ("8B") and the dtype.
    weights_gib: float = Field(0.0, alias="weightsGiB", ge=0)
    # KV cache the model needs beyond its weights to be worth running (a few max-length sequences).
    min_kv_cache_gib: float = Field(1.0, alias="minKvCacheGiB", ge=0)
    # Shards of one batch of this model running at once when it may run on SageMaker (gpuBackend sagemaker or
    # both): set it to the account's training quota of its ml.* type, so the Map does not submit jobs the quota
    # would refuse; 0: maxGpus.
    sagemaker_max_jobs: int = Field(0, alias="sagemakerMaxJobs", ge=0, le=256)


_FLEET_KEYS = {f.alias or n for n, f in ModelFleet.model_fields.items()} | set(ModelFleet.model_fields)


class DeployedModel(_Strict):
    """A served model as written in `cdk.json`: the runtime `ModelSpec`, the secret its weights need, its jobs."""

    spec: ModelSpec
    # Name of a Secrets Manager secret holding a Hugging Face token (gated `hf:` models only).
    token_secret: str | None = None
    fleet: ModelFleet = ModelFleet()

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if isinstance(data, dict) and "spec" not in data:
            data = dict(data)
            token = data.pop("tokenSecret", None) or data.pop("token_secret", None)
            fleet = {k: data.pop(k) for k in list(data) if k in _FLEET_KEYS}
            return {"spec": data, "token_secret": token, "fleet": fleet}
        return data

    @property
    def gpu(self) -> GpuNeeds:
        """What it asks of its GPUs (tensor parallelism, memory, FP8, /dev/shm), checked against its types."""
        return GpuNeeds.of(self.spec, weights_gib_set=self.fleet.weights_gib,
                           shared_memory_gib_set=self.fleet.shared_memory_gib,
                           min_kv_cache_gib=self.fleet.min_kv_cache_gib)

    @field_validator("spec")
    @classmethod
    def _source_for_aws(cls, spec: ModelSpec) -> ModelSpec:
        if spec.endpoint is not None and spec.endpoint.api_key_env:
            raise ValueError(f"model {spec.name!r}: in AWS an endpoint's API key comes from `api_key_secret` (a "
                             "Secrets Manager secret the runner may read), not from an environment variable")
        if spec.has_weights and not spec.source.startswith(("s3://", "hf:")):
            raise ValueError(
                f"model {spec.name!r}: in AWS the weight source must be 's3://bucket/prefix' or 'hf:org/name'"
                f" (got {spec.source!r})"
            )
        local = sorted(name for name, source in spec.lora_modules.items() if not source.startswith("s3://"))
        if local:
            raise ValueError(f"model {spec.name!r}: in AWS LoRA adapters come from 's3://bucket/prefix' (not {local})")
        template = spec.chat_template
        if template is not None and not template.startswith("nightbatch:") and not any(c in template for c in "{}"):
            raise ValueError(
                f"model {spec.name!r}: in AWS chat_template must be the template itself or 'nightbatch:<file>'"
                " (a path on this machine does not exist in the worker image)"
            )
        return spec


class Capacity(_Strict):
    spot: bool = True
    on_demand: bool = Field(True, alias="onDemand")

    @model_validator(mode="after")
    def _some(self) -> Capacity:
        if not (self.spot or self.on_demand):
            raise ValueError("capacity: at least one of spot and onDemand must be true")
        return self


class FairShare(_Strict):
    """AWS Batch fair-share scheduling between tenants (share identifier = tenant id, alphanumerics only)."""

    # Relative weights: a lower weight gets more of the GPUs (0.5 gets twice what 1.0 gets). Tenants not
    # listed get `defaultWeight`.
    weights: dict[str, float] = Field(default_factory=dict)
    default_weight: float = Field(1.0, alias="defaultWeight", gt=0)
    share_decay_seconds: int = Field(3600, alias="shareDecaySeconds", ge=0, le=604800)
    compute_reservation: int = Field(0, alias="computeReservation", ge=0, le=99)

    @field_validator("weights")
    @classmethod
    def _weights(cls, weights: dict[str, float]) -> dict[str, float]:
        for tenant, weight in weights.items():
            if not tenant.isalnum() or len(tenant) > 255:
                raise ValueError(f"fairShare.weights: {tenant!r} is not a share identifier (alphanumerics, <= 255)")
            if not 0 < weight < 1000:
                raise ValueError(f"fairShare.weights[{tenant!r}]: {weight} is outside 0.0001..999.9999")
        return weights

    def policy_weights(self) -> dict[str, float]:
        """Batch gives unlisted shares 1.0; weights are relative, so listed ones are scaled by the default."""
        return {t: max(0.0001, min(999.9999, w / self.default_weight)) for t, w in self.weights.items()}


class ShardRetry(_Strict):
    """Capacity's retries of a shard's failed attempt, with backoff (docs/ARCHITECTURE.md, decision 3: the second
    layer)."""

    max_attempts: int = Field(2, alias="maxAttempts", ge=0, le=10)
    interval_seconds: int = Field(60, alias="intervalSeconds", ge=1)
    backoff_rate: float = Field(2.0, alias="backoffRate", ge=1.0)


class Notifications(_Strict):
    # The From address of batch e-mails; empty disables e-mail.
    sender_email: str = Field("", alias="senderEmail")
    # The SES identity (the address itself, or a domain covering it) that already exists in the account and
    # region; empty means the address. The stack only refers to it, so stages can share one sender.
    sender_identity: str = Field("", alias="senderIdentity")
    # Opt-in: let this stack create that identity (SES then mails a verification link, or a domain needs its
    # DKIM records). Exactly one stack per account and region may own an identity.
    create_sender_identity: bool = Field(False, alias="createSenderIdentity")
    # Recipient domains a batch may ask to notify; ["*"] means any domain, empty means none.
    allowed_domains: tuple[str, ...] = Field((), alias="allowedDomains")
    # Operator address subscribed to the alarm topic; empty means no subscription.
    alarm_email: str = Field("", alias="alarmEmail")
    # EventBridge bus every batch state change is put on (docs/NOTIFICATIONS.md): "default" (the account's
    # default bus), another bus's name or ARN in this account and region, or "" for none.
    event_bus: str = Field("default", alias="eventBus", pattern=r"^$|^[A-Za-z0-9._\-/:]{1,1600}$")

    @field_validator("sender_email", "alarm_email")
    @classmethod
    def _address(cls, value: str) -> str:
        if value and "@" not in value:
            raise ValueError(f"{value!r} is not an e-mail address")
        return value

    @model_validator(mode="after")
    def _identity_covers_sender(self) -> Notifications:
        if not self.sender_email:
            if self.sender_identity or self.create_sender_identity:
                raise ValueError("notifications: senderIdentity/createSenderIdentity need a senderEmail")
            return self
        identity = self.identity.lower()
        domain = self.sender_email.rpartition("@")[2].lower()
        if identity != self.sender_email.lower() and domain != identity and not domain.endswith(f".{identity}"):
            raise ValueError(f"notifications: senderIdentity {self.sender_identity!r} does not cover "
                             f"senderEmail {self.sender_email!r} (name the address or its domain)")
        return self

    @property
    def identity(self) -> str:
        """The SES identity e-mails are sent through: senderIdentity, or the sender address itself."""
        return self.sender_identity or self.sender_email


class Alarms(_Strict):
    stuck_batch_minutes: int = Field(30, alias="stuckBatchMinutes", ge=5)
    runnable_minutes: int = Field(60, alias="runnableMinutes", ge=5)
    shard_attempts: int = Field(3, alias="shardAttempts", ge=1)


class ApiOptions(_Strict):
    rate_limit: int = Field(50, alias="rateLimit", ge=1)
    burst_limit: int = Field(100, alias="burstLimit", ge=1)
    memory_mb: int = Field(1024, alias="memoryMb", ge=128)


class Concurrency(_Strict):
    """Reserved concurrency (0 = none): the workflow's Lambdas always have room, and the API, which anyone with a
    key (or none) can call, cannot take the whole account's concurrency from them. Every reservation comes out of
    the account's Lambda quota, of which AWS keeps 100 unreserved (nightbatch/lambda_quota.py): the synth fails,
    naming these keys, when the stack's reservations do not fit in `accountLimit` (the quota; lower the others,
    or set `accountLimit` to what `nightbatch doctor` reads in the account)."""

    api: int = Field(50, ge=0)
    workflow: int = Field(10, ge=0)  # each workflow Lambda: every one but the API and the sweeper (infra/stack.py)
    sweep: int = Field(1, ge=0)
    # The account's "Concurrent executions" quota (established accounts: 1,000; new ones get less).
    account_limit: int = Field(1000, alias="accountLimit", ge=0)


class SageMakerFields(_Strict):
    """The CreateTrainingJob fields Step Functions' documentation does not list for `createTrainingJob.sync`
    (nightbatch/pipeline/training_jobs.py UNLISTED_FIELDS): each off until `nightbatch doctor --stack` proves Step
    Functions accepts it in the account, then turned on here."""

    container_entrypoint: bool = Field(False, alias="ContainerEntrypoint")
    retry_strategy: bool = Field(False, alias="RetryStrategy")
    max_pending_time: bool = Field(False, alias="MaxPendingTimeInSeconds")

    @property
    def enabled(self) -> tuple[str, ...]:
        """The fields turned on, by their CreateTrainingJob names."""
        return tuple(f.alias or n for n, f in type(self).model_fields.items() if getattr(self, n))


class DeployConfig(_Strict):
    """Everything per stage that shapes the stack; nothing here is looked up from AWS at synth."""

    stage: str = Field("prod", pattern=r"^[a-z][a-z0-9-]{0,15}$")
    account: str | None = None
    region: str | None = None
    models: tuple[DeployedModel, ...]
    gpu_instance_types: tuple[str, ...] = Field(("g6.xlarge", "g5.xlarge", "g6e.xlarge"), alias="gpuInstanceTypes")
    capacity: Capacity = Capacity()
    # Where shards run: AWS Batch, SageMaker Training Jobs, or Batch first with SageMaker as the fallback when
    # Batch cannot place a shard. A model's own `gpuBackend` overrides it.
    gpu_backend: GpuBackend = Field("batch", alias="gpuBackend")
    max_gpus: int = Field(4, alias="maxGpus", ge=1, le=256)
    shard_retry: ShardRetry = Field(ShardRetry(), alias="shardRetry")
    runnable_timeout_minutes: int = Field(240, alias="runnableTimeoutMinutes", ge=10, le=1440)
    # A Spot job RUNNABLE this long (Spot shortage) is cancelled by its queue and resubmitted on-demand.
    spot_runnable_minutes: int = Field(30, alias="spotRunnableMinutes", ge=10, le=1440)
    # A batch moves to on-demand when its slack (time left - estimated remaining work) falls below this.
    capacity_margin_minutes: int = Field(30, alias="capacityMarginMinutes", ge=0)
    fair_share: FairShare = Field(FairShare(), alias="fairShare")
    finalize_margin_hours: int = Field(3, alias="finalizeMarginHours", ge=1)
    worker_volume_gib: int = Field(200, alias="workerVolumeGiB", ge=60)
    # gp3 root volume of GPU hosts: pulling and unpacking the ~20 GB worker image is bound by these (gp3's
    # 125 MiB/s default makes that minutes). Throughput may be at most IOPS / 4.
    worker_volume_throughput: int = Field(1000, alias="workerVolumeThroughputMiBps", ge=125, le=2000)
    worker_volume_iops: int = Field(4000, alias="workerVolumeIops", ge=3000, le=16000)
    # Runtime limits, keyed by setting name (NIGHTBATCH_<NAME> lower-cased, `nightbatch.settings.SETTINGS`); set
    # on every Lambda and the worker.
    limits: dict[str, Any] = Field(default_factory=dict)
    notifications: Notifications = Notifications()
    alarms: Alarms = Alarms()
    api: ApiOptions = ApiOptions()
    concurrency: Concurrency = Concurrency()
    # How the Lambda asset is built (infra/bundling.py): `docker` compiles .pyc files with the runtime's Python.
    lambda_bundling: Literal["auto", "docker", "local"] = Field("auto", alias="lambdaBundling")
    log_retention_days: int = Field(30, alias="logRetentionDays")
    # Keep the bucket and table on `cdk destroy` (the user's files and batch history).
    retain_data: bool = Field(True, alias="retainData")
    # The users' own buckets batches may read from and write to (infra/user_buckets.py, docs/USER_BUCKETS.md).
    user_buckets: UserBuckets = Field(UserBuckets(), alias="userBuckets")
    sagemaker_fields: SageMakerFields = Field(SageMakerFields(), alias="sagemakerFields")
    # The VPC the runners of endpoint models run in (required when a model has an `endpoint`).
    endpoint_network: EndpointNetwork | None = Field(None, alias="endpointNetwork")

    @field_validator("models")
    @classmethod
    def _unique_models(cls, models: tuple[DeployedModel, ...]) -> tuple[DeployedModel, ...]:
        if not models:
            raise ValueError("models: at least one served model is required")
        names = [m.spec.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: duplicate served names in {names}")
        secrets = {m.token_secret for m in models if m.token_secret}
        if len(secrets) > 1:
            raise ValueError(f"models: one Hugging Face token secret per deployment is supported, got {secrets}")
        return models

    @model_validator(mode="after")
    def _runnable(self) -> DeployConfig:
        unknown = sorted({t for t in self.gpu_instance_types if t not in GPU_SHAPES})
        if unknown:
            raise ValueError(f"gpuInstanceTypes {unknown} are not types nightbatch knows: {sorted(GPU_SHAPES)}")
        for model in self.gpu_models:
            model.gpu.check_fits(self.instance_types_for(model))
        if self.uses_endpoint and self.endpoint_network is None:
            names = [m.spec.name for m in self.models if m.spec.endpoint is not None]
            raise ValueError(f"models {names} have an endpoint: set `endpointNetwork` (the VPC and subnets from which "
                             "their runners reach it; docs/DEPLOY.md)")
        if self.worker_volume_throughput * 4 > self.worker_volume_iops:
            raise ValueError(f"workerVolumeThroughputMiBps={self.worker_volume_throughput} needs workerVolumeIops >= "
                             f"{self.worker_volume_throughput * 4} (gp3 allows 0.25 MiB/s per IOPS)")
        return self

    def instance_types_for(self, model: DeployedModel) -> tuple[str, ...]:
        return model.fleet.instance_types or self.gpu_instance_types

    def backend_for(self, model: DeployedModel) -> GpuBackend:
        return model.fleet.gpu_backend or self.gpu_backend

    @property
    def gpu_models(self) -> tuple[DeployedModel, ...]:
        """The models with weights of their own, which run on GPUs nightbatch starts (an endpoint model's only when
        its endpoint cannot finish a shard in its window)."""
        return tuple(m for m in self.models if m.spec.has_weights)

    @property
    def uses_batch(self) -> bool:
        """Some model runs on AWS Batch GPUs: the stack needs the VPC, compute environments and queues."""
        return any(self.backend_for(m) != "sagemaker" for m in self.gpu_models)

    @property
    def uses_sagemaker(self) -> bool:
        return any(self.backend_for(m) != "batch" for m in self.gpu_models)

    @property
    def uses_endpoint(self) -> bool:
        """Some model runs on an endpoint: the stack needs the runner's Fargate compute environment."""
        return any(m.spec.endpoint is not None for m in self.models)

    @property
    def endpoint_secrets(self) -> tuple[str, ...]:
        """The Secrets Manager secrets (names or ARNs) holding the endpoints' API keys: all the runner may read."""
        return tuple(sorted({m.spec.endpoint.api_key_secret for m in self.models
                             if m.spec.endpoint is not None and m.spec.endpoint.api_key_secret}))

    @property
    def all_instance_types(self) -> tuple[str, ...]:
        """Every type some model may run on, for the compute environments (Batch picks one a job fits)."""
        return tuple(dict.fromkeys(t for m in self.gpu_models for t in self.instance_types_for(m)))

    @property
    def sagemaker_instance_types(self) -> dict[str, str]:
        """The ml.* type each model's training jobs run on: its first instance type."""
        return {m.spec.name: f"ml.{self.instance_types_for(m)[0]}" for m in self.gpu_models
                if self.backend_for(m) != "batch"}

    @field_validator("limits")
    @classmethod
    def _limits_are_settings(cls, limits: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(limits) - set(SETTINGS))
        if unknown:
            raise ValueError(f"limits: {unknown} are not settings (nightbatch/settings/)")
        refused = sorted(set(limits) & set(FORBIDDEN_LIMITS))
        if refused:
            raise ValueError("limits: " + "; ".join(f"{k!r} may not be set here ({FORBIDDEN_LIMITS[k]})"
                                                    for k in refused))
        Settings.model_validate(nest(limits))
        return limits

    @property
    def max_window_hours(self) -> int:
        return int(self.limits.get("max_completion_window_hours",
                                   SETTINGS["max_completion_window_hours"].info.default))

    @property
    def hf_token_secret(self) -> str | None:
        return next((m.token_secret for m in self.models if m.token_secret), None)

    @property
    def models_json(self) -> str:
        """The value of NIGHTBATCH_MODELS_JSON: exactly what `Settings.serving.models` parses back."""
        # Defaults left out: the parse applies them again, and the 4 KB Lambda environment has room for more models.
        return json.dumps([m.spec.model_dump(mode="json", exclude_defaults=True) for m in self.models],
                          separators=(",", ":"))

    @classmethod
    def from_context(cls, get: Any) -> DeployConfig:
        """Build from a `node.try_get_context`-like getter; string values (from `-c key=value`) may be JSON."""
        raw: dict[str, Any] = {}
        for key in CONTEXT_KEYS:
            value = get(key)
            if value is None:
                continue
            if isinstance(value, str) and key not in ("stage", "account", "region", "lambdaBundling", "gpuBackend"):
                value = json.loads(value)
            raw[key] = value
        return cls.model_validate(raw)
