"""The sharding bench's bookkeeping (bench/sharding.py, bench/shard_host.py) on the deterministic engine: both
placements through the real Validate and Plan into 4 shards, every shard run by the shard host's loop, the
lines counted once, the same token counts under both placements. Nothing is timed and no vLLM runs here."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.shard_host import serve
from bench.sharding import (
    CONTIGUOUS,
    PLACEMENTS,
    PREFIX_AWARE,
    SHARDS,
    BatchRun,
    ShardedSide,
    parse_args,
    print_table,
    read_report,
    shared_prompts_per_shard,
)
from bench.worker import compare_tokens, write_inputs
from bench.worker_sides import RunResult, Usage
from nightbatch.models.spec import ModelSpec
from nightbatch.settings import get_settings

ENGINE = "tests.support.deterministic_engine:DeterministicEngine"
AWS_KEYS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


@pytest.fixture
def side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ShardedSide]:
    for key in AWS_KEYS:  # OurSide points this process at its moto server; restored after the test
        monkeypatch.setenv(key, os.environ.get(key, "unset"))
    spec = ModelSpec(name="SmolLM2-135M-Instruct", source=str(tmp_path / "no-weights"))
    s = ShardedSide(spec, tmp_path, requests=96)
    try:
        yield s
    finally:
        s.close()


def run_on_host(side: ShardedSide, batch_id: str, shards: list[dict[str, object]],
                monkeypatch: pytest.MonkeyPatch) -> BatchRun:
    """The shard host's loop in this process, on the deterministic engine, as bench/sharding.py drives it."""
    for key, value in {**side.worker_env(), "NIGHTBATCH_WORKER_ENGINE": ENGINE}.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    out = io.StringIO()
    try:
        asyncio.run(serve([json.dumps({"batch_id": batch_id, "shard_id": s["shard_id"]}) for s in shards], out))
    finally:
        get_settings.cache_clear()
    reports = []
    stream = io.StringIO(out.getvalue())
    while (report := read_report(stream)) is not None:
        reports.append(report)
    assert [r["shard_id"] for r in reports] == [s["shard_id"] for s in shards]
    assert all(r["finished"] for r in reports)
    assert not any(r["prefix_cache_reset"] for r in reports)  # the test engine has no cache to reset
    return BatchRun([RunResult(r["shard_id"], 1.0, 0.0, side.results(batch_id, r["shard_id"])) for r in reports])


def test_both_placements_run_every_line_once_with_the_same_token_counts(
        side: ShardedSide, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, args = parse_args(["--requests", "96", "--inputs", "mixed"])
    path = write_inputs(args, tmp_path)["mixed"]
    runs = {}
    spread = {}
    for label, groups in PLACEMENTS.items():
        batch_id, shards = side.plan_sharded(path, groups)
        assert len(shards) == SHARDS
        spread[label] = shared_prompts_per_shard(side, shards)
        runs[label] = run_on_host(side, batch_id, shards, monkeypatch)
        assert sum(len(r.usage) for r in runs[label].results) == 96  # each line in exactly one shard
    # Prefix-aware placement puts each shared system prompt in fewer shards than input order does.
    assert sum(spread[PREFIX_AWARE]) < sum(spread[CONTIGUOUS])
    check = compare_tokens(runs[CONTIGUOUS].merged("a"), runs[PREFIX_AWARE].merged("b"))
    assert check["lines"] == 96 and check["mismatched"] == 0


def test_rates_hit_rate_and_ratio_are_over_the_whole_batch(capsys: pytest.CaptureFixture[str]) -> None:
    def shard(seconds: float, cached: int) -> RunResult:
        return RunResult("s", seconds, 0.0, {f"x{seconds}{cached}": Usage(200, 100, 10, cached)})

    base = [BatchRun([shard(1.0, 0), shard(3.0, 50)])]  # 20 tokens in 4 s; 50 of 200 prompt tokens cached
    new = [BatchRun([shard(1.0, 100), shard(1.0, 100)])]
    assert base[0].out_tps == 5.0 and base[0].hit_rate == 0.25
    assert new[0].out_tps == 10.0 and new[0].hit_rate == 1.0
    ratios = print_table("mixed", {CONTIGUOUS: base, PREFIX_AWARE: new}, 1)
    assert ratios == [2.0]
    out = capsys.readouterr().out
    assert "**2.00x** (2.00..2.00)" in out and "25.0 (25.0..25.0) %" in out
    assert "prefilled" not in out  # nothing left to prefill on the prefix-aware side: no ceiling to print
    print_table("mixed", {CONTIGUOUS: base, PREFIX_AWARE: [BatchRun([shard(1.0, 75), shard(1.0, 75)])]}, 1)
    # 150 prompt tokens prefilled in input order against 50: placement can gain about 3x at most.
    assert "contiguous / prefix-aware: 150 / 50 = 3.00x" in capsys.readouterr().out


def test_on_the_uniform_input_both_placements_plan_the_same_shards(side: ShardedSide, tmp_path: Path) -> None:
    """Nothing shares a long prefix, so prefix-aware placement must change nothing (the uniform goal, >= 0.97x,
    holds by construction; what the bench measures there is the machine's noise)."""
    _, args = parse_args(["--requests", "96", "--inputs", "uniform"])
    path = write_inputs(args, tmp_path)["uniform"]
    plans = []
    for groups in PLACEMENTS.values():
        _, shards = side.plan_sharded(path, groups)
        plans.append([(s["est_tokens"], [side.adapters.blobs.get_bytes(k) for k in s["indexes"]]) for s in shards])
    assert len(plans[0]) == SHARDS and plans[0] == plans[1]
