"""The doctor's AWS tests: moto for what it models, with fake credentials and no endpoint override."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from moto import mock_aws

REGION = "us-east-1"


def fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # the session's moto server, if a test started it
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    fake_credentials(monkeypatch)
    with mock_aws():
        yield
