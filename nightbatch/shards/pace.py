"""An endpoint shard's pace: how fast its lines finish on the endpoint, and whether the window's slack runs out at that
rate — then the shard's remaining lines move to the model's GPU backend.

The runner measures it and writes it beside the shard's results (layout.pace_key, gpu_worker/pace_watch.py), and
stops its attempt when `must_move` says so; Capacity (nightbatch/pipeline/capacity.py) reads it and moves the shard.
One rule for both: `must_move`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from nightbatch import layout
from nightbatch.aws import BlobStore


class EndpointPace(BaseModel):
    """One reading of an endpoint attempt's pace."""

    version: Literal[1] = 1
    attempt: str = ""
    at: float = 0.0  # epoch seconds of the reading
    lines: int = 0  # the shard's lines
    done: int = 0  # of them with a result, this attempt's and earlier ones'
    lines_per_second: float = 0.0  # this attempt's, over its last `endpoint_pace_window_seconds`
    measured_seconds: float = 0.0  # how long this attempt has been measured
    seconds_left: float = 0.0  # until the batch expires, at `at`
    move: bool = False  # the attempt stopped so that its remaining lines move to the GPU backend
    reason: str = ""

    @property
    def remaining(self) -> int:
        return max(0, self.lines - self.done)


def endpoint_slack(seconds_left: float, remaining: int, lines_per_second: float) -> float:
    """Seconds of the window left once the endpoint has finished `remaining` lines at its measured rate."""
    if remaining <= 0:
        return seconds_left
    if lines_per_second <= 0:
        return -math.inf
    return seconds_left - remaining / lines_per_second


def must_move(pace: EndpointPace, *, margin_seconds: float, measure_seconds: float) -> str | None:
    """Why the shard's remaining lines must move to the GPU backend, or None: once the rate has been measured for
    `measure_seconds`, when the slack at that rate is below the margin (Capacity's `capacity_margin_seconds`, the
    same margin that moves a GPU batch from Spot to on-demand)."""
    if pace.remaining == 0 or pace.measured_seconds < measure_seconds:
        return None
    slack = endpoint_slack(pace.seconds_left, pace.remaining, pace.lines_per_second)
    if slack >= margin_seconds:
        return None
    finish = "never" if math.isinf(slack) else f"{pace.remaining / pace.lines_per_second:.0f} s"
    return (f"endpoint pace {pace.lines_per_second:.3g} lines/s finishes the shard's {pace.remaining} remaining lines "
            f"in {finish}, {pace.seconds_left:.0f} s left in the window (margin {margin_seconds:.0f} s)")


def write_pace(blobs: BlobStore, batch_id: str, shard_id: str, pace: EndpointPace) -> None:
    blobs.put_bytes(layout.pace_key(batch_id, shard_id), pace.model_dump_json().encode(),
                    content_type="application/json")


def read_pace(blobs: BlobStore, batch_id: str, shard_id: str) -> EndpointPace | None:
    raw = blobs.get_bytes(layout.pace_key(batch_id, shard_id))
    return EndpointPace.model_validate_json(raw) if raw else None
