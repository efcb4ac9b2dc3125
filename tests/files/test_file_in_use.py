"""A batch's input is immutable while the batch is open: its shards are byte ranges of that object.

DELETE /v1/files/{id} answers as OpenAI does (the file is gone for the API at once), but the bytes of a file an
open batch reads stay until the batch ends; the sweeper then deletes them. Through the stock OpenAI SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import openai
import pytest
from openai import OpenAI

from nightbatch import layout
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.pipeline.sweep import sweep
from nightbatch.shards.lines import shard_lines
from nightbatch.shards.spec import read_shard

if TYPE_CHECKING:
    from tests.conftest import ApiServer


def test_a_file_in_use_keeps_its_bytes_until_its_batch_ends(
        openai_client: OpenAI, api_server: ApiServer, make_jsonl: Callable[..., bytes]) -> None:
    data = make_jsonl(5)
    f = openai_client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = openai_client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
    deleted = openai_client.files.delete(f.id)
    assert (deleted.id, deleted.deleted) == (f.id, True)
    for call in (openai_client.files.retrieve, openai_client.files.content, openai_client.files.delete):
        with pytest.raises(openai.NotFoundError):
            call(f.id)
    assert f.id not in [x.id for x in openai_client.files.list()]
    with pytest.raises(openai.BadRequestError):  # no new batch takes a deleted file
        openai_client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")

    services = api_server.services
    blobs = services.adapters.blobs
    inp = BatchTaskInput(batch_id=batch.id)
    assert validate_batch(inp, services).valid  # the open batch still runs from its input
    assert plan_batch(inp, services).shard_count == 1
    spec = read_shard(blobs, batch.id, "00000")
    assert spec is not None and spec.version == 2
    assert [line.raw for line in shard_lines(blobs, spec)] == data.splitlines()
    assert sweep(services)["released_files"] == []
    assert blobs.get_bytes(layout.file_key(f.id)) == data

    openai_client.batches.cancel(batch.id)
    assert finalize_batch(inp, services).status == "cancelled"
    assert sweep(services)["released_files"] == [f.id]
    assert blobs.get_bytes(layout.file_key(f.id)) is None
    assert sweep(services)["released_files"] == []


def test_a_file_no_open_batch_reads_loses_its_bytes_at_once(
        openai_client: OpenAI, api_server: ApiServer, make_jsonl: Callable[..., bytes]) -> None:
    data = make_jsonl(2)
    f = openai_client.files.create(file=("in.jsonl", data), purpose="batch")
    other = openai_client.files.create(file=("other.jsonl", data), purpose="batch")
    batch = openai_client.batches.create(input_file_id=other.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
    assert openai_client.files.delete(f.id).deleted
    blobs = api_server.services.adapters.blobs
    assert blobs.get_bytes(layout.file_key(f.id)) is None
    # Once its batch has ended, a file is deleted with its bytes as any other.
    openai_client.batches.cancel(batch.id)
    assert finalize_batch(BatchTaskInput(batch_id=batch.id), api_server.services).status == "cancelled"
    assert openai_client.files.delete(other.id).deleted
    assert blobs.get_bytes(layout.file_key(other.id)) is None
