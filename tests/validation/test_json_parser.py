"""The one line decoder (nightbatch.jsonl.loads): what it accepts it reads as the standard library does; what
no line can carry (NaN, Infinity, numbers beyond a double, lone surrogate escapes) it refuses, with a code and
a message; and the exact bytes of every request are kept in segments."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nightbatch.jsonl import loads
from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch
from nightbatch.results import lines as results
from nightbatch.results.lines import ResultSummary, summarize_result_line
from nightbatch.settings import Settings
from nightbatch.shards.lines import shard_lines
from nightbatch.shards.spec import read_shard
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator
from nightbatch.wiring import Services
from tests.support.pipeline_world import make_batch, shard_requests_of

CHAT = "/v1/chat/completions"
HEAD = b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":'
BODY = b'{"model":"SmolLM2-135M-Instruct","messages":[{"role":"user","content":"hi"}]'


def check(data: bytes) -> Any:
    return Validator(settings=Settings(deployment={"mode": "local"}), endpoint=CHAT).check(3, data, len(data))


@pytest.mark.parametrize(("data", "error"), [
    (b'{"custom_id":"\xff"}', ("invalid_encoding", "This line is not valid UTF-8 (byte 14).", None)),
    (b'{"a":1,"b":"\xc3\x28"}', ("invalid_encoding", "This line is not valid UTF-8 (byte 12).", None)),
    (b"\xef\xbb\xbf{}", ("invalid_json_line", "This line is not parseable as valid JSON.", None)),
    (b'{"a":1,}', ("invalid_json_line", "This line is not parseable as valid JSON.", None)),
    (b'{"a":"x\x01"}', ("invalid_json_line", "This line is not parseable as valid JSON.", None)),
    (b"[1]", ("invalid_json_line", "This line is not a JSON object.", None)),
], ids=["bad byte", "bad sequence", "bom mid-file", "trailing comma", "control char", "array"])
def test_errors_and_positions_are_the_stdlib_ones(data: bytes, error: tuple[str, str, str | None]) -> None:
    with pytest.raises(LineInvalid) as e:
        check(data)
    assert e.value.error == error


@pytest.mark.parametrize(("extra", "code", "says"), [
    (b',"temperature":NaN', "invalid_json_line", "NaN"),
    (b',"temperature":-Infinity', "invalid_json_line", "-Infinity"),
    (b',"seed":1e400', "invalid_json_line", "1e400"),
    (b',"user":"\\ud800"', "invalid_encoding", "lone UTF-16 surrogate"),
    (b',"user":"\\udc00\\ud800"', "invalid_encoding", "lone UTF-16 surrogate"),
    (b',"x":{"\\ud800":1}', "invalid_encoding", "lone UTF-16 surrogate"),
])
def test_what_no_line_can_carry_is_refused_with_why(extra: bytes, code: str, says: str) -> None:
    """The standard library takes these; neither OpenAI's JSON nor a UTF-8 output line can carry them."""
    for data in (HEAD + BODY + extra + b"}}", HEAD.replace(b'"a"', b'"a' + extra[1:].replace(b'"', b"") + b'"')
                 + BODY + b"}}"):
        json.loads(data)
    with pytest.raises(LineInvalid) as e:
        check(HEAD + BODY + extra + b"}}")
    assert e.value.error[0] == code and says in e.value.error[1]


def test_what_the_decoder_accepts_beyond_64_bits_is_exact() -> None:
    data = HEAD + BODY + b',"seed":123456789012345678901234567890123,"user":"\\ud83d\\ude00"}}'
    req = check(data)
    assert req.raw == data
    assert repr(req.body) == repr(json.loads(data)["body"])


def test_duplicate_keys_last_wins_as_in_stdlib() -> None:
    data = HEAD + BODY + b',"max_tokens":5,"max_tokens":7}}'
    assert check(data).body["max_tokens"] == 7
    assert loads(b'{"a":1,"a":2}') == json.loads(b'{"a":1,"a":2}')


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
    max_leaves=12)


def _strict(text: str) -> Any:
    """The standard library, minus what no line can carry."""
    value = json.loads(text, parse_constant=_refuse, parse_float=lambda t: float(t) if math.isfinite(float(t))
                       else _refuse(t))
    json.dumps(value, ensure_ascii=False).encode()  # a lone surrogate: UnicodeEncodeError, a ValueError
    return value


def _refuse(text: str) -> Any:
    raise ValueError(text)


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(0, 40), st.binary(max_size=3))
def test_loads_equals_stdlib_on_valid_and_mangled_text(value: Any, cut: int, junk: bytes) -> None:
    text = json.dumps(value).encode()
    for data in (text, text[:cut] + junk + text[cut:]):
        try:
            expected: Any = repr(_strict(data.decode("utf-8")))  # lines are UTF-8 (no UTF-16 sniffing)
        except ValueError:
            expected = ValueError
        try:
            got: Any = repr(loads(data))
        except ValueError:
            got = ValueError
        assert got == expected, data


def test_shards_keep_each_request_byte_for_byte(services: Services) -> None:
    lines = [
        HEAD + BODY + b',"temperature":0.5e-3}}',
        b'  {"method" : "POST", "custom_id":"b","url":"/v1/chat/completions",  "body":' + BODY +
        b',"seed":123456789012345678901234567890,"x":"\\u00e9\\n\xc3\xa9"}}  ',
        HEAD.replace(b'"a"', b'"c"') + BODY + b',"max_tokens":1,"max_tokens":2}}',
    ]
    batch_id = make_batch(services, b"\n".join(lines) + b"\r\n")
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    assert plan_batch(inp, services).shard_count == 1
    spec = read_shard(services.adapters.blobs, batch_id, "00000")
    assert spec is not None
    assert [line.raw for line in shard_lines(services.adapters.blobs, spec)] == [x.strip() for x in lines]
    parsed = shard_requests_of(services, batch_id, "00000")
    assert [p.custom_id for p in parsed] == ["a", "b", "c"]
    assert parsed[0].body["temperature"] == 0.0005 and parsed[2].body["max_tokens"] == 2


def test_result_summary_and_written_lines() -> None:
    line = results.encode("batch_x", "é\"", response=results.Response(200, None, {
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}}))
    assert line == json.dumps(json.loads(line), separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    s = summarize_result_line(line.rstrip(b"\n"))
    assert (s.custom_id, s.ok, s.usage) == ('é"', True, {"prompt_tokens": 3, "completion_tokens": 2})
    odd = b'{"custom_id":7,"response":{"status_code":"500"}}'
    assert summarize_result_line(odd) == ResultSummary("7", False, {})  # the general path decides
    assert summarize_result_line(b'{"custom_id":"z","response":null,"error":{}}').ok is False
