"""Phase timings: the container entry measures them, the attempt's record and report carry them, Finalize's
summary and `nightbatch status` show them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_worker.main import main
from nightbatch.batches.cost import collect_shard_times
from nightbatch.layout import batch_prefix
from nightbatch.phases import PHASES, Phases, describe, summarize

from .conftest import ShardWorld, chat_requests
from .processes import DETERMINISTIC


def test_an_attempt_records_its_phases_in_order(env: ShardWorld, capsys: pytest.CaptureFixture[str]) -> None:
    env.seed(chat_requests(8))
    assert main(["--engine", DETERMINISTIC]) == 0
    report = json.loads(next(line for line in capsys.readouterr().out.splitlines() if '"phases"' in line))
    phases = report["phases"]
    assert phases["weights_source"] == "engine"
    seconds = [phases[f"{p}_s"] for p in PHASES]
    assert seconds == sorted(seconds) and seconds[-1] > 0
    # The attempt's accounting record carries them; Finalize reads them from there.
    times = collect_shard_times(env.adapters.blobs, [batch_prefix(env.batch_id) + "results/"])
    (recorded,) = times.phases
    assert recorded["shard_id"] == env.shard_id and recorded["engine_ready_s"] == phases["engine_ready_s"]


def _attempt(shard: str, source: str, *values: float) -> dict[str, Any]:
    return {"shard_id": shard, "weights_source": source, "container_start": 1.0,
            **{f"{p}_s": v for p, v in zip(PHASES, values, strict=True)}}


def test_summary_and_status_line() -> None:
    attempts = [_attempt("00000", "hub", 40, 90, 92, 600), _attempt("00001", "s3-cache", 10, 50, 51, 500),
                _attempt("00002", "s3-cache", 12, 55, 56, 550)]
    summary = summarize(attempts)
    assert summary["attempts"] == 3 and summary["weights_sources"] == {"hub": 1, "s3-cache": 2}
    assert summary["median_s"] == {"weights_ready": 12, "engine_ready": 55, "first_result": 56, "done": 550}
    assert summary["max_s"]["engine_ready"] == 90
    assert [a["shard_id"] for a in summary["shards"]] == ["00000", "00001", "00002"]
    line = describe(summary)
    assert line == ("weights 12.0 s → engine 55.0 s → first result 56.0 s → done 550.0 s "
                    "(median of 3 attempts; weights from hub, s3-cache x2)")
    assert summarize([]) == {} and describe({}) is None


def test_mark_keeps_the_first_time() -> None:
    p = Phases(origin=100.0)
    p.mark("first_result", 101.5)
    p.mark("first_result", 109.0)
    assert p.seconds == {"first_result": 1.5}
    assert p.metrics() == {"FirstResultSeconds": 1.5}
    with pytest.raises(ValueError):
        p.mark("lunch")
