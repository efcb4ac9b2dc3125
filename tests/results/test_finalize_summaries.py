"""Finalize from checkpoint summaries (nightbatch.results.lines.CheckpointSummary) gives the same output and error
bytes, request counts and usage as Finalize parsing every line; checkpoints of 0.1.x (no
summary), mixed with new ones, finalize alike; a summary that does not match its checkpoint is not trusted."""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_worker.engines.base import EngineReply
from gpu_worker.results import result_line
from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.results import merge
from nightbatch.results.compose import MIN_PART_BYTES, Read
from nightbatch.results.lines import (
    CheckpointSummary,
    Tally,
    oversized_result_line,
    read_checkpoint_summary,
    summarize_checkpoint,
    write_checkpoint_summary,
)
from nightbatch.wiring import Services
from tests.support.pipeline_world import planned_shards

KINDS = ["chat", "responses", "embeddings", "no_usage", "bad_request", "server_error", "oversized"]


def reply(kind: str, n: int, pad: str = "") -> EngineReply | None:
    """An engine's answer of each shape a worker turns into a result line (None: the oversized line)."""
    if kind == "chat":
        return EngineReply(200, {"object": "chat.completion", "choices": [{"message": {"content": f"a{n}{pad}"}}],
                                 "usage": {"prompt_tokens": n, "completion_tokens": 2 * n, "total_tokens": 3 * n,
                                           "prompt_tokens_details": {"cached_tokens": n // 2},
                                           "completion_tokens_details": {"reasoning_tokens": n % 3}}})
    if kind == "responses":
        return EngineReply(200, {"object": "response", "output": [{"type": "message", "content": pad}],
                                 "usage": {"input_tokens": n + 1, "input_tokens_details": {"cached_tokens": 1},
                                           "output_tokens": n + 2, "output_tokens_details": {"reasoning_tokens": n},
                                           "total_tokens": 2 * n + 3}})
    if kind == "embeddings":
        return EngineReply(200, {"object": "list", "data": [{"embedding": [0.5, -1.25e-3], "index": 0}],
                                 "usage": {"prompt_tokens": n + 3, "total_tokens": n + 3}})
    if kind == "no_usage":
        return EngineReply(200, {"object": "chat.completion", "choices": []})
    if kind == "oversized":
        return None
    status = 400 if kind == "bad_request" else 500
    return EngineReply(status, {"error": {"message": f"no {n}", "type": "x", "param": None, "code": status}})


def worker_line(batch_id: str, custom_id: str, kind: str, n: int, pad: str = "") -> bytes:
    r = reply(kind, n, pad)
    if r is None:
        return oversized_result_line(batch_id, custom_id, 1 << 27)
    return result_line(batch_id, custom_id, f"req_{n}", r).data


class Sink:
    """Output or error file as bytes; a range is read through the merge's own reader."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add_range(self, source: str, start: int, end: int, read: Read) -> None:
        self.data += read(start, end)

    def add_bytes(self, data: bytes | memoryview) -> None:
        self.data += data

    def write(self, data: bytes) -> None:
        self.data += data


def merged(blobs: BlobStore, batch_id: str, shard_id: str) -> tuple[bytes, bytes, Tally, int]:
    out, err, tally, seen = Sink(), Sink(), Tally(), set[int]()
    merge.merge_shard(blobs, batch_id, shard_id, seen, out, err, tally)
    return bytes(out.data), bytes(err.data), tally, len(seen)


_shards = itertools.count()
line_spec = st.tuples(st.integers(0, 12), st.sampled_from(KINDS), st.integers(0, 40))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(checkpoints=st.lists(st.lists(line_spec, min_size=1, max_size=12), min_size=1, max_size=5),
       summarized=st.lists(st.booleans(), min_size=5, max_size=5), window=st.sampled_from([1, 90, 700, 1 << 20]),
       lying=st.integers(-1, 4))
def test_summaries_merge_as_parsing_does(services: Services, checkpoints: list[list[tuple[int, str, int]]],
                                         summarized: list[bool], window: int, lying: int) -> None:
    """Checkpoints as workers write them (every usage shape, errors, the oversized line, duplicates within and
    across checkpoints as a zombie attempt leaves them), merged with summaries for some, all or none of them,
    give the parsing path's bytes and counts. A summary whose size is off is ignored (the checkpoint parsed)."""
    blobs = services.adapters.blobs
    batch_id, shard_id = "batch_h", f"{next(_shards):05d}"
    prefix = layout.results_prefix(batch_id, shard_id)
    keys, etags = [], []
    for seq, lines in enumerate(checkpoints):
        key = layout.checkpoint_key(prefix, seq, "a1")
        etags.append(blobs.put_bytes(key, b"".join(worker_line(batch_id, f"c{cid}", kind, n + seq)
                                                   for cid, kind, n in lines)))
        keys.append(key)
    parsed = merged(blobs, batch_id, shard_id)
    for seq, key in enumerate(keys):
        summary = summarize_checkpoint(blobs.get_bytes(key) or b"", etag=etags[seq])
        assert summary is not None
        if seq == lying:
            summary.size += 1
        if summarized[seq]:
            write_checkpoint_summary(blobs, key, summary)
    with mock.patch.object(merge, "WINDOW_BYTES", window), mock.patch.object(merge, "PARSE_BELOW", 0):
        assert merged(blobs, batch_id, shard_id) == parsed


def test_a_summary_of_another_version_or_unreadable_is_not_used(services: Services) -> None:
    blobs = services.adapters.blobs
    key = layout.checkpoint_key(layout.results_prefix("b", "1"), 0, "ab")
    data = worker_line("b", "x", "chat", 3) + worker_line("b", "y", "bad_request", 1)
    blobs.put_bytes(key, data)
    # Version 1 as 0.2 writes it, frozen: a later release must still read it.
    v1 = (b'{"version":1,"size":%d,"custom_ids":["x","y"],"lengths":[%d,%d],"failed":[1],"input_tokens":3,'
          b'"cached_tokens":1,"output_tokens":6,"reasoning_tokens":0}'
          % (len(data), len(data.split(b"\n")[0]) + 1, len(data.split(b"\n")[1]) + 1))
    blobs.put_bytes(layout.checkpoint_summary_key(key), v1)
    assert read_checkpoint_summary(blobs, key) == summarize_checkpoint(data, etag="")
    blobs.put_bytes(layout.checkpoint_summary_key(key), v1.replace(b'"version":1', b'"version":2'))
    assert read_checkpoint_summary(blobs, key) is None
    blobs.put_bytes(layout.checkpoint_summary_key(key), v1[:-5])
    assert read_checkpoint_summary(blobs, key) is None
    assert not layout.is_checkpoint(layout.results_prefix("b", "1"), layout.checkpoint_summary_key(key))


def test_odd_checkpoints_get_no_summary() -> None:
    line = worker_line("b", "x", "chat", 3)
    assert summarize_checkpoint(line, etag="") is not None
    for odd in (b"", line[:-1], line[:-1] + b"\r\n", line + b"\n", b"\n" + line, line + line[:-1]):
        assert summarize_checkpoint(odd, etag="") is None


class Reads:
    """Bytes Finalize reads from checkpoint objects, and the checkpoints it streams through the parser."""

    def __init__(self, blobs: BlobStore) -> None:
        self.ranged = 0
        self.parsed: list[str] = []
        get_range, ahead = blobs.get_range, blobs.iter_chunks_ahead

        def counted_range(key: str, start: int, end: int) -> bytes:
            self.ranged += end - start
            return get_range(key, start, end)

        def counted_ahead(key: str, **kw: Any) -> Any:
            self.parsed.append(key)
            return ahead(key, **kw)

        self.patches = [mock.patch.object(blobs, "get_range", counted_range),
                        mock.patch.object(blobs, "iter_chunks_ahead", counted_ahead)]

    def __enter__(self) -> Reads:
        for p in self.patches:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.patches:
            p.stop()


def test_finalize_from_summaries_matches_finalize_by_parsing(services: Services) -> None:
    """A whole batch, finalized three times: every checkpoint with a summary, some without (a batch the
    workers of 0.1.x began), none: the same output lines (in another order: a parsed line joins a
    merged part, a summarized run is copied where it stands), the same error bytes, request_counts and usage.
    With summaries no checkpoint is parsed and only part of their bytes is read."""
    n = 600
    batch_id, shards = planned_shards(services, n, segment_max_lines=300, shard_target_tokens=6_000)
    assert len(shards) > 1
    inp = BatchTaskInput(batch_id=batch_id)
    blobs = services.adapters.blobs
    keys: list[str] = []
    pad = "p" * 100_000  # lines of ~100 KB: runs of lines between errors pass S3's 5 MiB part floor
    for shard_id, ids in shards:
        objects: list[list[bytes]] = [[], [], []]
        for j, cid in enumerate(ids):
            kind = KINDS[j] if j < len(KINDS) else ["chat", "responses", "embeddings"][j % 3]
            objects[0 if j < len(ids) * 0.8 else 1 + j % 2].append(worker_line(batch_id, cid, kind, j, pad))
        # A zombie attempt's duplicates (read after object 0: they lose), an error among them.
        objects[2][:0] = [worker_line(batch_id, ids[0], "chat", 999, "zombie"),
                          worker_line(batch_id, ids[1], "server_error", 998)]
        prefix = layout.results_prefix(batch_id, shard_id)
        for k, lines in enumerate(objects):
            key = layout.checkpoint_key(prefix, k, "a")
            etag = blobs.put_bytes(key, b"".join(lines))
            write_checkpoint_summary(blobs, key, summarize_checkpoint(b"".join(lines), etag=etag) or
                                     CheckpointSummary(size=-1, custom_ids=[], lengths=[]))
            keys.append(key)
        blobs.put_bytes(layout.done_key(batch_id, shard_id), b"{}")

    def finalize() -> tuple[list[bytes], bytes | None, dict[str, Any], dict[str, Any]]:
        services.adapters.table.update(batch_id, set_={"status": "finalizing", "finalize_target": "completed"})
        assert finalize_batch(inp, services).status == "completed"
        batch = services.batches.get("default", batch_id)
        assert batch.usage is not None
        out = blobs.get_bytes(layout.output_key(batch_id)) or b""
        return (sorted(out.splitlines(keepends=True)), blobs.get_bytes(layout.error_key(batch_id)),
                batch.request_counts.model_dump(), batch.usage.model_dump())

    gets: list[str] = []
    blobs.client.meta.events.register("before-parameter-build.s3.GetObject",
                                      lambda params, **_: gets.append(params["Key"]), unique_id="finalize-gets")
    with Reads(blobs) as reads:
        summarized = finalize()
    blobs.client.meta.events.unregister("before-parameter-build.s3.GetObject", unique_id="finalize-gets")
    total = sum(len(blobs.get_bytes(k) or b"") for k in keys)
    assert reads.parsed == [] and 0 < reads.ranged < total - 2 * MIN_PART_BYTES  # parts copied, never read
    # Every line has a result: the manifest's line counts say so, and no shard spec is read.
    assert gets and not {layout.shard_key(batch_id, shard_id) for shard_id, _ in shards} & set(gets)
    out, err, counts, usage = summarized
    assert sum(map(len, out)) > 2 * MIN_PART_BYTES and err is not None
    assert counts["total"] == n and counts["failed"] > 0
    assert usage["input_tokens"] > 0 and usage["output_tokens_details"]["reasoning_tokens"] > 0
    for key in keys[::2]:  # 0.1.x's checkpoints, mixed with new ones
        blobs.delete(layout.checkpoint_summary_key(key))
    assert finalize() == summarized
    for key in keys[1::2]:
        blobs.delete(layout.checkpoint_summary_key(key))
    with Reads(blobs) as reads:
        assert finalize() == summarized
    assert sorted(reads.parsed) == sorted(keys)


def test_a_summary_is_checked_against_its_checkpoint_not_trusted(services: Services,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary that names other custom_ids than its checkpoint holds (a checkpoint rewritten after it, a bug)
    must not drop the lines the partial results served: its ETag is not the listed one, so Finalize parses."""
    monkeypatch.setattr(merge, "PARSE_BELOW", 0)  # summaries read however small the checkpoint
    blobs = services.adapters.blobs
    batch_id, shard_id = "batch_etag", f"{next(_shards):05d}"
    key = layout.checkpoint_key(layout.results_prefix(batch_id, shard_id), 0, "a1")
    data = worker_line(batch_id, "x", "chat", 3) + worker_line(batch_id, "y", "chat", 4)
    etag = blobs.put_bytes(key, data)
    good = summarize_checkpoint(data, etag=etag)
    assert good is not None and good.etag == etag
    wrong = msgspec.structs.replace(good, custom_ids=["x", "x"], etag='"0123456789abcdef0123456789abcdef"')
    write_checkpoint_summary(blobs, key, wrong)
    out, _, tally, seen = merged(blobs, batch_id, shard_id)
    assert out == data and tally.completed == 2 and seen == 2
    write_checkpoint_summary(blobs, key, good)  # the true one is used (and agrees)
    assert merged(blobs, batch_id, shard_id)[0] == data


def test_a_small_checkpoint_is_parsed_its_summary_unread(services: Services) -> None:
    """Under PARSE_BELOW bytes (an attempt's first checkpoint) a checkpoint is parsed, its summary not fetched:
    its bytes are read anyway, the summary would be one more GET; the lines and counts are the same."""
    blobs = services.adapters.blobs
    batch_id, shard_id = "batch_small", f"{next(_shards):05d}"
    prefix = layout.results_prefix(batch_id, shard_id)
    small, big = layout.checkpoint_key(prefix, 0, "a1"), layout.checkpoint_key(prefix, 1, "a1")
    datas = {small: worker_line(batch_id, "x", "chat", 3) + worker_line(batch_id, "y", "bad_request", 1),
             big: b"".join(worker_line(batch_id, f"z{i}", "chat", i, "p" * 2_000) for i in range(80))}
    assert len(datas[small]) < merge.PARSE_BELOW <= len(datas[big])
    for key, data in datas.items():
        summary = summarize_checkpoint(data, etag=blobs.put_bytes(key, data))
        assert summary is not None
        write_checkpoint_summary(blobs, key, summary)
    got: list[str] = []
    get_bytes = blobs.get_bytes

    def counted(key: str) -> bytes | None:
        got.append(key)
        return get_bytes(key)

    with Reads(blobs) as reads, mock.patch.object(blobs, "get_bytes", counted):
        out, err, tally, seen = merged(blobs, batch_id, shard_id)
    assert got == [layout.checkpoint_summary_key(big)] and reads.parsed == [small]
    assert seen == 82 and (tally.completed, tally.failed) == (81, 1)
    assert sorted(out.splitlines()) == sorted(datas[small].splitlines()[:1] + datas[big].splitlines())
    assert err == datas[small].splitlines(keepends=True)[1]
