"""The dashboard's tests use the shared API server (tests/conftest.py: `api_server`)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives the dashboard in headless chromium (-m browser)")
