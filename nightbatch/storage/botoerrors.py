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
