"""What a batch cost: GPU-seconds from the shards' own records, priced by the configured instance.

Attempts that ran on SageMaker (accounting.py: AttemptRecord.backend) are priced at ml.* training prices, which run
15-70 % above EC2's (docs/DEPLOY.md "GPU backend: AWS Batch, SageMaker Training Jobs, or both"); managed Spot
bills only a training job's `BillableTimeInSeconds`, so where Finalize could read a job's billable and training times
the saving is exact.

Attempts on a model's endpoint ran on GPUs nobody started for the batch: they are reported (`cost.endpoint`: lines,
tokens, wall time on the endpoint) and priced at their runner's price only (a Fargate task's, `endpoint_runner_price_
per_hour`); a fallback to the GPU backend is priced as any GPU attempt. `cost.lines_by_backend` says which backend
ran how many of the batch's lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nightbatch.aws import Adapters, BlobStore
from nightbatch.batches.accounting import read_attempts
from nightbatch.settings import Settings

# USD per instance-hour, us-east-1: AWS's on-demand list prices, and Spot from SkyPilot's AWS catalog (prices drift —
# override with NIGHTBATCH_INSTANCE_PRICE_PER_HOUR). Spot figures are typical, not guaranteed.
PRICES: dict[str, dict[str, float]] = {
    # instance: on-demand list $/h and a mid-range us-east-1 Spot snapshot $/h.
    "g5.xlarge": {"on-demand": 1.006, "spot": 0.40},
    "g6.xlarge": {"on-demand": 0.8048, "spot": 0.40},
    "g6e.xlarge": {"on-demand": 1.861, "spot": 0.79},
    "g6e.12xlarge": {"on-demand": 10.493, "spot": 4.72},  # 4x g6e.xlarge-class L40S; spot scaled (est)
    "p5.48xlarge": {"on-demand": 55.04, "spot": 28.0},  # post-Jun-2025 ~55 (est); spot 20.99-30.33
    "p5e.48xlarge": {"on-demand": 43.26, "spot": 15.5},  # Capacity Blocks price; spot us-east-2
    "p5en.48xlarge": {"on-demand": 63.296, "spot": 27.2},
    "cpu-local": {"on-demand": 0.0, "spot": 0.0},
}

# USD per instance-hour of a SageMaker training instance, on-demand, us-east-1 (a type absent here is priced 0 and
# reported unpriced: set NIGHTBATCH_SAGEMAKER_PRICES_JSON). No AWS price page was readable offline; the figures
# are from two third-party cost models that say they were taken from the AWS Pricing API in 2026, and the g4dn ones
# from a public SageMaker price list (us-east-2). Check with `aws pricing get-products --service-code AmazonSageMaker`
# before quoting them.
ML_PRICES: dict[str, float] = {
    "ml.g4dn.2xlarge": 0.94,
    "ml.g4dn.12xlarge": 4.89,
    "ml.g5.xlarge": 1.408,  # EC2 1.006: +40 %
    "ml.g6e.xlarge": 1.861,  # one source says 2.61, probably the hosting rate
    "ml.p4d.24xlarge": 37.688,
    "ml.p5.48xlarge": 113.14,
}


@dataclass
class EndpointTime:
    """What a batch's attempts on a model's endpoint did: their results, tokens and wall time."""

    lines: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    wall_seconds: float = 0.0
    attempts: int = 0


@dataclass
class ShardTime:
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    # Every attempt's phase timings (nightbatch/phases.py), with its shard id.
    phases: list[dict[str, Any]] = field(default_factory=list)
    # The attempts that ran on SageMaker: (ml.* instance type or "", training job name or "", seconds).
    sagemaker: list[tuple[str, str, float]] = field(default_factory=list)
    # The attempts on a model's endpoint (not in the GPU seconds above), and the results each backend made.
    endpoint: EndpointTime = field(default_factory=EndpointTime)
    lines_by_backend: dict[str, int] = field(default_factory=dict)

    def add(self, other: ShardTime, share: float = 1.0) -> None:
        """`other`'s times (a share of them: a model's part of a shard serving several) added to these."""
        self.model_load_seconds += other.model_load_seconds * share
        self.inference_seconds += other.inference_seconds * share
        self.idle_seconds += other.idle_seconds * share
        # SageMaker attempts are priced at ml.* rates (sagemaker_cost), so they keep their job.
        self.sagemaker += [(kind, job, seconds * share) for kind, job, seconds in other.sagemaker]
        e, o = self.endpoint, other.endpoint
        e.lines += round(o.lines * share)
        e.input_tokens += round(o.input_tokens * share)
        e.output_tokens += round(o.output_tokens * share)
        e.wall_seconds += o.wall_seconds * share
        e.attempts += o.attempts
        for backend, lines in other.lines_by_backend.items():
            self.lines_by_backend[backend] = self.lines_by_backend.get(backend, 0) + round(lines * share)

    @property
    def training_jobs(self) -> list[str]:
        return sorted({job for _, job, _ in self.sagemaker if job})

    @property
    def total(self) -> float:
        return self.model_load_seconds + self.inference_seconds + self.idle_seconds


def price_per_gpu_second(settings: Settings) -> float:
    a = settings.accounting
    hourly = a.instance_price_per_hour or PRICES.get(a.instance_type, {}).get(a.capacity, 0.0)
    return hourly / 3600.0 / max(1, a.gpus_per_instance)


def collect_shard_times(blobs: BlobStore, results_prefixes: list[str], listed: Iterable[str] | None = None
                        ) -> ShardTime:
    """Sums every attempt's record (accounting.py: AttemptRecord), so time lost to Spot interruptions is counted too.
    `listed`: the keys under the prefixes, if listed already (else listed here)."""
    t = ShardTime()
    for rec in read_attempts(blobs, results_prefixes, listed):
        if rec.lines:
            t.lines_by_backend[rec.backend] = t.lines_by_backend.get(rec.backend, 0) + rec.lines
        if rec.backend == "endpoint":  # no GPU of the batch's: reported apart, priced as its runner
            e = t.endpoint
            e.lines, e.attempts = e.lines + rec.lines, e.attempts + 1
            e.input_tokens, e.output_tokens = e.input_tokens + rec.input_tokens, e.output_tokens + rec.output_tokens
            e.wall_seconds += rec.model_load_seconds + rec.inference_seconds + rec.idle_seconds
            if rec.phases:
                t.phases.append({"shard_id": rec.shard_id, **rec.phases})
            continue
        t.model_load_seconds += rec.model_load_seconds
        t.inference_seconds += rec.inference_seconds
        t.idle_seconds += rec.idle_seconds
        if rec.phases:
            t.phases.append({"shard_id": rec.shard_id, **rec.phases})
        if rec.backend == "sagemaker":
            t.sagemaker.append((rec.instance_type, rec.training_job,
                                rec.model_load_seconds + rec.inference_seconds + rec.idle_seconds))
    return t


def training_job_billing(adapters: Adapters, times: ShardTime) -> dict[str, tuple[float, float]]:
    """The billable and training seconds of the batch's SageMaker jobs (none read when none ran)."""
    jobs = times.training_jobs
    if not jobs:
        return {}
    # Here, not at the top: the API imports this module for its price table, and its cold import has no botocore.
    from nightbatch.aws.sagemaker_reads import billing

    return billing(adapters.client("sagemaker"), jobs)


