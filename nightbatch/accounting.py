"""What a batch cost: GPU-seconds from the shards' own records, priced by the configured instance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nightbatch import layout
from nightbatch.settings import Settings
from nightbatch.storage import BlobStore

# USD per instance-hour, us-east-1 (../shared/reference/perf-cost-anchors.md §3; prices drift — override with
# NIGHTBATCH_INSTANCE_PRICE_PER_HOUR). Spot figures are typical, not guaranteed.
PRICES: dict[str, dict[str, float]] = {
    # instance: on-demand list $/h and a mid-range us-east-1 Spot snapshot $/h (§3a).
    "g5.xlarge": {"on-demand": 1.006, "spot": 0.40},
    "g6.xlarge": {"on-demand": 0.8048, "spot": 0.40},
    "g6e.xlarge": {"on-demand": 1.861, "spot": 0.79},
    "g6e.12xlarge": {"on-demand": 10.493, "spot": 4.72},  # 4x g6e.xlarge-class L40S; spot scaled (est)
    "p5.48xlarge": {"on-demand": 55.04, "spot": 28.0},  # post-Jun-2025 ~55 (est); spot 20.99-30.33
    "p5e.48xlarge": {"on-demand": 43.26, "spot": 15.5},  # Capacity Blocks price; spot us-east-2
    "p5en.48xlarge": {"on-demand": 63.296, "spot": 27.2},
    "cpu-local": {"on-demand": 0.0, "spot": 0.0},
}


@dataclass
class ShardTime:
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    # Every attempt's phase timings (nightbatch/phases.py), with its shard id.
    phases: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.model_load_seconds + self.inference_seconds + self.idle_seconds


def price_per_gpu_second(settings: Settings) -> float:
    a = settings.accounting
    hourly = a.instance_price_per_hour or PRICES.get(a.instance_type, {}).get(a.capacity, 0.0)
    return hourly / 3600.0 / max(1, a.gpus_per_instance)


def collect_shard_times(blobs: BlobStore, results_prefixes: list[str]) -> ShardTime:
    """Sums every attempt's record (layout.AttemptRecord), so time lost to Spot interruptions is counted too."""
    t = ShardTime()
    for rec in layout.read_attempts(blobs, results_prefixes):
        t.model_load_seconds += rec.model_load_seconds
        t.inference_seconds += rec.inference_seconds
        t.idle_seconds += rec.idle_seconds
        if rec.phases:
            t.phases.append({"shard_id": rec.shard_id, **rec.phases})
    return t


def cost_summary(settings: Settings, times: ShardTime, total_tokens: int, output_tokens: int) -> dict[str, Any]:
    gpu_seconds = times.total
    cost = gpu_seconds * price_per_gpu_second(settings)
    return {
        "gpu_seconds": round(gpu_seconds, 3),
        "model_load_seconds": round(times.model_load_seconds, 3),
        "load_share": round(times.model_load_seconds / gpu_seconds, 4) if gpu_seconds else 0.0,
        "instance_type": settings.accounting.instance_type,
        "capacity": settings.accounting.capacity,
        "estimated_cost_usd": round(cost, 6),
        "usd_per_1m_tokens": round(cost / total_tokens * 1e6, 6) if total_tokens else None,
        "usd_per_1m_output_tokens": round(cost / output_tokens * 1e6, 6) if output_tokens else None,
        "estimate": True,
    }
