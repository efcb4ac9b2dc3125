"""`nightbatch keys create|list|revoke`: API keys in the deployment's table (or a running `nightbatch local`).

Which table: `--table/--region` (plus `--endpoint-url`), else NIGHTBATCH_TABLE/NIGHTBATCH_REGION, else the
endpoints a running `nightbatch local` recorded in its state file, else the default table name in the
configured region. AWS credentials come from the usual boto3 chain.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nightbatch.aws.records import KeyRecord
from nightbatch.errors import NightbatchError
from nightbatch.settings import Settings
from nightbatch.tenancy.keys import DEFAULT_TENANT, KeyStore

# moto accepts any credentials; a shell that talks to `nightbatch local` may have none configured.
MIN_PREFIX_CHARS = 7
LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@dataclass(frozen=True)
class Target:
    table: str
    region: str
    endpoint_url: str | None
    source: str


def register(sub: Any) -> None:
    """Adds the `keys` command to the top-level subparsers."""
    target = argparse.ArgumentParser(add_help=False)
    group = target.add_argument_group("where the keys live")
    group.add_argument("--table", help="DynamoDB table of the deployment (default: NIGHTBATCH_TABLE, "
                                       "else a running `nightbatch local`)")
    group.add_argument("--region", help="AWS region (default: NIGHTBATCH_REGION)")
    group.add_argument("--endpoint-url", help="AWS endpoint override (e.g. an emulator)")

    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    create = ksub.add_parser("create", parents=[target], help="create a key; it is printed once")
    create.add_argument("--name", required=True, help="a label for the key, unique among active keys")
    create.add_argument("--tenant", default=DEFAULT_TENANT,
                        help=f"the tenant the key acts for (default: {DEFAULT_TENANT})")
    create.add_argument("--json", action="store_true", help="print the key and its record as JSON")
    lst = ksub.add_parser("list", parents=[target], help="list keys (never the keys themselves)")
    lst.add_argument("--json", action="store_true", help="print JSON lines")
    revoke = ksub.add_parser("revoke", parents=[target], help="revoke keys by id, name or prefix")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("key_id", nargs="?", help="the key's id (key_…), as `keys list` shows it")
    which.add_argument("--name", help="revoke the active key(s) with this name")
    which.add_argument("--prefix", help="revoke the active key(s) starting with this (e.g. nb-AbCd1234)")


def resolve_target(args: argparse.Namespace, settings: Settings | None = None) -> Target:
    settings = settings or Settings()
    region = args.region or settings.deployment.region
    if args.table:
        return Target(args.table, region, args.endpoint_url, "--table")
    if "table" in settings.deployment.model_fields_set:
        return Target(settings.deployment.table, region, args.endpoint_url, "NIGHTBATCH_TABLE")
    local = _running_local()
    if local is not None:
        return Target(str(local["table"]), str(local.get("region") or region),
                      args.endpoint_url or str(local["aws_endpoint_url"]), "nightbatch local")
    return Target(settings.deployment.table, region, args.endpoint_url, "default")


def _running_local() -> dict[str, Any] | None:
    from nightbatch.local.stack import state_file

    try:
        data: dict[str, Any] = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    pid = data.get("pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # left behind by a stack that did not stop cleanly
        except PermissionError:
            pass
    return data if data.get("aws_endpoint_url") and data.get("table") else None


def open_store(target: Target) -> KeyStore:
    from nightbatch.aws import make_adapters

    if target.source == "nightbatch local":
        for k, v in LOCAL_CREDENTIALS.items():
            os.environ.setdefault(k, v)
    settings = Settings(deployment={"table": target.table, "region": target.region})
    return KeyStore(make_adapters(settings, endpoint_url=target.endpoint_url).table)


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args)
    try:
        store = open_store(target)
        if args.keys_command == "create":
            return _create(store, args, target)
        if args.keys_command == "list":
            return _list(store, args)
        return _revoke(store, args)
    except NightbatchError as e:
        print(f"nightbatch keys: {e.message}", file=sys.stderr)
        return 2
    except Exception as e:
        # Usually: no credentials, a wrong region, or a table that does not exist there.
        print(f"nightbatch keys: cannot reach table '{target.table}' in {target.region} "
              f"({target.source}): {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _when(ts: int | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ") if ts else "-"


def _as_json(rec: KeyRecord) -> dict[str, Any]:
    return {"id": rec.key_id, "name": rec.name, "tenant": rec.tenant, "prefix": rec.prefix,
            "created_at": rec.created_at, "revoked_at": rec.revoked_at}


def _create(store: KeyStore, args: argparse.Namespace, target: Target) -> int:
    key, rec = store.create(name=args.name, tenant=args.tenant)
    if args.json:
        print(json.dumps({"key": key, **_as_json(rec)}))
        return 0
    # The key alone on stdout (KEY=$(nightbatch keys create …) works); the rest on stderr.
    print(f"Created {rec.key_id} '{rec.name}' for tenant '{rec.tenant}' in table '{target.table}' "
          f"({target.source}). It is shown this once; store it now:", file=sys.stderr)
    print(key)
    return 0


def _list(store: KeyStore, args: argparse.Namespace) -> int:
    records = store.list_keys()
    if args.json:
        for rec in records:
            print(json.dumps(_as_json(rec)))
        return 0
    rows = [("ID", "NAME", "TENANT", "PREFIX", "CREATED", "REVOKED")]
    rows += [(r.key_id, r.name, r.tenant, r.prefix + "…", _when(r.created_at), _when(r.revoked_at))
             for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if not records:
        print("(no keys; create one with `nightbatch keys create --name NAME`)", file=sys.stderr)
    return 0


def _revoke(store: KeyStore, args: argparse.Namespace) -> int:
    if args.prefix is not None and len(args.prefix) < MIN_PREFIX_CHARS:
        # "nb-" alone would match every key.
        print(f"nightbatch keys: --prefix needs at least {MIN_PREFIX_CHARS} characters (e.g. nb-AbCd1234)",
              file=sys.stderr)
        return 2
    matches = store.find(key_id=args.key_id, name=args.name, prefix=args.prefix)
    if not matches:
        print("nightbatch keys: no active key matches; see `nightbatch keys list`", file=sys.stderr)
        return 1
    for rec in matches:
        done = store.revoke(rec)
        print(f"revoked {done.key_id} '{done.name}' (tenant '{done.tenant}') at {_when(done.revoked_at)}")
    return 0
