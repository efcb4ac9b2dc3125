"""Who a batch's e-mails go to: the operator's recipients, and the addresses the batch asked for (opt-in per batch:
`extra_body={"nightbatch": {"notify": {"email": ...}}}`) in a domain the deployment may e-mail. The one rule,
checked at create (a 400 now rather than a dropped e-mail later: batches/request.py) and again at send (the
Notify step, nightbatch/notifications/notifier.py), when the allowed domains may have changed.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from nightbatch.errors import InvalidRequestError
from nightbatch.settings import Settings
from nightbatch.settings.base import comma_list

MAX_BATCH_RECIPIENTS = 10
ADDRESS_RE = re.compile(r"^[A-Za-z0-9.!#$%&*+/=?^_`{|}~-]+@([A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+)$")
PARAM = "nightbatch.notify.email"


def requested(options: dict[str, Any] | None) -> list[str]:
    """The addresses a batch asked for: `extra_body={"nightbatch": {"notify": {"email": "a@x" | [...]}}}`."""
    notify = (options or {}).get("notify") or {}
    value = notify.get("email") if isinstance(notify, dict) else None
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value) if isinstance(value, list) else [value]


@lru_cache(maxsize=16)
def allowed_domains(raw: str) -> frozenset[str]:
    """NIGHTBATCH_EMAIL_ALLOWED_DOMAINS as a set of lower-cased domains, parsed once per distinct value."""
    return frozenset(d.lower() for d in comma_list(raw))


def domain_allowed(settings: Settings, address: str) -> bool:
    """NIGHTBATCH_EMAIL_ALLOWED_DOMAINS: "*" allows any domain; empty allows none in AWS, where anyone holding
    an API key could otherwise make the deployment's SES identity mail anywhere, and any in the local mode,
    whose SES is the embedded emulation that sends nothing."""
    domains = allowed_domains(settings.notifications.email_allowed_domains)
    m = ADDRESS_RE.fullmatch(address)
    if m is None:
        return False
    if not domains:
        return settings.deployment.mode == "local"
    return "*" in domains or m.group(1).lower() in domains


def check_notify_options(options: dict[str, Any] | None, settings: Settings) -> None:
    """For batch create: a clear 400 now rather than a silently dropped email later."""
    addresses = requested(options)
    if len(addresses) > MAX_BATCH_RECIPIENTS:
        raise InvalidRequestError(f"Invalid '{PARAM}': at most {MAX_BATCH_RECIPIENTS} addresses.", param=PARAM,
                                  code="invalid_value")
    for a in addresses:
        if not isinstance(a, str) or not ADDRESS_RE.fullmatch(a):
            raise InvalidRequestError(f"Invalid '{PARAM}': {a!r} is not an email address.", param=PARAM,
                                      code="invalid_value")
        if not domain_allowed(settings, a):
            raise InvalidRequestError(
                f"Invalid '{PARAM}': '{a}' is not in a domain this deployment may email "
                "(NIGHTBATCH_EMAIL_ALLOWED_DOMAINS).", param=PARAM, code="invalid_value")


def recipients(settings: Settings, options: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """(to send to, refused): the operator's recipients, then the batch's own that pass the domain rule."""
    out: list[str] = []
    refused: list[str] = []
    for a in comma_list(settings.notifications.email_recipients):
        if a.lower() not in (x.lower() for x in out):
            out.append(a)
    for a in requested(options)[:MAX_BATCH_RECIPIENTS]:
        if not isinstance(a, str) or not domain_allowed(settings, a):
            refused.append(str(a))
        elif a.lower() not in (x.lower() for x in out):
            out.append(a)
    return out, refused
