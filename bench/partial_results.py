"""Partial results bench: memory and speed of one GET …/results read of a running batch, on moto in-process.

A batch of `--lines` finished result lines in checkpoints of `--per-checkpoint` lines over `--shards` shards
(every tenth line also written again by a zombie attempt, which the read must drop). The table shows the
lines and bytes streamed, the seconds, and the peak of Python allocations during the read (tracemalloc; moto's
stored objects were allocated before it, so they do not count), next to the bytes of the checkpoints.

    .venv/bin/python -m bench.partial_results --lines 200000
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc

from moto import mock_aws

from bench.control_plane_world import result_line
from nightbatch import layout
from nightbatch.aws import make_adapters
from nightbatch.aws.dynamo import create_table
from nightbatch.aws.records import BatchRecord
from nightbatch.results.partial import partial_results
from nightbatch.settings import Settings
from nightbatch.shards.spec import ShardItem, ShardSpec, write_manifest, write_shard
from nightbatch.wiring import build_services


class _Workflow:
    def start(self, batch_id: str) -> None: ...


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--per-checkpoint", type=int, default=2000)
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(k, "bench")
    os.environ.pop("AWS_ENDPOINT_URL", None)
    with mock_aws():
        settings = Settings(deployment={"mode": "local", "bucket": "bench", "table": "bench"})
        adapters = make_adapters(settings)
        adapters.client("s3").create_bucket(Bucket="bench")
        create_table(adapters.client("dynamodb"), "bench")
        services = build_services(adapters, _Workflow())
        batch_id = "batch_" + "b" * 32
        adapters.table.put_record(BatchRecord(
            pk=batch_id, tenant="default", status="in_progress", endpoint="/v1/chat/completions",
            input_file_id="file-x", completion_window="24h", created_at=int(time.time())))
        per_shard = args.lines // args.shards
        stored = 0
        items = []
        for s in range(args.shards):
            shard_id = f"{s:05d}"
            items.append(ShardItem(batch_id=batch_id, shard_id=shard_id))
            write_shard(adapters.blobs, ShardSpec(
                batch_id=batch_id, shard_id=shard_id, endpoint="/v1/chat/completions", model="m", segments=[],
                lines=per_shard))
            prefix = layout.results_prefix(batch_id, shard_id)
            for seq, start in enumerate(range(0, per_shard, args.per_checkpoint)):
                ids = [f"s{s}-r{i}" for i in range(start, min(start + args.per_checkpoint, per_shard))]
                data = b"".join(result_line(batch_id, c, n) for n, c in enumerate(ids))
                adapters.blobs.put_bytes(layout.checkpoint_key(prefix, seq, "a"), data)
                zombie = b"".join(result_line(batch_id, c, -1) for c in ids[::10])
                adapters.blobs.put_bytes(layout.checkpoint_key(prefix, seq, "f"), zombie)
                stored += len(data) + len(zombie)
        write_manifest(adapters.blobs, batch_id, items)
        tracemalloc.start()
        started = time.perf_counter()
        lines = size = 0
        for line in partial_results(services, "default", batch_id, "output").lines:
            lines += 1
            size += len(line)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    mib = 1024 * 1024
    print(f"{'lines':>10} {'streamed MiB':>13} {'checkpoints MiB':>16} {'seconds':>8} {'lines/s':>9} "
          f"{'peak alloc MiB':>15}")
    print(f"{lines:>10} {size / mib:>13.1f} {stored / mib:>16.1f} {seconds:>8.2f} {lines / seconds:>9.0f} "
          f"{peak / mib:>15.1f}")
    assert lines == per_shard * args.shards, "every line once: the zombie duplicates dropped"


if __name__ == "__main__":
    main()
