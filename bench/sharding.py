"""Sharding bench: the worker bench's mixed input planned into 4 shards with and without prefix-aware
placement, each shard run as a separate GPU would run it (its own worker process and engine, so the prefix
cache starts empty in every shard); prefix-cache hit rate and output tokens/s side by side.

    .venv/bin/python -m bench.sharding                 # engine runs: 2 placements x 4 shards x --repeat
    .venv/bin/python -m bench.sharding --plan-only     # placement only (no engine): shared prompts per shard

Output tokens/s is the batch's completion tokens over the summed running phases of its shards (the GPU time
the shards took, one after another on this machine). Hit rate is cached prompt tokens over prompt tokens.
Placements alternate order across repeats; medians with min..max spread; the ratio is the median of the
per-repeat ratios. The uniform input is run too when `--inputs` names it (it has no shared prefixes: the
goal there is "no worse").
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.worker import model_spec, write_inputs
from bench.worker import parse_args as worker_args
from bench.worker_sides import OurSide, RunResult

SHARDS = 4
PLACEMENTS = {"contiguous (input order)": "0", "prefix-aware": "8"}


@dataclass
class BatchRun:
    results: list[RunResult]

    @property
    def out_tps(self) -> float:
        return sum(r.tokens()[1] for r in self.results) / sum(r.running_seconds for r in self.results)

    @property
    def hit_rate(self) -> float:
        prompt = sum(r.tokens()[0] for r in self.results)
        return sum(r.tokens()[2] for r in self.results) / prompt if prompt else 0.0


class ShardedSide(OurSide):
    """OurSide planning into SHARDS shards (fixed count), placement chosen per run."""

    def __init__(self, spec: Any, workdir: Path) -> None:
        super().__init__(spec, workdir)
        self.settings.pipeline.max_gpus = SHARDS
        self.settings.pipeline.shards_per_gpu = 1
        self.settings.pipeline.shard_target_tokens = 1  # the cap (SHARDS) decides the count
        self.settings.pipeline.segment_max_lines = 25   # enough segments to place

    def plan_sharded(self, input_path: Path, groups: int) -> tuple[str, list[dict[str, Any]]]:
        from bench.worker_sides import TENANT
        from nightbatch.batches import CreateBatchRequest
        from nightbatch.pipeline import BatchTaskInput, layout, plan_batch, validate_batch

        self.settings.pipeline.plan_prefix_groups = groups
        services = self._services()
        with input_path.open("rb") as f:
            file_id = services.files.create(TENANT, filename=input_path.name, purpose="batch", fileobj=f,
                                            size=input_path.stat().st_size).id
        batch = services.batches.create(TENANT, CreateBatchRequest(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"))
        inp = BatchTaskInput(batch_id=batch.id)
        assert validate_batch(inp, services).valid
        plan = plan_batch(inp, services)
        blobs = self.adapters.blobs
        shards = [json.loads(blobs.get_bytes(layout.shard_key(batch.id, f"{i:05d}")) or b"{}")
                  for i in range(plan.shard_count)]
        return str(batch.id), shards

    def run_shard(self, batch_id: str, shard_id: str, label: str) -> RunResult:
        return self.run_planned(batch_id, shard_id, label)


def shared_prompts_per_shard(side: ShardedSide, shards: list[dict[str, Any]]) -> list[int]:
    from nightbatch.pipeline.segments import parse_segment_line

    out = []
    for shard in shards:
        systems = set()
        for key in shard["segments"]:
            for raw in (side.adapters.blobs.get_bytes(key) or b"").splitlines():
                first = parse_segment_line(raw).body["messages"][0]
                if first["role"] == "system":
                    systems.add(first["content"])
        out.append(len(systems))
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sharding", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--plan-only", action="store_true", help="print the placements, run no engine")
    p.add_argument("--inputs", default="mixed")
    p.add_argument("--requests", type=int, default=200)
    ours = p.parse_args()
    args = worker_args(["--inputs", ours.inputs, "--requests", str(ours.requests)])
    workdir = Path(tempfile.mkdtemp(prefix="bench-sharding-"))
    spec, _ = model_spec(args)
    inputs = write_inputs(args, workdir)
    side = ShardedSide(spec, workdir)
    try:
        for name, path in inputs.items():
            print(f"\n### {name} input, {SHARDS} shards: distinct shared system prompts per shard\n")
            print("| placement | shards | system prompts in each shard | est. tokens per shard |")
            print("|---|---:|---|---|")
            for label, groups in PLACEMENTS.items():
                _, shards = side.plan_sharded(path, int(groups))
                print(f"| {label} | {len(shards)} | {shared_prompts_per_shard(side, shards)} "
                      f"| {[s['est_tokens'] for s in shards]} |")
            if ours.plan_only:
                continue
            runs: dict[str, list[BatchRun]] = {k: [] for k in PLACEMENTS}
            for i in range(ours.repeat):
                order = list(PLACEMENTS) if i % 2 == 0 else list(reversed(PLACEMENTS))
                for label in order:
                    batch_id, shards = side.plan_sharded(path, int(PLACEMENTS[label]))
                    results = [side.run_shard(batch_id, s["shard_id"], f"{name}-{label[:6]}-{i}-{s['shard_id']}")
                               for s in shards]
                    runs[label].append(BatchRun(results))
                    print(f"  {label} #{i}: out tok/s {runs[label][-1].out_tps:.1f}, "
                          f"hit rate {runs[label][-1].hit_rate:.1%}", flush=True)
            base, new = runs["contiguous (input order)"], runs["prefix-aware"]
            ratios = [n.out_tps / b.out_tps for n, b in zip(new, base, strict=True)]
            print(f"\n### {name} input, {SHARDS} shards run one after another, cache reset per shard; "
                  f"median (min..max) of {ours.repeat}\n")
            print("| placement | out tok/s | prefix-cache hit rate |")
            print("|---|---:|---:|")
            for label, rs in runs.items():
                tps = [r.out_tps for r in rs]
                hits = [r.hit_rate for r in rs]
                print(f"| {label} | {statistics.median(tps):.1f} ({min(tps):.1f}..{max(tps):.1f}) "
                      f"| {statistics.median(hits):.1%} ({min(hits):.1%}..{max(hits):.1%}) |")
            print(f"\nprefix-aware / contiguous out tok/s: **{statistics.median(ratios):.2f}x** "
                  f"({min(ratios):.2f}..{max(ratios):.2f}) (goal >= 1.3x mixed, >= 0.97x uniform)")
    finally:
        side.close()


if __name__ == "__main__":
    main()
