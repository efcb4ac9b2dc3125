"""Secrets Manager adapter: a secret's string value, cached per process by Powertools' Parameters utility.

The deployment reads two secrets at run time: the bootstrap API keys (functions/api/deps.py) and the
link-signing keys (nightbatch/files/links.py). Powertools' `SecretsProvider` keeps each value for `max_age` seconds;
a failed read raises and is not cached (BootstrapKeys adds its own back-off for that).

The worker reads its secrets once per job (a Hugging Face token, an endpoint's API key) with `secret_string`: its
image has boto3 but not Powertools.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.parameters import SecretsProvider


def secret_string(client: Any, secret_id: str) -> str:
    """A secret's string value (name or ARN), read now; raises when it cannot be read."""
    return str(client.get_secret_value(SecretId=secret_id)["SecretString"])


class SecretReader:
    def __init__(self, *, client: Any) -> None:
        self.client = client
        self._provider: SecretsProvider | None = None
        self._lock = threading.Lock()

    @property
    def provider(self) -> SecretsProvider:
        with self._lock:
            if self._provider is None:
                # Imported on the first read, not at the API's cold import (issue #17): it loads every
                # Parameters provider. Powertools is in the `api` extra, which every process reading a secret has.
                from aws_lambda_powertools.utilities.parameters import SecretsProvider

                self._provider = SecretsProvider(boto3_client=self.client)
            return self._provider

    def read(self, secret_id: str, *, max_age: float = 0) -> str:
        """The secret's current string value, at most `max_age` seconds old; raises when it cannot be read."""
        value = self.provider.get(secret_id, max_age=max(0, math.ceil(max_age)))
        if isinstance(value, bytes):
            return value.decode()
        return str(value or "")

    def forget(self) -> None:
        """Drops the cached values (the next read asks Secrets Manager)."""
        self.provider.clear_cache()  # type: ignore[no-untyped-call]
