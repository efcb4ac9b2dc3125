"""botocore's exception classes, imported when an except clause is first matched, not when an adapter is imported.

An except clause's expression is evaluated only while an exception is being matched, so `except client_error()`
costs nothing on the happy path and keeps botocore (and boto3) out of the API's cold import (issue #17).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from botocore.exceptions import BotoCoreError, ClientError


def client_error() -> type[ClientError]:
    from botocore.exceptions import ClientError

    cls: type[ClientError] = ClientError  # botocore ships no type hints
    return cls


def botocore_error() -> type[BotoCoreError]:
    from botocore.exceptions import BotoCoreError

    cls: type[BotoCoreError] = BotoCoreError
    return cls


# S3's (and AWS's) answers that say "not now" rather than "no": throttling, a server-side failure, a timeout.
_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeoutException", "InternalError",
    "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequestsException", "PriorRequestNotComplete",
})


def transient(exc: BaseException) -> bool:
    """Worth the same call again a little later (throttling, a 5xx, a connection reset or timeout, a body cut
    short), unlike an answer about the request itself (NoSuchKey, AccessDenied, a bad range)."""
    from botocore import exceptions as boto

    if isinstance(exc, boto.ClientError):
        status, code = answer(exc)
        return code in _TRANSIENT_CODES or status >= 500 or status == 429
    # botocore's HTTPClientError: a connection closed or a read timing out (mid-body too: ResponseStreamingError);
    # the builtin ConnectionError: a socket reset or aborted.
    return isinstance(exc, boto.ConnectionError | boto.HTTPClientError | boto.IncompleteReadError | ConnectionError
                      | TimeoutError)


def answer(e: ClientError) -> tuple[int, str]:
    """What S3 (or another service) answered a refused call: its HTTP status and error code ("" when none)."""
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return status, str(e.response.get("Error", {}).get("Code", ""))
