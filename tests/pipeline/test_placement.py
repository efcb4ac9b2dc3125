"""Prefix-aware placement: requests sharing a long prompt head land in as few shards as balance allows."""

from __future__ import annotations

import json
from collections import defaultdict

from nightbatch import layout
from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch
from nightbatch.pipeline.placement import place_by_prefix
from nightbatch.pipeline.prefixes import PrefixGroups
from nightbatch.shards.index import SegmentEntry
from nightbatch.wiring import Services
from tests.support.pipeline_world import jsonl, make_batch, shard_requests_of


def seg(i: int, est: int, group: int = 0) -> SegmentEntry:
    return SegmentEntry(key=f"s{i:04d}", lines=1, est=est, group=group)


def test_groups_stay_together_and_shards_stay_balanced() -> None:
    segs = [seg(i, 10, group=1 + i % 3) for i in range(30)] + [seg(100 + i, 10) for i in range(10)]
    contiguous = [segs[i::4] for i in range(4)]
    out = place_by_prefix(contiguous)
    assert sorted(s.key for shard in out for s in shard) == sorted(s.key for s in segs)
    loads = [sum(s.est for s in shard) for shard in out]
    assert max(loads) - min(loads) <= 10
    spread = {g: sum(1 for shard in out if any(s.group == g for s in shard)) for g in (1, 2, 3)}
    assert sum(spread.values()) <= 3 + 4 - 1  # each group in one shard, plus at most one spill per boundary


def test_without_groups_or_with_one_shard_nothing_moves() -> None:
    plain = [[seg(0, 5), seg(1, 5)], [seg(2, 5)]]
    assert place_by_prefix(plain) is plain
    one = [[seg(0, 5, 2), seg(1, 5)]]
    assert place_by_prefix(one) is one
    few = place_by_prefix([[seg(0, 100, 1)], [seg(1, 1, 1)], [seg(2, 1, 1)]])
    assert all(few) and len(few) == 3


def test_prefix_group_keys_on_the_head_of_long_prompts() -> None:
    system = "You are a careful assistant. " * 50
    a = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "one"}]}
    b = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "two"}]}
    short = {"messages": [{"role": "user", "content": "hi"}]}
    groups = PrefixGroups(groups=8, min_chars=1024)
    assert groups.of(a) == groups.of(b) > 0
    assert groups.of(short) == 0
    assert PrefixGroups(groups=0, min_chars=1024).of(a) == 0


def test_distinct_prefixes_get_distinct_groups_until_the_groups_run_out() -> None:
    def body(k: int) -> dict[str, object]:
        return {"messages": [{"role": "system", "content": f"Prompt {k}. " + "Be brief. " * 120},
                             {"role": "user", "content": "q"}]}

    groups = PrefixGroups(groups=8, min_chars=1024)
    first = [groups.of(body(k)) for k in range(8)]
    assert first == list(range(1, 9))  # no two of the first eight share a group, whatever their hashes
    assert [groups.of(body(k)) for k in range(8)] == first  # and keep it
    assert all(1 <= groups.of(body(k)) <= 8 for k in range(8, 40))  # past eight: by hash, in range


def test_plan_keeps_each_system_prompt_in_few_shards(services: Services) -> None:
    services.settings.pipeline.segment_max_lines = 10
    services.settings.pipeline.shard_target_tokens = 20_000
    systems = [f"System prompt {k}: " + "follow the house style. " * 60 for k in range(3)]
    lines = []
    for i in range(240):
        messages = [{"role": "user", "content": f"short question {i}"}]
        if i % 2:
            messages.insert(0, {"role": "system", "content": systems[i % 3]})
        lines.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "SmolLM2-135M-Instruct", "messages": messages}})
    batch_id = make_batch(services, jsonl(lines))
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    plan = plan_batch(inp, services)
    n = plan.shard_count
    assert n >= 4
    blobs = services.adapters.blobs
    shards_of: dict[str, set[str]] = defaultdict(set)
    seen: list[str] = []
    est = []
    for item in json.loads(blobs.get_bytes(plan.manifest_key) or b"[]"):
        shard = json.loads(blobs.get_bytes(layout.shard_key(batch_id, item["shard_id"])) or b"{}")
        est.append(shard["est_tokens"])
        for req in shard_requests_of(services, batch_id, item["shard_id"]):
            seen.append(req.custom_id)
            first = req.body["messages"][0]
            if first["role"] == "system":
                shards_of[first["content"]].add(item["shard_id"])
    assert sorted(seen) == sorted(x["custom_id"] for x in lines)
    assert max(est) <= 1.25 * min(est), est
    # Scattered in input order, every system prompt would be in every shard.
    assert sum(len(v) for v in shards_of.values()) <= 3 + n - 1, shards_of
