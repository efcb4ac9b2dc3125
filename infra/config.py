"""Deployment configuration: the CDK context (`cdk.json`, `-c key=value`) parsed once into a frozen model."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nightbatch.settings import ModelSpec, Settings

# Context keys this app reads; anything else in the context belongs to the CDK itself.
CONTEXT_KEYS = (
    "stage",
    "account",
    "region",
    "models",
    "gpuInstanceTypes",
    "capacity",
    "maxGpus",
    "shardRetry",
    "runnableTimeoutMinutes",
    "finalizeMarginHours",
    "workerVolumeGiB",
    "limits",
    "notifications",
    "alarms",
    "api",
    "logRetentionDays",
    "concurrency",
    "retainData",
)


# Settings `limits` may not set: secrets (CloudFormation parameters and Lambda environments are readable by
# anyone with describe rights; the stack keeps secrets in Secrets Manager), the safety switch for private
# webhook targets, resource wiring the stack sets itself, and development-only knobs.
FORBIDDEN_LIMITS: dict[str, str] = {
    **dict.fromkeys(("api_keys", "api_key", "link_secret", "api_keys_secret"), "a secret"),
    "allow_private_targets": "lets webhooks reach the VPC and loopback; never in AWS",
    **dict.fromkeys(("mode", "region", "bucket", "table", "state_machine_arn", "topic_arn", "job_queue",
                     "webhook_queue_url", "upload_queue_url", "models_json", "batch_id", "shard_id",
                     "worker_engine", "email_sender", "email_configuration_set", "base_url"),
                    "set by the stack"),
    **dict.fromkeys(("hour_seconds", "upload_compose_delay_seconds"), "development only"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class DeployedModel(_Strict):
    """A served model as written in `cdk.json`: the runtime `ModelSpec` plus the secret its weights need."""

    spec: ModelSpec
    # Name of a Secrets Manager secret holding a Hugging Face token (gated `hf:` models only).
    token_secret: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if isinstance(data, dict) and "spec" not in data:
            data = dict(data)
            token = data.pop("tokenSecret", None) or data.pop("token_secret", None)
            return {"spec": data, "token_secret": token}
        return data

    @field_validator("spec")
    @classmethod
    def _source_for_aws(cls, spec: ModelSpec) -> ModelSpec:
        if not spec.source.startswith(("s3://", "hf:")):
            raise ValueError(
                f"model {spec.name!r}: in AWS the weight source must be 's3://bucket/prefix' or 'hf:org/name'"
                f" (got {spec.source!r})"
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


class ShardRetry(_Strict):
    """Step Functions retry of a shard's Batch job (ARCHITECTURE decision 3, second layer)."""

    max_attempts: int = Field(2, alias="maxAttempts", ge=0, le=10)
    interval_seconds: int = Field(60, alias="intervalSeconds", ge=1)
    backoff_rate: float = Field(2.0, alias="backoffRate", ge=1.0)


class Notifications(_Strict):
    # Verified SES identity that batch e-mails come from; empty disables e-mail.
    sender_email: str = Field("", alias="senderEmail")
    # Recipient domains a batch may ask to notify; ["*"] means any domain, empty means none.
    allowed_domains: tuple[str, ...] = Field((), alias="allowedDomains")
    # Operator address subscribed to the alarm topic; empty means no subscription.
    alarm_email: str = Field("", alias="alarmEmail")

    @field_validator("sender_email", "alarm_email")
    @classmethod
    def _address(cls, value: str) -> str:
        if value and "@" not in value:
            raise ValueError(f"{value!r} is not an e-mail address")
        return value


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
    key (or none) can call, cannot take the whole account's concurrency from them. Needs the account's limit to
    exceed the sum by 100 (AWS keeps 100 unreserved)."""

    api: int = Field(50, ge=0)
    workflow: int = Field(10, ge=0)  # each of validate, plan, finalize, notify, deliver, compose_upload
    sweep: int = Field(1, ge=0)


class DeployConfig(_Strict):
    """Everything per stage that shapes the stack; nothing here is looked up from AWS at synth."""

    stage: str = Field("prod", pattern=r"^[a-z][a-z0-9-]{0,15}$")
    account: str | None = None
    region: str | None = None
    models: tuple[DeployedModel, ...]
    gpu_instance_types: tuple[str, ...] = Field(("g6.xlarge", "g5.xlarge", "g6e.xlarge"), alias="gpuInstanceTypes")
    capacity: Capacity = Capacity()
    max_gpus: int = Field(4, alias="maxGpus", ge=1, le=256)
    shard_retry: ShardRetry = Field(ShardRetry(), alias="shardRetry")
    runnable_timeout_minutes: int = Field(240, alias="runnableTimeoutMinutes", ge=10, le=1440)
    finalize_margin_hours: int = Field(3, alias="finalizeMarginHours", ge=1)
    worker_volume_gib: int = Field(200, alias="workerVolumeGiB", ge=60)
    # Runtime limits, keyed by `nightbatch.settings.Settings` field name; set on every Lambda and the worker.
    limits: dict[str, Any] = Field(default_factory=dict)
    notifications: Notifications = Notifications()
    alarms: Alarms = Alarms()
    api: ApiOptions = ApiOptions()
    concurrency: Concurrency = Concurrency()
    log_retention_days: int = Field(30, alias="logRetentionDays")
    # Keep the bucket and table on `cdk destroy` (the user's files and batch history).
    retain_data: bool = Field(True, alias="retainData")

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

    @field_validator("limits")
    @classmethod
    def _limits_are_settings(cls, limits: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(limits) - set(Settings.model_fields))
        if unknown:
            raise ValueError(f"limits: {unknown} are not fields of nightbatch.settings.Settings")
        refused = sorted(set(limits) & set(FORBIDDEN_LIMITS))
        if refused:
            raise ValueError("limits: " + "; ".join(f"{k!r} may not be set here ({FORBIDDEN_LIMITS[k]})"
                                                    for k in refused))
        Settings.model_validate(limits)
        return limits

    @property
    def max_window_hours(self) -> int:
        return int(self.limits.get("max_completion_window_hours", Settings.model_fields[
            "max_completion_window_hours"].default))

    @property
    def hf_token_secret(self) -> str | None:
        return next((m.token_secret for m in self.models if m.token_secret), None)

    @property
    def models_json(self) -> str:
        """The value of NIGHTBATCH_MODELS_JSON: exactly what `Settings.models` parses back."""
        return json.dumps([m.spec.model_dump(mode="json") for m in self.models], separators=(",", ":"))

    @classmethod
    def from_context(cls, get: Any) -> DeployConfig:
        """Build from a `node.try_get_context`-like getter; string values (from `-c key=value`) may be JSON."""
        raw: dict[str, Any] = {}
        for key in CONTEXT_KEYS:
            value = get(key)
            if value is None:
                continue
            if isinstance(value, str) and key not in ("stage", "account", "region"):
                value = json.loads(value)
            raw[key] = value
        return cls.model_validate(raw)
