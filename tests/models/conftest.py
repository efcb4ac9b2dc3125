"""Engine-argument tests build vLLM's AsyncEngineArgs for model paths that do not exist here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.hub import hub_not_offline


@pytest.fixture(autouse=True)
def _paths_are_not_resolved() -> Iterator[None]:
    with hub_not_offline():
        yield