def ml_price_per_hour(settings: Settings, instance_type: str) -> float | None:
    """The configured or built-in on-demand price of an ml.* type; None when neither knows it."""
    price = settings.accounting.sagemaker_prices.get(instance_type, ML_PRICES.get(instance_type))
    return float(price) if price is not None else None


def sagemaker_cost(settings: Settings, times: ShardTime,
                   billing: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any] | None:
    """The SageMaker attempts' share: seconds * ml.* price * (1 - Spot saving). `billing` maps a training job to
    its (TrainingTimeInSeconds, BillableTimeInSeconds); a job not in it saves `sagemaker_spot_savings`."""
    if not times.sagemaker:
        return None
    a = settings.accounting
    default_type = f"ml.{a.instance_type}"
    cost = seconds = saved_seconds = 0.0
    types: set[str] = set()
    unpriced: set[str] = set()
    measured = 0
    for instance_type, job, secs in times.sagemaker:
        instance_type = instance_type or default_type
        types.add(instance_type)
        hourly = ml_price_per_hour(settings, instance_type)
        if hourly is None:
            unpriced.add(instance_type)
            hourly = 0.0
        training, billable = (billing or {}).get(job, (0.0, 0.0))
        if training > 0:
            saving = min(1.0, max(0.0, 1.0 - billable / training))
            measured += 1
        else:
            saving = min(1.0, max(0.0, a.sagemaker_spot_savings))
        seconds += secs
        saved_seconds += secs * saving
        cost += secs * (1.0 - saving) * hourly / 3600.0 / max(1, a.gpus_per_instance)
    return {
        "gpu_seconds": round(seconds, 3),
        "instance_types": sorted(types),
        "estimated_cost_usd": round(cost, 6),
        # The share of the seconds managed Spot did not bill: measured from the jobs' billable time, else set.
        "spot_savings": round(saved_seconds / seconds, 4) if seconds else 0.0,
        "spot_savings_measured_jobs": measured,
        "unpriced_instance_types": sorted(unpriced),
    }


def endpoint_cost(settings: Settings, times: ShardTime) -> dict[str, Any] | None:
    """The endpoint attempts' share: their lines, tokens and wall time there, priced at the runner's price only."""
    e = times.endpoint
    if not e.attempts:
        return None
    return {"lines": e.lines, "input_tokens": e.input_tokens, "output_tokens": e.output_tokens,
            "wall_seconds": round(e.wall_seconds, 3), "attempts": e.attempts,
            "runner_cost_usd": round(e.wall_seconds * settings.accounting.endpoint_runner_price_per_hour / 3600, 6)}


def cost_summary(settings: Settings, times: ShardTime, total_tokens: int, output_tokens: int,
                 billing: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    gpu_seconds = times.total
    sagemaker = sagemaker_cost(settings, times, billing)
    endpoint = endpoint_cost(settings, times)
    batch_seconds = gpu_seconds - (sagemaker["gpu_seconds"] if sagemaker else 0.0)
    cost = (batch_seconds * price_per_gpu_second(settings) + (sagemaker["estimated_cost_usd"] if sagemaker else 0.0)
            + (endpoint["runner_cost_usd"] if endpoint else 0.0))
    summary = {
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
    if sagemaker:  # the attempts that ran as SageMaker Training Jobs, priced at ml.* rates (in the total too)
        summary["sagemaker"] = sagemaker
    if endpoint:  # the attempts on the model's endpoint: not GPU seconds of the batch's, their runner in the total
        summary["endpoint"] = endpoint
    if times.lines_by_backend:
        summary["lines_by_backend"] = dict(sorted(times.lines_by_backend.items()))
    return summary
