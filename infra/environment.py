"""What each Lambda and the worker are configured with: environments built from setting names
(`nightbatch.settings.SETTINGS`), so they cannot drift, out of the deployment configuration and the references
(ARNs, URLs, names) of the resources the stack built. The stack passes the references; this module decides which
principal gets which setting."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import aws_cdk as cdk
from constructs import Construct

from infra.config import DeployConfig
from nightbatch.settings import SETTINGS
from nightbatch.settings.document import render_value


def env_name(setting: str) -> str:
    return SETTINGS[setting].env  # KeyError naming the setting when there is none


def settings_environment(settings: Mapping[str, Any]) -> dict[str, str]:
    """{"bucket": ref} -> {"NIGHTBATCH_BUCKET": ref}; unknown setting names fail at synth."""
    return {env_name(setting): render_value(value) for setting, value in settings.items()}


def runtime_environment(config: DeployConfig, *, region: str, bucket: str, table: str) -> dict[str, str]:
    """What every Lambda and the worker are configured with."""
    return settings_environment({
        "mode": "aws",
        "region": region,
        "bucket": bucket,
        "table": table,
        "models_json": config.models_json,
        "max_gpus": config.max_gpus,
        # Cost estimates (batch.nightbatch.cost): the preferred type and capacity; the job definition is
        # shared by both compute environments, so a job cannot be told which one placed it.
        "instance_type": config.gpu_instance_types[0],
        "capacity": "spot" if config.capacity.spot else "on-demand",
        "gpus_per_instance": 1,
        **config.user_buckets.settings,  # the allow-list the API checks, as the grants (infra/user_buckets.py)
        **config.limits,
    })


def email_policy(config: DeployConfig) -> dict[str, str]:
    # The API refuses a batch naming an address outside these domains; Notify skips one that slipped through.
    return settings_environment({"email_allowed_domains": ",".join(config.notifications.allowed_domains)})


def channels_environment(config: DeployConfig, *, topic_arn: str, webhook_queue_url: str, secrets_kms_key: str,
                         configuration_set: str | None) -> dict[str, str]:
    """Notify's and the webhook deliverer's: the e-mail policy and the channels they send through."""
    policy = email_policy(config)
    channels: dict[str, Any] = {
        "topic_arn": topic_arn,
        "webhook_queue_url": webhook_queue_url,
        # Webhook signing secrets are sealed with the stack's key (nightbatch/aws/kms.py).
        "secrets_kms_key": secrets_kms_key,
    }
    if configuration_set is not None:
        channels["email_sender"] = config.notifications.sender_email
        channels["email_configuration_set"] = configuration_set
    return {**policy, **settings_environment(channels)}


def event_bus_environment(config: DeployConfig) -> dict[str, str]:
    """The principals that move a batch put its state changes on the bus (nightbatch/notifications/state_changes.py)."""
    bus = config.notifications.event_bus
    return settings_environment({"event_bus": bus}) if bus else {}


def link_environment(link_keys_secret: str) -> dict[str, str]:
    return settings_environment({"link_keys_secret": link_keys_secret})


def task_environments(config: DeployConfig, scope: Construct, *, channels: Mapping[str, str], link_keys_secret: str,
                      job_definitions: Mapping[str, str], job_queues: Mapping[str, str],
                      sagemaker_job_prefix: str, endpoint_runner: Mapping[str, str] | None = None
                      ) -> dict[str, dict[str, str]]:
    """The workflow's task Lambdas' own settings, by task (on top of the runtime environment). `endpoint_runner`: the
    runner's queue and job definition ARNs ({"queue": …, "job_definition": …}), when some model runs on an
    endpoint."""
    bus = event_bus_environment(config)
    to_json = cdk.Stack.of(scope).to_json_string  # the ARNs are tokens until deploy
    return {
        "notify": {**channels, **link_environment(link_keys_secret), **bus},
        "validate": bus,
        "finalize": bus,
        # Plan names each shard's job definition (the model's) in the Map's manifest.
        "plan": settings_environment({"job_definitions_json": to_json(dict(job_definitions)), **_backends(config),
                                      **_sagemaker_capacity(config, sagemaker_job_prefix)}),
        # Capacity picks each submission's queue (Spot, then on-demand), priority and share.
        "capacity": settings_environment({
            "job_queues_json": to_json(dict(job_queues)),
            **capacity_margin(config),
            "shard_retry_attempts": config.shard_retry.max_attempts,
            "shard_retry_interval_seconds": config.shard_retry.interval_seconds,
            "shard_retry_backoff": config.shard_retry.backoff_rate,
            **_sagemaker_capacity(config, sagemaker_job_prefix),
            **({"endpoint_job_queue": endpoint_runner["queue"],
                "endpoint_job_definition": endpoint_runner["job_definition"]} if endpoint_runner else {}),
        }),
    }


def capacity_margin(config: DeployConfig) -> dict[str, Any]:
    """The slack below which a batch moves on-demand, and an endpoint shard to its GPUs: Capacity's, and the endpoint
    runner's, which judges its own pace by it (gpu_worker/pace_watch.py)."""
    return {"capacity_margin_seconds": config.capacity_margin_minutes * 60}


