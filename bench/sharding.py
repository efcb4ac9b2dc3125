"""Sharding bench: an input planned into 4 shards with and without prefix-aware placement, each shard run as
a separate GPU would run it (its prefix cache empty when it starts); prefix-cache hit rate and output tokens/s
side by side.

    .venv/bin/python -m bench.sharding                 # mixed and uniform inputs, 3 repeats
    .venv/bin/python -m bench.sharding --plan-only     # placement only (no engine): shared prompts per shard

Both placements go through the real Validate and Plan (S3 and DynamoDB: moto's server in another process):
"contiguous" with `plan_prefix_groups=0` (Plan splits the file in input order), "prefix-aware" with the
default groups (nightbatch/pipeline/prefixes.py, placement.py). Every shard runs through the worker's own
runner on one vLLM engine per input (bench/shard_host.py), its prefix cache reset before each shard: the
same cold start a shard gets on its own GPU, without paying a minute of engine start per shard here.

Output tokens/s is the batch's completion tokens over the summed running phases of its 4 shards (the GPU time
the shards took, one after another on this machine). Hit rate is cached prompt tokens over prompt tokens.
One warm-up shard is run and discarded first; the placements alternate who goes first across repeats; the
tables show medians with the min..max spread; the ratio is the median of the per-repeat ratios. Token
counts must be the same line by line under both placements (the run fails otherwise). No assertions on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.worker import compare_tokens, input_spec, loads, model_spec, write_inputs
from bench.worker import parse_args as worker_args
from bench.worker_sides import OurSide, RunResult
from nightbatch.settings import SETTINGS

SHARDS = 4
CONTIGUOUS, PREFIX_AWARE = "contiguous (input order)", "prefix-aware"
# plan_prefix_groups: 0 turns prefix-aware placement off; the other is the setting's default.
PLACEMENTS = {CONTIGUOUS: 0, PREFIX_AWARE: int(SETTINGS["plan_prefix_groups"].info.default)}


@dataclass
class BatchRun:
    """One placement's shards, run one after another."""

    results: list[RunResult]

    @property
    def out_tps(self) -> float:
        return sum(r.tokens()[1] for r in self.results) / sum(r.running_seconds for r in self.results)

    @property
    def hit_rate(self) -> float:
        prompt = sum(r.tokens()[0] for r in self.results)
        return sum(r.tokens()[2] for r in self.results) / prompt if prompt else 0.0

    def merged(self, label: str) -> RunResult:
        usage = {k: v for r in self.results for k, v in r.usage.items()}
        return RunResult(label, sum(r.running_seconds for r in self.results), 0.0, usage)


