"""What the worker needs from where it runs beyond its settings: SageMaker's settings document, HF token and
failure file.

A SageMaker training job's Environment cannot hold the deployment's settings (512 characters a value), so its
Environment names an object Plan wrote (nightbatch/settings/document.py); an AWS Batch job definition carries
them itself and names none. SageMaker reports the first line of the failure file as the job's FailureReason,
which Capacity reads to decide the next attempt.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpu_worker.model_prep import HF_TOKEN_ENV
from nightbatch.aws import make_adapters
from nightbatch.aws.secrets import secret_string
from nightbatch.settings import JobInputs, Settings
from nightbatch.settings import document as settings_document

log = logging.getLogger("gpu_worker")
FAILURE_REASON_CHARS = 1024  # SageMaker keeps the start of it


def apply_settings_document(inputs: JobInputs, bootstrap: Settings) -> bool:
    """Adds the document's settings to the environment (the job's own variables win); True if there was one, and
    the caller reads its settings again. `bootstrap`: what the job's Environment alone says (bucket, region)."""
    if not inputs.settings_key:
        return False
    raw = make_adapters(bootstrap).blobs.get_bytes(inputs.settings_key)
    if raw is None:
        raise LookupError(f"the settings document s3://{bootstrap.deployment.bucket}/{inputs.settings_key} "
                          "is missing")
    added = settings_document.apply(raw)
    log.info("%d settings from s3://%s/%s", len(added), bootstrap.deployment.bucket, inputs.settings_key)
    return True


def apply_hf_token(settings: Settings) -> None:
    """HF_TOKEN from the secret the job names, unless the platform injected it (AWS Batch does)."""
    if not settings.worker.hf_token_secret or os.environ.get(HF_TOKEN_ENV):
        return
    client = make_adapters(settings).client("secretsmanager")
    os.environ[HF_TOKEN_ENV] = secret_string(client, settings.worker.hf_token_secret)


def report_failure(settings: Settings, reason: str) -> None:
    """One line where the platform reports it; nothing when the platform reads exit codes alone (AWS Batch)."""
    path = settings.worker.failure_file
    if not path:
        return
    try:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(" ".join(reason.split())[:FAILURE_REASON_CHARS] + "\n")
    except OSError:
        log.exception("could not write the failure reason to %s", path)
