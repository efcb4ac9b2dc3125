"""The storage layer (nightbatch/aws/) is the only code that builds or reads raw DynamoDB items: everything
else goes through the typed records (nightbatch/aws/records.py) and Table's record methods."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("nightbatch", "gpu_worker", "functions")
STORAGE = ROOT / "nightbatch" / "aws"
# An item's key or kind named as a string, a boto3 item argument, or a Table call that takes or returns a raw
# item (get/put/put_new/update/query_*; their record counterparts are get_record, put_record, update_record,
# update_attributes, records, page and open_ids).
# `kind` is also an ordinary word (the results' `kind=output|error`): it counts read from an item or set to a
# literal kind, as items carry it.
RAW_ITEM = re.compile(
    r"""["'](?:pk|sk)["']"""
    r"""|(?:\[|\.get\()["']kind["']|["']kind["']\s*:\s*["']"""
    r"""|\bItem\s*="""
    r"""|\btable\.(?:get|put|put_new|update|query_owner|query_open)\("""
)


def _offenders() -> list[str]:
    found = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if STORAGE in path.parents:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if RAW_ITEM.search(line.split("#", 1)[0]):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return found


def test_only_the_storage_layer_touches_raw_items() -> None:
    offenders = _offenders()
    assert offenders == [], "raw DynamoDB items outside nightbatch/aws/:\n" + "\n".join(offenders)


def test_the_pattern_would_catch_a_raw_item() -> None:
    assert RAW_ITEM.search('batch = table.get(inp.batch_id)')
    assert RAW_ITEM.search('self.table.update(upload_id, add={"parts_received": 1})')
    assert RAW_ITEM.search('if item.get("kind") != "file" or item["tenant"] != tenant:')
    assert RAW_ITEM.search('return ValidateOutput(batch_id=batch["pk"], valid=False)')
    assert RAW_ITEM.search('client.put_item(TableName=name, Item=item)')
    assert RAW_ITEM.search('for key in self.table.query_open(OPEN_STATUS):')
    assert RAW_ITEM.search('table.put({"pk": pk, "kind": "file"})') and RAW_ITEM.search('{"kind": "batch"}')
    assert not RAW_ITEM.search("batch = table.get_record(BatchRecord, inp.batch_id)")
    assert not RAW_ITEM.search('httpx.stream("GET", url, params={"kind": kind})')
    assert not RAW_ITEM.search("table.update_attributes(BatchRecord, batch_id, set_={'shard_count': 3})")
    assert not RAW_ITEM.search("for upload_id in self.table.open_ids(OPEN_STATUS):")
