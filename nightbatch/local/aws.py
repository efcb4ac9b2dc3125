"""Embedded AWS: moto's server in this process on loopback, with the bucket and table infra/ would create."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.utils import parseaddr
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

from nightbatch.aws import make_adapters
from nightbatch.aws.dynamo import create_table
from nightbatch.settings import Settings

LOCAL_TOPIC = "nightbatch-events"
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class AtomicDynamoDB:
    """WSGI wrapper around moto's server app that runs one DynamoDB request at a time.

    Real DynamoDB applies each write (its condition and its update, or an ADD) atomically. moto's threaded
    server runs requests concurrently without a lock, so two conditional transitions from one status could
    both win and concurrent ADDs could lose counts. Serializing DynamoDB calls restores the guarantee the
    lifecycle relies on; other services (S3 streams, Step Functions) stay concurrent.
    """

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("HTTP_X_AMZ_TARGET", "")).startswith("DynamoDB_"):
            with self.lock:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


class AtomicMotoServer(ThreadedMotoServer):  # type: ignore[misc]
    """ThreadedMotoServer whose DynamoDB requests are atomic, as in AWS (see AtomicDynamoDB)."""

    def _server_entry(self) -> None:
        # Mirrors ThreadedMotoServer._server_entry (moto 5.x), with the app wrapped.
        app = AtomicDynamoDB(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


@dataclass
class EmbeddedAws:
    server: Any
    endpoint_url: str
    port: int
    topic_arn: str = ""

    def stop(self) -> None:
        self.server.stop()


def start_embedded_aws(settings: Settings, *, host: str = "127.0.0.1") -> EmbeddedAws:
    port = free_port(host)
    # boto3 in this process (and any child process) reaches moto without code changes.
    for k, v in FAKE_CREDENTIALS.items():
        os.environ.setdefault(k, v)
    os.environ["AWS_DEFAULT_REGION"] = settings.deployment.region
    os.environ["MOTO_PORT"] = str(port)
    server = AtomicMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    endpoint = f"http://{host}:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    adapters = make_adapters(settings, endpoint_url=endpoint)
    adapters.client("s3").create_bucket(Bucket=settings.deployment.bucket)
    create_table(adapters.client("dynamodb"), settings.deployment.table)
    # Notifications: the topic infra/ creates, and the sender's domain verified in SES (moto enforces it).
    topic_arn = str(adapters.sns.create_topic(Name=LOCAL_TOPIC)["TopicArn"])
    sender = parseaddr(settings.notifications.email_sender)[1]
    if "@" in sender:
        adapters.client("ses").verify_domain_identity(Domain=sender.rsplit("@", 1)[1])
    return EmbeddedAws(server=server, endpoint_url=endpoint, port=port, topic_arn=topic_arn)