class ShardedSide(OurSide):
    """OurSide planning into SHARDS shards (fixed count), placement chosen per plan."""

    def __init__(self, spec: Any, workdir: Path, requests: int) -> None:
        super().__init__(spec, workdir)
        self.settings.pipeline.max_gpus = SHARDS
        self.settings.pipeline.shards_per_gpu = 1
        self.settings.pipeline.shard_target_tokens = 1  # the cap (SHARDS) decides the count
        # Enough segments to place (~4 a shard): a real batch has thousands of lines per segment.
        self.settings.pipeline.segment_max_lines = max(1, requests // (4 * SHARDS))
        self.file_ids: dict[Path, str] = {}

    def plan_sharded(self, input_path: Path, groups: int) -> tuple[str, list[dict[str, Any]]]:
        from bench.worker_sides import TENANT
        from nightbatch import layout
        from nightbatch.batches.request import CreateBatchRequest
        from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch

        self.settings.pipeline.plan_prefix_groups = groups
        services = self._services()
        if input_path not in self.file_ids:
            with input_path.open("rb") as f:
                self.file_ids[input_path] = services.files.create(
                    TENANT, filename=input_path.name, purpose="batch", fileobj=f,
                    size=input_path.stat().st_size).id
        batch = services.batches.create(TENANT, CreateBatchRequest(
            input_file_id=self.file_ids[input_path], endpoint="/v1/chat/completions", completion_window="24h"))
        inp = BatchTaskInput(batch_id=batch.id)
        if not validate_batch(inp, services).valid:
            raise RuntimeError(f"batch {batch.id} did not validate")
        plan = plan_batch(inp, services)
        blobs = self.adapters.blobs
        shards = [json.loads(blobs.get_bytes(layout.shard_key(batch.id, f"{i:05d}")) or b"{}")
                  for i in range(plan.shard_count)]
        return str(batch.id), shards


class Host:
    """bench/shard_host.py in a subprocess: one engine; each shard run on an emptied prefix cache."""

    def __init__(self, side: ShardedSide, spec: Any, log: Path) -> None:
        self.side = side
        self.log = log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.shard_host"], env=side.worker_env(spec),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def run(self, batch_id: str, shard_id: str, label: str) -> RunResult:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps({"batch_id": batch_id, "shard_id": shard_id}) + "\n")
        stdin.flush()
        report = read_report(stdout)
        if report is None:
            raise RuntimeError(f"the shard host ended without a report; see {self.log.name}")
        if not report.get("finished") or not report.get("prefix_cache_reset"):
            raise RuntimeError(f"shard not finished, or its prefix cache not reset: {report}")
        return RunResult(label, float(report["running_seconds"]), 0.0, self.side.results(batch_id, shard_id),
                         {"report": report, "load": os.getloadavg()[0]})

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait()
        self.log.close()


def read_report(stdout: IO[str]) -> dict[str, Any] | None:
    """The next ShardReport line (anything else a library prints on stdout is skipped); None at the end."""
    for line in stdout:
        if line.startswith('{"batch_id"'):
            report: dict[str, Any] = json.loads(line)
            return report
    return None


def shared_prompts_per_shard(side: ShardedSide, shards: list[dict[str, Any]]) -> list[int]:
    from nightbatch.shards.lines import shard_requests
    from nightbatch.shards.spec import ShardSpec

    out = []
    for shard in shards:
        systems = set()
        for req in shard_requests(side.adapters.blobs, ShardSpec.model_validate(shard)):
            first = req.body["messages"][0]
            if first["role"] == "system":
                systems.add(first["content"])
        out.append(len(systems))
    return out


def spread(xs: list[float], fmt: str = ".1f") -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}..{max(xs):{fmt}})"


def print_table(name: str, runs: dict[str, list[BatchRun]], repeat: int) -> list[float]:
    base, new = runs[CONTIGUOUS], runs[PREFIX_AWARE]
    ratios = [n.out_tps / b.out_tps for n, b in zip(new, base, strict=True)]
    print(f"\n### {name} input, {SHARDS} shards run one after another, prefix cache reset per shard; "
          f"median (min..max) of {repeat}\n")
    print("| placement | out tok/s | prefix-cache hit rate | running s (4 shards) | cached / prompt tokens |")
    print("|---|---:|---:|---:|---:|")
    for label, rs in runs.items():
        secs = [sum(r.running_seconds for r in b.results) for b in rs]
        prompt = statistics.median(sum(r.tokens()[0] for r in b.results) for b in rs)
        cached = statistics.median(sum(r.tokens()[2] for r in b.results) for b in rs)
        print(f"| {label} | {spread([r.out_tps for r in rs])} | {spread([100 * r.hit_rate for r in rs])} % "
              f"| {spread(secs)} | {cached:.0f} / {prompt:.0f} |")
    prefilled = {label: statistics.median(sum(r.tokens()[0] - r.tokens()[2] for r in b.results) for b in rs)
                 for label, rs in runs.items()}
    if prefilled[PREFIX_AWARE]:
        # Placement only changes which prompt tokens are prefilled; decoding is the same work on both sides.
        print(f"\n{name}: prompt tokens prefilled (not cached), contiguous / prefix-aware: "
              f"{prefilled[CONTIGUOUS]:.0f} / {prefilled[PREFIX_AWARE]:.0f} = "
              f"{prefilled[CONTIGUOUS] / prefilled[PREFIX_AWARE]:.2f}x, roughly the ceiling of the out tok/s gain "
              "(reached only if prefill took all the time)")
    print(f"\n{name}: prefix-aware / contiguous out tok/s **{statistics.median(ratios):.2f}x** "
          f"({min(ratios):.2f}..{max(ratios):.2f}) (goal >= 1.3x mixed, >= 0.97x uniform)")
    return ratios


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.sharding", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--plan-only", action="store_true", help="print the placements, run no engine")
    p.add_argument("--inputs", default="mixed,uniform", help="comma-separated: mixed, uniform, kv")
    p.add_argument("--requests", type=int, default=96, help="requests per input (24 a shard)")
    p.add_argument("--workdir", type=Path, default=None, help="keep inputs and logs here")
    ours, rest = p.parse_known_args(argv)
    # Anything else is bench/worker's: model, engine sizes, input shapes (--system-prompts, --kv-blocks, ...).
    return ours, worker_args(["--inputs", ours.inputs, "--requests", str(ours.requests), *rest])


