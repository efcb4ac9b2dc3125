"""`nightbatch local --no-engines` does what the README and `--help` say: the API serves, no model runs, and a
batch ends at once as `completed` with every line in its error file as `shard_failed` (no line is lost, and
nothing waits for an engine that will never start)."""

from __future__ import annotations

import json
from pathlib import Path

from nightbatch.cli.main import build_parser
from nightbatch.local.runner import LocalWorkflow
from nightbatch.wiring import Services
from tests.support.pipeline_world import chat_line, jsonl, make_batch

ROOT = Path(__file__).resolve().parents[2]


def test_without_engines_a_batch_completes_at_once_with_every_line_shard_failed(services: Services) -> None:
    workflow = LocalWorkflow(services.adapters, engines=False)
    workflow.bind(services)
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(3)]))
    workflow.run(batch_id)
    batch = services.batches.get("default", batch_id)
    assert batch.status == "completed" and batch.request_counts.model_dump() == {"total": 3, "completed": 0,
                                                                                 "failed": 3}
    errors = b"".join(services.files.chunks(services.files.item("default", batch.error_file_id or "")))
    assert sorted((json.loads(x)["custom_id"], json.loads(x)["error"]["code"]) for x in errors.splitlines()) == [
        (f"req-{i}", "shard_failed") for i in range(3)]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`nightbatch local --no-engines`" in readme and "`shard_failed`" in readme
    assert "stay `in_progress`" not in readme and "stay in_progress" not in readme
    local = build_parser()._subparsers._group_actions[0].choices["local"]  # type: ignore[union-attr]
    flag = next(a for a in local._actions if "--no-engines" in a.option_strings)
    assert flag.help is not None and "shard_failed" in flag.help
