"""The notification phase without --stack: the webhook event of each probe batch, as a subscriber sees it.

Against a server on this machine (`nightbatch local`) the doctor listens on a loopback port of its own, subscribes
it as a temporary webhook endpoint for the run and deletes it afterwards, so the phase is the real delivery.
Elsewhere it never creates an endpoint (that would send the tenant's events somewhere new): it reads the
delivery records of endpoints the tenant already has, and without any the phase is skipped.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import openai

from nightbatch.cli.doctor.report import JOB_PHASES, Check, Phase, Probe, Report
from nightbatch.wire import TERMINAL_STATUSES

EVENT_TYPES = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.received: dict[str, tuple[float, str]] = {}  # batch id → (when, event type)
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            event = json.loads(body)
            batch_id = str(event["data"]["id"])
            self.server.received.setdefault(batch_id, (self.server.clock(), str(event.get("type"))))
        except (ValueError, KeyError, TypeError):
            pass
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None  # the doctor prints its own lines


class WebhookWatcher:
    def __init__(self, client: openai.OpenAI, base_url: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.local = (urlsplit(base_url).hostname or "") in LOOPBACK
        self.clock = clock
        self.receiver: _Receiver | None = None
        self.endpoint_id: str | None = None
        self.existing: list[str] = []  # endpoints the tenant already has (not on loopback)

    def preflight(self, report: Report) -> None:
        if self.local:
            self._listen(report)
        else:
            self._existing(report)

    def _listen(self, report: Report) -> None:
        self.receiver = _Receiver(self.clock)
        threading.Thread(target=self.receiver.serve_forever, name="doctor-webhooks", daemon=True).start()
        url = f"http://127.0.0.1:{self.receiver.server_address[1]}/nightbatch-doctor"
        try:
            created = self.client.post("/webhook_endpoints", cast_to=dict[str, Any], body={
                "url": url, "name": "nightbatch doctor (temporary)", "event_types": EVENT_TYPES})
        except openai.APIStatusError as e:
            report.add(Check("webhook", "skipped", f"could not subscribe {url}: {e.message}"))
            self.close()
            return
        self.endpoint_id = str(created["id"])
        report.add(Check("webhook", "ok", f"listening on {url} for the probes' events (removed afterwards)"))

    def _existing(self, report: Report) -> None:
        try:
            page = self.client.get("/webhook_endpoints", cast_to=dict[str, Any], options={"params": {"limit": 100}})
        except openai.APIStatusError:
            return
        self.existing = [str(e["id"]) for e in page.get("data", [])
                         if set(EVENT_TYPES) & set(e.get("event_types", [])) and e.get("status") != "disabled"]

    def observe(self, probe: Probe, at: float) -> None:
        for name in JOB_PHASES:
            probe.skip(name, "pass --stack NAME to follow the AWS Batch job")
        if probe.status not in TERMINAL_STATUSES or probe.batch_id is None:
            return
        if self.receiver is not None:
            got = self.receiver.received.get(probe.batch_id)
            if got is not None:
                when, kind = got
                # Finalize is seen at a poll, the event when it lands: never show the event before the poll.
                received = max(at - (self.clock() - when), probe.phase("finalize").at or 0.0)
                probe.reach("notification", received, detail=f"webhook {kind} received")
            return
        for endpoint in self.existing:
            if self._delivered(probe, endpoint, at):
                return
        if not self.existing:
            probe.skip("notification", "no webhook endpoint to watch; --stack reads the Notify step")

    def _delivered(self, probe: Probe, endpoint: str, at: float) -> bool:
        try:
            page = self.client.get(f"/nightbatch/webhook_endpoints/{endpoint}/deliveries", cast_to=dict[str, Any],
                                   options={"params": {"limit": 20}})
        except openai.APIStatusError:
            return False
        for delivery in page.get("data", []):
            if delivery.get("batch_id") == probe.batch_id:
                status = delivery.get("status")
                probe.reach("notification", at, detail=f"webhook {delivery.get('event_type')} to {endpoint}: {status}",
                            status="ok" if status == "succeeded" else "warn")
                return True
        return False

    def diagnose(self, probe: Probe, phase: Phase) -> tuple[str, str] | None:
        if phase.name == "notification" and self.receiver is not None:
            return ("no webhook event arrived for the batch",
                    "the Notify step or the delivery failed: look at the server's log for `notify`")
        return None

    def close(self) -> None:
        if self.endpoint_id is not None:
            with contextlib.suppress(openai.OpenAIError):
                self.client.delete(f"/webhook_endpoints/{self.endpoint_id}", cast_to=dict[str, Any])
            self.endpoint_id = None
        if self.receiver is not None:
            self.receiver.shutdown()
            self.receiver.server_close()
            self.receiver = None
