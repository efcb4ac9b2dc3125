"""Where this worker attempt runs: AWS Batch, a SageMaker Training Job, or the runner of an endpoint shard (no GPU of
its own: gpu_worker/engines/endpoint_engine.py), read from the container's environment.

The state machine may say so (`NIGHTBATCH_BACKEND`, a job input); without it SageMaker is recognised by what it
sets in every training container: `TRAINING_JOB_ARN`/`TRAINING_JOB_NAME` and `/opt/ml/input/config/
resourceconfig.json`, whose `current_instance_type` names the ml.* instance. AWS Batch tells a container nothing
of its instance, so a Batch attempt is priced by the deployment's configured type.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nightbatch.settings import env_var

RESOURCE_CONFIG = Path("/opt/ml/input/config/resourceconfig.json")
SAGEMAKER_MARKERS = ("TRAINING_JOB_ARN", "TRAINING_JOB_NAME", "SM_TRAINING_ENV")


@dataclass(frozen=True)
class Host:
    backend: Literal["batch", "sagemaker", "endpoint"] = "batch"
    instance_type: str = ""  # "ml.g6e.xlarge" on SageMaker; "" when the host does not say
    training_job: str = ""


def detect(environ: Mapping[str, str] | None = None, resource_config: Path = RESOURCE_CONFIG) -> Host:
    env = os.environ if environ is None else environ
    declared = env.get(env_var("backend"), "").strip().lower()
    if declared == "endpoint":
        return Host(backend="endpoint")
    if declared == "batch" or (not declared and not any(env.get(k) for k in SAGEMAKER_MARKERS)):
        return Host()
    job = env.get("TRAINING_JOB_NAME") or env.get("TRAINING_JOB_ARN", "").rsplit("/", 1)[-1]
    return Host(backend="sagemaker", instance_type=_instance_type(env, resource_config), training_job=job)


def _instance_type(env: Mapping[str, str], resource_config: Path) -> str:
    texts = [env.get("SM_TRAINING_ENV") or ""]
    with contextlib.suppress(OSError):  # not a SageMaker host, or an old one without the file
        texts.append(resource_config.read_text())
    for text in texts:
        try:
            found = json.loads(text or "{}").get("current_instance_type")
        except (ValueError, AttributeError):
            continue
        if isinstance(found, str) and found:
            return found
    return env.get("SM_CURRENT_INSTANCE_TYPE", "")
