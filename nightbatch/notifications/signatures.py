"""Standard Webhooks signing: `whsec_` secrets and the three headers OpenAI's `webhooks.unwrap()` verifies."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # Standard Webhooks asks for 24 to 64 random bytes
USER_AGENT = "nightbatch-webhooks/1.0 (OpenAI-compatible; +https://www.standardwebhooks.com)"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_hint(secret: str) -> str:
    return f"{SECRET_PREFIX}****{secret[-4:]}"


def signed_headers(webhook_id: str, body: bytes, signing_secrets: Iterable[str], *, at: int) -> dict[str, str]:
    """Headers for one attempt: a fresh timestamp, and one signature per active secret (rotation overlap)."""
    timestamp = datetime.fromtimestamp(at, tz=UTC)
    text = body.decode("utf-8")
    signatures = [Webhook(s).sign(msg_id=webhook_id, timestamp=timestamp, data=text) for s in signing_secrets]
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": webhook_id,
        "webhook-timestamp": str(at),
        "webhook-signature": " ".join(signatures),
    }
