"""Results while running (nightbatch/results/partial.py): the checkpoints' lines as Finalize will merge them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nightbatch import layout
from nightbatch.errors import InvalidRequestError, NotFoundError
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.results import lines as results
from nightbatch.results.partial import PartialResults, partial_results
from nightbatch.wiring import Services
from tests.pipeline.test_pipeline import run_to_shards
from tests.support.pipeline_world import chat_line, jsonl, make_batch


def result(batch_id: str, custom_id: str, status: int, answer: str) -> bytes:
    body: dict[str, Any] = ({"choices": [{"message": {"content": answer}}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
                            if status == 200 else {"error": {"message": answer, "code": None}})
    return results.encode(batch_id, custom_id, response=results.Response(status, f"req_{answer}", body))


def read(found: PartialResults) -> list[bytes]:
    data = b"".join(found.lines)
    assert data == b"" or data.endswith(b"\n")
    return data.splitlines(keepends=True)


def final_lines(services: Services, file_id: str | None) -> list[bytes]:
    if file_id is None:
        return []
    return b"".join(services.files.chunks(services.files.item("default", file_id))).splitlines(keepends=True)


def test_running_batch_serves_checkpoint_lines_first_wins_and_they_match_the_final_files(
        services: Services) -> None:
    services.settings.pipeline.shard_target_tokens = 50
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 21)]))
    shards = run_to_shards(services, batch_id)
    assert len(shards) > 1
    blobs = services.adapters.blobs
    prefix = layout.results_prefix(batch_id, shards[0])
    # A zombie attempt "b" wrote req-1 again after attempt "a": the first in key order wins, as in Finalize.
    blobs.put_bytes(layout.checkpoint_key(prefix, 0, "a"),
                    result(batch_id, "req-1", 200, "first") + result(batch_id, "req-2", 400, "bad"))
    blobs.put_bytes(layout.checkpoint_key(prefix, 0, "b"), result(batch_id, "req-1", 200, "zombie"))
    services.adapters.table.update(batch_id, add={"live_completed": 1, "live_failed": 1})

    found = partial_results(services, "default", batch_id, "output")
    assert not found.complete and found.count == 1 and found.status == "in_progress"
    assert found.headers()["x-nightbatch-complete"] == "false"
    out1 = read(found)
    assert [json.loads(x)["response"]["request_id"] for x in out1] == ["req_first"]
    err1 = read(partial_results(services, "default", batch_id, "error"))
    assert [json.loads(x)["custom_id"] for x in err1] == ["req-2"]

    # More checkpoints arrive (the next seq); what was shown stays as it was.
    blobs.put_bytes(layout.checkpoint_key(prefix, 1, "c"),
                    result(batch_id, "req-1", 200, "rerun") + result(batch_id, "req-3", 200, "three"))
    out2 = read(partial_results(services, "default", batch_id, "output"))
    assert out2[:1] == out1 and len(out2) == 2

    services.batches.cancel("default", batch_id)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    batch = services.batches.get("default", batch_id)
    done = partial_results(services, "default", batch_id, "output")
    assert done.complete and done.file is not None and done.count == batch.request_counts.completed == 2
    final_out = final_lines(services, batch.output_file_id)
    assert final_out == out2
    final_err = final_lines(services, batch.error_file_id)
    assert err1[0] in final_err
    assert partial_results(services, "default", batch_id, "error").count == len(final_err) == 18


def test_a_validating_batch_has_no_lines_yet(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(1)]))
    found = partial_results(services, "default", batch_id, "output")
    assert (found.complete, found.count, read(found)) == (False, 0, [])


def test_another_tenants_batch_is_not_found_and_kind_is_checked(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(1)]))
    with pytest.raises(NotFoundError):
        partial_results(services, "other", batch_id, "output")
    with pytest.raises(InvalidRequestError) as e:
        partial_results(services, "default", batch_id, "outputs")
    assert e.value.param == "kind"


def test_over_the_inline_limit_the_whole_lines_that_fit_are_served_and_the_read_says_truncated(
        services: Services) -> None:
    """A checkpoint (usually S3's 5 MiB part minimum) may be bigger than a Lambda response: the read serves the
    whole lines of the checkpoints' first `max_inline_download_bytes`, not whole checkpoints only."""
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 5)]))
    shard = run_to_shards(services, batch_id)[0]
    prefix = layout.results_prefix(batch_id, shard)
    one = result(batch_id, "req-1", 200, "one")
    first = one + result(batch_id, "req-2", 200, "two")
    services.adapters.blobs.put_bytes(layout.checkpoint_key(prefix, 0, "a"), first)
    services.adapters.blobs.put_bytes(layout.checkpoint_key(prefix, 1, "a"), result(batch_id, "req-3", 200, "x"))
    services.settings.deployment.mode = "aws"
    services.settings.files.max_inline_download_bytes = len(one) + 10
    found = partial_results(services, "default", batch_id, "output")
    assert found.truncated and found.headers()["x-nightbatch-truncated"] == "true"
    assert b"".join(read(found)) == one
    services.settings.files.max_inline_download_bytes = len(first) + 10
    found = partial_results(services, "default", batch_id, "output")
    assert found.truncated and b"".join(read(found)) == first
    services.settings.files.max_inline_download_bytes = 10 * len(first)
    found = partial_results(services, "default", batch_id, "output")
    assert not found.truncated and len(b"".join(read(found)).splitlines()) == 3
