"""The dashboard's tests share one live API per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.live_api import LiveApi, serve_live_api


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives the dashboard in headless chromium (-m browser)")


@pytest.fixture(scope="module")
def live_api() -> Iterator[LiveApi]:
    with serve_live_api("nb-test-dashboard") as api:
        yield api
