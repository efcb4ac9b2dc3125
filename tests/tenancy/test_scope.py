"""The one owner of "may this tenant touch this object" (nightbatch/tenancy/scope.py): the URI grammar, the
allow-list entries and their `{tenant}` expansion."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nightbatch.settings import Settings
from nightbatch.tenancy.scope import Scope, ScopeError, parse_entry, parse_s3_uri

READ = "s3://lake/teams/{tenant}/,shared-bucket,s3://lake/common/"
WRITE = "s3://out/{tenant}/,s3://out-shared/all/"


def scope(tenant: str, *, read: str = READ, write: str = WRITE) -> Scope:
    settings = Settings(files={"user_input_buckets": read, "user_output_prefixes": write},
                        deployment={"bucket": "nightbatch-data"})
    return Scope.of(settings, tenant)


def test_a_tenant_reads_its_own_expansion_and_the_shared_entries() -> None:
    a = scope("team-a")
    assert str(a.readable("s3://lake/teams/team-a/in.jsonl", "p")) == "s3://lake/teams/team-a/in.jsonl"
    assert a.readable("s3://lake/teams/team-a/", "p").is_prefix
    assert a.readable("s3://shared-bucket/anything/at/all.jsonl", "p").key == "anything/at/all.jsonl"
    assert a.readable("s3://lake/common/x.png", "p").bucket == "lake"
    assert str(a.writable("s3://out/team-a/nightly", "p")) == "s3://out/team-a/nightly/"


@pytest.mark.parametrize("uri", [
    "s3://lake/teams/team-b/secret.jsonl",  # another tenant's expansion
    "s3://lake/teams/team-b/",
    "s3://lake/teams/",  # a parent of the tenant's prefix
    "s3://lake/teams/team-a",  # the prefix without its slash is an object beside it, not under it
    "s3://lake/teams/team-ab/x.jsonl",  # a tenant whose name starts with ours
    "s3://lake/",
    "s3://lake/other/x.jsonl",
    "s3://unlisted/x.jsonl",
])
def test_anything_else_is_refused_naming_the_parameter(uri: str) -> None:
    with pytest.raises(ScopeError) as e:
        scope("team-a").readable(uri, "nightbatch.input_uri")
    assert (e.value.status, e.value.code, e.value.param) == (400, "bucket_not_allowed", "nightbatch.input_uri")
    assert "team-a" in e.value.message


@pytest.mark.parametrize(("uri", "why"), [
    ("s3://lake/teams/team-a/../team-b/x", "'.' or '..'"),
    ("s3://lake/teams/team-a/./x", "'.' or '..'"),
    ("s3://lake/teams/team-a/%2e%2e/team-b/x", "'.' or '..'"),
    ("s3://lake/teams/team-a/%2E%2e/x", "'.' or '..'"),
    ("s3://lake/teams/team-a/%252e%252e/x", "'.' or '..'"),
    ("s3://lake/teams/team-a//x", "empty path segment"),
    ("s3://lake//teams/team-a/x", "empty path segment"),
    ("s3://lake/teams/team-a/a\nb", "control character"),
    ("s3://lake/teams/team-a/a\x00b", "control character"),
    ("s3://lake/teams/team-a/\ud800x", "not valid UTF-8"),
    ("s3://lake/teams/team-a/" + "k" * 1100, "at most 1024 bytes"),
    ("s3://lake/teams/team-a/*.jsonl", "'*' is not allowed"),
    ("s3://Not_A_Bucket/x", "not a bucket name"),
    ("s3://a..b/x", "not a bucket name"),
    ("s3:///x", "not a bucket name"),
])
def test_a_uri_that_is_not_a_plain_s3_name_is_a_400(uri: str, why: str) -> None:
    with pytest.raises(ScopeError) as e:
        scope("team-a").readable(uri, "nightbatch.input_uri")
    assert e.value.code == "invalid_value" and why in e.value.message
    e.value.message.encode("utf-8")  # the message itself is printable and encodable


@pytest.mark.parametrize("value", [None, 3, ["s3://lake/x"], "https://lake/x", "lake/x", ""])
def test_not_an_s3_uri(value: object) -> None:
    with pytest.raises(ScopeError, match="expected an 's3://bucket/key' URI"):
        parse_s3_uri(value, "p")


def test_the_deployments_own_bucket_is_never_named() -> None:
    own = scope("team-a", read="nightbatch-data,lake")
    with pytest.raises(ScopeError, match="deployment's own bucket"):
        own.readable("s3://nightbatch-data/files/file-abc", "p")
    assert not own.may_read("nightbatch-data", "files/file-abc")


def test_the_worker_checks_by_bucket_and_key() -> None:
    a = scope("team-a")
    assert a.may_read("lake", "teams/team-a/x.png") and not a.may_read("lake", "teams/team-b/x.png")
    assert a.may_write("out", "team-a/batch_1/output.jsonl") and not a.may_write("out", "team-b/x")
    assert a.owns({"nightbatch-tenant": "team-a"}) and not a.owns({"nightbatch-tenant": "team-b"})
    assert not a.owns({})


@pytest.mark.parametrize(("entry", "message"), [
    ("Not_A_Bucket", "neither a bucket name"),
    ("s3://lake/teams-{tenant}/", "one whole path segment"),
    ("s3://lake/{tenant}/{tenant}/", "one whole path segment"),
    ("s3://lake/../x/", "'.' or '..'"),
])
def test_a_bad_entry_is_refused(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_entry(entry)


def test_entries_are_normalised_to_prefixes() -> None:
    assert str(parse_entry("s3://lake/teams/{tenant}")) == "s3://lake/teams/{tenant}/"
    assert str(parse_entry("lake")) == "s3://lake/"
    assert parse_entry("s3://lake/teams/{tenant}/").per_tenant and not parse_entry("lake").per_tenant


TENANTS = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True)
SEGMENT = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=12)


@given(a=TENANTS, b=TENANTS, rest=st.lists(SEGMENT, max_size=4))
def test_no_uri_reaches_another_tenants_expansion(a: str, b: str, rest: list[str]) -> None:
    """Whatever a tenant writes after another tenant's prefix, it is refused (or not even an S3 name)."""
    if a == b:
        return
    uri = "s3://lake/teams/" + b + "/" + "/".join(rest)
    try:
        got = scope(a, read="s3://lake/teams/{tenant}/").readable(uri, "p")
    except ScopeError:
        return
    assert got.key.startswith(f"teams/{a}/")  # only reachable if it is really under a's own prefix
