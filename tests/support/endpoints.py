"""Each test that runs the endpoint engine starts with no endpoint known to the process (their admission windows are
shared per URL: gpu_worker/engines/endpoint_engine.py), and leaves none behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_worker.engines import endpoint_engine


@pytest.fixture
def fresh_endpoints() -> Iterator[None]:
    endpoint_engine._endpoints.clear()
    yield
    endpoint_engine._endpoints.clear()
