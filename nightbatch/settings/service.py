"""The sections the API reads: where the deployment lives, the served models, keys, files, uploads, the CLI."""

from __future__ import annotations

from typing import Annotated, Literal

from nightbatch.models.spec import LOCAL_MODELS, ModelSpec
from nightbatch.settings.base import Env, JsonSetting, Section, comma_list

# NIGHTBATCH_MODELS_JSON: a JSON list of model settings (infra/config.py writes it from cdk.json `models`).
MODELS: JsonSetting[tuple[ModelSpec, ...]] = JsonSetting("models_json", tuple[ModelSpec, ...], empty="[]")


class DeploymentSettings(Section):
    """Where the deployment lives; read by everything that touches AWS."""

    mode: Literal["aws", "local"] = "aws"
    region: str = "us-east-1"
    bucket: str = "nightbatch-data"
    table: str = "nightbatch"

class ServingSettings(Section):
    """The served models (Validate, Plan, the worker, /v1/models)."""

    models_json: Annotated[str, MODELS.validator] = ""
    default_max_tokens: int = 256

    @property
    def models(self) -> list[ModelSpec]:
        """The served models, parsed once per value of models_json; unset: the local defaults."""
        return list(MODELS.parse(self.models_json)) if self.models_json.strip() else list(LOCAL_MODELS)

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
        keys = set(comma_list(self.api_keys))
        if self.api_key:
            keys.add(self.api_key)
        return keys

class FileSettings(Section):
    """Files: upload size, lifetimes, downloads (docs/ARCHITECTURE.md "Payload limits")."""

    # ~4 MiB through API Gateway + Lambda, OpenAI's 512 MB locally.
    max_upload_bytes: int = 4 * 1024 * 1024
    input_file_ttl_seconds: int = 30 * 86400
    output_file_ttl_seconds: int = 30 * 86400
    # Larger downloads answer 307 to a pre-signed S3 URL (a Lambda response carries ~4 MiB raw); 0 = no limit.
    max_inline_download_bytes: int = 4 * 1024 * 1024
    presigned_url_seconds: int = 300
    # docs/ARCHITECTURE.md, decision 7: GET /v1/files/{id} on a batch_output file returns JSONL unless Accept asks for
    # JSON.
    seed_compat_file_get: bool = True
    # The users' own buckets (docs/USER_BUCKETS.md), set by the stack from cdk.json `userBuckets` so that they
    # match its IAM grants: comma-separated bucket names a batch may read its input from in place
    # (`nightbatch.input_uri`), and comma-separated s3://bucket/prefix/ a batch may have its output copied under
    # (`nightbatch.output_uri`).
    user_input_buckets: str = ""
    user_output_prefixes: str = ""
    # Objects one `input_uri` prefix may hold (their list is kept in the file's item: DynamoDB's 400 KB).
    max_user_input_objects: int = 1000

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

class CliSettings(Section):
    """The `nightbatch` CLI's connection (its API key is `api.api_key`)."""

    # The server the CLI talks to (`--base-url`); unset: the running `nightbatch local`, if there is one.
    base_url: str = ""
