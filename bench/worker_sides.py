"""The two sides of the worker bench: vLLM's `run_batch` as a subprocess, and our worker on one shard.

Both sides are timed the same two ways:
- whole process: from spawning the process to its exit (imports, engine start, run, shutdown);
- running phase: from the first request handed to the serving layer to the last result back. run_batch
  starts its tqdm bar immediately before it awaits all requests and closes it after the last one; with
  TQDM_SMOOTHING=0 the rate on its final line is the overall average, so the phase is n / rate (3 significant
  digits). Our runner records the same two instants and reports `running_seconds` in its ShardReport.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightbatch.models.spec import ModelSpec
from nightbatch.settings import Settings

BUCKET = "bench-worker"
TABLE = "bench-worker"
TENANT = "bench"
# vLLM's CPU defaults for a small box (gpu_worker/engines/vllm_args.py: CPU_ENV_DEFAULTS), applied to both sides alike.
CPU_ENV = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
BAR_RE = re.compile(r"Running batch: 100% Completed \| (\d+)/(\d+) \[[^,\]]*, *([\d.]+)(req/s|s/req)\]")


@dataclass
class Usage:
    status: int
    prompt: int
    completion: int
    cached: int


@dataclass
class RunResult:
    label: str
    running_seconds: float
    process_seconds: float
    usage: dict[str, Usage]
    detail: dict[str, Any] = field(default_factory=dict)

    def tokens(self) -> tuple[int, int, int]:
        """(prompt, completion, cached prompt) tokens over successful lines."""
        ok = [u for u in self.usage.values() if u.status == 200]
        return sum(u.prompt for u in ok), sum(u.completion for u in ok), sum(u.cached for u in ok)


def on_cpu_build() -> bool:
    """vllm-cpu (the local build) runs eagerly: our engine forces it, so run_batch is told the same."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def engine_env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TQDM_SMOOTHING": "0"}
    if on_cpu_build():
        for k, v in CPU_ENV.items():
            env.setdefault(k, v)
    return env


