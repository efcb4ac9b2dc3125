"""CloudWatch metrics as Embedded Metric Format lines on stdout (Lambda and Batch ship stdout to Logs).

Names and dimensions are what infra/observability.py's dashboard and alarms read: namespace `nightbatch`,
exactly the dimension given (an extra dimension would make a different metric the alarms never see).

Powertools' Metrics is not used: the GPU worker (AWS Batch, no Powertools in its image) writes these records
too and one writer keeps both identical; and Powertools' records differ (each value a list, a `service`
dimension added whenever POWERTOOLS_SERVICE_NAME is set, one flush per invocation through `log_metrics`)
while adding nothing the dashboard or the alarms read.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TextIO

from nightbatch.settings import Settings

NAMESPACE = "nightbatch"


def emf_line(values: dict[str, float], *, units: dict[str, str] | None = None,
             dimensions: dict[str, str] | None = None, timestamp_ms: int | None = None) -> str:
    dims = dimensions or {}
    record: dict[str, object] = {
        "_aws": {
            "Timestamp": timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [sorted(dims)],
                "Metrics": [{"Name": k, "Unit": (units or {}).get(k, "Count")} for k in values],
            }],
        },
        **dims,
        **values,
    }
    return json.dumps(record, separators=(",", ":"))


def emit(settings: Settings, values: dict[str, float], *, units: dict[str, str] | None = None,
         dimensions: dict[str, str] | None = None, out: TextIO | None = None) -> None:
    """Writes one EMF record in AWS; locally there is no CloudWatch to feed, so nothing is written."""
    if settings.deployment.mode != "aws" or not values:
        return
    print(emf_line(values, units=units, dimensions=dimensions), file=out or sys.stdout, flush=True)
