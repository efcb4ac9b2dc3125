"""The sections the workflow reads: validation, per-tenant limits, Plan, Capacity, accounting and the GPU worker."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from nightbatch.settings.base import Env, JsonSetting, Section

GpuBackend = Literal["batch", "sagemaker", "both"]
# A deployment's SageMaker job-name prefix (nightbatch/pipeline/training_jobs.py): `nb-<1-8 lower-case
# alphanumerics>-`; with the rest of a name (32 hex + a 5-digit shard + up to 5 digits of attempt + 6 hex +
# 4 dashes) it stays within 63 characters.
JOB_PREFIX_RE = re.compile(r"^nb-[a-z0-9]{1,8}-$")
# What a deployment whose stack wrote no prefix (the local mode, tests) names its jobs.
DEFAULT_JOB_PREFIX = "nb-local-"


class TenantLimits(BaseModel):
    """What one tenant may hold at once; 0 means unlimited (nightbatch/tenancy/limits.py resolves them)."""

    model_config = ConfigDict(extra="forbid")

    queued_requests: int
    queued_tokens: int
    batches_in_flight: int
    requests_per_minute: int
    stored_bytes: int


def _known_limits(values: dict[str, int]) -> dict[str, int]:
    # A typo in a limit name must not silently mean "no limit".
    unknown = sorted(set(values) - set(TenantLimits.model_fields))
    if unknown:
        raise ValueError(f"{unknown} are not limits; the limits are {sorted(TenantLimits.model_fields)}")
    return values


class SageMakerConfig(BaseModel):
    """NIGHTBATCH_SAGEMAKER_JSON, written by the stack (nightbatch/pipeline/training_jobs.py reads it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # one parsed value is shared by every reader

    instance_types: dict[str, str] = {}  # model -> ml.* instance type
    spot: bool = True
    on_demand: bool = True
    # MaxPendingTimeInSeconds of an on-demand job; 0: not sent (nightbatch/pipeline/training_jobs.py).
    max_pending_seconds: int = 0
    max_jobs: dict[str, int] = {}  # model -> shards of one batch at once (its training quota); absent: max_gpus
    job_prefix: str = Field(DEFAULT_JOB_PREFIX, pattern=JOB_PREFIX_RE.pattern)  # deployment_job_prefix(stack)


TENANT_LIMITS: JsonSetting[dict[str, dict[str, int]]] = JsonSetting(
    "tenant_limits_json", dict[str, Annotated[dict[str, int], AfterValidator(_known_limits)]])
JOB_DEFINITIONS: JsonSetting[dict[str, str]] = JsonSetting("job_definitions_json", dict[str, str])
BACKENDS: JsonSetting[dict[str, GpuBackend]] = JsonSetting("backends_json", dict[str, GpuBackend])
JOB_QUEUES: JsonSetting[dict[str, str]] = JsonSetting("job_queues_json", dict[str, str])
SAGEMAKER: JsonSetting[SageMakerConfig] = JsonSetting("sagemaker_json", SageMakerConfig)
SAGEMAKER_PRICES: JsonSetting[dict[str, float]] = JsonSetting("sagemaker_prices_json", dict[str, float])


class ValidationSettings(Section):
    """What one batch may hold and ask for (OpenAI's defaults, raisable), and its completion window."""

    max_requests_per_batch: int = 50_000
    max_input_bytes: int = 200 * 1000 * 1000
    max_line_bytes: int = 4 * 1024 * 1024
    max_embedding_inputs: int = 50_000
    # Per request: OpenAI's 2048 inputs per embeddings call; completions per request (`n`, `best_of`), each of
    # which multiplies the GPU work a line asks for. 0 = no cap.
    max_embedding_inputs_per_request: int = 2048
    max_choices_per_request: int = 16
    # Documents (pairs) one /v1/score or /v1/rerank line may score: each is a forward pass, and one line is
    # answered by one engine call, so it must stay far smaller than a shard. 0 = no cap.
    max_score_documents_per_request: int = 1000
    # Comma-separated https hosts whose image/audio/video URLs requests may name; empty: inline data: URLs only.
    media_allowed_domains: str = ""
    # One image of a line (inline, by file id or by s3://, docs/USER_BUCKETS.md) may be this large; the worker
    # fetches one by reference into a data: URL and answers a larger one with the line's own error.
    max_image_bytes: int = 20 * 1024 * 1024
    # The images one line names, each distinct one counted once, may total this much (OpenAI's 50 MB a request);
    # Validate counts what it knows (inline images, files), the worker what it fetches. 0 = no cap.
    max_image_bytes_per_request: int = 50 * 1024 * 1024
    # Images one line may hold (data:, https, s3:// or file ids; on every wire, an Anthropic tool_result's
    # too); 0 = no cap.
    max_images_per_request: int = 32
    max_reported_errors: int = 1000
    # Lines of one batch may name different served models (each shard still serves one; counts, usage and cost
    # per model under `nightbatch.models`). Off: OpenAI's rule, one model per batch (`mismatched_model`);
    # the LoRA adapters of one served model may share a batch either way.
    multi_model_batches: bool = False
    max_completion_window_hours: int = 168
    # Development only: the length of one "hour" of a completion window, so tests can expire batches in seconds.
    hour_seconds: float = 3600.0

    @field_validator("hour_seconds")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("hour_seconds must be positive")
        return v

class LimitSettings(Section):
    """Per-tenant limits (nightbatch/tenancy/limits.py); 0 means unlimited.

    NIGHTBATCH_TENANT_LIMITS_JSON overrides them per tenant:
    {"team-a": {"queued_tokens": 1000000}, "*": {"requests_per_minute": 600}} ("*" = every other tenant).
    """

    queued_requests: Annotated[int, Env("limit_queued_requests")] = 1_000_000
    queued_tokens: Annotated[int, Env("limit_queued_tokens")] = 50_000_000
    batches_in_flight: Annotated[int, Env("limit_batches_in_flight")] = 1000
    requests_per_minute: Annotated[int, Env("limit_requests_per_minute")] = 6000
    # Bytes a tenant's uploaded files and open Uploads may hold (batch outputs are not counted).
    stored_bytes: Annotated[int, Env("limit_stored_bytes")] = 100 * 1024**3
    # Retry-After sent with a 429 for too many batches in flight (the SDK honours values up to 60 s).
    in_flight_retry_after: Annotated[int, Env("limit_in_flight_retry_after")] = 30
    tenant_limits_json: Annotated[str, TENANT_LIMITS.validator] = ""

    @property
    def tenant_overrides(self) -> Mapping[str, Mapping[str, int]]:
        """tenant_limits_json: tenant ("*" = every other) -> the limits it changes."""
        return TENANT_LIMITS.parse(self.tenant_limits_json)

class PipelineSettings(Section):
    """The workflow: Validate's segments, Plan's shards, the sweeper.

    Validate writes the input as segments; Plan groups whole segments into shards. The shard count
    (nightbatch/pipeline/sizing.py) keeps each shard's cold start (instance, image, weights, engine) <= the
    cold-start share of its GPU time at the model's throughput, within max_gpus * shards_per_gpu, and raises
    it (up to one shard per GPU, then the cap) when the batch would otherwise miss its window.
    """

    state_machine_arn: str = ""
    segment_max_lines: int = 1000
    segment_max_bytes: int = 4 * 1024 * 1024
    # > 0: a fixed number of estimated tokens per shard instead (tests and benches use it).
    shard_target_tokens: int = 0
    shards_per_gpu: int = 3
    # Prefix-aware placement (nightbatch/pipeline/placement.py): prompts of at least `plan_prefix_chars`
    # characters are grouped by the hash of that head into `plan_prefix_groups` groups (0 = off), and Plan
    # keeps each group in as few shards as balance allows, so a shared system prompt is prefilled once per
    # shard it lands in rather than in every shard. Costs one open segment buffer per group in Validate.
    plan_prefix_groups: int = 8
    plan_prefix_chars: int = 1024
    max_gpus: int = 4
    # Estimated tokens (prompt + expected output) one GPU processes per second, and one shard's cold start.
    # Defaults: an 8B model on one L40S/L4-class GPU (bench/cost: ~1.6k-5k output tok/s at 1:1 in/out) and
    # ~3 min from job start to first result on a new host (instance + image pull + weights + engine;
    # refine it from the phase metrics, FirstResultSeconds).
    shard_tokens_per_second: float = 4000.0
    shard_cold_start_seconds: float = 180.0
    shard_cold_start_share: float = 0.10
    # Share of a completion window kept free for queueing and Finalize when sizing for it.
    window_safety_share: float = 0.25
    # Plan: {"<model>": "<job definition ARN>"}, the job definition each shard of a model's batch runs with.
    job_definitions_json: Annotated[str, JOB_DEFINITIONS.validator] = ""
    # Plan: {"<model>": "batch" | "sagemaker" | "both"}, the model's `gpuBackend` (absent: batch). `both` starts a
    # shard on AWS Batch and lets Capacity move it to SageMaker when Batch cannot place it.
    backends_json: Annotated[str, BACKENDS.validator] = ""
    # AWS Batch queue ARNs (comma-separated): the sweeper cancels a cancelled/expired batch's unstarted jobs.
    job_queue: str = ""

    @property
    def job_definitions(self) -> Mapping[str, str]:
        return JOB_DEFINITIONS.parse(self.job_definitions_json)

    @property
    def backends(self) -> Mapping[str, GpuBackend]:
        return BACKENDS.parse(self.backends_json)

class CapacitySettings(Section):
    """The Capacity step (nightbatch/pipeline/capacity.py): where and how often a shard is submitted."""

    # {"spot": "<queue ARN>", "on-demand": "<queue ARN>"}; a batch moves to on-demand when its slack (time
    # left - estimated remaining work) drops below the margin.
    job_queues_json: Annotated[str, JOB_QUEUES.validator] = ""
    margin_seconds: Annotated[float, Env("capacity_margin_seconds")] = 1800.0
    # Failed attempts of a shard (other than a Spot shortage) retried on the same capacity, with backoff.
    retry_attempts: Annotated[int, Env("shard_retry_attempts")] = 2
    retry_interval_seconds: Annotated[float, Env("shard_retry_interval_seconds")] = 60.0
    retry_backoff: Annotated[float, Env("shard_retry_backoff")] = 2.0
    # SageMaker Training Jobs (nightbatch/pipeline/training_jobs.py): {"instance_types": {"<model>": "ml.g6.xlarge"},
    # "spot": true, "on_demand": true, "max_pending_seconds": 14400}; empty: no model runs there.
    sagemaker_json: Annotated[str, SAGEMAKER.validator] = ""
    # Endpoint shards (a model's `endpoint`; nightbatch/shards/pace.py): the runner's AWS Batch queue and job
    # definition (set by the stack), and how the pace is judged: measured over the last `pace_window_seconds`,
    # and only once an attempt has run `measure_seconds`; then a slack below the margin moves the shard's remaining
    # lines to the model's GPU backend.
    endpoint_job_queue: str = ""
    endpoint_job_definition: str = ""
    endpoint_measure_seconds: float = 300.0
    endpoint_pace_window_seconds: float = 600.0

    @property
    def job_queues(self) -> Mapping[str, str]:
        return JOB_QUEUES.parse(self.job_queues_json)

    @property
    def sagemaker(self) -> SageMakerConfig:
        return SAGEMAKER.parse(self.sagemaker_json)

class AccountingSettings(Section):
    """What one GPU-second costs, for `batch.nightbatch.cost` (estimates; set to your prices)."""

    instance_type: str = "g6e.xlarge"
    capacity: Literal["spot", "on-demand"] = "spot"
    instance_price_per_hour: float = 0.0  # 0 = use the built-in price table for instance_type and capacity
    gpus_per_instance: int = 1
    # SageMaker attempts (gpu_backend sagemaker/both): {"ml.g6.xlarge": 1.2} USD per instance-hour on top of the
    # built-in ml.* table (nightbatch/batches/cost.py); the type is the job's, else "ml." + instance_type.
    sagemaker_prices_json: Annotated[str, SAGEMAKER_PRICES.validator] = ""
    # The managed-Spot saving assumed for a training job whose billable time Finalize could not read (0 = price
    # it on-demand, an upper bound).
    sagemaker_spot_savings: float = 0.0  # read as a share, clamped to 0-1
    # USD per hour of an endpoint shard's runner (an AWS Batch Fargate task of 0.5 vCPU and 1 GiB, us-east-1 on-demand:
    # 0.5 x 0.04048 + 1 x 0.004445): what an attempt on a model's endpoint costs the batch; the endpoint's own GPUs
    # are already paid for.
    endpoint_runner_price_per_hour: float = 0.0247

    @property
    def sagemaker_prices(self) -> Mapping[str, float]:
        return SAGEMAKER_PRICES.parse(self.sagemaker_prices_json)

class WorkerSettings(Section):
    """The GPU worker (gpu_worker/): its engine, checkpoints, polling, draining and request order."""

    # "module:Class" of an engine taking a ModelSpec; empty means the vLLM engine.
    engine: Annotated[str, Env("worker_engine")] = ""
    # How often a running shard reads the batch item for cancel/expiry.
    poll_seconds: Annotated[float, Env("worker_poll_seconds")] = 5.0
    # How long a stopping shard lets in-flight requests finish: under ECS's 30 s SIGTERM-to-SIGKILL window.
    drain_seconds: Annotated[float, Env("worker_drain_seconds")] = 20.0
    # Checkpoints (gpu_worker/checkpoints.py, CheckpointPolicy): an attempt's first one after `every_lines` lines or
    # `every_seconds`; then each when `checkpoint_bytes` of results are buffered (0: S3's 5 MiB part minimum, so
    # Finalize copies it server-side; smaller ones it uploads again) or `max_seconds` after the last; on a stop at
    # once. The live counters are added every `every_seconds`.
    checkpoint_every_lines: int = 64
    checkpoint_every_seconds: float = 10.0
    checkpoint_bytes: int = 0
    checkpoint_max_seconds: float = 600.0
    max_in_flight: int = 256
    # Image bytes the lines in flight may hold at once, fetched by reference (gpu_worker/images.py): a line waits
    # for its share rather than fail (unless it alone needs more); their data: URLs take about 4/3 of it. 0 = no
    # bound.
    image_bytes_in_flight: Annotated[int, Env("worker_image_bytes_in_flight")] = 256 * 1024 * 1024
    # A fetch of an image that S3 throttles, fails with a 5xx, or that times out or is cut short is tried this
    # many times in all, waiting `backoff` seconds, doubled each time, in between.
    image_fetch_attempts: Annotated[int, Env("worker_image_fetch_attempts")] = 4
    image_fetch_backoff_seconds: Annotated[float, Env("worker_image_fetch_backoff_seconds")] = 0.5
    # Throughput (gpu_worker/scheduling.py): pending lines are read this far ahead and reordered within that
    # window (0 = input order, no window); the char bound (prompt text) keeps a window of very long lines in
    # bounded memory.
    order_window_lines: Annotated[int, Env("worker_order_window_lines")] = 4096
    order_window_chars: Annotated[int, Env("worker_order_window_chars")] = 64 * 1024 * 1024
    # Requests whose prompts begin with the same `prefix_chars` characters (~64 tokens) go to the engine
    # together, so vLLM's prefix cache computes their shared blocks once.
    group_prefixes: Annotated[bool, Env("worker_group_prefixes")] = True
    prefix_chars: Annotated[int, Env("worker_prefix_chars")] = 256
    # "longest" prompt first (groups by their longest member, then within each group), "shortest", or "none".
    length_order: Annotated[Literal["longest", "shortest", "none"], Env("worker_length_order")] = "longest"
    # Keep at least this many requests in flight per engine sequence slot (vLLM's max_num_seqs), whatever
    # max_in_flight says, so the engine's scheduler always has work waiting; 0 = max_in_flight alone.
    in_flight_per_slot: Annotated[float, Env("worker_in_flight_per_slot")] = 2.0
    # Where a failed run writes its cause in one line (SageMaker reports /opt/ml/output/failure as FailureReason).
    failure_file: Annotated[str, Env("worker_failure_file")] = ""
    # A Secrets Manager secret holding a Hugging Face token, read by the worker itself where the platform cannot
    # inject it (SageMaker; an AWS Batch job definition injects HF_TOKEN).
    hf_token_secret: Annotated[str, Env("worker_hf_token_secret")] = ""
