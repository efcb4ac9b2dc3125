"""What the worker needs from where it runs beyond its settings: SageMaker's settings document and failure file.

A SageMaker training job's Environment cannot hold the deployment's settings (512 characters a value), so its
Environment names an object Plan wrote (nightbatch/settings/document.py); an AWS Batch job definition carries
them itself and names none. SageMaker reports the first line of the failure file as the job's FailureReason,
which Capacity reads to decide the next attempt.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nightbatch.settings import JobInputs, Settings, get_settings
from nightbatch.settings import document as settings_document
from nightbatch.storage import make_adapters

log = logging.getLogger("gpu_worker")
FAILURE_REASON_CHARS = 1024  # SageMaker keeps the start of it


def apply_settings_document(inputs: JobInputs) -> None:
    """Adds the document's settings to the environment (the job's own variables win), before any read them."""
    if not inputs.settings_key:
        return
    bootstrap = Settings()  # the bucket and region come with the job's Environment
    raw = make_adapters(bootstrap).blobs.get_bytes(inputs.settings_key)
    if raw is None:
        raise LookupError(f"the settings document s3://{bootstrap.deployment.bucket}/{inputs.settings_key} "
                          "is missing")
    added = settings_document.apply(raw)
    get_settings.cache_clear()
    log.info("%d settings from s3://%s/%s", len(added), bootstrap.deployment.bucket, inputs.settings_key)


def report_failure(reason: str) -> None:
    """One line where the platform reports it; nothing when the platform reads exit codes alone (AWS Batch)."""
    path = Settings().worker.failure_file
    if not path:
        return
    try:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(" ".join(reason.split())[:FAILURE_REASON_CHARS] + "\n")
    except OSError:
        log.exception("could not write the failure reason to %s", path)
