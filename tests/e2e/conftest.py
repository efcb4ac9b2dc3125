"""The e2e tests use the session's one `nightbatch local`: the `local_stack` fixture (tests/support/local_stack.py);
the endpoint backend's tests (test_endpoint_backend.py) use the session's one `vllm serve` (`vllm_server`)."""

from collections.abc import Iterator

import pytest

from bench.vllm_server import VllmServer, chat_model_dir
from tests.support.local_stack import API_KEY, HOUR_SECONDS, LocalStack

__all__ = ["API_KEY", "HOUR_SECONDS", "LocalStack"]


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One real OpenAI-compatible vLLM server for the session (an online fleet's), stopped at its end."""
    server = VllmServer(model_dir=chat_model_dir(), log=tmp_path_factory.mktemp("vllm") / "vllm-serve.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
