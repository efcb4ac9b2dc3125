"""The control-plane bench's world, none of it timed: S3 (moto's server in another process), the settings, the
input and result lines, a created batch, and the stand-in GPU workers writing each shard's checkpoints (the
worker's own policy and writer) and summaries.

What is measured, and how it is printed: bench/control_plane.py.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from nightbatch.settings import Settings

BUCKET = "bench-bucket"
TABLE = "bench-table"


def settings() -> Settings:
    return Settings(deployment={"mode": "local", "bucket": BUCKET, "table": TABLE},
                    validation={"max_requests_per_batch": 2_000_000, "max_input_bytes": 4 * 1024**3},
                    pipeline={"segment_max_lines": 5000, "shard_target_tokens": 2_500_000, "max_gpus": 16},
                    limits={"queued_requests": 0, "queued_tokens": 0})  # 0 = unlimited


def input_line(i: int) -> bytes:
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "SmolLM2-135M-Instruct", "max_tokens": 32,
        "messages": [{"role": "user", "content": f"Summarise document {i} in one sentence, please."}]}},
        separators=(",", ":")).encode() + b"\n"


def result_line(batch_id: str, custom_id: str, n: int) -> bytes:
    from nightbatch.ids import batch_request_id

    body = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1, "model": "SmolLM2-135M-Instruct",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"Document {n} is short."},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 21, "completion_tokens": 7, "total_tokens": 28}}
    return json.dumps({"id": batch_request_id(batch_id, custom_id), "custom_id": custom_id,
                       "response": {"status_code": 200, "request_id": f"req_{n}", "body": body}, "error": None},
                      separators=(",", ":")).encode() + b"\n"


def start_s3() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto server did not start")


def prepare(n: int) -> dict[str, Any]:
    """Uploads an n-line input, creates the batch (not timed)."""
    from nightbatch.aws import make_adapters
    from nightbatch.batches.request import CreateBatchRequest
    from nightbatch.wiring import build_services

    class NoWorkflow:
        def start(self, batch_id: str) -> None:
            pass

    s = settings()
    services = build_services(make_adapters(s), NoWorkflow())
    with tempfile.TemporaryFile() as tmp:
        for i in range(n):
            tmp.write(input_line(i))
        size = tmp.tell()
        tmp.seek(0)
        f = services.files.create("bench", filename="in.jsonl", purpose="batch", fileobj=tmp, size=size)
    b = services.batches.create("bench", CreateBatchRequest(input_file_id=f.id, endpoint="/v1/chat/completions",
                                                            completion_window="24h"))
    return {"batch_id": b.id, "file_key": f"files/{f.id}", "bytes": size}


# The stand-in workers' pace, in bytes of result lines a second per shard: about an 8B chat model on one GPU
# (~3k output tokens/s of ~4 bytes, plus each line's JSON). The checkpoint policy's time bounds run on this clock.
WORKER_BYTES_PER_SECOND = 20_000


def write_results(services: Any, batch_id: str, pace: float = WORKER_BYTES_PER_SECOND) -> None:
    """Stands in for the GPU workers: one result line per planned request, checkpointed by the worker's own
    policy and writer (gpu_worker.checkpoints: CheckpointPolicy, Checkpointer.write — each checkpoint, its
    summary, the progress samples) on a clock that advances `pace` bytes a second per shard (not timed)."""
    from nightbatch import layout

    try:
        from gpu_worker.checkpoints import Checkpointer, CheckpointPolicy
        from gpu_worker.results import ResultLine
    except ImportError:  # a baseline checkout from before the size policy (`--baseline`)
        _one_checkpoint_per_shard(services, batch_id)
        return
    blobs = services.adapters.blobs
    policy = CheckpointPolicy.from_settings(services.settings.worker)
    for item in json.loads(blobs.get_bytes(layout.manifest_key(batch_id)) or b"[]"):
        writer = Checkpointer(blobs=blobs, table=services.adapters.table, batch_id=batch_id,
                              prefix=layout.results_prefix(batch_id, item["shard_id"]), attempt="bec4", next_seq=0,
                              policy=policy)
        clock = last = 0.0
        buffer: list[Any] = []
        size = 0
        for number, custom_id in _planned_requests(blobs, batch_id, item["shard_id"]):
            data = result_line(batch_id, custom_id, number)
            clock += len(data) / pace
            buffer.append(line(ResultLine, custom_id, data, number))
            size += len(data)
            if policy.due(lines=len(buffer), nbytes=size, since=clock - last, first=not writer.objects):
                writer.write(buffer)
                buffer, size, last = [], 0, clock
        if buffer:
            try:
                writer.write(buffer, last=True)  # the shard's end: appended to the previous checkpoint
            except TypeError:  # a baseline checkout from before last lines were appended
                writer.write(buffer)
        blobs.put_bytes(layout.done_key(batch_id, item["shard_id"]), b"{}")


def line(kind: Any, custom_id: str, data: bytes, number: int) -> Any:
    """A worker's ResultLine (gpu_worker.results), with its input line number where the checkout has them."""
    try:
        return kind(custom_id, data, ok=True, input_tokens=21, output_tokens=7, number=number)
    except TypeError:  # a baseline checkout from before checkpoints were written in input order
        return kind(custom_id, data, ok=True, input_tokens=21, output_tokens=7)


