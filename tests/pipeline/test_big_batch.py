"""A 100k-line batch through validate → plan → finalize in flat memory (results written by the test, no engine)."""

from __future__ import annotations

import pytest

from bench.control_plane import measure


@pytest.mark.slow
def test_100k_lines_one_result_each_in_bounded_memory() -> None:
    [row] = measure([100_000])  # asserts total == completed == 100_000 (counts come from the files)
    assert row["ours_rss_mb"] < 256, row
