"""`nightbatch local`: embedded AWS + the API app + the in-process workflow runner, in one process."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

from nightbatch.settings import SETTINGS, Settings

log = logging.getLogger("nightbatch.local")

LOCAL_UPLOAD_LIMIT = 512 * 1000 * 1000  # OpenAI's per-file limit; no API Gateway in front locally
LOCAL_PART_LIMIT = 64 * 1024 * 1024  # OpenAI's part limit, the SDK's default part_size
LOCAL_SENDER = "nightbatch@nightbatch.local"  # verified in the embedded SES; mail never leaves the process


def state_file() -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return base / "nightbatch" / "local.json"


def local_settings(**overrides: Any) -> Settings:
    # A laptop's CPU costs nothing extra: cost estimates read $0 unless an instance price is configured.
    # No Lambda response limit locally: uploads and parts up to OpenAI's sizes, every download inline.
    defaults: dict[str, Any] = {"max_upload_bytes": LOCAL_UPLOAD_LIMIT, "instance_type": "cpu-local",
                                "endpoint_runner_price_per_hour": 0.0,
                                "max_upload_part_bytes": LOCAL_PART_LIMIT, "max_inline_download_bytes": 0,
                                # Webhook receivers on this machine are fine; e-mail only reaches the embedded SES.
                                "allow_private_targets": True, "email_sender": LOCAL_SENDER}
    # Local defaults yield to NIGHTBATCH_* variables; explicit overrides win over both.
    values = {k: v for k, v in defaults.items() if SETTINGS[k].env not in os.environ}
    values.update(overrides)
    values["mode"] = "local"
    return Settings.from_names(values)


def serve(host: str = "127.0.0.1", port: int = 8000, *, engines: bool = True) -> None:
    import uvicorn

    from functions.api.app import create_app
    from nightbatch.aws import make_adapters
    from nightbatch.local.aws import start_embedded_aws
    from nightbatch.local.runner import LocalWorkflow
    from nightbatch.wiring import build_services

    # Engine start-up chatter stays out of the way unless asked for; models never come from a hub.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    env_key = os.environ.get("NIGHTBATCH_API_KEY", "")
    key = env_key or f"nb-dev-{secrets.token_urlsafe(24)}"
    settings = local_settings(api_key=key)
    aws = start_embedded_aws(settings, host="127.0.0.1")
    settings = settings.updated({
        "topic_arn": settings.notifications.topic_arn or aws.topic_arn,
        "public_base_url": settings.notifications.public_base_url or f"http://{host}:{port}",
    })
    adapters = make_adapters(settings, endpoint_url=aws.endpoint_url)
    workflow = LocalWorkflow(adapters, engines=engines)
    services = build_services(adapters, workflow)
    workflow.bind(services)
    app = create_app(lambda: services)

    base_url = f"http://{host}:{port}/v1"
    _record(base_url, aws.endpoint_url, settings)
    print(f"nightbatch local: {base_url}", flush=True)
    print(f"  API key: {key}" + ("" if env_key else "   (generated; set NIGHTBATCH_API_KEY to choose one)"),
          flush=True)
    print(f"  Dashboard: http://{host}:{port}/", flush=True)
    print("  State is in memory and is lost when this process stops.", flush=True)
    print(f"  Try: OpenAI(base_url='{base_url}', api_key='{key}')", flush=True)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    # uvicorn shuts down on SIGINT/SIGTERM, then re-raises the signal to the handler it found: make that a
    # clean exit, so the cleanup below always runs (the default SIGTERM action would kill us first).
    signal.signal(signal.SIGTERM, _stop_requested)
    try:
        if engines:
            workflow.warm_up_in_background()
        server.run()
    except (KeyboardInterrupt, StopRequestedError):
        pass
    finally:
        workflow.stop()
        aws.stop()
        _forget()
        _end_children()
        print("nightbatch local: stopped", file=sys.stderr, flush=True)


class StopRequestedError(Exception):
    """SIGTERM arrived: stop like on Ctrl-C."""


def _stop_requested(signum: int, frame: object) -> None:
    raise StopRequestedError


def _record(base_url: str, aws_endpoint: str, settings: Settings) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "base_url": base_url, "aws_endpoint_url": aws_endpoint, "table": settings.deployment.table,
        "bucket": settings.deployment.bucket, "region": settings.deployment.region, "pid": os.getpid(),
    }))


def _forget() -> None:
    path = state_file()
    try:
        data = json.loads(path.read_text())
        if data.get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def _end_children(grace: float = 10.0) -> None:
    """Ends engine processes that outlived their engine (vLLM's EngineCore can, if its parent was interrupted
    mid-shutdown), so that stopping `nightbatch local` never leaves a model in memory."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
