"""LoRA on the vLLM engine: the engine arguments a model's adapters need and vLLM's static adapter list."""

from __future__ import annotations

from typing import Any

from nightbatch.models.spec import ModelSpec


def lora_engine_args(spec: ModelSpec, *, on_cpu: bool = False) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"enable_lora": True}
    if spec.max_loras is not None:
        kwargs["max_loras"] = spec.max_loras
    if on_cpu:
        # vLLM 0.32's CPU LoRA ops gather the adapter slot of every row, -1 ("no adapter") included, which
        # reads the last slot: a base-model line in the same engine step as an adapter's got that adapter's
        # delta (measured: its greedy answer became the adapter's; upstream vllm-project/vllm#48421). One slot
        # more than the adapters keeps the last one empty (zeros), so the base model's rows stay its own.
        kwargs["max_loras"] = max(spec.max_loras or 1, len(spec.lora_modules)) + 1
    if spec.max_lora_rank is not None:
        kwargs["max_lora_rank"] = spec.max_lora_rank
    return kwargs


def lora_module_paths(spec: ModelSpec, lora_dirs: dict[str, str]) -> list[Any]:
    """vLLM's static adapters (--lora-modules): loaded at start, listed by /v1/models with the model as
    parent, and served to any request whose `model` names them."""
    from vllm.entrypoints.openai.models.protocol import LoRAModulePath

    missing = sorted(set(spec.lora_modules) - set(lora_dirs))
    if missing:
        raise ValueError(f"model {spec.name!r}: adapter(s) {', '.join(missing)} have no local directory")
    return [LoRAModulePath(name=name, path=str(lora_dirs[name]), base_model_name=spec.name)
            for name in spec.lora_modules]
