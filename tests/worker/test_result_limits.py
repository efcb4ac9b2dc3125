"""L4: a result line too long for Finalize to read back is that request's own error, not a silent shard_failed."""

from __future__ import annotations

import json

import pytest

from gpu_worker.engines.base import EngineReply
from gpu_worker.results import result_line
from nightbatch.results import lines as results
from nightbatch.results.lines import summarize_result_line


def test_an_over_long_result_line_becomes_that_requests_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "MAX_RESULT_LINE", 500)
    reply = EngineReply(status_code=200, body={"object": "chat.completion", "choices": [{"text": "x" * 2000}],
                                               "usage": {"prompt_tokens": 3, "completion_tokens": 900}})
    line = result_line("batch_1", "req-7", "req_abc", reply)
    assert not line.ok and (line.input_tokens, line.output_tokens) == (0, 0)
    record = json.loads(line.data)
    assert record["custom_id"] == "req-7" and record["response"] is None
    assert record["error"]["code"] == "result_too_large" and "500-byte limit" in record["error"]["message"]
    summary = summarize_result_line(line.data.rstrip(b"\n"))
    assert summary.custom_id == "req-7" and not summary.ok
    small = result_line("batch_1", "req-8", "req_abd", EngineReply(status_code=200, body={"usage": {}}))
    assert small.ok and json.loads(small.data)["response"]["status_code"] == 200
