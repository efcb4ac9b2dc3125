"""Settings: every environment variable the code reads, parsed once into pydantic models, grouped in sections
by what reads them."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from nightbatch.model_spec import LOCAL_MODELS, ModelSpec


class Env:
    """Marks a section field whose environment variable is not NIGHTBATCH_<FIELD> (`Annotated[int, Env("X")]`)."""

    def __init__(self, name: str) -> None:
        self.name = name  # the setting name: the variable without its prefix, lower-cased


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeploymentSettings(Section):
    """Where the deployment lives; read by everything that touches AWS."""

    mode: Literal["aws", "local"] = "aws"
    region: str = "us-east-1"
    bucket: str = "nightbatch-data"
    table: str = "nightbatch"


class ServingSettings(Section):
    """The served models (Validate, Plan, the worker, /v1/models)."""

    models_json: str = ""
    default_max_tokens: int = 256

    @property
    def models(self) -> list[ModelSpec]:
        if self.models_json:
            return [ModelSpec.model_validate(m) for m in json.loads(self.models_json)]
        return list(LOCAL_MODELS)

    def model(self, name: str) -> ModelSpec | None:
        return next((m for m in self.models if m.name == name), None)


class ApiSettings(Section):
    """The API's keys, key cache and Idempotency-Key records (docs/TENANCY.md)."""

    # Comma-separated keys accepted as the "default" tenant (bootstrap; stored keys come later).
    api_keys: str = ""
    api_key: str = ""
    api_keys_secret: str = ""  # Secrets Manager secret (ARN) holding comma-separated API keys
    # How long a process trusts a stored key lookup; a revoked key stops working within this many seconds.
    key_cache_seconds: float = 30.0
    # Idempotency-Key records: how long a key replays its first answer, and how long an unfinished first
    # request holds the key before a retry may take it over (a crashed request must not block it forever).
    idempotency_ttl_seconds: int = 86400
    idempotency_lock_seconds: int = 300

    @property
    def accepted_keys(self) -> set[str]:
        keys = {k.strip() for k in self.api_keys.split(",") if k.strip()}
        if self.api_key:
            keys.add(self.api_key)
        return keys


class FileSettings(Section):
    """Files: upload size, lifetimes, downloads (ARCHITECTURE "Payload limits")."""

    # ~4 MiB through API Gateway + Lambda, OpenAI's 512 MB locally.
    max_upload_bytes: int = 4 * 1024 * 1024
    input_file_ttl_seconds: int = 30 * 86400
    output_file_ttl_seconds: int = 30 * 86400
    # Larger downloads answer 307 to a pre-signed S3 URL (a Lambda response carries ~4 MiB raw); 0 = no limit.
    max_inline_download_bytes: int = 4 * 1024 * 1024
    presigned_url_seconds: int = 300
    # ARCHITECTURE decision 7: GET /v1/files/{id} on a batch_output file returns JSONL unless Accept asks for JSON.
    seed_compat_file_get: bool = True


