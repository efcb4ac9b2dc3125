"""GPU instance types nightbatch knows, and the checks that refuse a model/instance pairing vLLM cannot run.

Shapes and GPU facts: AWS instance pages and ../shared/reference/aws-gpu-fleet-notes.md §3.3. GPU memory is what
the driver reports (a little under the nominal figure), in GiB. Synth calls `check_model_fit` for every model and
every instance type it may be placed on, so an impossible configuration fails before anything is deployed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuShape:
    vcpus: int
    memory_gib: int
    gpus: int
    gpu: str  # the GPU model, for messages
    compute_capability: float
    gpu_memory_gib: float

    @property
    def bf16(self) -> bool:
        # vLLM refuses bfloat16 below compute capability 8.0 ("use --dtype=half").
        return self.compute_capability >= 8.0

    @property
    def fp8(self) -> bool:
        # W8A8 FP8 needs Ada/Hopper (8.9+); older GPUs would run FP8 checkpoints weight-only, without the gain.
        return self.compute_capability >= 8.9


_T4 = ("T4", 7.5, 15.0)
_A10G = ("A10G", 8.6, 22.0)
_L4 = ("L4", 8.9, 22.0)
_L40S = ("L40S", 8.9, 44.5)
_A100_40 = ("A100-40GB", 8.0, 39.5)
_A100_80 = ("A100-80GB", 8.0, 79.0)
_H100 = ("H100", 9.0, 79.0)
_H200 = ("H200", 9.0, 139.0)

GPU_SHAPES: Mapping[str, GpuShape] = {
    "g4dn.xlarge": GpuShape(4, 16, 1, *_T4),
    "g4dn.2xlarge": GpuShape(8, 32, 1, *_T4),
    "g4dn.12xlarge": GpuShape(48, 192, 4, *_T4),
    "g5.xlarge": GpuShape(4, 16, 1, *_A10G),
    "g5.2xlarge": GpuShape(8, 32, 1, *_A10G),
    "g5.4xlarge": GpuShape(16, 64, 1, *_A10G),
    "g5.12xlarge": GpuShape(48, 192, 4, *_A10G),
    "g5.48xlarge": GpuShape(192, 768, 8, *_A10G),
    "g6.xlarge": GpuShape(4, 16, 1, *_L4),
    "g6.2xlarge": GpuShape(8, 32, 1, *_L4),
    "g6.4xlarge": GpuShape(16, 64, 1, *_L4),
    "g6.12xlarge": GpuShape(48, 192, 4, *_L4),
    "g6.48xlarge": GpuShape(192, 768, 8, *_L4),
    "g6e.xlarge": GpuShape(4, 32, 1, *_L40S),
    "g6e.2xlarge": GpuShape(8, 64, 1, *_L40S),
    "g6e.12xlarge": GpuShape(48, 384, 4, *_L40S),
    "g6e.48xlarge": GpuShape(192, 1536, 8, *_L40S),
    "p4d.24xlarge": GpuShape(96, 1152, 8, *_A100_40),
    "p4de.24xlarge": GpuShape(96, 1152, 8, *_A100_80),
    "p5.48xlarge": GpuShape(192, 2048, 8, *_H100),
    "p5en.48xlarge": GpuShape(192, 2048, 8, *_H200),
}
# Memory the OS, the ECS agent and the NVIDIA runtime keep for themselves on the host (Batch: leave ~5 %).
HOST_RESERVED_GIB = 2
HOST_RESERVED_SHARE = 0.05

_BYTES_PER_PARAM = {"float32": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0, "auto": 2.0}
# "Llama-3.1-8B", "Qwen2.5-72B-Instruct", "s3://w/llama/8b/", "SmolLM2-135M"
_PARAMS = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([bBmM])(?![a-zA-Z])")


def shape(instance_type: str) -> GpuShape:
    if instance_type not in GPU_SHAPES:
        raise ValueError(f"instance type {instance_type!r} is not one nightbatch knows: {sorted(GPU_SHAPES)}")
    return GPU_SHAPES[instance_type]


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


def check_model_fit(
    *,
    model: str,
    instance_type: str,
    dtype: str,
    tensor_parallel_size: int,
    fp8: bool,
    weights: float | None,
    min_kv_cache_gib: float,
    gpu_memory_utilization: float,
) -> None:
    """Raise ValueError, naming the model, the instance type and the fix, when vLLM could not serve it there."""
    s = shape(instance_type)
    where = f"model {model!r} on {instance_type} ({s.gpus}x {s.gpu}, compute capability {s.compute_capability})"
    if tensor_parallel_size > s.gpus:
        raise ValueError(f"{where}: tensor_parallel_size={tensor_parallel_size} needs {tensor_parallel_size} GPUs in "
                         f"one instance, it has {s.gpus}; list multi-GPU types in the model's instanceTypes")
    if dtype.lower() == "bfloat16" and not s.bf16:
        raise ValueError(f"{where}: {s.gpu} has no bfloat16 (vLLM needs compute capability >= 8.0); "
                         f"set the model's dtype to float16, or drop {instance_type} from its instanceTypes")
    if fp8 and not s.fp8:
        raise ValueError(f"{where}: {s.gpu} has no FP8 (W8A8 FP8 needs compute capability >= 8.9: L4, L40S, H100); "
                         f"use g6/g6e/p5 types or an unquantized checkpoint")
    if weights is not None:
        usable = s.gpu_memory_gib * tensor_parallel_size * gpu_memory_utilization
        if weights + min_kv_cache_gib > usable:
            raise ValueError(
                f"{where}: weights {weights:.1f} GiB + minimum KV cache {min_kv_cache_gib:.1f} GiB exceed the "
                f"{usable:.1f} GiB vLLM may use on {tensor_parallel_size} GPU(s) at gpu_memory_utilization="
                f"{gpu_memory_utilization}; raise tensor_parallel_size, use larger GPUs, or quantize")


def job_resources(instance_types: Sequence[str], gpus: int = 1) -> tuple[int, int]:
    """vCPUs and memory (GiB) a job of `gpus` GPUs may ask for so that it fits every listed instance type.

    A job gets the GPUs' share of the host: a 1-GPU job on a 4-GPU host asks for a quarter of its vCPUs/memory.
    """
    shapes = [shape(t) for t in instance_types]
    too_small = [t for t, s in zip(instance_types, shapes, strict=True) if s.gpus < gpus]
    if too_small:
        raise ValueError(f"instance types {too_small} have fewer than the {gpus} GPUs a job needs")
    vcpus = min(s.vcpus * gpus // s.gpus for s in shapes)
    memory = min(int(s.memory_gib * gpus / s.gpus * (1 - HOST_RESERVED_SHARE)) for s in shapes)
    memory = min(memory, min(s.memory_gib * gpus // s.gpus - HOST_RESERVED_GIB for s in shapes))
    return vcpus, memory
