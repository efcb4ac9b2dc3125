"""The sections that reach users after a batch: signed download links and notifications."""

from __future__ import annotations

from typing import Annotated

from nightbatch.settings.base import Env, Section


class LinkSettings(Section):
    """Signed download links (/v1/nightbatch/files/{id}/download; nightbatch/files/links.py)."""

    # HMAC key. Unset: a random key per process, fine for `nightbatch local`; in AWS set it, since every Lambda
    # (API, notify) must share it.
    secret: Annotated[str, Env("link_secret")] = ""
    # Secrets Manager secret (ARN) holding the link-signing keys, read at run time; the stack sets it and no key
    # sits in any environment. Wins over `secret`.
    keys_secret: Annotated[str, Env("link_keys_secret")] = ""
    ttl_seconds: Annotated[int, Env("link_ttl_seconds")] = 300

class NotificationSettings(Section):
    """Webhooks, SNS, e-mail (nightbatch/notifications, docs/NOTIFICATIONS.md)."""

    topic_arn: str = ""
    # EventBridge bus (a name, "default" for the account's default bus, or an ARN) every batch state change is
    # put on (nightbatch/notifications/state_changes.py); empty: none. The stack sets it from cdk.json `eventBus`.
    event_bus: str = ""
    notify_function: str = ""  # the Notify Lambda: the sweeper re-invokes it for events with channels pending
    webhook_queue_url: str = ""  # SQS queue Notify puts webhook deliveries on
    # Failed webhook deliveries are retried with exponential backoff from the base delay, each gap capped, until
    # the event is older than the max age (OpenAI retries for 72 h). Tests shrink them to seconds.
    webhook_retry_base_seconds: float = 5.0
    webhook_retry_max_delay_seconds: float = 6 * 3600.0
    webhook_max_age_seconds: float = 72 * 3600.0
    webhook_timeout_seconds: float = 10.0
    # Private and loopback webhook targets (the local stack allows them; never in AWS). Link-local (instance
    # metadata), multicast, reserved and unspecified addresses are refused regardless.
    allow_private_targets: bool = False
    # Webhook endpoints one tenant may register (every event fans out to each); 0 = no cap.
    max_webhook_endpoints: int = 20
    # KMS key (ARN) sealing webhook signing secrets in the table; empty stores them as they are (the local mode).
    secrets_kms_key: str = ""
    email_sender: str = ""  # verified SES sender address; empty disables e-mail notifications
    email_configuration_set: str = ""
    # Comma-separated recipient domains a batch may ask to e-mail; "*" allows any. Empty allows none in AWS and
    # any in the local mode (nightbatch/batches/recipients.py).
    email_allowed_domains: str = ""
    # Comma-separated addresses e-mailed about every terminal batch (the operator's own; not domain-checked).
    email_recipients: str = ""
    # Download links in e-mails: how long they stay valid (a mailbox is not a vault: a day, then the dashboard
    # issues fresh ones), and the API's public base URL (with or without /v1; empty: e-mails name the file ids).
    email_link_ttl_seconds: int = 86400
    public_base_url: str = ""