class UploadSettings(Section):
    """The Uploads API (docs/UPLOADS.md)."""

    # One part's bytes: ~4 MiB fits API Gateway + Lambda once base64-encoded; locally OpenAI's 64 MiB.
    max_part_bytes: Annotated[int, Env("max_upload_part_bytes")] = 4 * 1024 * 1024
    # OpenAI: an Upload holds at most 8 GB.
    max_total_bytes: Annotated[int, Env("max_upload_total_bytes")] = 8 * 1024 * 1024 * 1024
    # Keeps a File item's ordered part-key list under DynamoDB's 400 KB item limit (4 MiB parts -> 16 GB).
    max_parts: Annotated[int, Env("max_upload_parts")] = 4000
    # SQS queue of the compose-upload task (AWS); empty composes on a thread of this process (the local mode).
    queue_url: Annotated[str, Env("upload_queue_url")] = ""
    # Part objects outlive composition this long so readers already streaming through them can finish.
    parts_grace_seconds: Annotated[int, Env("upload_parts_grace_seconds")] = 900
    # Development only: wait this long before composing, so tests can observe a file still made of parts.
    compose_delay_seconds: Annotated[float, Env("upload_compose_delay_seconds")] = 0.0


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
    # Comma-separated https hosts whose image/audio/video URLs requests may name; empty: inline data: URLs only.
    media_allowed_domains: str = ""
    max_reported_errors: int = 1000
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
    """Per-tenant limits (nightbatch/limits.py); 0 means unlimited.

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
    tenant_limits_json: str = ""


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
    job_definitions_json: str = ""
    # AWS Batch queue ARNs (comma-separated): the sweeper cancels a cancelled/expired batch's unstarted jobs.
    job_queue: str = ""


class CapacitySettings(Section):
    """The Capacity step (nightbatch/pipeline/capacity.py): where and how often a shard is submitted."""

    # {"spot": "<queue ARN>", "on-demand": "<queue ARN>"}; a batch moves to on-demand when its slack (time
    # left - estimated remaining work) drops below the margin.
    job_queues_json: str = ""
    margin_seconds: Annotated[float, Env("capacity_margin_seconds")] = 1800.0
    # Failed attempts of a shard (other than a Spot shortage) retried on the same capacity, with backoff.
    retry_attempts: Annotated[int, Env("shard_retry_attempts")] = 2
    retry_interval_seconds: Annotated[float, Env("shard_retry_interval_seconds")] = 60.0
    retry_backoff: Annotated[float, Env("shard_retry_backoff")] = 2.0


class AccountingSettings(Section):
    """What one GPU-second costs, for `batch.nightbatch.cost` (estimates; set to your prices)."""

    instance_type: str = "g6e.xlarge"
    capacity: Literal["spot", "on-demand"] = "spot"
    instance_price_per_hour: float = 0.0  # 0 = use the built-in price table for instance_type and capacity
    gpus_per_instance: int = 1


class WorkerSettings(Section):
    """The GPU worker (gpu_worker/): its engine, checkpoints, polling, draining and request order."""

    # "module:Class" of an engine taking a ModelSpec; empty means the vLLM engine.
    engine: Annotated[str, Env("worker_engine")] = ""
    # How often a running shard reads the batch item for cancel/expiry.
    poll_seconds: Annotated[float, Env("worker_poll_seconds")] = 5.0
    # How long a stopping shard lets in-flight requests finish: under ECS's 30 s SIGTERM-to-SIGKILL window.
    drain_seconds: Annotated[float, Env("worker_drain_seconds")] = 20.0
    checkpoint_every_lines: int = 64
    checkpoint_every_seconds: float = 10.0
    max_in_flight: int = 256
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


class LinkSettings(Section):
    """Signed download links (/v1/nightbatch/files/{id}/download; nightbatch/links.py)."""

    # HMAC key. Unset: a random key per process, fine for `nightbatch local`; in AWS set it, since every Lambda
    # (API, notify) must share it.
    secret: Annotated[str, Env("link_secret")] = ""
    # Secrets Manager secret (ARN) holding the link-signing keys, read at run time; the stack sets it and no key
    # sits in any environment. Wins over `secret`.
    keys_secret: Annotated[str, Env("link_keys_secret")] = ""
    ttl_seconds: Annotated[int, Env("link_ttl_seconds")] = 300


class NotificationSettings(Section):
    """Webhooks, SNS, e-mail (nightbatch/notifications, docs/NOTIFICATIONS.md)."""

    topic_arn: str = ""
    notify_function: str = ""  # the Notify Lambda: the sweeper re-invokes it for events with channels pending
    webhook_queue_url: str = ""  # SQS queue Notify puts webhook deliveries on
    # Failed webhook deliveries are retried with exponential backoff from the base delay, each gap capped, until
    # the event is older than the max age (OpenAI retries for 72 h). Tests shrink them to seconds.
    webhook_retry_base_seconds: float = 5.0
    webhook_retry_max_delay_seconds: float = 6 * 3600.0
    webhook_max_age_seconds: float = 72 * 3600.0
    webhook_timeout_seconds: float = 10.0
    # Private and loopback webhook targets (the local stack allows them; never in AWS). Link-local (instance
    # metadata), multicast, reserved and unspecified addresses are refused regardless.
    allow_private_targets: bool = False
    # Webhook endpoints one tenant may register (every event fans out to each); 0 = no cap.
    max_webhook_endpoints: int = 20
    # KMS key (ARN) sealing webhook signing secrets in the table; empty stores them as they are (the local mode).
    secrets_kms_key: str = ""
    email_sender: str = ""  # verified SES sender address; empty disables e-mail notifications
    email_configuration_set: str = ""
    # Comma-separated recipient domains a batch may ask to e-mail; "*" allows any. Empty allows none in AWS and
    # any in the local mode (nightbatch/notifications/email.py).
    email_allowed_domains: str = ""
    # Comma-separated addresses e-mailed about every terminal batch (the operator's own; not domain-checked).
    email_recipients: str = ""
    # Download links in e-mails: how long they stay valid (a mailbox is not a vault: a day, then the dashboard
    # issues fresh ones), and the API's public base URL (with or without /v1; empty: e-mails name the file ids).
    email_link_ttl_seconds: int = 86400
    public_base_url: str = ""


class CliSettings(Section):
    """The `nightbatch` CLI's connection (its API key is `api.api_key`)."""

    # The server the CLI talks to (`--base-url`); unset: the running `nightbatch local`, if there is one.
    base_url: str = ""


