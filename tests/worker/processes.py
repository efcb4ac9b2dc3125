"""Worker subprocesses for the crash tests: `python -m gpu_worker` against the loopback moto server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nightbatch.local.aws import FAKE_CREDENTIALS

from .conftest import ShardWorld

ROOT = Path(__file__).resolve().parents[2]
DETERMINISTIC = "tests.support.deterministic_engine:DeterministicEngine"


def worker_env(world: ShardWorld, **overrides: str) -> dict[str, str]:
    s = world.settings
    assert world.adapters.endpoint_url, "worker subprocesses need a moto server, not mock_aws"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTBATCH_", "AWS_"))}
    env.update(FAKE_CREDENTIALS)
    env.update({
        "AWS_ENDPOINT_URL": world.adapters.endpoint_url, "AWS_DEFAULT_REGION": s.region,
        "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
        "NIGHTBATCH_BUCKET": s.bucket, "NIGHTBATCH_TABLE": s.table, "NIGHTBATCH_REGION": s.region,
        "NIGHTBATCH_BATCH_ID": world.batch_id, "NIGHTBATCH_SHARD_ID": world.shard_id,
        "NIGHTBATCH_CHECKPOINT_EVERY_LINES": "8", "NIGHTBATCH_CHECKPOINT_EVERY_SECONDS": "0.3",
        "NIGHTBATCH_MAX_IN_FLIGHT": "4", "NIGHTBATCH_WORKER_POLL_SECONDS": "0.2",
        "NIGHTBATCH_WORKER_DRAIN_SECONDS": "5",
    })
    env.update(overrides)
    return env


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path
    started: float

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> bool:
        """SIGKILLs the worker and anything it spawned (vLLM's engine core), as losing the host would;
        True if it was still running."""
        was_alive = self.alive()
        if was_alive:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return was_alive

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"worker still running after {timeout} s; log:\n{self.stderr()}") from None

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def spawn(env: dict[str, str], log: Path, *, engine: str = DETERMINISTIC) -> Worker:
    out = log.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_worker", "--engine", engine], env=env, cwd=ROOT,
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )
    out.close()
    return Worker(proc=proc, log=log, started=time.monotonic())


def checkpoints_reach(world: ShardWorld, count: int) -> Callable[[], bool]:
    return lambda: len(world.checkpoint_keys()) >= count


def wait_until(condition: Callable[[], bool], worker: Worker, *, timeout: float, every: float = 0.01) -> bool:
    """Polls until `condition` holds (True) or the worker exits or time runs out (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if not worker.alive():
            return False
        time.sleep(every)
    return False
