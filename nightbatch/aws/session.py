"""Builds the boto3 clients once per process and hands them to the adapters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import cached_property
from typing import Any

from nightbatch.aws.dynamo import Table
from nightbatch.aws.eventbus import EventBus
from nightbatch.aws.s3 import BlobStore
from nightbatch.aws.secrets import SecretReader
from nightbatch.settings import Settings

EVENTS_TIMEOUT_SECONDS = 2


@dataclass
class Adapters:
    settings: Settings
    session: Any
    endpoint_url: str | None = None

    def client(self, service: str, **kw: Any) -> Any:
        return self.session.client(service, endpoint_url=self.endpoint_url, **kw)

    @cached_property
    def blobs(self) -> BlobStore:
        from botocore.config import Config

        # SigV4 so pre-signed URLs work in every region (moto and us-east-1 default to SigV2 otherwise).
        cfg = Config(signature_version="s3v4", retries={"max_attempts": 5, "mode": "standard"})
        return BlobStore(client=self.client("s3", config=cfg), bucket=self.settings.deployment.bucket)

    @cached_property
    def table(self) -> Table:
        resource = self.session.resource("dynamodb", endpoint_url=self.endpoint_url)
        return Table(resource=resource, name=self.settings.deployment.table)

    @cached_property
    def stepfunctions(self) -> Any:
        return self.client("stepfunctions")

    @cached_property
    def sns(self) -> Any:
        return self.client("sns")

    @cached_property
    def event_bus(self) -> EventBus | None:
        """The bus batch state changes go to, when one is configured."""
        bus = self.settings.notifications.event_bus
        if not bus:
            return None
        from botocore.config import Config

        # The API puts creates' and cancels' events inline: a slow bus costs a request at most ~2 s twice, never
        # API Gateway's 29 s (botocore's defaults are 60 s reads, retried). An open status's event is best
        # effort; the terminal one is retried by the Notify step.
        cfg = Config(connect_timeout=EVENTS_TIMEOUT_SECONDS, read_timeout=EVENTS_TIMEOUT_SECONDS,
                     retries={"total_max_attempts": 2, "mode": "standard"})
        return EventBus(client=self.client("events", config=cfg), bus=bus)

    @cached_property
    def secrets(self) -> SecretReader:
        """One per process (services are built once), so its cache outlives a request."""
        return SecretReader(client=self.client("secretsmanager"))


def make_adapters(settings: Settings, *, endpoint_url: str | None = None) -> Adapters:
    # Imported here, not at the top: the API's cold import stays free of boto3 until a request needs AWS.
    import boto3

    session = boto3.session.Session(region_name=settings.deployment.region)
    # Before any client is made: its response parsers take the parser they are built with.
    session._session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
    return Adapters(settings=settings, session=session, endpoint_url=endpoint_url)


def parse_timestamp(value: Any) -> datetime:
    """botocore's timestamp parser for the two forms AWS answers in — ISO 8601 (a listing's LastModified) and
    RFC 7231 (a GET's Last-Modified header) — without dateutil, which costs ~0.1 ms a value (every key a listing
    returns, every GET: a tenth of Finalize's CPU); the same datetime (aware when the value names its zone, as
    AWS's do). Anything else (epoch numbers, other shapes) goes to botocore's own."""
    if isinstance(value, str):
        try:
            if value[:1].isdigit():
                return datetime.fromisoformat(value)
            parsed = parsedate_to_datetime(value)
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)  # "-0000": UTC
        except (ValueError, TypeError, IndexError):
            pass
    from botocore.utils import parse_timestamp as botocore_parse

    return botocore_parse(value)  # type: ignore[no-any-return]
