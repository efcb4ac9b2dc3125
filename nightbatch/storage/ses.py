"""SES adapter: plain-text email from the configured sender identity."""

from __future__ import annotations

from typing import Any


class Mailer:
    def __init__(self, *, client: Any, sender: str) -> None:
        self.client = client
        self.sender = sender

    def send_text(self, to: str, *, subject: str, text: str) -> str:
        resp = self.client.send_email(
            Source=self.sender,
            Destination={"ToAddresses": [to]},
            Message={"Subject": {"Data": subject, "Charset": "UTF-8"},
                     "Body": {"Text": {"Data": text, "Charset": "UTF-8"}}},
        )
        return str(resp["MessageId"])
