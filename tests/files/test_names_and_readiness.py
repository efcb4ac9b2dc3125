"""L3: filename and mime_type are capped before any byte reaches S3; L12: only a processed file is batch input."""

from __future__ import annotations

import hashlib
import threading

import openai
import pytest

from tests.files.stack import Stack


def _keys(stack: Stack) -> set[str]:
    return set(stack.services.files.blobs.list_keys("files/")) | set(stack.services.files.blobs.list_keys(
        "uploads/"))


def test_long_filenames_and_mime_types_are_refused_and_leave_no_object(stack: Stack,
                                                                       client: openai.OpenAI) -> None:
    before = _keys(stack)
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("x" * 256 + ".jsonl", b'{"a": 1}\n'), purpose="batch")
    assert err.value.code == "string_above_max_length" and err.value.param == "filename"
    for kw, param in (({"filename": "f" * 256}, "filename"), ({"mime_type": "m" * 256}, "mime_type")):
        args = {"bytes": 1, "filename": "in.jsonl", "mime_type": "text/plain", "purpose": "batch", **kw}
        with pytest.raises(openai.BadRequestError) as err:
            client.uploads.create(**args)
        assert err.value.code == "string_above_max_length" and err.value.param == param
    assert _keys(stack) == before, "a refused request wrote nothing to S3"
    ok = client.files.create(file=("x" * 249 + ".jsonl", b'{"a": 1}\n'), purpose="batch")
    assert len(ok.filename) == 255


def test_only_a_processed_file_is_batch_input(stack: Stack, client: openai.OpenAI,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Composition is held until the batch has been refused (a 3 s compose delay raced it on a loaded machine).
    assembly = stack.services.assembly
    compose, release = assembly.compose, threading.Event()

    def held(file_id: str, upload_id: str) -> str:
        release.wait(timeout=600)
        return compose(file_id, upload_id)

    monkeypatch.setattr(assembly, "compose", held)
    line = (b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
            b'"SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}]}}\n')
    try:  # released whatever happens: the session's stack composes on one thread, later tests wait behind it
        upload = client.uploads.create(bytes=len(line), filename="in.jsonl", mime_type="text/plain",
                                       purpose="batch")
        # The second half arrives first: no running digest, so the md5 is left to the compose step.
        second = client.uploads.parts.create(upload_id=upload.id, data=line[50:]).id
        first = client.uploads.parts.create(upload_id=upload.id, data=line[:50]).id
        done = client.uploads.complete(upload_id=upload.id, part_ids=[first, second],
                                       md5=hashlib.md5(line).hexdigest())
        assert done.file is not None and done.file.status == "uploaded"
        with pytest.raises(openai.BadRequestError) as err:
            client.batches.create(input_file_id=done.file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
        assert err.value.code == "file_not_ready" and "still being processed" in err.value.message
    finally:
        release.set()
    stack.jobs.drain()
    assert stack.services.files.item("default", done.file.id).status is None  # verified once composed
