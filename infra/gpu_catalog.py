"""GPU instance types nightbatch knows, and what a job of some GPUs may ask of them.

Shapes and GPU facts: AWS's instance type pages and the AWS Batch User Guide ("GPU jobs"). GPU memory is what
the driver reports (a little under the nominal figure), in GiB. Whether a model fits a type: `infra.gpu_fit`.
"""

from __future__ import annotations

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


def shape(instance_type: str) -> GpuShape:
    if instance_type not in GPU_SHAPES:
        raise ValueError(f"instance type {instance_type!r} is not one nightbatch knows: {sorted(GPU_SHAPES)}")
    return GPU_SHAPES[instance_type]


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
