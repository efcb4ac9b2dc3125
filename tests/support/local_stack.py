"""One `nightbatch local` for the whole session, started as a user starts it; the e2e and the dashboard's
end-to-end browser test share it (registered in tests/conftest.py, so that a session starts one engine)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI

from bench.vllm_server import wait_serving
from nightbatch.local.aws import free_port

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-e2e-test-key"
# One "hour" of a completion window lasts this many seconds in the e2e stack, so `1h` batches expire in
# the test while `24h` ones (8 minutes) never do.
HOUR_SECONDS = 20
# The session stack serves SmolLM2 with this LoRA adapter (tests/support/lora.py) and allows multi-model
# batches: LoRA is enabled on the one SmolLM2 engine rather than started on a second one.
LORA_ADAPTER = "smollm2-random-lora"
# The session stack's engine schedules by priority, as `nightbatch local`'s does; a check run may set this variable to
# `fcfs` to start it first-come-first-served instead (the model's engine_args override, nightbatch/local/engines.py)
# and see tests/e2e/test_fair_sharing.py fail.
SCHEDULING_ENV = "NIGHTBATCH_E2E_SCHEDULING_POLICY"
# A bucket of "the user's" (the test that uses it creates it in the stack's embedded AWS) and the prefix under it that
# batches may copy their output to: the stack's allow-list, as cdk.json `userBuckets` makes it in AWS.
USER_BUCKET = "e2e-user-data"
USER_OUTPUT_PREFIX = f"s3://{USER_BUCKET}/results/"


@dataclass
class LocalStack:
    base_url: str
    api_key: str
    log: Path
    state: Path | None = None  # what `nightbatch local` records of itself (its embedded AWS endpoint, …)

    def client(self, **kw: object) -> OpenAI:
        return OpenAI(base_url=self.base_url, api_key=self.api_key, **kw)  # type: ignore[arg-type]

    @property
    def aws_endpoint_url(self) -> str:
        """The stack's embedded AWS (moto's server), as `nightbatch local` recorded it."""
        assert self.state is not None, "started without XDG_STATE_HOME"
        return str(json.loads(self.state.read_text())["aws_endpoint_url"])


@contextlib.contextmanager
def running_local(env: dict[str, str], log: Path, *args: str, stop_timeout: float) -> Iterator[LocalStack]:
    """`nightbatch local [args]` on a free port with `env`, ready to answer; stopped (SIGTERM, as a user's
    Ctrl-C or a service manager would, then its whole process group) when the block ends."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nightbatch", "local", *args, "--port", str(port)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_serving(proc, base_url, API_KEY, name="nightbatch local", timeout=120,
                     tail=lambda: log.read_text()[-4000:], interval=0.5)
        state = Path(env["XDG_STATE_HOME"]) / "nightbatch" / "local.json" if "XDG_STATE_HOME" in env else None
        yield LocalStack(base_url=base_url, api_key=API_KEY, log=log, state=state)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the stack may outlive it


def _models_with_adapter(adapter_dir: Path) -> list[dict[str, object]]:
    """The local models, SmolLM2 with a random LoRA adapter made (about 5 s) in a subprocess: the test
    process never imports torch for it."""
    subprocess.run([sys.executable, "-m", "tests.support.lora", str(adapter_dir)], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    from nightbatch.models.spec import LOCAL_MODELS
    from tests.support.lora import RANK

    models = [m.model_dump(exclude_defaults=True) for m in LOCAL_MODELS]
    models[0].update(lora_modules={LORA_ADAPTER: str(adapter_dir)}, max_lora_rank=RANK)
    policy = os.environ.get(SCHEDULING_ENV)
    if policy:
        models[0]["engine_args"] = {**models[0].get("engine_args", {}), "scheduling_policy": policy}
    return models


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    log = tmp_path_factory.mktemp("local") / "nightbatch-local.log"
    env = {**os.environ, "NIGHTBATCH_API_KEY": API_KEY, "NIGHTBATCH_HOUR_SECONDS": str(HOUR_SECONDS),
           "NIGHTBATCH_MODELS_JSON": json.dumps(_models_with_adapter(tmp_path_factory.mktemp("lora") / "adapter")),
           "NIGHTBATCH_MULTI_MODEL_BATCHES": "true",
           # State changes go to the embedded AWS's default bus, as in AWS (tests/e2e/test_state_change_events.py).
           "NIGHTBATCH_EVENT_BUS": "default",
           "NIGHTBATCH_WORKER_POLL_SECONDS": "1", "NIGHTBATCH_CHECKPOINT_EVERY_SECONDS": "1",
           "NIGHTBATCH_WORKER_DRAIN_SECONDS": "5", "PYTHONPATH": str(ROOT),
           "NIGHTBATCH_USER_INPUT_BUCKETS": USER_BUCKET, "NIGHTBATCH_USER_OUTPUT_PREFIXES": USER_OUTPUT_PREFIX,
           "XDG_STATE_HOME": str(tmp_path_factory.mktemp("state"))}
    env.pop("AWS_ENDPOINT_URL", None)
    with running_local(env, log, stop_timeout=60) as stack:
        yield stack
