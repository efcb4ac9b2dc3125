"""`nightbatch doctor` against a real `nightbatch local` (the session's stack, real CPU engines), run as a user
runs it: every phase is printed with its time, and every check passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nightbatch.cli.doctor.report import PHASES
from nightbatch.models.spec import LOCAL_MODELS
from tests.support.local_stack import LORA_ADAPTER, ROOT, LocalStack

pytestmark = pytest.mark.e2e


def run_doctor(local_stack: LocalStack, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTBATCH_", "AWS_ENDPOINT_URL"))}
    env.update({"PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state")})
    return subprocess.run([sys.executable, "-m", "nightbatch", "doctor", "--base-url", local_stack.base_url,
                           "--api-key", local_stack.api_key, "--timeout", "300", "--poll-interval", "0.5", *extra],
                          env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)


def test_doctor_against_nightbatch_local_passes_every_phase(local_stack: LocalStack, tmp_path: Path) -> None:
    done = run_doctor(local_stack, tmp_path)
    print(done.stdout)  # the report, as a user sees it (`pytest -s`)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "✓ API key" in out and "✓ models" in out and "✓ webhook" in out
    # Every model on every endpoint it serves, the session stack's LoRA adapter included (local_stack.py).
    with local_stack.client() as client:
        served = list(client.models.list())
    pairs = [(m.id, e) for m in served for e in (m.model_extra or {})["nightbatch"]["endpoints"]]
    assert {m.name for m in LOCAL_MODELS} | {LORA_ADAPTER} == {m.id for m in served}
    for model, endpoint in pairs:
        assert f"{model} {endpoint}  batch_" in out
    for phase in PHASES:
        assert out.count(f" {phase} ") >= len(pairs), phase
    assert out.count("✓ notification") == len(pairs) and "webhook batch.completed received" in out
    assert "✗" not in out and out.rstrip().endswith("All checks passed.")

    report = json.loads(run_doctor(local_stack, tmp_path, "--json").stdout)
    assert report["passed"] is True and len(report["probes"]) == len(pairs)
    for probe in report["probes"]:
        assert probe["status"] == "completed"
        phases = {p["name"]: p for p in probe["phases"]}
        for name in ("validate", "first result", "finalize", "notification"):
            assert phases[name]["status"] == "ok" and phases[name]["at"] is not None, (name, phases[name])
        assert phases["model loaded"]["status"] == "ok"
        assert {phases[n]["status"] for n in ("job queued", "job RUNNABLE", "job STARTING", "job RUNNING")} == {
            "skipped"}  # AWS Batch only, with --stack
        ats = [phases[n]["at"] for n in ("validate", "first result", "finalize", "notification")]
        assert ats == sorted(ats)
    # The temporary webhook endpoint is gone again.
    assert local_stack.client().get("/webhook_endpoints", cast_to=dict)["data"] == []  # type: ignore[type-arg]
