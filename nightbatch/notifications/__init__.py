"""Completion notifications: OpenAI-compatible signed webhooks, SNS and SES email (docs/NOTIFICATIONS.md)."""

from nightbatch.notifications.notifier import Notifier, NotifyError, NotifyResult, notify_batch

__all__ = ["Notifier", "NotifyError", "NotifyResult", "notify_batch"]
