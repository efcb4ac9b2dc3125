"""SES adapter: plain-text email from the configured sender identity."""

from __future__ import annotations

from typing import Any

from nightbatch.aws.botoerrors import client_error

# SES's answers that sending again cannot change (an unverified recipient in the sandbox, a bad address, an
# unverified sender); throttling and service errors stay ordinary exceptions, worth a retry.
PERMANENT_CODES = frozenset({"MessageRejected", "MailFromDomainNotVerifiedException", "InvalidParameterValue",
                             "ConfigurationSetDoesNotExist", "AccountSendingPausedException"})


class EmailRejectedError(Exception):
    """SES refused this message for good; retrying the same message would be refused again."""


class Mailer:
    def __init__(self, *, client: Any, sender: str, configuration_set: str = "") -> None:
        self.client = client
        self.sender = sender
        self.configuration_set = configuration_set

    def send_text(self, to: str, *, subject: str, text: str) -> str:
        extra = {"ConfigurationSetName": self.configuration_set} if self.configuration_set else {}
        try:
            resp = self.client.send_email(
                **extra,
                Source=self.sender,
                Destination={"ToAddresses": [to]},
                Message={"Subject": {"Data": subject, "Charset": "UTF-8"},
                         "Body": {"Text": {"Data": text, "Charset": "UTF-8"}}},
            )
        except client_error() as e:
            error = e.response.get("Error", {})
            if error.get("Code") in PERMANENT_CODES:
                raise EmailRejectedError(f"{error.get('Code')}: {error.get('Message')}") from e
            raise
        return str(resp["MessageId"])
