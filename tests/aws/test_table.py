"""The DynamoDB adapter against moto: conditional writes, races between transitions, owner-ordered queries."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nightbatch.aws import Adapters, Table
from nightbatch.batches import lifecycle
from nightbatch.clock import sort_key
from nightbatch.errors import StorageConflictError


def batch_item(pk: str, status: str = "validating", **extra: Any) -> dict[str, Any]:
    item = {"pk": pk, "kind": "batch", "tenant": "t", "owner": "t#batch", "owner_sk": sort_key(1, pk),
            "status": status, "open_status": status, "created_sk": sort_key(1, pk), "created_at": 1,
            "endpoint": "/v1/chat/completions", "input_file_id": "file-1", "completion_window": "24h"}
    item.update(extra)
    return item


def test_put_new_refuses_an_existing_item(adapters: Adapters) -> None:
    table = adapters.table
    table.put_new(batch_item("batch_1"))
    with pytest.raises(StorageConflictError):
        table.put_new(batch_item("batch_1", status="failed"))
    got = table.get("batch_1")
    assert got is not None and got["status"] == "validating"


def test_put_overwrites_and_get_round_trips_types(adapters: Adapters) -> None:
    table = adapters.table
    table.put(batch_item("batch_2", ratio=0.25, n=3, nested={"a": [1, 2.5, "x"]}, none=None))
    table.put(batch_item("batch_2", ratio=0.5, n=4, nested={"a": [1, 2.5, "x"]}, none=None))
    got = table.get("batch_2")
    assert got is not None
    assert (got["ratio"], got["n"], got["nested"], got["none"]) == (0.5, 4, {"a": [1, 2.5, "x"]}, None)
    assert isinstance(got["n"], int)
    assert table.get("batch_missing") is None


def test_update_with_expected_status(adapters: Adapters) -> None:
    table = adapters.table
    table.put_new(batch_item("batch_3"))
    new = table.update("batch_3", set_={"status": "in_progress"}, expect_in={"status": ("validating",)})
    assert new["status"] == "in_progress"
    with pytest.raises(StorageConflictError):
        table.update("batch_3", set_={"status": "in_progress"}, expect_in={"status": ("validating",)})


def test_update_counters_remove_and_absent_conditions(adapters: Adapters) -> None:
    table = adapters.table
    table.put_new(batch_item("batch_4"))
    table.update("batch_4", add={"live_completed": 2})
    new = table.update("batch_4", add={"live_completed": 3, "live_failed": 1}, remove=("open_status",))
    assert (new["live_completed"], new["live_failed"]) == (5, 1)
    assert "open_status" not in new
    table.update("batch_4", set_={"flag": "x"}, expect_absent=("flag",))
    with pytest.raises(StorageConflictError):
        table.update("batch_4", set_={"flag": "y"}, expect_absent=("flag",))


def test_update_of_a_missing_item_is_a_conflict_unless_allowed(adapters: Adapters) -> None:
    table = adapters.table
    with pytest.raises(StorageConflictError):
        table.update("batch_none", set_={"status": "failed"})
    assert table.get("batch_none") is None
    created = table.update("batch_none", set_={"status": "failed"}, must_exist=False)
    assert created == {"pk": "batch_none", "status": "failed"}


def race(table: Table, batch_id: str, targets: list[str]) -> tuple[list[str], int]:
    """Runs one transition per target at the same moment from threads; returns winners and conflicts."""
    barrier = threading.Barrier(len(targets))
    winners: list[str] = []
    conflicts: list[str] = []
    lock = threading.Lock()

    def attempt(to: str) -> None:
        barrier.wait()
        try:
            lifecycle.transition(table, batch_id, to, from_=("validating",))
        except StorageConflictError:
            with lock:
                conflicts.append(to)
        else:
            with lock:
                winners.append(to)

    threads = [threading.Thread(target=attempt, args=(to,)) for to in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return winners, len(conflicts)


@pytest.mark.parametrize("targets", [
    ["in_progress", "cancelling"],
    ["failed", "in_progress"],
    ["cancelling"] * 6,
    ["in_progress", "cancelling", "failed", "finalizing"],
])
def test_concurrent_transitions_from_one_state_have_exactly_one_winner(
    adapters: Adapters, targets: list[str]
) -> None:
    table = adapters.table
    for round_ in range(3):
        batch_id = f"batch_race{round_}"
        table.put_new(batch_item(batch_id))
        winners, conflicts = race(table, batch_id, targets)
        assert len(winners) == 1, winners
        assert conflicts == len(targets) - 1
        got = table.get(batch_id)
        assert got is not None
        assert got["status"] == winners[0]
        assert got[f"{winners[0]}_at"] > 0


def test_transition_sets_its_timestamp_and_the_open_index(adapters: Adapters) -> None:
    table = adapters.table
    table.put_new(batch_item("batch_ts"))
    rec = lifecycle.transition(table, "batch_ts", "in_progress", at=123, extra={"request_counts": {"total": 2}})
    assert (rec.status, rec.in_progress_at, rec.request_counts) == ("in_progress", 123, {"total": 2})
    assert list(table.open_ids("in_progress")) == ["batch_ts"]
    lifecycle.transition(table, "batch_ts", "finalizing")
    done = lifecycle.transition(table, "batch_ts", "completed")
    assert done.status == "completed"
    item = table.get("batch_ts")
    assert item is not None and "open_status" not in item  # terminal batches leave the sweeper's index
    assert list(table.query_open("finalizing")) == []
    with pytest.raises(StorageConflictError):
        lifecycle.transition(table, "batch_ts", "cancelling")


def put_owned(table: Table, owner: str, n: int) -> list[str]:
    """n items of one owner with increasing owner_sk; returns their sort keys in ascending order."""
    keys = []
    for i in range(n):
        pk = f"file-q{i:03d}"
        sk = sort_key(1_000 + i // 2, pk)  # pairs share a second: the id breaks the tie
        table.put({"pk": pk, "kind": "file", "owner": owner, "owner_sk": sk})
        keys.append(sk)
    table.put({"pk": "file-other", "kind": "file", "owner": "someone-else", "owner_sk": sort_key(1_000, "x")})
    return keys


@pytest.mark.parametrize("page_size", [2, 3, 100])
def test_query_owner_orders_and_pages(adapters: Adapters, page_size: int) -> None:
    table = adapters.table
    keys = put_owned(table, "t#file", 7)
    asc = [i["owner_sk"] for i in table.query_owner("t#file", ascending=True, page_size=page_size)]
    desc = [i["owner_sk"] for i in table.query_owner("t#file", ascending=False, page_size=page_size)]
    assert asc == keys
    assert desc == keys[::-1]


def test_query_owner_after_is_exclusive_in_both_directions(adapters: Adapters) -> None:
    table = adapters.table
    keys = put_owned(table, "t#file", 6)
    after = keys[2]
    asc = [i["owner_sk"] for i in table.query_owner("t#file", ascending=True, after_sk=after, page_size=2)]
    desc = [i["owner_sk"] for i in table.query_owner("t#file", ascending=False, after_sk=after, page_size=2)]
    assert asc == keys[3:]
    assert desc == keys[:2][::-1]
    assert list(table.query_owner("t#file", ascending=True, after_sk=keys[-1])) == []
    assert list(table.query_owner("nobody", ascending=True)) == []
