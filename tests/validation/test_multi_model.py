"""Several models and LoRA adapters in one batch: Validate's rule and record, Plan's shards per served model and
adapter placement, the runner on the deterministic engine, Finalize's `nightbatch.models`."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpu_worker.runner import ShardJob, run_shard
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.pipeline.placement import place_by_model
from nightbatch.settings import Settings
from nightbatch.shards.index import SegmentEntry
from nightbatch.shards.spec import ShardItem, read_manifest, read_shard
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator
from nightbatch.wiring import Services
from tests.support.deterministic_engine import DeterministicEngine
from tests.support.pipeline_world import chat_line, jsonl, make_batch

BASE_A, BASE_B = "chat-a", "chat-b"
ADAPTERS = {"a-sql": "/adapters/sql", "a-poem": "/adapters/poem"}
MODELS = [
    {"name": BASE_A, "source": "/models/a", "lora_modules": ADAPTERS, "max_loras": 2},
    {"name": BASE_B, "source": "/models/b"},
    {"name": "embed", "source": "/models/e", "task": "embed"},
]


def configure(settings: Settings, *, multi: bool) -> None:
    settings.serving.models_json = json.dumps(MODELS)
    settings.validation.multi_model_batches = multi


def check(settings: Settings, models: list[str]) -> Validator:
    v = Validator(settings=settings, endpoint="/v1/chat/completions")
    for i, model in enumerate(models, 1):
        v.check(i, json.dumps(chat_line(i, model)).encode(), 0)
    return v


def test_one_model_per_batch_by_default_but_adapters_of_that_model_mix() -> None:
    settings = Settings()
    configure(settings, multi=False)
    v = check(settings, [BASE_A, "a-sql", "a-poem", "a-sql"])
    assert v.model == BASE_A and v.models == {BASE_A: 1, "a-sql": 2, "a-poem": 1}
    with pytest.raises(LineInvalid) as e:
        check(settings, ["a-sql", BASE_B])
    assert e.value.error[0] == "mismatched_model" and e.value.error[2] == "body.model"


def test_multi_model_batches_take_any_served_model_and_unknown_adapters_are_model_not_found() -> None:
    settings = Settings()
    configure(settings, multi=True)
    v = check(settings, [BASE_B, BASE_A, "a-poem", BASE_B])
    assert v.model == BASE_B and v.models == {BASE_B: 2, BASE_A: 1, "a-poem": 1}
    with pytest.raises(LineInvalid) as e:
        check(settings, [BASE_A, "a-typo"])
    code, message, param = e.value.error
    assert (code, param) == ("model_not_found", "body.model")
    assert "'a-typo'" in message and "a-sql" in message and "a-poem" in message and "embed" not in message


def test_place_by_model_keeps_an_adapter_s_segments_together() -> None:
    segs = [SegmentEntry(key=f"s{i:02d}", lines=1, est=10, model=m)
            for i, m in enumerate(["x", "y", "x", "y", "x", "y", "z", "z"])]
    out = place_by_model([segs[0:3], segs[3:6], segs[6:8]])
    assert sorted(s.key for shard in out for s in shard) == [s.key for s in segs] and all(out)
    homes = {m: {i for i, shard in enumerate(out) for s in shard if s.model == m} for m in "xyz"}
    assert all(len(h) == 1 for h in homes.values()), homes


def run_all_shards(services: Services, batch_id: str, items: list[ShardItem]) -> dict[str, int]:
    """Each shard on a deterministic engine for its own model, as the worker starts one; engine starts per model."""
    starts: dict[str, int] = {}
    for item in items:
        shard = read_shard(services.adapters.blobs, batch_id, item.shard_id)
        assert shard is not None
        spec = services.settings.serving.model(shard.model)
        assert spec is not None
        engine = DeterministicEngine(spec)
        starts[spec.name] = starts.get(spec.name, 0) + 1
        report = asyncio.run(run_shard(ShardJob(batch_id=batch_id, shard_id=item.shard_id), engine=engine,
                                       blobs=services.adapters.blobs, table=services.adapters.table,
                                       settings=services.settings))
        assert report.finished
    return starts


def test_multi_model_batch_plans_a_model_per_shard_and_reports_each_model(services: Services) -> None:
    configure(services.settings, multi=True)
    services.settings.pipeline.shard_target_tokens = 60
    services.settings.pipeline.job_definitions_json = json.dumps({BASE_A: "jd-a", BASE_B: "jd-b"})
    names = [BASE_A, BASE_B, "a-sql", BASE_B, "a-poem", "a-sql"] * 5
    lines = [chat_line(i, m) for i, m in enumerate(names, 1)]
    lines[3]["body"]["max_tokens"] = -1  # the deterministic engine answers 400: a failed line of BASE_B
    batch_id = make_batch(services, jsonl(lines))
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    batch = services.batches.get("default", batch_id)
    assert batch.model == BASE_A  # the first line's model
    assert batch.nightbatch is not None and batch.nightbatch["models"][BASE_B]["request_counts"]["total"] == 10
    plan_batch(inp, services)
    blobs = services.adapters.blobs
    items = read_manifest(blobs, batch_id)
    shards = [read_shard(blobs, batch_id, i.shard_id) for i in items]
    served = [s.model for s in shards if s is not None]
    assert len(items) > 2 and set(served) == {BASE_A, BASE_B}
    assert served == sorted(served, key=[BASE_A, BASE_B].index)  # a model's shards are numbered together
    assert [i.job_definition for i in items] == ["jd-a" if m == BASE_A else "jd-b" for m in served]
    homes: dict[str, list[str]] = {}
    for s in shards:
        assert s is not None
        if s.model == BASE_B:
            assert s.models == {}
        else:
            assert not s.models or sum(s.models.values()) == s.lines
        for name in s.models:
            homes.setdefault(name, []).append(s.shard_id)
    assert homes["a-sql"] and homes["a-poem"]
    assert len(homes["a-poem"]) == 1  # 5 lines of an adapter: one shard holds them all
    assert starts_are_one_per_shard(run_all_shards(services, batch_id, items), served)
    assert finalize_batch(inp, services).status == "completed"
    batch = services.batches.get("default", batch_id)
    assert batch.model == BASE_A and batch.request_counts.model_dump() == {"total": 30, "completed": 29,
                                                                           "failed": 1}
    assert batch.nightbatch is not None
    models = batch.nightbatch["models"]
    assert {m: r["request_counts"]["total"] for m, r in models.items()} == {
        BASE_A: 5, BASE_B: 10, "a-sql": 10, "a-poem": 5}
    assert models[BASE_B]["request_counts"]["failed"] == 1
    assert sum(r["usage"]["total_tokens"] for r in models.values()) == batch.usage.total_tokens
    assert all(r["cost"]["estimate"] for r in models.values())
    out = b"".join(services.files.chunks(services.files.item("default", batch.output_file_id)))
    answered = {json.loads(x)["custom_id"]: json.loads(x)["response"]["body"]["model"] for x in out.splitlines()}
    assert answered["req-3"] == "a-sql" and answered["req-2"] == BASE_B and answered["req-1"] == BASE_A


def starts_are_one_per_shard(starts: dict[str, int], served: list[str]) -> bool:
    return starts == {m: served.count(m) for m in set(served)}


def test_single_model_batch_has_no_models_breakdown(services: Services) -> None:
    configure(services.settings, multi=True)
    batch_id = make_batch(services, jsonl([chat_line(i, BASE_B) for i in range(1, 5)]))
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    plan_batch(inp, services)
    shard = read_shard(services.adapters.blobs, batch_id, "00000")
    assert shard is not None and shard.model == BASE_B and shard.models == {}
    finalize_batch(inp, services)  # never run: every line unrun
    batch = services.batches.get("default", batch_id)
    assert "models" not in (batch.nightbatch or {})


@pytest.mark.parametrize("spec", [
    {"name": "e", "source": "/e", "task": "embed", "lora_modules": {"x": "/x"}},
    {"name": "m", "source": "/m", "lora_modules": {"m": "/x"}},
])
def test_adapters_need_a_generate_model_and_their_own_name(spec: dict[str, object]) -> None:
    from pydantic import ValidationError

    from nightbatch.models.spec import ModelSpec

    with pytest.raises(ValidationError):
        ModelSpec.model_validate(spec)
