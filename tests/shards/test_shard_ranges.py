"""Shards point into the input: read through byte ranges they give, byte for byte, the requests the previous
release's segment copies gave (number, estimate, the request as uploaded), and Validate copies no input."""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightbatch import layout
from nightbatch.aws.records import BatchRecord, FileRecord
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.files.inputs import InputReader
from nightbatch.files.sources import InputPart, InputSource
from nightbatch.jsonl import BOM, split_lines
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.shards import lines as shard_lines_module
from nightbatch.shards.lines import ShardLine, shard_lines
from nightbatch.shards.spec import ShardSpec, read_manifest, read_shard
from nightbatch.validation.lines import Validator
from nightbatch.wiring import Services
from tests.support.older_formats import read_line_index, segment_key, segment_line
from tests.support.pipeline_world import chat_line, make_batch, upload_in_parts

SYSTEMS = ["You are terse. " * 80, "You answer in French. " * 60]  # long enough for prefix groups


def request(i: int, variant: int) -> bytes:
    line: dict[str, Any] = chat_line(i)
    if variant % 3 == 1:
        line["body"]["messages"].insert(0, {"role": "system", "content": SYSTEMS[i % 2]})
    if variant % 5 == 2:
        line["body"]["messages"][-1]["content"] = f"é \u2028 {i} \\n"
    raw = json.dumps(line, ensure_ascii=variant % 2 == 0).encode()
    return b"  " + raw + b"\t " if variant % 7 == 3 else raw


def previous_release(services: Services, data: bytes) -> list[ShardLine]:
    """What the segments of 0.1.x held for `data`: segment_line of every valid line, read back through
    a version 1 shard (copies in S3, as the old Validate wrote them)."""
    validator = Validator(settings=services.settings, endpoint="/v1/chat/completions")
    lines = [segment_line(raw.number, validator.check(raw.number, raw.data, raw.size).est_tokens, raw.data)
             for raw in split_lines([data], max_bytes=services.settings.validation.max_line_bytes)
             if raw.data and raw.data.strip()]
    blobs = services.adapters.blobs
    key = segment_key("old", 0)
    blobs.put_bytes(key, b"".join(lines))
    spec = ShardSpec(batch_id="old", shard_id="00000", endpoint="", model="", segments=[key],
                     lines=len(lines))
    return list(shard_lines(blobs, spec))


def through_ranges(services: Services, batch_id: str, chunk: int) -> list[ShardLine]:
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    blobs = services.adapters.blobs
    out: list[ShardLine] = []
    assert plan_batch(inp, services).shard_count >= 1
    for item in read_manifest(blobs, batch_id):
        spec = read_shard(blobs, batch_id, item.shard_id)
        assert spec is not None and spec.version == 2 and spec.input is not None
        got = list(shard_lines(blobs, spec, chunk=chunk))
        assert len(got) == spec.lines
        for key in spec.indexes:  # each segment's lines in input order
            numbers = [r[0] for r in read_line_index(blobs, key).runs]
            assert numbers == sorted(numbers)
        # Each line named by the index as Validate accepted it: its custom_id.
        assert [x.custom_id for x in got] == [json.loads(x.raw)["custom_id"] for x in got]
        out += [ShardLine(x.number, x.est, x.raw) for x in got]
    return sorted(out)


