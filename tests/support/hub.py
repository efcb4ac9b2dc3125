"""huggingface_hub reads HF_HUB_OFFLINE once, at import: a test module that sets it (the real-engine tests do,
at collection) makes vLLM's AsyncEngineArgs resolve every model name as a local hub snapshot for the rest of
the session, so building engine arguments for a made-up path fails. Tests of the arguments themselves undo it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def hub_not_offline() -> Iterator[None]:
    import huggingface_hub.constants as hub

    before = hub.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = before
