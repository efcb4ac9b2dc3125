"""What every tenant of the deployment shares: the users' bucket entries without a `{tenant}` segment
(docs/USER_BUCKETS.md). Any tenant may read (or write) what lies under a shared entry and serve it back through the
Files API, so the doctor names each one, from the stack's `UserBuckets` output (or the synthesized template's)."""

from __future__ import annotations

import json

from nightbatch.cli.doctor.report import Check, Report
from nightbatch.tenancy.scope import STACK_OUTPUT, parse_entry


def user_buckets(report: Report, outputs: dict[str, str]) -> None:
    raw = outputs.get(STACK_OUTPUT)
    if not raw:
        return
    lists: dict[str, list[str]] = json.loads(raw)
    shared = [f"{kind} {entry}" for kind, entries in lists.items() for entry in entries
              if not parse_entry(entry).per_tenant]
    per_tenant = sum(len(entries) for entries in lists.values()) - len(shared)
    if not shared:
        report.add(Check("user buckets", "ok", f"{per_tenant} entries, each a prefix per tenant"))
        return
    report.add(Check(
        "user buckets", "warn", "shared by every tenant: " + ", ".join(shared),
        "any tenant may read (or write) what lies under a shared entry; give each tenant its own prefix with a "
        "{tenant} segment (cdk.json userBuckets, docs/USER_BUCKETS.md) unless sharing is what you want"))
