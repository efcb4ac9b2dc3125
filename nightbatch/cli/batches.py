"""The batch commands, each a few calls of the stock OpenAI SDK: submit, status, list, cancel, results."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO, cast

import httpx
import openai
from openai.types import Batch, FileObject

from nightbatch.cli.connection import CommandError, connect, resolve_target
from nightbatch.cli.progress import follow
from nightbatch.cli.render import human_bytes, outcome, show

JSONL = "application/jsonl"


def _client(args: argparse.Namespace) -> openai.OpenAI:
    return connect(resolve_target(args.base_url, args.api_key))


def _human_stream(args: argparse.Namespace) -> TextIO:
    # With --json, stdout carries only the JSON; everything meant for people goes to stderr.
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def _say(stream: TextIO, text: str) -> None:
    stream.write(text + "\n")
    stream.flush()


def _ended_well(batch: Batch) -> int:
    return 0 if batch.status == "completed" else 1


def submit(args: argparse.Namespace) -> int:
    client = _client(args)
    out = _human_stream(args)
    path: Path = args.file
    size = path.stat().st_size
    endpoint = args.endpoint or endpoint_of(path)
    started = time.monotonic()
    uploaded = upload(client, path, size, part_size=args.part_size, out=out)
    took = time.monotonic() - started
    _say(out, f"Uploaded {path.name} ({human_bytes(size)}) as {uploaded.id} in {took:.1f}s")
    if getattr(args, "estimate", False):
        return _estimate(args, client, uploaded.id, endpoint, out)
    batch = client.batches.create(
        input_file_id=uploaded.id,
        # Typed as OpenAI's own lists; a nightbatch server answers other values with a clear 400.
        endpoint=cast(Any, endpoint),
        completion_window=cast(Any, args.window),
        metadata=dict(args.metadata) if args.metadata else openai.omit,
    )
    _say(out, f"Created batch {batch.id} ({batch.status})")
    if not args.wait:
        if args.json:
            print(batch.model_dump_json(indent=2))
        else:
            _say(out, f"  follow it:  nightbatch status {batch.id} --wait")
        return 0
    batch = follow(client, batch, interval=args.poll_interval, stream=out)
    return _finish(args, batch, out)


def _estimate(args: argparse.Namespace, client: openai.OpenAI, file_id: str, endpoint: str, out: TextIO) -> int:
    """The dry run: what a batch of the uploaded file would take; exit 0 when it is valid and fits its window."""
    est: dict[str, Any] = client.post("/nightbatch/estimate", cast_to=cast(Any, object), body={
        "input_file_id": file_id, "endpoint": endpoint, "completion_window": args.window})
    if args.json:
        print(json.dumps(est, indent=2))
    plan = est["shard_plan"]
    validity = "valid" if est["valid"] else f"{len(est['errors'])} errors"
    for line in (
        f"Requests     {est['requests']:,} ({validity})",
        f"Tokens       {est['input_tokens']:,} input + {est['expected_output_tokens']:,} output (approximate)",
        f"GPU time     {est['gpu_seconds'] / 3600:,.2f} GPU-hours on {est['instance_type']}",
        f"Cost         ${est['cost_usd']['spot']:,.4f} Spot / ${est['cost_usd']['on-demand']:,.4f} on-demand",
        f"Shards       {plan['shards']} on {plan['gpus']} GPUs, cold start {100 * plan['cold_start_share']:.0f} %"
        f" of GPU time, about {plan['wall_seconds'] / 3600:,.2f} h",
        f"Window       {args.window}: {'fits' if est['window_feasible'] else 'does NOT fit'}"
        f" (queue ahead {est['queue_ahead_seconds'] / 3600:,.2f} h)",
    ):
        _say(out, line)
    for err in est["errors"][:5]:
        _say(out, f"  line {err.get('line')}: {err['code']}: {err['message']}")
    return 0 if est["valid"] and est["window_feasible"] else 1


def _finish(args: argparse.Namespace, batch: Batch, out: TextIO) -> int:
    for line in outcome(batch):
        _say(out, line)
    if args.json:
        print(batch.model_dump_json(indent=2))
    return _ended_well(batch)


def endpoint_of(path: Path) -> str:
    """The `url` of the first request in the file, so `--endpoint` can be left out."""
    with path.open(encoding="utf-8-sig", errors="replace") as f:
        for line in itertools.islice(f, 1000):
            if not line.strip():
                continue
            try:
                url = json.loads(line).get("url")
            except (ValueError, AttributeError):
                url = None
            if isinstance(url, str) and url:
                return url
            break
    raise CommandError(f"cannot tell the endpoint from the first request in {path}; pass --endpoint")


def upload(client: openai.OpenAI, path: Path, size: int, *, part_size: int, out: TextIO) -> FileObject:
    """One `files.create` for small files; the Uploads API in parts above `part_size` (the ~4 MiB a request
    can carry through API Gateway and Lambda)."""
    if size > part_size:
        parts = math.ceil(size / part_size)
        _say(out, f"Uploading {path.name} ({human_bytes(size)}) in {parts} parts "
                  f"of {human_bytes(part_size)}...")
        try:
            done = client.uploads.upload_file_chunked(file=path, mime_type=JSONL, purpose="batch",
                                                      part_size=part_size)
        except openai.NotFoundError as e:
            if "/uploads" not in str(e.message):
                raise
            _say(out, "  this server has no Uploads API; sending the file in one request")
        else:
            if done.file is None:
                raise CommandError(f"upload {done.id} ended as {done.status} without a file")
            return done.file
    else:
        _say(out, f"Uploading {path.name} ({human_bytes(size)})...")
    with path.open("rb") as f:
        return client.files.create(file=f, purpose="batch")


def status(args: argparse.Namespace) -> int:
    client = _client(args)
    batch = client.batches.retrieve(args.batch_id)
    if args.wait:
        out = _human_stream(args)
        return _finish(args, follow(client, batch, interval=args.poll_interval, stream=out), out)
    if args.json:
        print(batch.model_dump_json(indent=2))
    else:
        show(sys.stdout, batch)
    return 0


def list_batches(args: argparse.Namespace) -> int:
    client = _client(args)
    # The SDK's page iterator follows `after` cursors by itself; stop after --limit batches.
    pages = client.batches.list(limit=min(args.limit, 100))
    batches = list(itertools.islice(pages, args.limit))
    if args.json:
        print(json.dumps([b.model_dump(mode="json") for b in batches], indent=2))
    elif batches:
        show(sys.stdout, batches=batches)
    else:
        _say(sys.stderr, "No batches yet. Create one with `nightbatch submit requests.jsonl`.")
    return 0


def cancel(args: argparse.Namespace) -> int:
    batch = _client(args).batches.cancel(args.batch_id)
    if args.json:
        print(batch.model_dump_json(indent=2))
    else:
        print(f"{batch.id}  {batch.status}")
    return 0


def results(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.partial:
        return _partial_results(args, client)
    batch = client.batches.retrieve(args.batch_id)
    file_id = batch.error_file_id if args.errors else batch.output_file_id
    if not file_id:
        which = "error" if args.errors else "output"
        hint = (f" Wait for it with `nightbatch status {batch.id} --wait`, or read what has finished so far "
                f"with `nightbatch results {batch.id} --partial`."
                if batch.status not in ("completed", "failed", "expired", "cancelled") else "")
        raise CommandError(f"{batch.id} is {batch.status} and has no {which} file.{hint}")
    with client.files.with_streaming_response.content(file_id) as response:
        written, lines = _write(args, response.iter_bytes())
    target = "stdout" if args.output is None else str(args.output)
    _say(sys.stderr, f"Wrote {lines:,} lines ({human_bytes(written)}) of {file_id} to {target}")
    return 0


def _partial_results(args: argparse.Namespace, client: openai.OpenAI) -> int:
    """GET /v1/nightbatch/batches/{id}/results: the lines finished so far (the final file once it ended).
    Streamed with httpx: the SDK has no streaming call for an endpoint of ours."""
    kind = "error" if args.errors else "output"
    url = f"{str(client.base_url).rstrip('/')}/nightbatch/batches/{args.batch_id}/results"
    with httpx.stream("GET", url, params={"kind": kind}, headers={"Authorization": f"Bearer {client.api_key}"},
                      timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=True) as response:
        if response.status_code != 200:
            response.read()
            raise CommandError(_error_message(response))
        written, lines = _write(args, response.iter_bytes())
        complete = response.headers.get("x-nightbatch-complete") == "true"
        status = response.headers.get("x-nightbatch-status", "?")
        truncated = response.headers.get("x-nightbatch-truncated") == "true"
    target = "stdout" if args.output is None else str(args.output)
    state = ("complete" if complete else f"so far; the batch is {status}"
             + (", and this deployment cut the read at its response limit" if truncated else ""))
    _say(sys.stderr, f"Wrote {lines:,} {kind} lines ({human_bytes(written)}, {state}) of {args.batch_id} "
                     f"to {target}")
    return 0


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"


def _write(args: argparse.Namespace, chunks: Iterator[bytes]) -> tuple[int, int]:
    """Chunks to stdout or to `-o FILE`; returns (bytes, lines) written."""
    written, lines = 0, 0
    if args.output is None:
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
            written, lines = written + len(chunk), lines + chunk.count(b"\n")
        sys.stdout.buffer.flush()
        return written, lines
    # Into a side file first: an interrupted download never looks like a complete one.
    partial = args.output.with_name(args.output.name + ".part")
    with partial.open("wb") as f:
        for chunk in chunks:
            f.write(chunk)
            written, lines = written + len(chunk), lines + chunk.count(b"\n")
    partial.replace(args.output)
    return written, lines
