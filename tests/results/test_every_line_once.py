"""The rule (docs/ARCHITECTURE.md, decision 3: every accepted line ends exactly once): a line Validate accepts reaches
the output or the error file exactly once — in Finalize, in the partial results and across a retry — whatever bytes it
holds; a line nobody could answer is refused at validation with its line number.

The whole chain runs for real on moto: an upload (sometimes in Upload parts, the first one byte long, read
before composition), Validate, Plan, the shard runner on the deterministic engine, the partial-results route,
Finalize, then a retry of the failed lines through the same chain. Every reader of a line goes through the one
decoder (nightbatch.jsonl.loads): were Validate to accept what the worker or Finalize cannot read, a line would
end nowhere, and this test fails.
"""

from __future__ import annotations

import io
import itertools
import json
import unicodedata
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightbatch.batches.request import CreateBatchRequest
from nightbatch.files.uploads import CompleteUploadRequest, CreateUploadRequest
from nightbatch.jsonl import loads
from nightbatch.pipeline import BatchTaskInput, finalize_batch, validate_batch
from nightbatch.results.partial import partial_results
from nightbatch.results.retry import RetryRequest, retry_batch
from nightbatch.wiring import Services
from tests.support.pipeline_world import run_shards

MODEL = "SmolLM2-135M-Instruct"
URL = "/v1/chat/completions"
_ids = itertools.count()


@dataclass
class Line:
    data: bytes          # the line as uploaded (no newline)
    custom_id: str       # as the decoder reads it
    refused: bool        # Validate must refuse it (and say which line)
    fails: bool = False  # the engine answers it with an error (it ends in the error file)


def _request(custom_id_json: str, content_json: str, extra: str = "") -> bytes:
    return (f'{{"custom_id":{custom_id_json},"method":"POST","url":"{URL}","body":{{"model":"{MODEL}",'
            f'"messages":[{{"role":"user","content":{content_json}}}],"max_tokens":4{extra}}}}}').encode()


odd_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


@st.composite
def lines(draw: st.DrawFn) -> Line:
    n = next(_ids)
    base = draw(odd_text)
    kind = draw(st.sampled_from(["plain", "nfd", "nul", "big_int", "deep", "fail", "nan", "inf",
                                 "surrogate_id", "surrogate_text", "huge_float"]))
    cid = f"{n}-{unicodedata.normalize('NFD' if kind == 'nfd' else 'NFC', base + 'é')}"
    content = json.dumps(base + ("FAIL" if kind == "fail" else ""), ensure_ascii=draw(st.booleans()))
    if kind == "nul":
        content = json.dumps(base + "\x00")
    extra = {"big_int": ',"seed":123456789012345678901234567890',
             "deep": ',"metadata_x":' + "[" * 40 + "1" + "]" * 40,
             "nan": ',"temperature":NaN', "inf": ',"temperature":-Infinity',
             "huge_float": ',"top_p":1e400'}.get(kind, "")
    if kind == "surrogate_id":
        return Line(_request(json.dumps(cid)[:-1] + '\\ud800"', content, extra), cid, True)
    if kind == "surrogate_text":
        return Line(_request(json.dumps(cid), '"x\\udfff"', extra), cid, True)
    return Line(_request(json.dumps(cid, ensure_ascii=draw(st.booleans())), content, extra), cid,
                kind in ("nan", "inf", "huge_float"), fails=kind == "fail")