ENV_PREFIX = "NIGHTBATCH_"



def env_var(name: str) -> str:
    """The environment variable a setting (or a job input) of that name is read from."""
    return ENV_PREFIX + name.upper()

@dataclass(frozen=True)
class SettingField:
    """One setting: its name (its environment variable without the prefix, lower-cased), section and field."""

    name: str
    section: str
    field: str

    @property
    def env(self) -> str:
        return env_var(self.name)

    @property
    def info(self) -> FieldInfo:
        section: type[BaseModel] = Settings.model_fields[self.section].annotation  # type: ignore[assignment]
        return section.model_fields[self.field]

    def get(self, settings: Settings) -> Any:
        return getattr(getattr(settings, self.section), self.field)

    def set(self, settings: Settings, value: Any) -> None:
        """In place (tests change a running stack's settings this way; its services read them per request)."""
        setattr(getattr(settings, self.section), self.field, value)


class Settings(BaseSettings):
    """Runtime configuration of the API, the task functions, the worker, the CLI and the local stack, in sections.

    Every field is read from its own environment variable, NIGHTBATCH_<NAME>: the names users set did not
    change when the settings were grouped (`Env` marks the fields named differently from their variable).
    A shard's per-job inputs are not here: they are `JobInputs`.
    """

    model_config = SettingsConfigDict(extra="forbid")

    deployment: DeploymentSettings = Field(default_factory=DeploymentSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    files: FileSettings = Field(default_factory=FileSettings)
    uploads: UploadSettings = Field(default_factory=UploadSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    accounting: AccountingSettings = Field(default_factory=AccountingSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    links: LinkSettings = Field(default_factory=LinkSettings)
    notifications: NotificationSettings = Field(default_factory=NotificationSettings)
    cli: CliSettings = Field(default_factory=CliSettings)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Arguments win over the environment, merged section by section.
        return init_settings, _Environment(settings_cls)

    @classmethod
    def from_names(cls, values: Mapping[str, Any]) -> Settings:
        """The environment's settings with some given by setting name ({"bucket": …, "worker_engine": …})."""
        nested: dict[str, Any] = nest(values)
        return cls(**nested)

    def updated(self, values: Mapping[str, Any]) -> Settings:
        """A copy with some settings changed, by setting name; validated, without reading the environment again."""
        data = self.model_dump()
        for section, fields in nest(values).items():
            data[section].update(fields)
        return type(self).model_validate(data)


def _fields() -> dict[str, SettingField]:
    found: dict[str, SettingField] = {}
    for section, info in Settings.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, Section), section
        for field, finfo in model.model_fields.items():
            name = next((m.name for m in finfo.metadata if isinstance(m, Env)), field)
            if name in found:
                raise TypeError(f"setting {name!r} is in two sections: {found[name].section} and {section}")
            found[name] = SettingField(name=name, section=section, field=field)
    return found


# Every setting by name, in declaration order: the names environment variables and cdk.json `limits` use.
SETTINGS: dict[str, SettingField] = _fields()


def nest(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{"bucket": …, "worker_engine": …} -> {"deployment": {"bucket": …}, "worker": {"engine": …}}."""
    unknown = sorted(set(values) - set(SETTINGS))
    if unknown:
        raise KeyError(f"{unknown} are not settings (nightbatch/settings.py)")
    nested: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        s = SETTINGS[name]
        nested.setdefault(s.section, {})[s.field] = value
    return nested


def variable_of(loc: tuple[int | str, ...]) -> str:
    """The variable behind an error location: ("worker", "poll_seconds") -> NIGHTBATCH_WORKER_POLL_SECONDS."""
    found = next((s for s in SETTINGS.values() if (s.section, s.field) == tuple(loc[:2])), None)
    return found.env if found else ENV_PREFIX + "*"


class _Environment(PydanticBaseSettingsSource):
    """NIGHTBATCH_<NAME> of every setting, into its section; names are case-insensitive, as pydantic-settings'."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every setting at once

    def __call__(self) -> dict[str, Any]:
        env = {k.upper(): v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
        return nest({s.name: env[s.env] for s in SETTINGS.values() if s.env in env})


class JobInputs(BaseSettings):
    """What one GPU worker job is asked to run: its shard, set per job by AWS Batch.

    The state machine passes them as container overrides (infra/orchestration.py); the job definition's
    environment carries the deployment's settings.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    batch_id: str = ""
    shard_id: str = ""

    @classmethod
    def env_name(cls, field: str) -> str:
        if field not in cls.model_fields:
            raise KeyError(f"{field!r} is not a job input")
        return env_var(field)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
