"""The e2e tests use the session's one `nightbatch local`: the `local_stack` fixture (tests/support/local_stack.py)."""

from tests.support.local_stack import API_KEY, HOUR_SECONDS, LocalStack

__all__ = ["API_KEY", "HOUR_SECONDS", "LocalStack"]
