"""How many shards a batch gets: few enough that each shard's cold start (instance, image, weights, engine) stays a
small share of its GPU time, enough that the batch fits its window on `max_gpus` GPUs.

Plan owns which lines go into which shard; this module owns only the count (and the estimate it rests on), so
the two can change separately. The estimate endpoint shows the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from nightbatch.settings import Settings


@dataclass(frozen=True)
class ShardPlan:
    shards: int
    gpus: int  # GPUs the shards run on at once
    work_seconds: float  # GPU-seconds of inference, cold starts excluded
    gpu_seconds: float  # including one cold start per shard
    cold_start_share: float
    wall_seconds: float  # expected time from the first job's start to the last shard's end
    window_seconds: float | None
    fits_window: bool | None

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def wall_seconds(work: float, shards: int, gpus: int, cold: float) -> float:
    """The wall time of `work` GPU-seconds in `shards` equal shards on `gpus` GPUs, each shard a cold start first:
    Plan's count (below), Capacity's remaining work and the estimate's queue ahead."""
    waves = math.ceil(shards / gpus)
    return waves * (cold + work / shards)


def plan_shards(est_tokens: int, segments: int, settings: Settings, window_seconds: float | None = None) -> ShardPlan:
    """The shard count for `est_tokens` of work held in `segments` whole segments (a shard is >= 1 segment)."""
    segments = max(1, segments)
    cold = max(0.0, settings.pipeline.shard_cold_start_seconds)
    work = est_tokens / max(1e-9, settings.pipeline.shard_tokens_per_second)
    cap = min(segments, max(1, settings.pipeline.max_gpus * settings.pipeline.shards_per_gpu))
    if settings.pipeline.shard_target_tokens > 0:  # a fixed size per shard (tests, benches, operators who want it)
        n = math.ceil(est_tokens / settings.pipeline.shard_target_tokens)
    else:
        # Each shard needs work >= cold * (1 - share) / share for the cold start to be <= share of its GPU time.
        share = min(0.99, max(0.01, settings.pipeline.shard_cold_start_share))
        n = math.floor(work / (cold * (1 - share) / share)) if cold > 0 else cap
    n = max(1, min(cap, n))
    if window_seconds is not None:
        # More shards (up to one per GPU, then the cap) when the amortised count would miss the window.
        budget = window_seconds * (1 - settings.pipeline.window_safety_share)
        while n < cap and wall_seconds(work, n, min(n, settings.pipeline.max_gpus), cold) > budget:
            n += 1
    gpus = min(n, settings.pipeline.max_gpus)
    wall = wall_seconds(work, n, gpus, cold)
    gpu_seconds = work + n * cold
    return ShardPlan(
        shards=n, gpus=gpus, work_seconds=work, gpu_seconds=gpu_seconds,
        cold_start_share=(n * cold / gpu_seconds) if gpu_seconds else 0.0, wall_seconds=wall,
        window_seconds=window_seconds, fits_window=None if window_seconds is None else wall <= window_seconds,
    )
