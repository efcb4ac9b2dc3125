"""Grouping the settings in sections changed no environment variable: each field of each section is set by the
variable that set it before (the table below is the flat model's names, frozen), and the per-job inputs of a
shard are read apart from the deployment's settings."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel

from nightbatch.settings import SETTINGS, JobInputs, Settings

# Every variable of the flat Settings (before the sections) -> the section field it sets now. A new setting
# adds a line and a removed one takes its line away; a line never changes (deployments set these variables).
ENV_NAMES: dict[str, str] = {
    "NIGHTBATCH_MODE": "deployment.mode",
    "NIGHTBATCH_REGION": "deployment.region",
    "NIGHTBATCH_BUCKET": "deployment.bucket",
    "NIGHTBATCH_TABLE": "deployment.table",
    "NIGHTBATCH_MODELS_JSON": "serving.models_json",
    "NIGHTBATCH_DEFAULT_MAX_TOKENS": "serving.default_max_tokens",
    "NIGHTBATCH_API_KEYS": "api.api_keys",
    "NIGHTBATCH_API_KEY": "api.api_key",
    "NIGHTBATCH_API_KEYS_SECRET": "api.api_keys_secret",
    "NIGHTBATCH_KEY_CACHE_SECONDS": "api.key_cache_seconds",
    "NIGHTBATCH_IDEMPOTENCY_TTL_SECONDS": "api.idempotency_ttl_seconds",
    "NIGHTBATCH_IDEMPOTENCY_LOCK_SECONDS": "api.idempotency_lock_seconds",
    "NIGHTBATCH_MAX_UPLOAD_BYTES": "files.max_upload_bytes",
    "NIGHTBATCH_INPUT_FILE_TTL_SECONDS": "files.input_file_ttl_seconds",
    "NIGHTBATCH_OUTPUT_FILE_TTL_SECONDS": "files.output_file_ttl_seconds",
    "NIGHTBATCH_MAX_INLINE_DOWNLOAD_BYTES": "files.max_inline_download_bytes",
    "NIGHTBATCH_PRESIGNED_URL_SECONDS": "files.presigned_url_seconds",
    "NIGHTBATCH_SEED_COMPAT_FILE_GET": "files.seed_compat_file_get",
    "NIGHTBATCH_USER_INPUT_BUCKETS": "files.user_input_buckets",
    "NIGHTBATCH_USER_OUTPUT_PREFIXES": "files.user_output_prefixes",
    "NIGHTBATCH_MAX_USER_INPUT_OBJECTS": "files.max_user_input_objects",
    "NIGHTBATCH_MAX_UPLOAD_PART_BYTES": "uploads.max_part_bytes",
    "NIGHTBATCH_MAX_UPLOAD_TOTAL_BYTES": "uploads.max_total_bytes",
    "NIGHTBATCH_MAX_UPLOAD_PARTS": "uploads.max_parts",
    "NIGHTBATCH_UPLOAD_QUEUE_URL": "uploads.queue_url",
    "NIGHTBATCH_UPLOAD_PARTS_GRACE_SECONDS": "uploads.parts_grace_seconds",
    "NIGHTBATCH_UPLOAD_COMPOSE_DELAY_SECONDS": "uploads.compose_delay_seconds",
    "NIGHTBATCH_MAX_REQUESTS_PER_BATCH": "validation.max_requests_per_batch",
    "NIGHTBATCH_MAX_INPUT_BYTES": "validation.max_input_bytes",
    "NIGHTBATCH_MAX_LINE_BYTES": "validation.max_line_bytes",
    "NIGHTBATCH_MAX_EMBEDDING_INPUTS": "validation.max_embedding_inputs",
    "NIGHTBATCH_MAX_EMBEDDING_INPUTS_PER_REQUEST": "validation.max_embedding_inputs_per_request",
    "NIGHTBATCH_MAX_CHOICES_PER_REQUEST": "validation.max_choices_per_request",
    "NIGHTBATCH_MAX_SCORE_DOCUMENTS_PER_REQUEST": "validation.max_score_documents_per_request",
    "NIGHTBATCH_MEDIA_ALLOWED_DOMAINS": "validation.media_allowed_domains",
    "NIGHTBATCH_MAX_IMAGE_BYTES": "validation.max_image_bytes",
    "NIGHTBATCH_MAX_IMAGES_PER_REQUEST": "validation.max_images_per_request",
    "NIGHTBATCH_MAX_IMAGE_BYTES_PER_REQUEST": "validation.max_image_bytes_per_request",
    "NIGHTBATCH_MAX_REPORTED_ERRORS": "validation.max_reported_errors",
    "NIGHTBATCH_MULTI_MODEL_BATCHES": "validation.multi_model_batches",
    "NIGHTBATCH_MAX_COMPLETION_WINDOW_HOURS": "validation.max_completion_window_hours",
    "NIGHTBATCH_HOUR_SECONDS": "validation.hour_seconds",
    "NIGHTBATCH_LIMIT_QUEUED_REQUESTS": "limits.queued_requests",
    "NIGHTBATCH_LIMIT_QUEUED_TOKENS": "limits.queued_tokens",
    "NIGHTBATCH_LIMIT_BATCHES_IN_FLIGHT": "limits.batches_in_flight",
    "NIGHTBATCH_LIMIT_REQUESTS_PER_MINUTE": "limits.requests_per_minute",
    "NIGHTBATCH_LIMIT_STORED_BYTES": "limits.stored_bytes",
    "NIGHTBATCH_LIMIT_IN_FLIGHT_RETRY_AFTER": "limits.in_flight_retry_after",
    "NIGHTBATCH_TENANT_LIMITS_JSON": "limits.tenant_limits_json",
    "NIGHTBATCH_STATE_MACHINE_ARN": "pipeline.state_machine_arn",
    "NIGHTBATCH_SEGMENT_MAX_LINES": "pipeline.segment_max_lines",
    "NIGHTBATCH_SEGMENT_MAX_BYTES": "pipeline.segment_max_bytes",
    "NIGHTBATCH_SHARD_TARGET_TOKENS": "pipeline.shard_target_tokens",
    "NIGHTBATCH_SHARDS_PER_GPU": "pipeline.shards_per_gpu",
    "NIGHTBATCH_PLAN_PREFIX_GROUPS": "pipeline.plan_prefix_groups",
    "NIGHTBATCH_PLAN_PREFIX_CHARS": "pipeline.plan_prefix_chars",
    "NIGHTBATCH_MAX_GPUS": "pipeline.max_gpus",
    "NIGHTBATCH_SHARD_TOKENS_PER_SECOND": "pipeline.shard_tokens_per_second",
    "NIGHTBATCH_SHARD_COLD_START_SECONDS": "pipeline.shard_cold_start_seconds",
    "NIGHTBATCH_SHARD_COLD_START_SHARE": "pipeline.shard_cold_start_share",
    "NIGHTBATCH_WINDOW_SAFETY_SHARE": "pipeline.window_safety_share",
    "NIGHTBATCH_JOB_DEFINITIONS_JSON": "pipeline.job_definitions_json",
    "NIGHTBATCH_BACKENDS_JSON": "pipeline.backends_json",
    "NIGHTBATCH_JOB_QUEUE": "pipeline.job_queue",
    "NIGHTBATCH_JOB_QUEUES_JSON": "capacity.job_queues_json",
    "NIGHTBATCH_CAPACITY_MARGIN_SECONDS": "capacity.margin_seconds",
    "NIGHTBATCH_SHARD_RETRY_ATTEMPTS": "capacity.retry_attempts",
    "NIGHTBATCH_SHARD_RETRY_INTERVAL_SECONDS": "capacity.retry_interval_seconds",
    "NIGHTBATCH_SHARD_RETRY_BACKOFF": "capacity.retry_backoff",
    "NIGHTBATCH_SAGEMAKER_JSON": "capacity.sagemaker_json",
    "NIGHTBATCH_INSTANCE_TYPE": "accounting.instance_type",
    "NIGHTBATCH_CAPACITY": "accounting.capacity",
    "NIGHTBATCH_INSTANCE_PRICE_PER_HOUR": "accounting.instance_price_per_hour",
    "NIGHTBATCH_GPUS_PER_INSTANCE": "accounting.gpus_per_instance",
    "NIGHTBATCH_SAGEMAKER_PRICES_JSON": "accounting.sagemaker_prices_json",
    "NIGHTBATCH_SAGEMAKER_SPOT_SAVINGS": "accounting.sagemaker_spot_savings",
    "NIGHTBATCH_WORKER_ENGINE": "worker.engine",
    "NIGHTBATCH_WORKER_POLL_SECONDS": "worker.poll_seconds",
    "NIGHTBATCH_WORKER_DRAIN_SECONDS": "worker.drain_seconds",
    "NIGHTBATCH_CHECKPOINT_EVERY_LINES": "worker.checkpoint_every_lines",
    "NIGHTBATCH_CHECKPOINT_EVERY_SECONDS": "worker.checkpoint_every_seconds",
    "NIGHTBATCH_CHECKPOINT_BYTES": "worker.checkpoint_bytes",
    "NIGHTBATCH_CHECKPOINT_MAX_SECONDS": "worker.checkpoint_max_seconds",
    "NIGHTBATCH_MAX_IN_FLIGHT": "worker.max_in_flight",
    "NIGHTBATCH_WORKER_IMAGE_BYTES_IN_FLIGHT": "worker.image_bytes_in_flight",
    "NIGHTBATCH_WORKER_IMAGE_FETCH_ATTEMPTS": "worker.image_fetch_attempts",
    "NIGHTBATCH_WORKER_IMAGE_FETCH_BACKOFF_SECONDS": "worker.image_fetch_backoff_seconds",
    "NIGHTBATCH_WORKER_ORDER_WINDOW_LINES": "worker.order_window_lines",
    "NIGHTBATCH_WORKER_ORDER_WINDOW_CHARS": "worker.order_window_chars",
    "NIGHTBATCH_WORKER_GROUP_PREFIXES": "worker.group_prefixes",
    "NIGHTBATCH_WORKER_PREFIX_CHARS": "worker.prefix_chars",
    "NIGHTBATCH_WORKER_LENGTH_ORDER": "worker.length_order",
    "NIGHTBATCH_WORKER_IN_FLIGHT_PER_SLOT": "worker.in_flight_per_slot",
    "NIGHTBATCH_WORKER_FAILURE_FILE": "worker.failure_file",
    "NIGHTBATCH_WORKER_HF_TOKEN_SECRET": "worker.hf_token_secret",
    "NIGHTBATCH_LINK_SECRET": "links.secret",
    "NIGHTBATCH_LINK_KEYS_SECRET": "links.keys_secret",
    "NIGHTBATCH_LINK_TTL_SECONDS": "links.ttl_seconds",
    "NIGHTBATCH_TOPIC_ARN": "notifications.topic_arn",
    "NIGHTBATCH_EVENT_BUS": "notifications.event_bus",
    "NIGHTBATCH_NOTIFY_FUNCTION": "notifications.notify_function",
    "NIGHTBATCH_WEBHOOK_QUEUE_URL": "notifications.webhook_queue_url",
    "NIGHTBATCH_WEBHOOK_RETRY_BASE_SECONDS": "notifications.webhook_retry_base_seconds",
    "NIGHTBATCH_WEBHOOK_RETRY_MAX_DELAY_SECONDS": "notifications.webhook_retry_max_delay_seconds",
    "NIGHTBATCH_WEBHOOK_MAX_AGE_SECONDS": "notifications.webhook_max_age_seconds",
    "NIGHTBATCH_WEBHOOK_TIMEOUT_SECONDS": "notifications.webhook_timeout_seconds",
    "NIGHTBATCH_ALLOW_PRIVATE_TARGETS": "notifications.allow_private_targets",
    "NIGHTBATCH_MAX_WEBHOOK_ENDPOINTS": "notifications.max_webhook_endpoints",
    "NIGHTBATCH_SECRETS_KMS_KEY": "notifications.secrets_kms_key",
    "NIGHTBATCH_EMAIL_SENDER": "notifications.email_sender",
    "NIGHTBATCH_EMAIL_CONFIGURATION_SET": "notifications.email_configuration_set",
    "NIGHTBATCH_EMAIL_ALLOWED_DOMAINS": "notifications.email_allowed_domains",
    "NIGHTBATCH_EMAIL_RECIPIENTS": "notifications.email_recipients",
    "NIGHTBATCH_EMAIL_LINK_TTL_SECONDS": "notifications.email_link_ttl_seconds",
    "NIGHTBATCH_PUBLIC_BASE_URL": "notifications.public_base_url",
    "NIGHTBATCH_BASE_URL": "cli.base_url",
    "NIGHTBATCH_ENDPOINT_JOB_QUEUE": "capacity.endpoint_job_queue",
    "NIGHTBATCH_ENDPOINT_JOB_DEFINITION": "capacity.endpoint_job_definition",
    "NIGHTBATCH_ENDPOINT_MEASURE_SECONDS": "capacity.endpoint_measure_seconds",
    "NIGHTBATCH_ENDPOINT_PACE_WINDOW_SECONDS": "capacity.endpoint_pace_window_seconds",
    "NIGHTBATCH_ENDPOINT_RUNNER_PRICE_PER_HOUR": "accounting.endpoint_runner_price_per_hour",
    "NIGHTBATCH_ENDPOINT_MIN_CONCURRENCY": "admission.floor",
    "NIGHTBATCH_ENDPOINT_MAX_CONCURRENCY": "admission.ceiling",
    "NIGHTBATCH_ENDPOINT_INITIAL_CONCURRENCY": "admission.initial",
    "NIGHTBATCH_ENDPOINT_BACKOFF_FACTOR": "admission.decrease",
    "NIGHTBATCH_ENDPOINT_ADDITIVE_INCREASE": "admission.increase",
    "NIGHTBATCH_ENDPOINT_MAX_WAITING": "admission.max_waiting",
    "NIGHTBATCH_ENDPOINT_MAX_KV_CACHE": "admission.max_kv_cache",
    "NIGHTBATCH_ENDPOINT_METRICS_SECONDS": "admission.metrics_seconds",
    "NIGHTBATCH_ENDPOINT_TIMEOUT_SECONDS": "admission.timeout_seconds",
    "NIGHTBATCH_ENDPOINT_RETRY_SECONDS": "admission.retry_seconds",
    "NIGHTBATCH_ENDPOINT_RETRY_MAX_SECONDS": "admission.retry_max_seconds",
    "NIGHTBATCH_ENDPOINT_RETRY_AFTER_MAX_SECONDS": "admission.retry_after_max_seconds",
    "NIGHTBATCH_ENDPOINT_SERVER_ERROR_RETRIES": "admission.server_error_retries",
}
JOB_ENV_NAMES = {"NIGHTBATCH_BATCH_ID": "batch_id", "NIGHTBATCH_SHARD_ID": "shard_id",
                 "NIGHTBATCH_SETTINGS_KEY": "settings_key", "NIGHTBATCH_BACKEND": "backend"}


def _model_fields() -> list[str]:
    found = []
    for section, info in Settings.model_fields.items():
        model: type[BaseModel] = info.annotation  # type: ignore[assignment]
        found += [f"{section}.{field}" for field in model.model_fields]
    return found


def _other_value(annotation: Any, default: Any) -> tuple[str, Any]:
    """An environment value for a field and what it parses to, different from the default."""
    options = typing.get_args(annotation)
    if options and all(isinstance(o, str) for o in options):  # a Literal
        choice = next(o for o in options if o != default)
        return choice, choice
    if annotation is bool:
        return ("false", False) if default else ("true", True)
    if annotation is int:
        return str(default + 7), default + 7
    if annotation is float:
        return str(default + 1.5), default + 1.5
    assert annotation is str, annotation
    return "set-from-env", "set-from-env"


def test_every_field_has_its_old_variable_and_every_old_variable_a_field() -> None:
    assert sorted(ENV_NAMES.values()) == sorted(_model_fields())
    assert {s.env: f"{s.section}.{s.field}" for s in SETTINGS.values()} == ENV_NAMES


@pytest.mark.parametrize("path", _model_fields())
def test_each_field_is_set_by_its_old_variable(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    section, field = path.split(".")
    (env,) = [name for name, p in ENV_NAMES.items() if p == path]
    model: type[BaseModel] = Settings.model_fields[section].annotation  # type: ignore[assignment]
    info = model.model_fields[field]
    # A JSON setting's variable must hold JSON (tests/settings/test_json_settings.py).
    json_value = "[]" if field == "models_json" else "{}"
    raw, parsed = (json_value, json_value) if field.endswith("_json") else _other_value(info.annotation, info.default)
    monkeypatch.setenv(env, raw)
    assert getattr(getattr(Settings(), section), field) == parsed
    monkeypatch.delenv(env)
    monkeypatch.setenv(env.lower(), raw)  # as before the sections, names are case-insensitive
    assert getattr(getattr(Settings(), section), field) == parsed


def test_arguments_win_over_the_environment_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTBATCH_WORKER_POLL_SECONDS", "9")
    monkeypatch.setenv("NIGHTBATCH_MAX_IN_FLIGHT", "3")
    settings = Settings(worker={"max_in_flight": 5})
    assert (settings.worker.poll_seconds, settings.worker.max_in_flight) == (9.0, 5)
    assert Settings.from_names({"max_in_flight": 6}).worker.max_in_flight == 6
    assert settings.updated({"worker_poll_seconds": 1}).worker.poll_seconds == 1.0
    assert settings.worker.poll_seconds == 9.0  # updated() copies


def test_unknown_names_and_section_fields_are_refused() -> None:
    with pytest.raises(KeyError, match="worker_poll_secs"):
        Settings.from_names({"worker_poll_secs": 1})
    with pytest.raises(ValueError, match="poll_secs"):
        Settings(worker={"poll_secs": 1})
    with pytest.raises(ValueError, match="bucket"):
        Settings(bucket="flat")  # type: ignore[call-arg]  # the flat model's arguments are gone


def test_the_job_inputs_are_their_own_model(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, field in JOB_ENV_NAMES.items():
        monkeypatch.setenv(env, f"value-of-{field}")
        assert JobInputs.env_name(field) == env
    inputs = JobInputs()
    assert (inputs.batch_id, inputs.shard_id) == ("value-of-batch_id", "value-of-shard_id")
    assert set(JobInputs.model_fields) == set(JOB_ENV_NAMES.values())
    assert not {s.name for s in SETTINGS.values()} & set(JOB_ENV_NAMES.values())


def test_an_invalid_variable_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from nightbatch.cli.connection import CommandError, resolve_target

    monkeypatch.setenv("NIGHTBATCH_WORKER_POLL_SECONDS", "soon")
    with pytest.raises(CommandError, match="NIGHTBATCH_WORKER_POLL_SECONDS in the environment is invalid"):
        resolve_target("http://127.0.0.1:1", "k")
