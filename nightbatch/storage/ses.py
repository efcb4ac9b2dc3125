"""SES adapter: plain-text email from the configured sender identity."""

from __future__ import annotations

from typing import Any


class Mailer:
    def __init__(self, *, client: Any, sender: str, configuration_set: str = "") -> None:
        self.client = client
        self.sender = sender
        self.configuration_set = configuration_set

    def send_text(self, to: str, *, subject: str, text: str) -> str:
        extra = {"ConfigurationSetName": self.configuration_set} if self.configuration_set else {}
        resp = self.client.send_email(
            **extra,
            Source=self.sender,
            Destination={"ToAddresses": [to]},
            Message={"Subject": {"Data": subject, "Charset": "UTF-8"},
                     "Body": {"Text": {"Data": text, "Charset": "UTF-8"}}},
        )
        return str(resp["MessageId"])
