# ruff: noqa: F811  (the `services` fixture is imported from tests/support/pipeline_world.py, then requested)
"""A value checked against a pattern must match it whole: `re.match(r"…$")` also takes the value followed by a
newline (`$` matches before a trailing "\\n"), so each check below refuses the value with one appended. (The
Anthropic `custom_id` is checked through the SDK in tests/messages/test_message_batches_api.py; pydantic's `pattern=`
fields already match whole values.) A scan of the packages keeps such a prefix match from coming back, on a
value of ours (an S3 key name) as on a user's."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.user_buckets import UserBuckets
from nightbatch.batches.recipients import check_notify_options, domain_allowed
from nightbatch.batches.request import window_hours
from nightbatch.errors import InvalidRequestError
from nightbatch.settings import Settings
from nightbatch.tenancy.keys import KeyStore, check_tenant
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.media import check_media_url
from nightbatch.wiring import Services
from tests.support.pipeline_world import services  # noqa: F401


def settings() -> Settings:
    return Settings(notifications={"email_allowed_domains": "example.com"},
                    validation={"media_allowed_domains": "images.example.com"})


CHECKS: dict[str, tuple[Callable[[str], object], str]] = {
    "completion_window": (lambda v: window_hours(v, 168), "24h"),
    "notify email": (lambda v: check_notify_options({"notify": {"email": [v]}}, settings()), "me@example.com"),
    "tenant": (check_tenant, "team-a"),
    "media url": (lambda v: check_media_url(settings(), v, "image_url", "body.messages[0].content[0]"),
                  "https://images.example.com:443"),
    "cdk.json userBuckets.kmsKeys": (lambda v: UserBuckets(kmsKeys=(v,)),
                                     "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab"),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_a_trailing_newline_is_refused(name: str) -> None:
    check, good = CHECKS[name]
    check(good)  # the value itself passes
    for bad in (good + "\n", good + "\n\n"):
        with pytest.raises((InvalidRequestError, LineInvalid, ValidationError)):
            check(bad)


def test_an_email_domain_with_a_trailing_newline_is_not_allowed() -> None:
    assert domain_allowed(settings(), "me@example.com")
    assert not domain_allowed(settings(), "me@example.com\n")


def test_key_names_and_tenants_with_a_trailing_newline_make_no_key(services: Services) -> None:
    store = KeyStore(services.adapters.table)
    for name, tenant in (("ci\n", "team-a"), ("ci", "team-a\n")):
        with pytest.raises(InvalidRequestError):
            store.create(name=name, tenant=tenant)
    assert store.list_keys() == []
    store.create(name="ci", tenant="team-a")


ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("nightbatch", "functions", "gpu_worker", "infra")


def _anchored_at_end(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith("$") and (
        not node.value.endswith("\\$"))


def _compiled(tree: ast.Module) -> set[str]:
    """The names bound to `re.compile(r"…$")`."""
    return {target.id for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "compile"
            and node.value.args and _anchored_at_end(node.value.args[0])
            for target in node.targets if isinstance(target, ast.Name)}


def _prefix_matches(tree: ast.Module, everywhere: set[str]) -> list[int]:
    """Lines of `re.match/search(r"…$", …)` and of `.match/.search` on such a compiled pattern: the module's own,
    one it imports by name, or `module.NAME` of one compiled anywhere (`everywhere`)."""
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    names = _compiled(tree) | (imported & everywhere)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("match", "search")):
            continue
        owner = node.func.value
        if (isinstance(owner, ast.Name) and owner.id == "re" and node.args and _anchored_at_end(node.args[0])) or (
                isinstance(owner, ast.Name) and owner.id in names) or (
                isinstance(owner, ast.Attribute) and owner.attr in everywhere):
            found.append(node.lineno)
    return found


def test_no_pattern_ending_in_dollar_is_matched_by_its_prefix() -> None:
    """The next check cannot reintroduce it: use `fullmatch` (or end the pattern with `\\Z`)."""
    trees = {path: ast.parse(path.read_text())
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}
    compiled = set().union(*map(_compiled, trees.values()))
    assert {"CUSTOM_ID_RE", "TENANT_RE", "WINDOW_RE"} <= compiled
    found = [f"{path.relative_to(ROOT)}:{line}"
             for path, tree in trees.items() for line in _prefix_matches(tree, compiled)]
    assert found == []