odd_lines = st.lists(st.tuples(st.integers(0, 20), st.sampled_from([b"\n", b"\r\n", b"\n\n", b"\n \t\r\n"])),
                     min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(odd_lines, st.booleans(), st.booleans(), st.integers(1, 300), st.integers(200, 5000))
def test_ranges_give_the_requests_segments_gave(services: Services, lines: list[tuple[int, bytes]], bom: bool,
                                                 last_newline: bool, chunk: int, block: int) -> None:
    data = (BOM if bom else b"") + b"".join(request(i, v) + end for i, (v, end) in enumerate(lines))
    if not last_newline:
        data = data.rstrip(b"\r\n")
    expected = sorted(previous_release(services, data))
    with patch.object(shard_lines_module, "BLOCK_BYTES", block):  # lines straddling GETs, and pieces of them
        assert through_ranges(services, make_batch(services, data), chunk) == expected


def test_four_mib_lines_straddling_every_chunk(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_lines_module, "BLOCK_BYTES", 1_500_000)
    big = chat_line(1)
    big["body"]["messages"][0]["content"] = "w " * (2 * 1024 * 1024 - 200)
    lines = [json.dumps(chat_line(0)).encode(), json.dumps(big).encode(), json.dumps(chat_line(2)).encode()]
    assert 4 * 1024 * 1024 - 1024 < len(lines[1]) <= services.settings.validation.max_line_bytes
    data = b"\r\n".join(lines) + b"\r\n"
    expected = sorted(previous_release(services, data))
    assert through_ranges(services, make_batch(services, data), chunk=1_000_003) == expected


def test_an_upload_is_read_through_its_parts(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    # Composition not run yet (it runs minutes later in AWS): the File reads through its parts.
    monkeypatch.setattr(services.uploads.jobs, "compose", lambda *a, **k: None)
    data = b"".join(request(i, i) + b"\r\n" for i in range(30))
    cuts = [0, 1, 517, 518, 2000, len(data)]  # a one-byte part and parts cutting lines anywhere
    file_id, upload_id = upload_in_parts(services, data, cuts)
    file = services.files.item("default", file_id)
    source = InputSource(key=file.s3_key, bytes=file.bytes,
                                parts=[InputPart(key=k, bytes=services.adapters.blobs.size(k) or 0)
                                       for k in file.parts or []])
    assert len(source.parts) == 5 and services.adapters.blobs.size(file.s3_key) is None
    reader = InputReader(services.adapters.blobs, source)
    for a, b in [(0, len(data)), (1, 518), (517, 519), (300, 2100), (len(data) - 1, len(data))]:
        assert b"".join(reader.stream(a, b, chunk=7)) == data[a:b]
    batch = services.batches.create("default", CreateBatchRequest(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"))
    assert through_ranges(services, batch.id, chunk=64) == sorted(previous_release(services, data))
    # Composed meanwhile (the parts purged later): the same ranges from the composed object.
    services.assembly.compose(file_id, upload_id)
    assert services.adapters.blobs.size(file.s3_key) == len(data)
    composed = InputReader(services.adapters.blobs, source)
    assert b"".join(composed.stream(1, 2001, chunk=5)) == data[1:2001] and composed.composed


def test_validate_writes_an_index_not_a_copy(services: Services) -> None:
    data = b"".join(request(i, i) + b"\n" for i in range(200))
    batch_id = make_batch(services, data)
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    plan_batch(inp, services)
    blobs = services.adapters.blobs
    written = {k: blobs.get_bytes(k) or b"" for k in blobs.list_keys(layout.batch_prefix(batch_id))}
    total = sum(len(v) for v in written.values())
    # Indexes, shard specs and the manifest: tens of bytes a line, never the lines (~150-1,400 bytes each).
    assert total < 100 * 200, (total, len(data))
    assert not any(b"question 7" in v or b"custom_id" in v for v in written.values())


def test_unrun_lines_of_a_cancelled_batch_are_read_through_ranges(services: Services) -> None:
    data = b"\xef\xbb\xbf" + b"".join(request(i, i) + b"\r\n\r\n" for i in range(12))
    batch_id = make_batch(services, data)
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    services.adapters.table.update_attributes(BatchRecord, batch_id, set_={"status": "cancelling"})
    assert finalize_batch(inp, services).status == "cancelled"
    err = services.adapters.blobs.get_bytes(layout.error_key(batch_id)) or b""
    # Segment by segment, as before: the prefix-grouped lines after the others.
    assert sorted(json.loads(x)["custom_id"] for x in err.splitlines()) == sorted(f"req-{i}" for i in range(12))


@pytest.mark.parametrize("version", [1, 2])
def test_a_shard_of_either_version_reads(services: Services, version: int) -> None:
    """A worker of 0.2 meets shards planned by 0.1.x (version 1) and by 0.2 (version 2)."""
    data = b"".join(request(i, 0) + b"\n" for i in range(5))
    if version == 1:
        got = previous_release(services, data)
    else:
        got = through_ranges(services, make_batch(services, data), chunk=1 << 20)
    assert [(x.number, x.raw) for x in got] == [(i + 1, request(i, 0)) for i in range(5)]


def test_an_input_the_lifecycle_would_delete_before_the_batch_ends_is_rewritten(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    blobs = services.adapters.blobs
    data = b"".join(request(i, 0) + b"\n" for i in range(3))
    fresh = make_batch(services, data)
    assert validate_batch(BatchTaskInput(batch_id=fresh), services).valid
    fresh_file = (services.adapters.table.get_record(BatchRecord, fresh) or pytest.fail()).input_file_id
    assert blobs.client.head_object(Bucket=blobs.bucket, Key=layout.file_key(fresh_file))["Metadata"] == {}
    # A file written (by the lifecycle's count) long before: as if the lifecycle ran after a day.
    monkeypatch.setattr(layout, "OBJECT_EXPIRY_DAYS", 1)
    old = make_batch(services, data)
    assert validate_batch(BatchTaskInput(batch_id=old), services).valid
    file_id = (services.adapters.table.get_record(BatchRecord, old) or pytest.fail()).input_file_id
    head = blobs.client.head_object(Bucket=blobs.bucket, Key=layout.file_key(file_id))
    accepted = (services.adapters.table.get_record(FileRecord, file_id) or pytest.fail()).etag or ""
    # The ETag it had is kept beside it: a reader pinned to it reads on (tests/files/test_pinned_inputs.py).
    assert head["Metadata"] == {"nightbatch-kept-for": old, "nightbatch-etags": accepted.strip('"')}
    assert blobs.get_bytes(layout.file_key(file_id)) == data
