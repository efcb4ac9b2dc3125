"""The sweeper re-drives never-started batches, finalizes abandoned ones, and emits EMF gauges in AWS mode."""

from __future__ import annotations

import json

import pytest

from nightbatch.metrics import emf_line
from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.pipeline.sweep import sweep
from nightbatch.services import Services
from tests.workflow.conftest import chat_line, jsonl, make_batch


def test_stale_validating_batch_is_redriven(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(1)]))
    workflow = services.batches.workflow
    assert sweep(services, stale_seconds=3600)["redriven"] == []
    assert sweep(services, stale_seconds=-1)["redriven"] == [batch_id]
    assert workflow.started == [batch_id, batch_id]  # type: ignore[attr-defined]


def test_batch_past_its_window_is_finalized_as_expired(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(1), chat_line(2)]))
    validate_batch(BatchTaskInput(batch_id=batch_id), services)
    services.adapters.table.update(batch_id, set_={"expires_at": 1})
    assert sweep(services)["finalized"] == [batch_id]
    batch = services.batches.get("default", batch_id)
    assert batch.status == "expired" and batch.request_counts.failed == 2


def test_gauges_are_emf_in_aws_mode(services: Services, capsys: pytest.CaptureFixture[str]) -> None:
    make_batch(services, jsonl([chat_line(1)]))
    services.settings.deployment.mode = "aws"
    sweep(services, stale_seconds=3600)
    records = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    open_ = [r for r in records if "BatchesOpen" in r]
    assert open_ and open_[0]["Status"] == "validating" and open_[0]["BatchesOpen"] == 1
    assert open_[0]["_aws"]["CloudWatchMetrics"][0] == {
        "Namespace": "nightbatch", "Dimensions": [["Status"]], "Metrics": [{"Name": "BatchesOpen", "Unit": "Count"}]}
    assert any("OldestBatchAgeSeconds" in r for r in records)


def test_emf_line_shape() -> None:
    rec = json.loads(emf_line({"RequestsCompleted": 3}, timestamp_ms=5))
    assert rec == {"_aws": {"Timestamp": 5, "CloudWatchMetrics": [{"Namespace": "nightbatch", "Dimensions": [[]],
                   "Metrics": [{"Name": "RequestsCompleted", "Unit": "Count"}]}]}, "RequestsCompleted": 3}
