"""The deployment's settings as one JSON document, for a worker whose environment cannot hold them.

A SageMaker training job's Environment takes values of at most 512 characters (models_json alone outgrows
that). Plan writes the settings it was configured with, the same ones the Batch job definition carries, as
{"NIGHTBATCH_<NAME>": "value"} to the batch's prefix (layout.worker_settings_key); the job's Environment names
the object, and the worker applies it before it reads its settings. The job's own variables win.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from nightbatch.settings import SETTINGS, Settings


def render_value(value: Any) -> str:
    """A setting's value as its environment variable holds it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def settings_document(settings: Settings) -> dict[str, str]:
    """Every setting the environment gave this process, as the variables that give it to another."""
    out: dict[str, str] = {}
    for field in SETTINGS.values():
        section = getattr(settings, field.section)
        if field.field in section.model_fields_set:
            out[field.env] = render_value(field.get(settings))
    return out


def dump(settings: Settings) -> bytes:
    return json.dumps(settings_document(settings), sort_keys=True).encode()


def apply(raw: bytes, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Sets the document's variables the environment lacks; returns their names."""
    environ = os.environ if environ is None else environ
    doc: Mapping[str, Any] = json.loads(raw)
    known = {f.env for f in SETTINGS.values()}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ValueError(f"the settings document names variables that are not settings: {unknown}")
    added = [name for name in doc if name not in environ]
    for name in added:
        environ[name] = str(doc[name])
    return added
