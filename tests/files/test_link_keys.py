"""M4: link-signing keys come from Secrets Manager at run time, links name their key, two keys verify during a
rotation. L8: a link names the API key that asked for it and dies with that key."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from nightbatch.files.links import InvalidLinkError, link_keys_from, sign_link, verify_link
from nightbatch.tenancy.keys import KeyStore
from tests.support.tenant_stack import Stack, chat_lines


def test_keys_rotate_without_breaking_links_in_flight(make_stack: Any) -> None:
    stack: Stack = make_stack()
    sm = stack.services.adapters.client("secretsmanager")
    arn = sm.create_secret(Name="nb-links-test", SecretString=json.dumps({"current": "k1", "k1": "a" * 64}))["ARN"]
    stack.settings.links.keys_secret = arn
    stack.settings.links.secret = ""
    adapters = stack.services.adapters
    old = sign_link(stack.settings, "file-x", keys=link_keys_from(adapters))
    assert old.kid == "k1" and "kid=k1" in old.path

    sm.put_secret_value(SecretId=arn, SecretString=json.dumps({"current": "k2", "k1": "a" * 64, "k2": "b" * 64}))
    adapters.secrets.forget()  # as after key_cache_seconds
    keys = link_keys_from(adapters)
    new = sign_link(stack.settings, "file-x", keys=keys)
    assert new.kid == "k2"
    for link in (old, new):  # both verify while both keys are in the secret
        verify_link(stack.settings, "file-x", str(link.expires_at), link.sig, kid=link.kid, keys=keys)

    sm.put_secret_value(SecretId=arn, SecretString=json.dumps({"current": "k2", "k2": "b" * 64}))
    adapters.secrets.forget()
    keys = link_keys_from(adapters)
    verify_link(stack.settings, "file-x", str(new.expires_at), new.sig, kid=new.kid, keys=keys)
    with pytest.raises(InvalidLinkError):
        verify_link(stack.settings, "file-x", str(old.expires_at), old.sig, kid=old.kid, keys=keys)
    with pytest.raises(InvalidLinkError):  # a link cannot claim another key id than the one that signed it
        verify_link(stack.settings, "file-x", str(new.expires_at), new.sig, kid="k1", keys=keys)


def test_a_link_stops_working_when_its_api_key_is_revoked(make_stack: Any) -> None:
    stack: Stack = make_stack()
    key = stack.new_key("team-a", name="laptop")
    client = stack.client(key)
    f = client.files.create(file=("in.jsonl", chat_lines(1)), purpose="batch")
    made = client.post(f"/nightbatch/files/{f.id}/link", cast_to=object)
    url = made["url"]
    (rec,) = KeyStore(stack.table).find(name="laptop")
    assert f"ak={rec.key_id}" in url
    assert requests.get(url, allow_redirects=False, timeout=10).status_code == 307
    tampered = url.replace(f"ak={rec.key_id}", "ak=")
    assert requests.get(tampered, allow_redirects=False, timeout=10).status_code == 403, "ak is signed"
    KeyStore(stack.table).revoke(rec)
    resp = requests.get(url, allow_redirects=False, timeout=10)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "link_revoked"
