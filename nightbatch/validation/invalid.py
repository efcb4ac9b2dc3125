"""The error every check of a batch line raises: a stable code, a message in OpenAI's wording where it has one,
and the parameter it names. Validate and the estimate write it as the batch's error for that line
(validation/lines.py: line_error); the Anthropic wire answers it as the create's 400; the worker ends the line
with it when an image it names cannot be used (gpu_worker/images.py)."""

from __future__ import annotations


class LineInvalid(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.error = (code, message, param)
