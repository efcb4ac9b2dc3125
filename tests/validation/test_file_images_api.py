"""Images by file id through the stock OpenAI SDK, over the real app with the local workflow (engines off: a valid
batch's lines all fail at run time, so reaching `completed` is what says Validate took them): a responses line
naming the tenant's own `vision` upload passes Validate; one naming another tenant's upload is refused at Validate
with the Files API's words, its existence never shown."""

from __future__ import annotations

import json
from collections.abc import Callable

from openai import OpenAI

from tests.support.tenant_stack import MODEL, Stack, wait_for
from tests.worker.test_file_images import PNG


def _batch(client: OpenAI, *file_ids: str) -> str:
    lines = [json.dumps({"custom_id": f"img-{i}", "method": "POST", "url": "/v1/responses", "body": {
        "model": MODEL, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is it?"}, {"type": "input_image", "file_id": file_id}]}]}})
        for i, file_id in enumerate(file_ids)]
    f = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint="/v1/responses", completion_window="24h").id


def test_a_line_may_name_its_tenants_image_file_only(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(workflow="local")
    a = stack.client(stack.new_key("team-a", "a"))
    b = stack.client(stack.new_key("team-b", "b"))
    mine = a.files.create(file=("cat.png", PNG, "image/png"), purpose="vision")
    theirs = b.files.create(file=("cat.png", PNG, "image/png"), purpose="vision")

    def ended(batch_id: str) -> str:
        return str(wait_for(lambda: (s := a.batches.retrieve(batch_id).status) in ("completed", "failed") and s))

    ok, refused = _batch(a, mine.id, mine.id), _batch(a, mine.id, theirs.id)
    assert ended(ok) == "completed"
    assert ended(refused) == "failed"
    errors = a.batches.retrieve(refused).errors
    assert errors is not None and errors.data is not None
    assert [(e.line, e.code, e.param, e.message) for e in errors.data] == [
        (2, "file_not_found", "body.input[0].content[1].file_id", f"No such File object: {theirs.id}")]