def _upload(services: Services, payload: bytes, one_byte_first_part: bool) -> str:
    if not one_byte_first_part or len(payload) < 2:
        return services.files.create("default", filename="in.jsonl", purpose="batch",
                                     fileobj=io.BytesIO(payload), size=len(payload)).id
    up = services.uploads.create("default", CreateUploadRequest(bytes=len(payload), filename="in.jsonl",
                                                                mime_type="text/jsonl", purpose="batch"))
    cuts = [0, 1, max(1, len(payload) // 2), len(payload)]
    parts = [services.uploads.add_part("default", up.id, io.BytesIO(payload[a:b]), b - a).id
             for a, b in itertools.pairwise(cuts) if b > a]
    done = services.uploads.complete("default", up.id, CompleteUploadRequest(part_ids=parts))
    assert done.file is not None
    return done.file.id


def _run(services: Services, batch_id: str) -> None:
    """Validate (already run) → Plan → every shard on the deterministic engine."""
    run_shards(services, batch_id, MODEL)


def _ids_of(data: bytes) -> list[str]:
    """The custom_ids of a written file, each line read back by the one decoder (valid UTF-8 JSONL)."""
    data.decode("utf-8")
    assert not data or data.endswith(b"\n")
    return [loads(line)["custom_id"] for line in data.split(b"\n")[:-1]]


def _file(services: Services, file_id: str | None) -> bytes:
    return b"" if file_id is None else b"".join(services.files.chunks(services.files.item("default", file_id)))


def _streamed(services: Services, batch_id: str, kind: str) -> bytes:
    result = partial_results(services, "default", batch_id, kind)
    assert not result.complete
    return b"".join(result.lines)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(st.lists(lines(), min_size=1, max_size=8), st.sampled_from([b"\n", b"\r\n"]), st.booleans(),
       st.booleans(), st.lists(st.integers(0, 8), max_size=2), st.booleans(), st.booleans())
def test_every_accepted_line_ends_exactly_once(services: Services, batch: list[Line], newline: bytes, bom: bool,
                                               one_byte_first_part: bool, blanks: list[int], twins: bool,
                                               clean: bool) -> None:
    if clean:  # the whole chain runs (a refused line ends the batch at validation)
        batch = [line for line in batch if not line.refused] or [Line(_request('"only"', '"hi"'), "only", False)]
    if twins:  # two custom_ids that are NFC/NFD forms of one text: two requests, each answered once
        n = next(_ids)
        batch += [Line(_request(json.dumps(cid), '"twin"'), cid, False)
                  for cid in (f"tw{n}-\u00e9", f"tw{n}-e\u0301")]
    body = [line.data for line in batch]
    for at in sorted(blanks, reverse=True):
        body.insert(min(at, len(body)), b"")  # blank lines: counted in the numbering, never requests
    payload = (b"\xef\xbb\xbf" if bom else b"") + newline.join(body) + newline
    numbers = [i for i, data in enumerate(body, 1) if data]
    file_id = _upload(services, payload, one_byte_first_part)
    batch_id = services.batches.create("default", CreateBatchRequest(
        input_file_id=file_id, endpoint=URL, completion_window="24h")).id
    inp = BatchTaskInput(batch_id=batch_id)
    refused = [n for n, line in zip(numbers, batch, strict=True) if line.refused]
    if not validate_batch(inp, services).valid:
        failed = services.batches.get("default", batch_id)
        assert failed.status == "failed" and failed.errors is not None
        assert sorted({e.line for e in failed.errors.data}) == refused  # each refused line, by its number
        assert all(e.code in ("invalid_encoding", "invalid_json_line") for e in failed.errors.data)
        return
    assert not refused, "Validate accepted a line no reader can carry"
    _run(services, batch_id)
    accepted = [line.custom_id for line in batch]
    # While the batch is still open, the partial results hold every line once (all have run).
    assert sorted(_ids_of(_streamed(services, batch_id, "output")) + _ids_of(_streamed(
        services, batch_id, "error"))) == sorted(accepted)
    assert finalize_batch(inp, services).status == "completed"
    done = services.batches.get("default", batch_id)
    out, err = _ids_of(_file(services, done.output_file_id)), _ids_of(_file(services, done.error_file_id))
    assert sorted(out + err) == sorted(accepted)
    assert sorted(err) == sorted(line.custom_id for line in batch if line.fails)
    assert done.request_counts.model_dump() == {"total": len(batch), "completed": len(out), "failed": len(err)}
    if not err:
        return
    again = retry_batch(services, "default", batch_id, RetryRequest(custom_ids=err))
    assert validate_batch(BatchTaskInput(batch_id=again.id), services).valid
    _run(services, again.id)
    assert finalize_batch(BatchTaskInput(batch_id=again.id), services).status == "completed"
    retried = services.batches.get("default", again.id)
    assert sorted(_ids_of(_file(services, retried.output_file_id)) + _ids_of(
        _file(services, retried.error_file_id))) == sorted(err)


@pytest.mark.parametrize("extra", [',"temperature":NaN', ',"user":"\\ud800"'])
def test_a_line_no_reader_can_carry_fails_the_batch_at_validation_and_it_ends(services: Services,
                                                                                extra: str) -> None:
    """The finding behind the rule: such a line used to pass Validate and wedge the batch in `finalizing`
    (every worker attempt raised encoding its id) with the tenant's slot held."""
    good = _request('"ok"', '"hi"')
    bad = _request('"a"', '"hi"', extra)
    file_id = _upload(services, good + b"\n" + bad + b"\n", False)
    batch_id = services.batches.create("default", CreateBatchRequest(
        input_file_id=file_id, endpoint=URL, completion_window="24h")).id
    assert not validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    batch = services.batches.get("default", batch_id)
    assert batch.status == "failed" and batch.errors is not None
    assert [(e.line, e.code) for e in batch.errors.data] in ([(2, "invalid_json_line")], [(2, "invalid_encoding")])


def test_any_line_loads_reads_it_reads_again_as_written(services: Services) -> None:
    """What the decoder accepts, the writer writes (no value is turned into another): the echo of a line."""
    for text in ["\x00", "e\u0301", "é", "😀", "\u2028", "\ufeff"]:
        value: Any = {"custom_id": text, "n": 123456789012345678901234567890}
        assert loads(json.dumps(value).encode()) == value


def test_a_bom_cut_across_the_first_chunks_is_stripped_as_a_whole_one() -> None:
    """An Upload's first part may be one byte: the BOM is dropped however the reads cut it (it was dropped only
    when the first chunk held all three bytes, so a batch read through its parts saw a different line 1)."""
    from nightbatch.jsonl import split_lines

    line = b'{"a":1}'
    for cuts in ([b"\xef", b"\xbb", b"\xbf" + line], [b"\xef\xbb", b"\xbf" + line], [b"\xef\xbb\xbf" + line],
                 [b"", b"\xef", b"\xbb\xbf", line]):
        [raw] = split_lines(cuts, max_bytes=100)
        assert (raw.data, raw.offset) == (line, 3)
    [raw] = split_lines([b"\xef\xbb"], max_bytes=100)  # not a BOM: kept (and refused as not JSON)
    assert raw.data == b"\xef\xbb"