def runner_environment(runtime: Mapping[str, str], config: DeployConfig) -> dict[str, str]:
    """The endpoint runner's job definition: the worker's runtime settings and Capacity's margin."""
    return {**runtime, **settings_environment(capacity_margin(config))}


def sweeper_environment(config: DeployConfig, job_queues: Sequence[str], *, sagemaker_job_prefix: str
                        ) -> dict[str, str]:
    """The event bus; it cancels a stopped batch's queued Batch jobs and stops its training jobs (by prefix)."""
    return {**event_bus_environment(config), **settings_environment({
        "job_queue": cdk.Fn.join(",", list(job_queues)) if job_queues else ""}),
        **settings_environment(_sagemaker_capacity(config, sagemaker_job_prefix))}


def api_environment(config: DeployConfig, *, link_keys_secret: str, upload_queue_url: str, state_machine_arn: str,
                    api_keys_secret: str, secrets_kms_key: str, webhook_queue_url: str) -> dict[str, str]:
    return {
        **link_environment(link_keys_secret),
        **settings_environment({"upload_queue_url": upload_queue_url}),
        **email_policy(config), **event_bus_environment(config), **settings_environment({
            "state_machine_arn": state_machine_arn,
            "api_keys_secret": api_keys_secret,
            "secrets_kms_key": secrets_kms_key,
            # `webhooks.test` queues its sample event for Deliver instead of calling the receiver itself.
            "webhook_queue_url": webhook_queue_url,
        })}


def _backends(config: DeployConfig) -> dict[str, Any]:
    """Plan's backend per model, when some model does not run on AWS Batch alone."""
    if not config.uses_sagemaker:
        return {}
    return {"backends_json": json.dumps({m.spec.name: config.backend_for(m) for m in config.models},
                                        separators=(",", ":"))}


def _sagemaker_capacity(config: DeployConfig, job_prefix: str) -> dict[str, Any]:
    """SageMaker's instance type per model (the model's first type as ml.*), capacity kinds, the deployment's
    training-job name prefix and each model's cap on jobs at once (Plan, Capacity and the sweeper read it)."""
    if not config.uses_sagemaker:
        return {}
    return {"sagemaker_json": json.dumps({
        "instance_types": config.sagemaker_instance_types,
        "spot": config.capacity.spot, "on_demand": config.capacity.on_demand,
        "max_pending_seconds": (config.runnable_timeout_minutes * 60
                                if "MaxPendingTimeInSeconds" in config.sagemaker_fields.enabled else 0),
        "job_prefix": job_prefix,
        "max_jobs": {m.spec.name: m.fleet.sagemaker_max_jobs for m in config.gpu_models
                     if config.backend_for(m) != "batch" and m.fleet.sagemaker_max_jobs},
    }, separators=(",", ":"))}
