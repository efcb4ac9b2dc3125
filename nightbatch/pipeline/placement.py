"""Prefix-aware placement: which segments go to which shard, once Plan knows how many shards there are.

Validate writes long prompts into segments by prefix group (nightbatch/pipeline/prefixes.py). Here each
group's segments go to as few shards as balance allows: groups largest first, each to the least-loaded
shard, spilling into the next least-loaded only once a shard holds its share of the estimated tokens. The
remaining segments (short prompts, group 0) then fill the shards up evenly. Each shard runs on its own GPU
with its own prefix cache, so a shared prefix is prefilled again in every shard it is scattered over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nightbatch.shards.index import SegmentEntry as Segment


def place_by_prefix(shards: list[list[Segment]]) -> list[list[Segment]]:
    """The same segments in the same number of shards (none empty), regrouped by prefix group.

    `shards` is the contiguous placement (its length is the shard count Plan chose); it is returned as it
    is when no segment carries a prefix group or there is a single shard."""
    return place_grouped(shards, lambda s: s.group)


def place_by_model(shards: list[list[Segment]]) -> list[list[Segment]]:
    """As place_by_prefix, grouped by the lines' `body.model` instead: the lines of one LoRA adapter go to as
    few shards as balance allows (each engine step serves at most `max_loras` adapters at once)."""
    return place_grouped(shards, lambda s: s.model)


def place_grouped(shards: list[list[Segment]], key: Callable[[Segment], Any]) -> list[list[Segment]]:
    """Segments of one group (`key`; a falsy key: no group) to as few shards as balance allows."""
    n = len(shards)
    segments = [s for shard in shards for s in shard]
    if n <= 1 or not any(key(s) for s in segments):
        return shards
    total = sum(s.est for s in segments)
    share = total / n
    groups: dict[Any, list[Segment]] = {}
    loose: list[Segment] = []
    for s in segments:
        k = key(s)
        (groups.setdefault(k, []) if k else loose).append(s)
    out: list[list[Segment]] = [[] for _ in range(n)]
    load = [0] * n

    def lightest() -> int:
        return min(range(n), key=lambda i: (load[i], i))

    def put(i: int, s: Segment) -> None:
        out[i].append(s)
        load[i] += s.est

    order = {k: i for i, k in enumerate(sorted(groups))}  # one key type per call
    for _, members in sorted(groups.items(), key=lambda kv: (-sum(s.est for s in kv[1]), order[kv[0]])):
        target = lightest()
        for s in members:
            if load[target] >= share:
                target = lightest()
            put(target, s)
    for s in sorted(loose, key=lambda s: -s.est):
        put(lightest(), s)
    # Every shard gets work: an empty one takes a segment from the shard holding the most segments.
    for i in range(n):
        if not out[i]:
            donor = max(range(n), key=lambda j: (len(out[j]), -j))
            s = out[donor].pop()
            load[donor] -= s.est
            put(i, s)
    for shard in out:
        shard.sort(key=lambda s: s.key)
    return out
