"""A request line of a batch, the one type from Validate to the worker: Validate's check hands it on for each valid
line (validation/lines.py: Validator), and a shard's reader hands the worker the same lines again
(nightbatch/shards/lines.py: shard_requests)."""

from __future__ import annotations

from typing import Any, Protocol

from nightbatch.jsonl import loads


class LineFailure(Protocol):
    """Why a line accepted by Validate can no longer be run: its input changed or cannot be read since
    (nightbatch/files/inputs.py: InputUnavailable). The worker writes it as the line's error."""

    code: str

    def line_message(self, number: int) -> str: ...


class RequestLine:
    """One request: its input line `number` (1-based), `est_tokens` (Validate's estimate), its bytes as uploaded
    (`raw`) and the model it names. `custom_id` and `body` are decoded from `raw` on first use when the reader did
    not keep them (Validate reads neither of a plain line: only its estimate). A line whose input can no longer be
    read as Validate accepted it carries its `failure` instead of its bytes (custom_id: the line index's)."""

    __slots__ = ("_body", "_custom_id", "est_tokens", "failure", "model", "number", "raw")

    def __init__(self, number: int, custom_id: str | None, body: dict[str, Any] | None, est_tokens: int,
                 raw: bytes = b"", model: str = "", failure: LineFailure | None = None) -> None:
        self.number, self._custom_id, self._body, self.est_tokens, self.raw = number, custom_id, body, est_tokens, raw
        self.model = model  # the line's `body.model`: a served model or one of its LoRA adapters ("": not read)
        self.failure = failure

    @property
    def custom_id(self) -> str:
        if self._custom_id is None:
            self._custom_id = loads(self.raw)["custom_id"]
        return self._custom_id

    @property
    def body(self) -> dict[str, Any]:
        if self._body is None:
            self._body = loads(self.raw)["body"]
        return self._body
