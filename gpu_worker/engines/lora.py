"""LoRA on the vLLM engine: the engine arguments a model's adapters need and vLLM's static adapter list."""

from __future__ import annotations

from typing import Any

from nightbatch.model_spec import ModelSpec


def lora_engine_args(spec: ModelSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"enable_lora": True}
    if spec.max_loras is not None:
        kwargs["max_loras"] = spec.max_loras
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
