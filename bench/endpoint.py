"""Endpoint bench: a batch fed to an online server by nightbatch's endpoint backend, against a fixed-concurrency
dispatcher (what LiteLLM or a plain script does), measured by what they do to the online traffic and how much of the
server's spare throughput the batch takes.

    .venv/bin/python -m bench.endpoint                 # CPU here: SmolLM2-135M on one `vllm serve`, ~25 min
    .venv/bin/python -m bench.endpoint --duration 20 --warmup 5 --repeat 1 --batch-lines 400   # a quick check
    .venv/bin/python -m bench.endpoint --server-url http://10.0.3.7:8000 ...   # a server you run (vLLM)

One `vllm serve` of the chat model (bench/vllm_server.py: priority scheduling, `--max-num-seqs` as given, so that a
full server queues rather than slows every sequence) unless --server-url names one. Each repeat measures, in windows
of --duration seconds:
1. the online traffic alone: --rate short chats a second (open loop), their latency;
2. for each dispatcher, the batch alone: `python -m gpu_worker` on one planned shard of --batch-lines chats
   (NIGHTBATCH_BACKEND=endpoint: the production runner and engine), its tokens a second read from the server's own
   counter (vllm:generation_tokens_total) after --warmup seconds;
3. for each dispatcher, the batch with the online traffic: the same, plus the traffic; the batch's tokens a second
   are the server's generated tokens less the traffic's.
Dispatchers: `nightbatch` (AIMD admission, saturation from /metrics, lowest priority: the defaults) and `fixed-N`
(the same runner with concurrency pinned to N, no metrics, no priority).

It prints, per dispatcher, the online traffic's p50 and p95 latency with the batch over alone, and the batch's
throughput with the traffic as a share of its throughput alone: medians of the repeats with the min..max spread.
The S3 and DynamoDB of the runner are moto's server in another process (bench/worker_sides.py), on this machine:
the runner, moto and the server share its cores, as the report says. No assertions on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.endpoint_load import Window, measure
from bench.vllm_server import API_KEY, SERVED_NAME, VllmServer, chat_model_dir
from bench.worker_sides import OurSide
from nightbatch.models.spec import ModelSpec

MODEL = "bench-endpoint"
KEY_ENV = "BENCH_ENDPOINT_KEY"


@dataclass(frozen=True)
class Dispatcher:
    name: str
    env: dict[str, str]  # the runner's settings
    priority: bool  # whether its requests carry the endpoint's (lowest) priority


def dispatchers(fixed: int) -> list[Dispatcher]:
    pinned = {"NIGHTBATCH_ENDPOINT_MIN_CONCURRENCY": str(fixed), "NIGHTBATCH_ENDPOINT_MAX_CONCURRENCY": str(fixed),
              "NIGHTBATCH_ENDPOINT_INITIAL_CONCURRENCY": str(fixed), "NIGHTBATCH_ENDPOINT_METRICS_SECONDS": "0"}
    return [Dispatcher("nightbatch", {}, True), Dispatcher(f"fixed-{fixed}", pinned, False)]


def batch_lines(n: int, max_tokens: int) -> bytes:
    """The batch: chats asking for long answers, distinct prompts (no prefix cache between them)."""
    return b"".join(json.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": [
            {"role": "user", "content": f"Request {i}: write a short story about a lighthouse keeper number {i}."}]},
    }).encode() + b"\n" for i in range(n))


class Runner:
    """`python -m gpu_worker` on a fresh planned shard, on the endpoint, until stopped."""

    def __init__(self, side: OurSide, input_path: Path, spec: ModelSpec, dispatcher: Dispatcher, log: Path) -> None:
        batch_id = side.plan(input_path)
        env = {**side.worker_env(spec), "NIGHTBATCH_BATCH_ID": batch_id, "NIGHTBATCH_SHARD_ID": "00000",
               "NIGHTBATCH_BACKEND": "endpoint", KEY_ENV: API_KEY, **dispatcher.env}
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpu_worker"], env=env, stdout=subprocess.DEVNULL,
                                         stderr=err)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # it drains and flushes, as on a Spot notice
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the runner exited {self.proc.returncode} early (the batch too small for the "
                               f"windows?); see {self.log}:\n{self.log.read_text()[-2000:]}")


def spec_for(server_url: str, dispatcher: Dispatcher) -> ModelSpec:
    return ModelSpec.model_validate({"name": MODEL, "max_model_len": 2048, "endpoint": {
        "url": server_url + "/v1", "model": SERVED_NAME, "api_key_env": KEY_ENV,
        **({} if dispatcher.priority else {"priority": None})}})


def with_batch(side: OurSide, input_path: Path, server_url: str, dispatcher: Dispatcher, args: argparse.Namespace,
               workdir: Path, label: str, rate: float) -> Window:
    runner = Runner(side, input_path, spec_for(server_url, dispatcher), dispatcher, workdir / f"{label}.log")
    try:
        time.sleep(args.warmup)  # the runner starts, and its concurrency settles
        runner.check()
        window = measure(server_url, seconds=args.duration, rate=rate, max_tokens=args.online_max_tokens, tag=label)
        runner.check()
        return window
    finally:
        runner.stop()


def spread(values: list[float]) -> str:
    finite = [v for v in values if v == v]
    if not finite:
        return "n/a"
    return f"{statistics.median(finite):.2f} ({min(finite):.2f}..{max(finite):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.endpoint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-url", default="", help="a running vLLM server (http://host:port); default: start one")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="the started server's --max-num-seqs")
    parser.add_argument("--rate", type=float, default=1.0, help="online chats a second")
    parser.add_argument("--online-max-tokens", type=int, default=16)
    parser.add_argument("--batch-lines", type=int, default=3000)
    parser.add_argument("--batch-max-tokens", type=int, default=96)
    parser.add_argument("--fixed", type=int, default=32, help="the fixed dispatcher's concurrency")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds a window measures")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds a batch runs before its window")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-endpoint-"))
    server: VllmServer | None = None
    if not args.server_url:
        server = VllmServer(model_dir=chat_model_dir(), log=workdir / "vllm-serve.log",
                            extra_args=("--max-num-seqs", str(args.max_num_seqs)))
        print(f"starting vllm serve (max_num_seqs {args.max_num_seqs}) …", file=sys.stderr, flush=True)
        server.start()
    url = args.server_url.rstrip("/") or (server.url if server else "")
    input_path = workdir / "batch.jsonl"
    input_path.write_bytes(batch_lines(args.batch_lines, args.batch_max_tokens))
    side = OurSide(spec_for(url, dispatchers(args.fixed)[0]), workdir)
    results: dict[str, dict[str, list[float]]] = {}
    alone: dict[str, list[float]] = {"p50": [], "p95": []}
    try:
        for r in range(args.repeat):
            base = measure(url, seconds=args.duration, rate=args.rate, max_tokens=args.online_max_tokens,
                           tag=f"alone-{r}")
            assert base.interactive is not None
            p50, p95 = base.interactive.quantile(0.5), base.interactive.quantile(0.95)
            alone["p50"].append(p50)
            alone["p95"].append(p95)
            for d in dispatchers(args.fixed):
                batch_only = with_batch(side, input_path, url, d, args, workdir, f"{d.name}-alone-{r}", 0.0)
                mixed = with_batch(side, input_path, url, d, args, workdir, f"{d.name}-mixed-{r}", args.rate)
                assert mixed.interactive is not None
                row = results.setdefault(d.name, {k: [] for k in ("p50", "p95", "share", "alone_tps", "mixed_tps",
                                                                  "failed")})
                row["p50"].append(mixed.interactive.quantile(0.5) / p50)
                row["p95"].append(mixed.interactive.quantile(0.95) / p95)
                row["share"].append(mixed.batch_tokens_per_second / max(1e-9, batch_only.batch_tokens_per_second))
                row["alone_tps"].append(batch_only.batch_tokens_per_second)
                row["mixed_tps"].append(mixed.batch_tokens_per_second)
                row["failed"].append(float(mixed.interactive.failed))
            print(f"repeat {r + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    finally:
        side.close()
        if server is not None:
            server.stop()
    load = os.getloadavg()
    print(f"\nendpoint bench: {args.rate}/s online chats ({args.online_max_tokens} tokens), batch of "
          f"{args.batch_max_tokens}-token chats, {args.duration:.0f} s windows, {args.repeat} repeats; "
          f"server {url} (max_num_seqs {args.max_num_seqs if server else '?'}); {os.cpu_count()} cores, "
          f"load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}")
    print(f"online traffic alone: p50 {spread(alone['p50'])} s, p95 {spread(alone['p95'])} s")
    print(f"{'dispatcher':<14} {'p50 with/alone':>22} {'p95 with/alone':>22} {'batch share':>22} "
          f"{'batch alone tok/s':>22} {'online failed':>14}")
    for name, row in results.items():
        print(f"{name:<14} {spread(row['p50']):>22} {spread(row['p95']):>22} {spread(row['share']):>22} "
              f"{spread(row['alone_tps']):>22} {spread(row['failed']):>14}")
    print(f"(medians of {args.repeat} repeats, min..max; logs in {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