def main(argv: list[str] | None = None) -> None:
    ours, args = parse_args(argv)
    workdir = ours.workdir or Path(tempfile.mkdtemp(prefix="bench-sharding-"))
    workdir.mkdir(parents=True, exist_ok=True)
    spec, _ = model_spec(args)
    inputs = write_inputs(args, workdir)
    load_before = os.getloadavg()
    print(f"model {spec.name}; engine args {spec.engine_args}; {args.requests} requests x {args.max_tokens} "
          f"output tokens; {SHARDS} shards; workdir {workdir}; load average {loads(load_before)}", flush=True)
    side = ShardedSide(spec, workdir, args.requests)
    failed = []
    try:
        for name, path in inputs.items():
            print(f"\n### {name} input, {SHARDS} shards: distinct shared system prompts per shard\n")
            print("| placement | shards | system prompts in each shard | est. tokens per shard |")
            print("|---|---:|---|---|")
            for label, groups in PLACEMENTS.items():
                _, shards = side.plan_sharded(path, groups)
                print(f"| {label} | {len(shards)} | {shared_prompts_per_shard(side, shards)} "
                      f"| {[s['est_tokens'] for s in shards]} |")
            if ours.plan_only:
                continue
            host = Host(side, input_spec(spec, args, name), workdir / f"host-{name}.log")
            try:
                batch_id, shards = side.plan_sharded(path, PLACEMENTS[CONTIGUOUS])
                warm = host.run(batch_id, shards[0]["shard_id"], f"{name}-warmup")
                print(f"  warm-up shard, discarded: running {warm.running_seconds:.1f} s", flush=True)
                runs: dict[str, list[BatchRun]] = {k: [] for k in PLACEMENTS}
                for i in range(ours.repeat):
                    for label in list(PLACEMENTS) if i % 2 == 0 else list(reversed(PLACEMENTS)):
                        batch_id, shards = side.plan_sharded(path, PLACEMENTS[label])
                        run = BatchRun([host.run(batch_id, s["shard_id"], f"{name}-{label}-{i}-{s['shard_id']}")
                                        for s in shards])
                        runs[label].append(run)
                        print(f"  {name} {label} #{i}: out tok/s {run.out_tps:.1f}, hit rate {run.hit_rate:.1%}, "
                              f"load average {os.getloadavg()[0]:.2f}", flush=True)
                    check = compare_tokens(runs[CONTIGUOUS][-1].merged(CONTIGUOUS),
                                           runs[PREFIX_AWARE][-1].merged(PREFIX_AWARE))
                    if check["mismatched"] or check["lines"] != args.requests:
                        failed.append(f"{name} #{i}: {check['mismatched']} of {check['lines']} lines differ")
                        print(f"  MISMATCH: {failed[-1]}", flush=True)
            finally:
                host.close()
            print_table(name, runs, ours.repeat)
    finally:
        side.close()
    print(f"\nload average (1, 5, 15 min) before {loads(load_before)}, after {loads(os.getloadavg())}; "
          f"{os.cpu_count()} CPUs; {ours.repeat} repeats after one warm-up shard; engine args {spec.engine_args}")
    if failed:
        print(f"FAILED: token counts differ between placements: {failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
