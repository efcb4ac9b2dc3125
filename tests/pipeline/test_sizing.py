"""The shard count: cold start amortised (<= 10 % by default), within max_gpus x shards_per_gpu and the window."""

from __future__ import annotations

import pytest

from nightbatch.pipeline.sizing import plan_shards
from nightbatch.settings import Settings

TOKENS_PER_LINE = 750  # ~500 prompt + ~250 output tokens


def settings(**overrides: object) -> Settings:
    return Settings.from_names({"mode": "local", **overrides})


@pytest.mark.parametrize(("lines", "shards"), [(1_000, 1), (100_000, 11), (1_000_000, 12)])
def test_defaults_for_1k_100k_1m_lines(lines: int, shards: int) -> None:
    s = settings()
    plan = plan_shards(lines * TOKENS_PER_LINE, segments=max(1, lines // 1000), settings=s,
                       window_seconds=24 * 3600)
    assert plan.shards == shards
    assert plan.fits_window
    if lines >= 100_000:  # enough work to amortise: the cold start stays under the share
        assert plan.cold_start_share <= s.pipeline.shard_cold_start_share + 1e-9
    assert plan.gpus == min(shards, s.pipeline.max_gpus)


def test_a_short_window_buys_parallelism_with_cold_starts() -> None:
    s = settings()
    relaxed = plan_shards(2_000_000, segments=50, settings=s, window_seconds=24 * 3600)
    assert relaxed.shards == 1  # 500 s of work: one cold start is cheapest
    tight = plan_shards(2_000_000, segments=50, settings=s, window_seconds=900)
    assert tight.shards > 1 and tight.wall_seconds <= 900 * (1 - s.pipeline.window_safety_share)
    assert tight.cold_start_share > relaxed.cold_start_share
    # Infeasible even on every GPU: capped, and says so.
    hopeless = plan_shards(10**9, segments=50, settings=s, window_seconds=3600)
    assert hopeless.shards == s.pipeline.max_gpus * s.pipeline.shards_per_gpu and hopeless.fits_window is False


def test_caps_and_fixed_target() -> None:
    s = settings(max_gpus=2, shards_per_gpu=2)
    assert plan_shards(10**10, segments=100, settings=s).shards == 4
    assert plan_shards(10**10, segments=3, settings=s).shards == 3  # never more shards than segments
    assert plan_shards(500, segments=10, settings=settings(shard_target_tokens=50)).shards == 10
    assert plan_shards(0, segments=1, settings=s).shards == 1
