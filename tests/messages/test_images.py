"""Images on Anthropic's wire through the real `anthropic` SDK (nightbatch/validation/media.py): an image block
inside a `tool_result` is checked at create like a top-level one (a URL off the allowed hosts, an inline image over
the limit) and counted against the per-request cap; each refusal is Anthropic's 400 naming the request and the
block, and no batch starts."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import pytest

from tests.worker.test_file_images import PNG

if TYPE_CHECKING:
    from tests.conftest import ApiServer

MODEL = "SmolLM2-135M-Instruct"
METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
INLINE = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()}


@pytest.fixture
def served(serve_api: Callable[..., ApiServer]) -> ApiServer:
    return serve_api(media_allowed_domains="images.example.com", max_image_bytes=300, max_images_per_request=2)


@pytest.fixture
def claude(served: ApiServer) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=served.base_url, api_key=served.api_key, max_retries=0)
    yield client
    client.close()


def request(*tool_content: dict[str, Any]) -> dict[str, Any]:
    """A request whose last turn answers a tool call with `tool_content`."""
    return {"custom_id": "r-0", "params": {"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "what is on the screen?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": list(tool_content)}]},
    ]}}


def refused(claude: anthropic.Anthropic, req: dict[str, Any]) -> str:
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.batches.create(requests=[req])  # type: ignore[list-item]
    body = info.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


WHERE = "requests.0.params.messages.2.content.0.content"


def test_a_tool_result_image_url_off_the_allowed_hosts_is_refused(served: ApiServer,
                                                                   claude: anthropic.Anthropic) -> None:
    message = refused(claude, request({"type": "image", "source": {"type": "url", "url": METADATA}}))
    assert message == (f"{WHERE}.0.source.url: Invalid 'source.url': only data: URLs are accepted, or https URLs "
                       "on images.example.com.")
    assert served.workflow.started == []


def test_tool_result_images_are_sized_and_counted(served: ApiServer, claude: anthropic.Anthropic) -> None:
    big = {"type": "image", "source": {**INLINE, "data": "A" * 800}}
    assert refused(claude, request(big)).startswith(f"{WHERE}.0.source.data: The image is about 600 bytes, over "
                                                    "the limit of 300 bytes per image.")
    three = [{"type": "image", "source": INLINE}] * 3
    assert refused(claude, request(*three)).startswith(f"{WHERE}.2.source.data: The request has more than 2 images")
    assert served.workflow.started == []
    ok = claude.messages.batches.create(requests=[request(  # type: ignore[list-item]
        {"type": "text", "text": "the screen:"}, {"type": "image", "source": INLINE},
        {"type": "image", "source": {"type": "url", "url": "https://images.example.com/screen.png"}})])
    assert ok.processing_status == "in_progress" and len(served.workflow.started) == 1