def cli_flags(engine_args: dict[str, Any]) -> list[str]:
    """`max_num_seqs=256` -> `--max-num-seqs 256`, True -> a bare flag, False -> `--no-...`."""
    flags: list[str] = []
    for key, value in engine_args.items():
        name = "--" + key.replace("_", "-")
        if value is True:
            flags.append(name)
        elif value is False:
            flags.append("--no-" + key.replace("_", "-"))
        else:
            flags += [name, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return flags


def usage_of(line: dict[str, Any]) -> Usage:
    response = line.get("response") or {}
    body = response.get("body") or {}
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Usage(status=int(response.get("status_code") or 0), prompt=int(usage.get("prompt_tokens") or 0),
                 completion=int(usage.get("completion_tokens") or 0), cached=int(details.get("cached_tokens") or 0))


def run_vllm_batch(spec: ModelSpec, model_dir: Path, input_path: Path, workdir: Path, label: str) -> RunResult:
    out = workdir / f"{label}.out.jsonl"
    log = workdir / f"{label}.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(input_path), "-o", str(out),
           "--model", str(model_dir), "--served-model-name", spec.name, "--dtype", spec.dtype,
           "--max-model-len", str(spec.max_model_len), "--disable-log-stats",
           *(["--enforce-eager"] if on_cpu_build() else []), *cli_flags(spec.engine_args)]
    load = os.getloadavg()[0]
    started = time.monotonic()
    with log.open("w") as f:
        code = subprocess.run(cmd, env=engine_env(), stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    process = time.monotonic() - started
    text = log.read_text(errors="replace")
    if code != 0:
        raise RuntimeError(f"run_batch exited {code}; see {log}:\n{text[-3000:]}")
    bars = BAR_RE.findall(text)
    if not bars:
        raise RuntimeError(f"no final progress line from run_batch in {log}")
    done, _total, rate, unit = bars[-1]
    running = int(done) / float(rate) if unit == "req/s" else int(done) * float(rate)
    usage = {}
    for raw in out.read_text().splitlines():
        line = json.loads(raw)
        usage[line["custom_id"]] = usage_of(line)
    return RunResult(label, running, process, usage, {"log": str(log), "load": load})


class OurSide:
    """moto's server in another process as S3 + DynamoDB; each run is a new batch through Validate and Plan
    (one shard), then `python -m gpu_worker` on it with the real vLLM engine."""

    def __init__(self, spec: ModelSpec, workdir: Path) -> None:
        from bench.control_plane_world import start_s3

        self.spec = spec
        self.workdir = workdir
        self.proc, self.url = start_s3()
        self.aws_env = {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        os.environ.update(self.aws_env)
        self.settings = Settings(
            deployment={"mode": "local", "bucket": BUCKET, "table": TABLE},
            serving={"models_json": json.dumps([spec.model_dump()])},
            # One shard whatever the size: the comparison is one engine against one engine.
            pipeline={"shard_target_tokens": 10**12, "max_gpus": 1},
            validation={"max_requests_per_batch": 10**7, "max_input_bytes": 10**11},
            limits={"queued_tokens": 0, "queued_requests": 0},
        )
        from nightbatch.aws import make_adapters
        from nightbatch.aws.dynamo import create_table

        self.adapters = make_adapters(self.settings)
        self.adapters.client("s3").create_bucket(Bucket=BUCKET)
        create_table(self.adapters.client("dynamodb"), TABLE)
        self.files: dict[Path, str] = {}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()

    def _services(self) -> Any:
        from nightbatch.wiring import build_services

        class NoWorkflow:
            def start(self, batch_id: str) -> None:
                pass

        return build_services(self.adapters, NoWorkflow())

    def plan(self, input_path: Path) -> str:
        """A new batch over the input, validated and planned into one shard; returns its id."""
        from nightbatch.batches.request import CreateBatchRequest
        from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch

        services = self._services()
        if input_path not in self.files:
            with input_path.open("rb") as f:
                self.files[input_path] = services.files.create(
                    TENANT, filename=input_path.name, purpose="batch", fileobj=f, size=input_path.stat().st_size).id
        batch = services.batches.create(TENANT, CreateBatchRequest(
            input_file_id=self.files[input_path], endpoint="/v1/chat/completions", completion_window="24h"))
        inp = BatchTaskInput(batch_id=batch.id)
        if not validate_batch(inp, services).valid:
            raise RuntimeError(f"batch {batch.id} did not validate: {services.batches.get(TENANT, batch.id)}")
        shards = plan_batch(inp, services).shard_count
        if shards != 1:
            raise RuntimeError(f"planned {shards} shards, expected one")
        return str(batch.id)

    def run(self, input_path: Path, label: str, overrides: dict[str, str], spec: ModelSpec | None = None) -> RunResult:
        return self.run_planned(self.plan(input_path), "00000", label, overrides, spec)

    def run_planned(self, batch_id: str, shard_id: str, label: str,
                    overrides: dict[str, str] | None = None, spec: ModelSpec | None = None) -> RunResult:
        """`python -m gpu_worker` on one planned shard: a fresh process and engine (an empty prefix cache).
        `spec` replaces the model's engine settings for this run (same name: the batch was planned for it)."""
        env = {**self.worker_env(spec), "NIGHTBATCH_BATCH_ID": batch_id, "NIGHTBATCH_SHARD_ID": shard_id,
               **(overrides or {})}
        log = self.workdir / f"{label}.log"
        load = os.getloadavg()[0]
        started = time.monotonic()
        with log.open("w") as err:
            proc = subprocess.run([sys.executable, "-m", "gpu_worker"], env=env, stdout=subprocess.PIPE,
                                  stderr=err, text=True, check=False)
        process = time.monotonic() - started
        if proc.returncode != 0:
            raise RuntimeError(f"worker exited {proc.returncode}; see {log}:\n{log.read_text()[-3000:]}")
        # The worker prints its ShardReport as one JSON line (metrics lines may follow it).
        reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"batch_id"')]
        if not reports:
            raise RuntimeError(f"no shard report on the worker's stdout; see {log}")
        report = reports[-1]
        if not report.get("finished"):
            raise RuntimeError(f"worker did not finish the shard: {report}")
        return RunResult(label, float(report["running_seconds"]), process, self.results(batch_id, shard_id),
                         {"report": report, "log": str(log), "load": load})

    def worker_env(self, spec: ModelSpec | None = None) -> dict[str, str]:
        """The environment `python -m gpu_worker` runs in: engine defaults, moto's endpoint, the model."""
        models_json = self.settings.serving.models_json if spec is None else json.dumps([spec.model_dump()])
        return {**engine_env(), **self.aws_env, "NIGHTBATCH_BUCKET": BUCKET, "NIGHTBATCH_TABLE": TABLE,
                "NIGHTBATCH_MODELS_JSON": models_json}

    def results(self, batch_id: str, shard_id: str = "00000") -> dict[str, Usage]:
        from nightbatch.layout import CHECKPOINT_RE, results_prefix
        from nightbatch.results.precedence import first_results

        blobs = self.adapters.blobs
        prefix = results_prefix(batch_id, shard_id)
        usage: dict[str, Usage] = {}
        seen: set[int] = set()
        for key in sorted(blobs.list_keys(prefix)):
            if CHECKPOINT_RE.match(key[len(prefix):]):
                for result in first_results(blobs, key, seen):
                    usage[result.summary.custom_id] = usage_of(json.loads(result.data))
        return usage