def _one_checkpoint_per_shard(services: Any, batch_id: str) -> None:
    """The stand-in of a checkout from before the size policy: one checkpoint per shard, and its summary."""
    from nightbatch import layout

    try:  # a baseline checkout from before checkpoint summaries
        from nightbatch.results.lines import summarize_checkpoint
    except ImportError:
        summarize_checkpoint = None
    try:  # the summary's writer beside it, or in layout (a checkout from before results/lines.py held it)
        from nightbatch.results.lines import write_checkpoint_summary
    except ImportError:
        write_checkpoint_summary = getattr(layout, "write_checkpoint_summary", None)

    blobs = services.adapters.blobs
    for item in json.loads(blobs.get_bytes(layout.manifest_key(batch_id)) or b"[]"):
        key = layout.checkpoint_key(layout.results_prefix(batch_id, item["shard_id"]), 0, "bec4")
        data = bytearray()
        for number, custom_id in _planned_requests(blobs, batch_id, item["shard_id"]):
            data += result_line(batch_id, custom_id, number)
        etag = blobs.put_bytes(key, bytes(data))
        if summarize_checkpoint is not None:
            try:
                summary = summarize_checkpoint(bytes(data), etag=etag)
            except TypeError:  # a checkout from before summaries carried their checkpoint's ETag
                summary = summarize_checkpoint(bytes(data))
            assert summary is not None
            write_checkpoint_summary(blobs, key, summary)
        blobs.put_bytes(layout.done_key(batch_id, item["shard_id"]), b"{}")


def _planned_requests(blobs: Any, batch_id: str, shard_id: str) -> Iterator[tuple[int, str]]:
    """(line number, custom_id) of a planned shard, read as the worker of that checkout reads it."""
    from nightbatch import layout

    try:
        from nightbatch.shards.lines import shard_lines
        from nightbatch.shards.spec import read_shard
    except ImportError:  # a baseline from before the shards/ package
        try:
            from nightbatch.pipeline.shard_lines import shard_lines  # type: ignore[no-redef]
        except ImportError:  # a baseline from before byte-range shards: the lines were copied into segments
            from nightbatch.pipeline.segments import parse_segment_line  # type: ignore[attr-defined]

            shard = json.loads(blobs.get_bytes(layout.shard_key(batch_id, shard_id)) or b"{}")
            for segment in shard["segments"]:
                for raw in io.BytesIO(blobs.get_bytes(segment) or b""):
                    line = parse_segment_line(raw)
                    yield line.number, line.custom_id
            return
        read_shard = layout.read_shard  # type: ignore[attr-defined]
    spec = read_shard(blobs, batch_id, shard_id)
    assert spec is not None
    for line in shard_lines(blobs, spec):
        yield line.number, json.loads(line.raw)["custom_id"]
