"""Worker subprocesses for the crash tests: `python -m gpu_worker` against the loopback moto server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightbatch.local.aws import FAKE_CREDENTIALS

from .conftest import ShardWorld

ROOT = Path(__file__).resolve().parents[2]
DETERMINISTIC = "tests.support.deterministic_engine:DeterministicEngine"


def worker_env(world: ShardWorld, **overrides: str) -> dict[str, str]:
    s = world.settings.deployment
    assert world.adapters.endpoint_url, "worker subprocesses need a moto server, not mock_aws"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTBATCH_", "AWS_"))}
    env.update(FAKE_CREDENTIALS)
    env.update({
        "AWS_ENDPOINT_URL": world.adapters.endpoint_url, "AWS_DEFAULT_REGION": s.region,
        "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
        "NIGHTBATCH_BUCKET": s.bucket, "NIGHTBATCH_TABLE": s.table, "NIGHTBATCH_REGION": s.region,
        "NIGHTBATCH_BATCH_ID": world.batch_id, "NIGHTBATCH_SHARD_ID": world.shard_id,
        # The first checkpoint after 8 lines, then one per ~4 KB (a few lines): many checkpoints to kill between.
        "NIGHTBATCH_CHECKPOINT_EVERY_LINES": "8", "NIGHTBATCH_CHECKPOINT_EVERY_SECONDS": "0.3",
        "NIGHTBATCH_CHECKPOINT_BYTES": "4096",
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


def spawn(env: dict[str, str], log: Path, *, engine: str = DETERMINISTIC, argv: list[str] | None = None) -> Worker:
    """`python -m gpu_worker --engine <engine>`, or exactly `argv` (the job definition's command)."""
    out = log.open("ab")
    proc = subprocess.Popen(
        argv or [sys.executable, "-m", "gpu_worker", "--engine", engine], env=env, cwd=ROOT,
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )
    out.close()
    return Worker(proc=proc, log=log, started=time.monotonic())


def checkpoints_reach(world: ShardWorld, count: int) -> Callable[[], bool]:
    return lambda: len(world.checkpoint_keys()) >= count


def engine_ready(worker: Worker) -> Callable[[], bool]:
    """The worker's engine said it is ready (the vLLM engine prints `<model> ready in <s> s`)."""
    return lambda: " ready in " in worker.log.read_text(errors="replace")


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


def job_definition_launch(template: dict[str, Any], world: ShardWorld, *, model: str, model_cache: Path,
                          ) -> tuple[list[str], dict[str, str]]:
    """The command and environment a Batch job of the synthesized stack starts the container with.

    Read from the template and the image, not copied by hand: the Dockerfile's ENTRYPOINT plus the job
    definition's Command; the job definition's Environment (its Refs to the stack's bucket and table pointed at
    this world's), plus the state machine's per-shard overrides. Stand-ins for what only AWS provides: moto's
    endpoint and fake credentials for the task role, a temporary directory for the host's model-cache mount,
    and the deterministic engine for vLLM on a GPU (NIGHTBATCH_WORKER_ENGINE, the worker's own setting).
    """
    from tests.infra.cfn import PSEUDO, one_of_type, resolve

    entrypoint = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", (ROOT / "gpu_worker" / "Dockerfile").read_text(),
                           flags=re.MULTILINE)
    assert entrypoint is not None
    _, job = one_of_type(template, "AWS::Batch::JobDefinition", prefix="GpuJob" + re.sub(r"[^A-Za-z0-9]", "", model))
    container = job["Properties"]["ContainerProperties"]
    argv = [*json.loads(entrypoint.group(1)), *container.get("Command", [])]
    assert argv[0] in ("python3", "python")
    argv[0] = sys.executable  # the image's interpreter

    refs = {one_of_type(template, "AWS::S3::Bucket")[0]: world.settings.deployment.bucket,
            one_of_type(template, "AWS::DynamoDB::GlobalTable")[0]: world.settings.deployment.table}
    job_env = {e["Name"]: str(resolve(e["Value"], refs, lambda logical, attr: f"{logical}.{attr}"))
               for e in container["Environment"]}
    _, machine = one_of_type(template, "AWS::StepFunctions::StateMachine")
    definition = json.loads(resolve(machine["Properties"]["DefinitionString"], _Names(), lambda lid, a: lid))
    overrides = definition["States"]["Shards"]["ItemProcessor"]["States"]["RunShard"]["Parameters"][
        "ContainerOverrides"]["Environment"]
    item = {"$.batch_id": world.batch_id, "$.shard_id": world.shard_id}
    job_env.update({o["Name"]: item[o["Value.$"]] if "Value.$" in o else o["Value"] for o in overrides})

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTBATCH_", "AWS_"))}
    env.update(FAKE_CREDENTIALS)
    env.update({"AWS_ENDPOINT_URL": world.adapters.endpoint_url or "", "AWS_DEFAULT_REGION": PSEUDO["AWS::Region"],
                "AWS_BATCH_JOB_ID": "job-definition-test", "PYTHONPATH": str(ROOT)})
    # The host volume's mount point in the container (model and compile caches) becomes a local directory.
    mounts = [m["ContainerPath"] for m in container.get("MountPoints", [])]
    assert mounts and job_env["NIGHTBATCH_MODEL_CACHE"].startswith(tuple(mounts))
    for name, value in job_env.items():
        for mount in mounts:
            if value == mount or value.startswith(mount + "/"):
                job_env[name] = str(model_cache) + value[len(mount):]
    env.update(job_env)
    env["NIGHTBATCH_WORKER_ENGINE"] = DETERMINISTIC
    return argv, env


class _Names(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return key
