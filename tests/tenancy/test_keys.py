"""Stored API keys: format, hash-only storage, listing, revocation through the cache, over real HTTP."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import openai
import pytest

from nightbatch.errors import InvalidRequestError
from nightbatch.tenancy.keys import KeyCache, KeyStore, hash_key


def test_key_format_and_only_the_hash_is_stored(make_stack: Any) -> None:
    stack = make_stack()
    store = KeyStore(stack.table)
    key, rec = store.create(name="ci", tenant="team-a")
    assert re.fullmatch(r"nb-[A-Za-z0-9_-]{43,}", key)  # 32 random bytes, URL-safe
    assert rec.tenant == "team-a" and rec.name == "ci" and rec.active
    assert rec.key_id.startswith("key_") and key.startswith(rec.prefix)
    raw = stack.services.adapters.client("dynamodb").scan(TableName=stack.settings.deployment.table)["Items"]
    dumped = json.dumps(raw)
    assert key not in dumped and key[len(rec.prefix):] not in dumped
    assert hash_key(key) in dumped
    item = stack.table.get(f"key#{hash_key(key)}")
    assert item["kind"] == "apikey" and item["tenant"] == "team-a" and item.get("revoked_at") is None
    assert item["created_at"] > 0


def test_names_and_tenants_are_checked(make_stack: Any) -> None:
    store = KeyStore(make_stack().table)
    store.create(name="ci")
    with pytest.raises(InvalidRequestError, match="already exists"):
        store.create(name="ci")
    for bad in ("Team", "a#b", "", "x" * 64, "-x"):
        with pytest.raises(InvalidRequestError, match="Invalid tenant"):
            store.create(name=f"n-{len(bad)}-{bad.isupper()}", tenant=bad)
    store.revoke(store.find(name="ci")[0])
    store.create(name="ci")  # the name is free again once its key is revoked


def test_revocation_takes_effect_at_once_with_a_zero_ttl(make_stack: Any) -> None:
    stack = make_stack()  # key_cache_seconds=0
    key = stack.new_key("team-a", "soon-revoked")
    client = stack.client(key)
    f = client.files.create(file=("a.jsonl", b'{"x": 1}\n'), purpose="batch")
    store = KeyStore(stack.table)
    [rec] = store.find(name="soon-revoked")
    store.revoke(rec)
    with pytest.raises(openai.AuthenticationError) as info:
        client.files.retrieve(f.id)
    assert info.value.code == "invalid_api_key"
    assert store.lookup(key) is None
    assert [r.revoked_at is not None for r in store.list_keys()] == [True]


def test_revocation_takes_effect_within_the_cache_ttl(make_stack: Any) -> None:
    ttl = 1.0
    stack = make_stack(key_cache_seconds=ttl)
    key = stack.new_key("team-a", "cached")
    client = stack.client(key)
    client.files.list()  # cached now: the entry is older than the revocation below
    store = KeyStore(stack.table)
    store.revoke(store.find(name="cached")[0])
    revoked_at = time.monotonic()
    while True:
        # A request that *starts* a TTL after the revocation must be refused, however long
        # a request takes on a loaded machine (a bound on the end time would measure the load).
        started = time.monotonic()
        try:
            client.files.list()
        except openai.AuthenticationError:
            break
        assert started - revoked_at < ttl, "a request started after the cache TTL was served with a revoked key"
        time.sleep(0.05)


def test_a_new_key_works_at_once_even_with_a_cache(make_stack: Any) -> None:
    stack = make_stack(key_cache_seconds=30.0)
    with pytest.raises(openai.AuthenticationError):
        stack.client("nb-" + "x" * 43).files.list()
    assert stack.client(stack.new_key("team-a")).files.list().data == []


def test_cache_hits_skip_the_table_and_are_bounded(make_stack: Any) -> None:
    stack = make_stack()
    store = KeyStore(stack.table)
    keys = [store.create(name=f"k{i}", tenant="team-a")[0] for i in range(3)]
    cache = KeyCache(store, ttl=60, max_entries=2)
    for k in keys:
        assert cache.lookup(k) is not None
    store.revoke(store.find(name="k2")[0])
    assert cache.lookup(keys[2]) is not None  # still cached: revocation waits for the TTL
    assert cache.lookup(keys[0]) is not None  # evicted (bounded), read again: still active
    assert len(cache._entries) == 2
    assert cache.lookup("not-a-key") is None
    assert cache.lookup("nb-" + "y" * 43) is None


def test_find_by_id_prefix_name_and_whole_key(make_stack: Any) -> None:
    store = KeyStore(make_stack().table)
    key, rec = store.create(name="ops", tenant="team-b")
    assert store.find(key_id=rec.key_id) == [rec]
    assert store.find(prefix=rec.prefix) == [rec]
    assert store.find(prefix=key) == [rec]
    assert store.find(name="ops") == [rec]
    assert store.find(name="nope") == []


def test_bootstrap_keys_from_the_deployment_secret(make_stack: Any) -> None:
    probe = make_stack()
    sm = probe.services.adapters.client("secretsmanager")
    arn = sm.create_secret(Name=f"nb-keys-{uuid.uuid4().hex[:8]}", SecretString="firstsecretkey0123456789")["ARN"]
    stack = make_stack(api_keys_secret=arn)
    assert stack.client("firstsecretkey0123456789").files.list().data == []  # tenant "default"
    # Rotation (two keys during the overlap) is picked up after the cache TTL (0 in tests).
    sm.put_secret_value(SecretId=arn, SecretString="firstsecretkey0123456789, secondsecretkey987654321")
    assert stack.client("secondsecretkey987654321").files.list().data == []
    sm.put_secret_value(SecretId=arn, SecretString="secondsecretkey987654321")
    with pytest.raises(openai.AuthenticationError):
        stack.client("firstsecretkey0123456789").files.list()
    # A secret that cannot be read leaves the other keys working (and is logged), not a 500 on every call.
    broken = make_stack(api_keys_secret=arn + "-missing")
    assert broken.client(broken.new_key("team-a")).files.list().data == []
    with pytest.raises(openai.AuthenticationError):
        broken.client("secondsecretkey987654321").files.list()


def test_secret_reads_are_cached_and_failures_back_off(make_stack: Any) -> None:
    """Parameters (Powertools) keeps a read secret for max_age; BootstrapKeys does not re-ask a failing one."""
    from nightbatch.tenancy.keys import BootstrapKeys

    stack = make_stack()
    reader = stack.services.adapters.secrets
    calls: list[str] = []
    reader.client.meta.events.register("before-parameter-build.secrets-manager.GetSecretValue",
                                       lambda params, **_: calls.append(params["SecretId"]))
    name = f"nb-cache-{uuid.uuid4().hex[:8]}"
    reader.client.create_secret(Name=name, SecretString="k1,k2")
    assert reader.read(name, max_age=3600) == "k1,k2"
    reader.client.put_secret_value(SecretId=name, SecretString="k3")
    assert reader.read(name, max_age=3600) == "k1,k2" and len(calls) == 1  # cached
    reader.forget()
    assert reader.read(name, max_age=3600) == "k3" and len(calls) == 2

    failing = BootstrapKeys({"env-key"}, lambda: reader.read(name + "-missing", max_age=3600), ttl=3600)
    assert failing.current() == {"env-key"} and failing.current() == {"env-key"}
    assert calls.count(name + "-missing") == 1  # the failure is remembered for the ttl
    reader.client.create_secret(Name=name + "-0", SecretString="k4")
    uncached = BootstrapKeys(set(), lambda: reader.read(name + "-0", max_age=0), ttl=0)
    assert uncached.current() == {"k4"} and uncached.current() == {"k4"}
    assert calls.count(name + "-0") == 2  # max_age 0 (the tests' key_cache_seconds): every call reads
