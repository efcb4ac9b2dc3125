"""Score and rerank lines (vLLM's /v1/score and /v1/rerank bodies): the checks Validate makes, and their tokens.

The bodies are vLLM's (entrypoints/pooling/scoring/protocol.py): a score request pairs two sides given as
`queries`/`documents`, `queries`/`items`, `data_1`/`data_2` or `text_1`/`text_2`; a rerank request has one
`query`, its `documents` and `top_n`. Each side holds strings or `{"content": [parts]}` objects. The sides
are paired 1:1, 1:N or N:N. Only the shape is checked here, so a line gets its line number and a parameter
path; the engine checks the rest and answers the line with vLLM's own error.
"""

from __future__ import annotations

from typing import Any, NoReturn

from nightbatch.jsonl import dumps
from nightbatch.models.spec import ModelSpec
from nightbatch.settings import Settings
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.requests import echo, estimate_tokens

# vLLM's ScoreRequest is a union over these pairs of names; it tries them in this order.
SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))


def check_scoring(settings: Settings, spec: ModelSpec, endpoint: str, body: dict[str, Any], line_bytes: int) -> int:
    """Checks a /v1/score or /v1/rerank body; returns its estimated prompt tokens."""
    if endpoint == "/v1/rerank":
        first, second = "query", "documents"
        if first not in body:
            _missing(first)
        if isinstance(body[first], list):
            raise LineInvalid("invalid_request", "'query' must be one string or one {\"content\": [...]} object; "
                              "to score several queries, use /v1/score.", "body.query")
        queries = [_side_item(body, first, body[first])]
        _check_top_n(body)
    else:
        first, second = _score_pair(body)
        queries = _side(body, first)
    documents = _side(body, second) if second in body else _missing(second)
    if len(queries) > 1 and len(queries) != len(documents):
        raise LineInvalid("invalid_request", f"'{first}' has {len(queries)} items and '{second}' has "
                          f"{len(documents)}: the two sides must be paired 1:1, 1:N or N:N.", f"body.{second}")
    cap = settings.validation.max_score_documents_per_request
    if cap and len(documents) > cap:
        raise LineInvalid("too_many_inputs", f"This request scores {len(documents)} documents; at most {cap} are "
                          f"allowed per {endpoint} request.", f"body.{second}")
    return _tokens(spec, queries, len(documents), line_bytes)


def _missing(name: str) -> NoReturn:
    raise LineInvalid("missing_required_parameter", f"Missing required parameter: '{name}'.", f"body.{name}")


def _score_pair(body: dict[str, Any]) -> tuple[str, str]:
    complete = [pair for pair in SCORE_PAIRS if pair[0] in body and pair[1] in body]
    if len(complete) > 1:
        names = " and ".join(f"'{a}'/'{b}'" for a, b in complete)
        raise LineInvalid("invalid_request", f"This request gives both {names}: send one pair of sides.",
                          f"body.{complete[1][0]}")
    if complete:
        return complete[0]
    for a, b in SCORE_PAIRS:  # one side given: name its partner
        if a in body:
            return _missing(b)
        if b in body:
            return _missing(a)
    raise LineInvalid("missing_required_parameter", "Missing required parameters: 'queries' and 'documents' "
                      "(or 'text_1' and 'text_2').", "body.queries")


def _side(body: dict[str, Any], name: str) -> list[Any]:
    value = body[name]
    if not isinstance(value, list):
        return [_side_item(body, name, value)]
    if not value:
        raise LineInvalid("invalid_request", f"'{name}' must hold at least one item.", f"body.{name}")
    for i, item in enumerate(value):
        _side_item(body, name, item, i)
    return value


def _side_item(body: dict[str, Any], name: str, item: Any, index: int | None = None) -> Any:
    """A string, or a {"content": [parts]} object (text and media parts, for a multimodal scoring model)."""
    if isinstance(item, str) or (isinstance(item, dict) and isinstance(item.get("content"), list)):
        return item
    where = f"body.{name}" if index is None else f"body.{name}[{index}]"
    raise LineInvalid("invalid_request", f"Invalid '{where.removeprefix('body.')}': expected a string or an object "
                      f"with a 'content' list, got {echo(item)}.", where)


def _check_top_n(body: dict[str, Any]) -> None:
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
        raise LineInvalid("invalid_value", f"Invalid 'top_n': {echo(top_n)}. Expected an integer of at least 0 "
                          "(0 returns every document).", "body.top_n")


def _tokens(spec: ModelSpec, queries: list[Any], pairs: int, line_bytes: int) -> int:
    """About four bytes a token, as for every line. A cross-encoder reads the query again with each document
    (one forward pass per pair); an embedding model encodes each side once."""
    tokens = estimate_tokens(line_bytes)
    if spec.task == "score" and len(queries) == 1 and pairs > 1:
        query = queries[0]  # a string, or a {"content": [parts]} object: its bytes as the line holds them
        size = len(query.encode() if isinstance(query, str) else dumps(query))
        tokens += estimate_tokens(size) * (pairs - 1)
    return tokens
