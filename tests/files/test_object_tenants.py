"""Objects of ours that a shard may read on a tenant's behalf carry that tenant's tag from the moment they are
written (tenancy/scope.py TENANT_TAG_KEY; the worker checks it, gpu_worker/images.py): a file uploaded through the
Files API, each Upload part, the object composed from them (and an empty Upload's), a Message Batch's input; and
marking one a batch's input (Validate) adds to its tags rather than replacing them."""

from __future__ import annotations

import io

import openai

from nightbatch import layout
from nightbatch.files.uploads import CompleteUploadRequest, CreateUploadRequest
from nightbatch.tenancy.scope import tenant_tags
from tests.files.stack import Stack


def test_a_file_uploaded_through_the_files_api_names_its_tenant(stack: Stack, client: openai.OpenAI) -> None:
    f = client.files.create(file=("cat.png", b"\x89PNG\r\n\x1a\n" + bytes(40), "image/png"), purpose="vision")
    assert stack.services.files.blobs.tags(layout.file_key(f.id)) == tenant_tags("default")


def test_upload_parts_and_the_composed_object_name_their_tenant(stack: Stack) -> None:
    uploads, blobs = stack.services.uploads, stack.services.files.blobs
    data = b"".join(b'{"custom_id": "r%d"}\n' % i for i in range(50))
    up = uploads.create("team-p", CreateUploadRequest(bytes=len(data), filename="in.jsonl", mime_type="text/jsonl",
                                                      purpose="batch"))
    parts = [uploads.add_part("team-p", up.id, io.BytesIO(chunk), len(chunk)).id
             for chunk in (data[:300], data[300:])]
    keys = stack.part_keys(up.id)
    assert len(keys) == 2 and all(blobs.tags(k) == tenant_tags("team-p") for k in keys)
    for key in keys:  # a batch validated on the parts meanwhile
        blobs.tag(key, layout.INPUT_TAGS)
    assert all(blobs.tags(k) == {**tenant_tags("team-p"), **layout.INPUT_TAGS} for k in keys)
    done = uploads.complete("team-p", up.id, CompleteUploadRequest(part_ids=parts))
    stack.jobs.drain()
    assert done.file is not None
    assert blobs.tags(layout.file_key(done.file.id)) == {**tenant_tags("team-p"), **layout.INPUT_TAGS}

    empty = uploads.create("team-p", CreateUploadRequest(bytes=0, filename="e.jsonl", mime_type="text/jsonl",
                                                         purpose="batch"))
    nothing = uploads.complete("team-p", empty.id, CompleteUploadRequest(part_ids=[]))
    assert nothing.file is not None
    assert blobs.tags(layout.file_key(nothing.file.id)) == tenant_tags("team-p")


def test_lines_written_as_a_batch_input_name_their_tenant(stack: Stack) -> None:
    """A Message Batch's requests (and a retry's lines) are written line by line, one PUT or a multipart upload."""
    files = stack.services.files
    lines = [b'{"custom_id": "a"}\n'] * 3
    f = files.create_lines("team-m", filename="requests.jsonl", lines=iter(lines), size=sum(map(len, lines)))
    assert files.blobs.tags(layout.file_key(f.id)) == tenant_tags("team-m")
