"""Whether a served model fits the GPUs it may be placed on: what it asks of them, and the checks that refuse a
model/instance pairing vLLM cannot run.

Synth checks every model against every instance type it may be placed on (`DeployConfig`), so an impossible
configuration fails before anything is deployed. The instance types' facts are `infra.gpu_catalog`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from infra.gpu_catalog import shape
from nightbatch.models.spec import ModelSpec

_BYTES_PER_PARAM = {"float32": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0, "auto": 2.0}
# "Llama-3.1-8B", "Qwen2.5-72B-Instruct", "s3://w/llama/8b/", "SmolLM2-135M"
_PARAMS = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([bBmM])(?![a-zA-Z])")


def params_billions(*texts: str) -> float | None:
    """The parameter count a model's name or source states ("8B", "135M"), in billions; None if none does."""
    for text in texts:
        for number, unit in _PARAMS.findall(text):
            return float(number) * (1.0 if unit in "bB" else 0.001)
    return None


def is_fp8(dtype: str, engine_args: Mapping[str, object], name: str) -> bool:
    quantization = str(engine_args.get("quantization") or "").lower()
    return "fp8" in quantization or "fp8" in dtype.lower() or bool(re.search(r"fp8", name, re.IGNORECASE))


def weights_gib(params_b: float, dtype: str, fp8: bool) -> float:
    per_param = 1.0 if fp8 else _BYTES_PER_PARAM.get(dtype.lower(), 2.0)
    return params_b * 1e9 * per_param / 2**30


@dataclass(frozen=True)
class GpuNeeds:
    """What a served model asks of its GPUs: from its `ModelSpec` and its deployment-only keys."""

    model: str
    dtype: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    fp8: bool
    # Weights in GPU memory; None when neither the configuration nor the name or source tells.
    weights_gib: float | None
    min_kv_cache_gib: float
    # /dev/shm of the container (tensor-parallel workers exchange data through it).
    shared_memory_gib: int

    @classmethod
    def of(cls, spec: ModelSpec, *, weights_gib_set: float, shared_memory_gib_set: int,
           min_kv_cache_gib: float) -> GpuNeeds:
        """`*_set` 0: derived (weights from the parameter count and dtype; 2 GiB + 4 GiB per extra GPU)."""
        tensor_parallel_size = int(spec.engine_args.get("tensor_parallel_size", 1))
        fp8 = is_fp8(spec.dtype, spec.engine_args, spec.name)
        params = params_billions(spec.name, spec.source)
        weights = weights_gib_set or (None if params is None else weights_gib(params, spec.dtype, fp8))
        return cls(
            model=spec.name, dtype=spec.dtype, tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=float(spec.engine_args.get("gpu_memory_utilization", 0.9)), fp8=fp8,
            weights_gib=weights, min_kv_cache_gib=min_kv_cache_gib,
            shared_memory_gib=shared_memory_gib_set or 2 + 4 * (tensor_parallel_size - 1),
        )

    def check_fits(self, instance_types: Iterable[str]) -> None:
        for instance_type in instance_types:
            check_model_fit(self, instance_type)


def check_model_fit(needs: GpuNeeds, instance_type: str) -> None:
    """Raise ValueError, naming the model, the instance type and the fix, when vLLM could not serve it there."""
    s = shape(instance_type)
    tp, model = needs.tensor_parallel_size, needs.model
    where = f"model {model!r} on {instance_type} ({s.gpus}x {s.gpu}, compute capability {s.compute_capability})"
    if tp > s.gpus:
        raise ValueError(f"{where}: tensor_parallel_size={tp} needs {tp} GPUs in "
                         f"one instance, it has {s.gpus}; list multi-GPU types in the model's instanceTypes")
    if needs.dtype.lower() == "bfloat16" and not s.bf16:
        raise ValueError(f"{where}: {s.gpu} has no bfloat16 (vLLM needs compute capability >= 8.0); "
                         f"set the model's dtype to float16, or drop {instance_type} from its instanceTypes")
    if needs.fp8 and not s.fp8:
        raise ValueError(f"{where}: {s.gpu} has no FP8 (W8A8 FP8 needs compute capability >= 8.9: L4, L40S, H100); "
                         f"use g6/g6e/p5 types or an unquantized checkpoint")
    if needs.weights_gib is not None:
        usable = s.gpu_memory_gib * tp * needs.gpu_memory_utilization
        if needs.weights_gib + needs.min_kv_cache_gib > usable:
            raise ValueError(
                f"{where}: weights {needs.weights_gib:.1f} GiB + minimum KV cache {needs.min_kv_cache_gib:.1f} GiB "
                f"exceed the {usable:.1f} GiB vLLM may use on {tp} GPU(s) at gpu_memory_utilization="
                f"{needs.gpu_memory_utilization}; raise tensor_parallel_size, use larger GPUs, or quantize")
