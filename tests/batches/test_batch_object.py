"""The Batch object's nightbatch figures computed from the record: the estimated finish while it runs, the
prompt-cache hit rate once it has usage."""

from __future__ import annotations

from typing import Any

import pytest

from nightbatch.aws.records import BatchRecord
from nightbatch.batches import objects

T = 1_800_000_000


def record(**fields: Any) -> BatchRecord:
    base: dict[str, Any] = {"pk": "batch_x", "tenant": "t", "created_at": T - 500, "endpoint": "/v1/chat/completions",
                            "input_file_id": "file-x", "completion_window": "24h", "status": "in_progress",
                            "request_counts": {"total": 100, "completed": 0, "failed": 0}}
    return BatchRecord.model_validate({**base, **fields})


@pytest.fixture(autouse=True)
def fixed_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects, "now", lambda: T)


def test_a_running_batch_says_when_it_should_finish_at_its_pace() -> None:
    # 40 of 100 lines in 200 s since the first shard began: 60 more take 300 s.
    rec = record(live_since=T - 200, live_completed=30, live_failed=10)
    assert (objects.to_wire(rec).nightbatch or {})["estimated_finish_at"] == T + 300


@pytest.mark.parametrize("fields", [{}, {"live_since": T - 200}, {"live_since": T - 5, "live_completed": 100},
                                    {"status": "finalizing", "live_since": T - 200, "live_completed": 50}])
def test_no_estimate_before_progress_or_once_it_stops_running(fields: dict[str, Any]) -> None:
    assert "estimated_finish_at" not in (objects.to_wire(record(**fields)).nightbatch or {})


def test_the_prompt_cache_hit_rate_of_a_finished_batch() -> None:
    usage = {"input_tokens": 800, "input_tokens_details": {"cached_tokens": 200}, "output_tokens": 10,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 810}
    rec = record(status="completed", usage=usage, request_counts={"total": 100, "completed": 100, "failed": 0})
    assert (objects.to_wire(rec).nightbatch or {})["prompt_cache_hit_rate"] == 0.25
    assert "prompt_cache_hit_rate" not in (objects.to_wire(record()).nightbatch or {})
