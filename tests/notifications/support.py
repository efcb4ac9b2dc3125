"""Helpers for the notification tests: stacks on moto, batches moved by hand, loopback webhook receivers."""

from __future__ import annotations

import io
import ipaddress
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests
from moto.core.models import DEFAULT_ACCOUNT_ID

from nightbatch.aws import Adapters
from nightbatch.batches import lifecycle
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.notifications import Notifier
from nightbatch.settings import Settings
from nightbatch.wiring import Services
from tests.conftest import REGION, TEST_API_KEY, ApiServer

SENDER = "nightbatch@example.org"


@dataclass
class ConnectionGuard:
    attempts: list[Any] = field(default_factory=list)


def is_loopback(address: Any) -> bool:
    if not isinstance(address, tuple):  # AF_UNIX
        return True
    try:
        return ipaddress.ip_address(str(address[0]).split("%", 1)[0]).is_loopback
    except ValueError:
        return str(address[0]) == "localhost"


@dataclass
class Stack:
    """The API on loopback (tests/conftest.py's serve_api) plus the notifier the Notify step would use."""

    api: ApiServer
    notifier: Notifier
    moto_url: str

    @property
    def settings(self) -> Settings:
        return self.api.services.settings

    @property
    def services(self) -> Services:
        return self.api.services

    @property
    def adapters(self) -> Adapters:
        return self.api.services.adapters

    @property
    def api_url(self) -> str:
        return self.api.base_url

    def client(self) -> Any:
        return self.api.openai()


def make_batch(stack: Stack, status: str = "completed", *, email: Any = None, tenant: str = "default") -> str:
    """A batch moved through the lifecycle table directly, with output and error files when it has results."""
    files = stack.services.files
    line = b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}\n'
    inp = files.create(tenant, filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(line), size=len(line))
    options = {"notify": {"email": email}} if email is not None else None
    batch = stack.services.batches.create(tenant, CreateBatchRequest(
        input_file_id=inp.id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"run": "nightly"}, nightbatch=options))
    table = stack.adapters.table
    if status == "failed":
        lifecycle.transition(table, batch.id, "failed", extra={"errors": {"object": "list", "data": [
            {"code": "invalid_json_line", "message": "This line is not parseable as valid JSON.", "param": None,
             "line": 1}]}})
        return batch.id
    if status == "cancelled":
        lifecycle.transition(table, batch.id, "cancelling")
        lifecycle.transition(table, batch.id, "cancelled")
        return batch.id
    lifecycle.transition(table, batch.id, "in_progress", extra={"request_counts": {"total": 3, "completed": 0,
                                                                                   "failed": 0}})
    lifecycle.transition(table, batch.id, "finalizing")
    out = b'{"id":"batch_req_1","custom_id":"a","response":{"status_code":200},"error":null}\n' * 2
    err = b'{"id":"batch_req_2","custom_id":"b","response":null,"error":{"code":"x","message":"y"}}\n'
    out_file = files.create(tenant, filename=f"{batch.id}_output.jsonl", purpose="batch_output",
                            fileobj=io.BytesIO(out), size=len(out))
    err_file = files.create(tenant, filename=f"{batch.id}_error.jsonl", purpose="batch_output",
                            fileobj=io.BytesIO(err), size=len(err))
    lifecycle.transition(table, batch.id, status, extra={
        "request_counts": {"total": 3, "completed": 2, "failed": 1}, "output_file_id": out_file.id,
        "error_file_id": err_file.id,
        "usage": {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 42},
    })
    return batch.id


# --- loopback webhook receivers ----------------------------------------------------------------------------------

@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


class Receiver:
    """A real HTTP server on loopback. `script` holds one reply per request (an int status, or ("sleep", s));
    when it runs out, replies are 200."""

    def __init__(self, script: list[Any] | None = None) -> None:
        self.script = list(script or [])
        self.received: list[Received] = []
        self.cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.cond:
                    receiver.received.append(Received({k.lower(): v for k, v in self.headers.items()}, body,
                                                      time.time()))
                    reply = receiver.script.pop(0) if receiver.script else 200
                    receiver.cond.notify_all()
                if isinstance(reply, tuple) and reply[0] == "sleep":
                    time.sleep(reply[1])
                    reply = 200
                if isinstance(reply, tuple) and reply[0] == "redirect":
                    self.send_response(302)
                    self.send_header("location", reply[1])
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                self.send_response(int(reply))
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/openai"

    def wait_for(self, n: int, timeout: float = 20.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.received) < n:
                left = deadline - time.monotonic()
                assert left > 0, f"expected {n} deliveries, got {len(self.received)}"
                self.cond.wait(left)
            return list(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def deliveries(stack: Stack, endpoint_id: str) -> list[dict[str, Any]]:
    resp = requests.get(f"{stack.api_url}/v1/nightbatch/webhook_endpoints/{endpoint_id}/deliveries",
                        headers={"authorization": f"Bearer {TEST_API_KEY}"}, timeout=10)
    assert resp.status_code == 200, resp.text
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


def sns_notifications(stack: Stack) -> list[tuple[Any, ...]]:
    from moto.sns.models import sns_backends

    topic = sns_backends[DEFAULT_ACCOUNT_ID][REGION].topics[stack.settings.notifications.topic_arn]
    return list(topic.sent_notifications)


def ses_messages() -> list[Any]:
    from moto.ses.models import ses_backends

    return list(ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages)


def event_json(received: Received) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(received.body)
    return out



def self_signed_certificate(host: str, directory: Any) -> tuple[str, str]:
    """(cert path, key path) for `host`, self-signed; a test trusts it explicitly."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = f"{directory}/cert.pem", f"{directory}/key.pem"
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return cert_path, key_path


class TlsReceiver(Receiver):
    """A Receiver behind TLS on loopback, recording the server name (SNI) each client asked for."""

    def __init__(self, cert_path: str, key_path: str) -> None:
        import ssl

        super().__init__()
        self.server_names: list[str | None] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_path, key_path)
        context.sni_callback = lambda sock, name, ctx: self.server_names.append(name)  # type: ignore[assignment]
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
