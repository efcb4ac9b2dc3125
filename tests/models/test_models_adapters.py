"""/v1/models with LoRA adapters: each adapter listed after its model, `parent`/`root` under `nightbatch`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

MODELS = [{"name": "base-chat", "source": "/m", "lora_modules": {"sql": "/a/sql", "poem": "/a/poem"}},
          {"name": "embed", "source": "/e", "task": "embed"}]


def test_adapters_are_listed_and_retrieved_under_their_model(serve_api: Callable[..., Any]) -> None:
    client = serve_api(models_json=json.dumps(MODELS)).openai()
    listed = [(m.id, (m.model_extra or {})["nightbatch"]) for m in client.models.list()]
    assert [i for i, _ in listed] == ["base-chat", "sql", "poem", "embed"]
    info = dict(listed)
    assert info["sql"] == {"task": "generate", "endpoints": info["base-chat"]["endpoints"], "parent": "base-chat",
                           "root": "base-chat"}
    assert "parent" not in info["base-chat"]
    one = client.models.retrieve("poem")
    assert one.id == "poem" and (one.model_extra or {})["nightbatch"]["parent"] == "base-chat"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-adapter")
