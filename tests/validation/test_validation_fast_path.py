"""The fast path of Validator.check (a typed decode of an endpoint's plain line: chat, completions,
embeddings) decides exactly as the general path: same requests accepted with the same estimate and body,
same errors for the same lines, same embedding inputs counted, over sequences of odd lines."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nightbatch.settings import Settings
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator
from nightbatch.validation.requests import estimate_tokens, estimate_tokens_each

CHAT = "/v1/chat/completions"
MODEL = "SmolLM2-135M-Instruct"
ODD_VALUES = [b"null", b"true", b"0", b"-3", b"7", b"1e400", b"NaN", b"12345678901234567890123", b'"x"', b"[]",
              b"{}", b'"\xff"', b'"\\ud800"', b'"\xc3\xa9"', b"[[[[1]]]]", b'"\\u0000"', b"2.5"]
BODY_KEYS = ["max_tokens", "max_completion_tokens", "stream", "n", "best_of", "tools", "tool_choice",
             "chat_template_kwargs", "temperature", "seed", "user"]


def chat_line(rng: random.Random, i: int) -> bytes:
    """A chat line: half plain (the fast path's), half with odd values, missing or duplicated keys."""
    odd = rng.random() < 0.5

    def pick(plain: list[Any], strange: list[Any]) -> Any:
        return rng.choice(strange if odd and rng.random() < 0.3 else plain)

    custom_id = pick([f'"r{i}"'], ['"dup"', '""', '"' + "x" * 513 + '"', "7", "null"])
    content = pick([b'"hi"', b'"h\xc3\xa9"', b'"\\ud83d\\ude00"'],
                   [b'[{"type":"text","text":"hi"}]', b"null", b"3", b'"\xed\xa0\x80"', b'"\\ud800"'])
    role = pick([b'"user"', b'"system"'], [b"1"])
    messages = pick([b'[{"role":%s,"content":%s}]' % (role, content),
                     b'[{"role":"user","content":"a"},{"role":"assistant","content":%s,"name":"x"}]' % content],
                    [b"[]", b'"hi"'])
    model = pick([f'"{MODEL}"'], ['"other-model"', '""', "3"]).encode()
    body = [b'"model":' + model, b'"messages":' + messages]
    keys = BODY_KEYS if odd else ["max_tokens", "max_completion_tokens", "temperature", "seed", "user"]
    values = ODD_VALUES if odd else [b"null", b"7", b"2.5", b'"x"', b"0", b"-3"]
    for key in rng.sample(keys, rng.randint(0, 3)):
        body.append(b'"%s":%s' % (key.encode(), rng.choice(values)))
    if rng.random() < 0.1:
        body.append(b'"max_tokens":5')  # maybe a duplicate: the last one wins
    rng.shuffle(body)
    fields = [b'"custom_id":' + custom_id.encode(), b'"method":' + pick([b'"POST"'], [b'"GET"']),
              b'"url":' + pick([f'"{CHAT}"'.encode()], [b'"/v1/embeddings"']),
              b'"body":{' + b",".join(body) + b"}"]
    if odd and rng.random() < 0.1:
        fields.pop(rng.randrange(len(fields)))
    if rng.random() < 0.1:
        fields.append(b'"extra":' + rng.choice(ODD_VALUES if odd else [b"1", b'"x"']))
    rng.shuffle(fields)
    return b"{" + b",".join(fields) + b"}"


COMPLETIONS, EMBEDDINGS, EMBEDDER = "/v1/completions", "/v1/embeddings", "all-MiniLM-L6-v2"
PROMPTS = [b'"hi"', b'["a","b","c","d","e"]', b'["a","b"]', b'["h\xc3\xa9"]', b'"\\ud83d\\ude00"']
ODD_PROMPTS = [b"[]", b'""', b"[1,2]", b"null", b"[[1]]", b'["a",1]', b'"\\ud800"', b'"\xff"', b"{}"]
KEYS = {COMPLETIONS: (["max_tokens", "temperature", "seed", "user", "echo", "suffix", "stop"],
                      ["n", "best_of", "stream", "max_completion_tokens", "logprobs"]),
        EMBEDDINGS: (["encoding_format", "dimensions", "user"], ["stream", "max_tokens", "truncate_prompt_tokens"])}


def other_line(rng: random.Random, i: int, endpoint: str) -> bytes:
    """A completions or embeddings line: half plain, half odd (as chat_line)."""
    odd = rng.random() < 0.5
    strange = odd and rng.random() < 0.3
    field = b'"prompt":' if endpoint == COMPLETIONS else b'"input":'
    body = [field + rng.choice(ODD_PROMPTS if strange else PROMPTS)]
    model = EMBEDDER if endpoint == EMBEDDINGS else MODEL
    body.append(b'"model":' + (rng.choice([b'"other-model"', b"3", b'""']) if strange else f'"{model}"'.encode()))
    plain, more = KEYS[endpoint]
    values = ODD_VALUES if odd else [b"null", b"7", b"2.5", b'"x"', b"0", b"true"]
    for key in rng.sample(plain + more if odd else plain, rng.randint(0, 3)):
        body.append(b'"%s":%s' % (key.encode(), rng.choice(values)))
    if strange and rng.random() < 0.3:
        body.pop(0)
    rng.shuffle(body)
    custom_id = rng.choice(['"dup"', '""', "7"]) if strange else f'"r{i}"'
    fields = [b'"custom_id":' + custom_id.encode(), b'"method":"POST"',
              b'"url":' + (f'"{CHAT}"' if strange and rng.random() < 0.3 else f'"{endpoint}"').encode(),
              b'"body":{' + b",".join(body) + b"}"]
    rng.shuffle(fields)
    return b"{" + b",".join(fields) + b"}"


def validator(endpoint: str, fast: bool = True, inputs: int = 40) -> Validator:
    # Small embedding caps, so that lines reach them.
    return Validator(settings=Settings(deployment={"mode": "local"}, validation={
        "max_embedding_inputs_per_request": 4, "max_embedding_inputs": inputs}), endpoint=endpoint,
        fast_max_bytes=Validator.fast_max_bytes if fast else 0)


def outcomes(lines: list[bytes], fast: bool, endpoint: str = CHAT) -> list[Any]:
    v = validator(endpoint, fast)
    out: list[Any] = []
    for n, data in enumerate(lines, 1):
        try:
            req = v.check(n, data, len(data))
        except LineInvalid as e:
            out.append(e.error)
        else:
            out.append((req.number, req.custom_id, req.est_tokens, req.raw, repr(req.body), req.model))
        out.append(v.embedding_inputs)
    return [*out, v.models]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32))
def test_fast_path_decides_as_the_general_path(seed: int) -> None:
    rng = random.Random(seed)
    lines = [chat_line(rng, i) for i in range(rng.randint(1, 30))]
    assert outcomes(lines, fast=True) == outcomes(lines, fast=False)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([COMPLETIONS, EMBEDDINGS]))
def test_fast_path_decides_as_the_general_path_for_completions_and_embeddings(seed: int, endpoint: str) -> None:
    rng = random.Random(seed)
    lines = [other_line(rng, i, endpoint) for i in range(rng.randint(1, 30))]
    assert outcomes(lines, True, endpoint) == outcomes(lines, False, endpoint)


@pytest.mark.parametrize("endpoint", [COMPLETIONS, EMBEDDINGS])
def test_completions_and_embeddings_reach_the_fast_path(endpoint: str) -> None:
    rng = random.Random(2)
    lines = [other_line(rng, i, endpoint) for i in range(400)]
    v = validator(endpoint, inputs=10**6)
    accepted = [r for n, data in enumerate(lines, 1) if (r := _try(v, n, data)) is not None]
    assert sum(1 for r in accepted if r._body is None) > 50


def test_long_digit_runs_and_exponents_in_typed_fields_take_the_fast_path() -> None:
    """Every value of a fast-path line is decoded by its type (range-checked as `loads` does), so digits
    that might be a huge number need no second look: they stay on the fast path."""
    v = validator(CHAT)
    line = b'{"custom_id":"%s","method":"POST","url":"%s","body":{"model":"%s","messages":[{"role":"user",' \
           b'"content":"%s"}],"seed":%s,"temperature":%s}}'
    v.check(1, line % (b"a", CHAT.encode(), MODEL.encode(), b"hi", b"1", b"0.5"), 10)
    for n, (content, seed, temperature) in enumerate([(b"call 123456789012345678901234", b"7", b"1"),
                                                      (b"hi", b"123456789012345678901234567890", b"1"),
                                                      (b"hi", b"1", b"1e-300"), (b"hi", b"1", b"2E+000")], 2):
        data = line % (b"r%d" % n, CHAT.encode(), MODEL.encode(), content, seed, temperature)
        req = v.check(n, data, len(data))
        assert req._body is None and req.body == json.loads(data)["body"]
    for n, temperature in enumerate([b"1e400", b"-1E+309"], 10):
        data = line % (b"r%d" % n, CHAT.encode(), MODEL.encode(), b"hi", b"1", temperature)
        with pytest.raises(LineInvalid) as e:
            v.check(n, data, len(data))
        assert e.value.error[0] == "invalid_json_line" and "beyond a double" in e.value.error[1]


def test_the_corpus_reaches_the_fast_path() -> None:
    """Most generated lines after the first valid one are plain: the comparison above is not vacuous."""
    v = Validator(settings=Settings(deployment={"mode": "local"}), endpoint=CHAT)
    plain = b'{"custom_id":"a%d","method":"POST","url":"%s","body":{"model":"%s","messages":[{"role":"user",' \
            b'"content":"hi"}],"max_tokens":%d}}'
    first = v.check(1, plain % (0, CHAT.encode(), MODEL.encode(), 5), 200)
    assert first._body is not None  # the batch's first line: the general path checked its model
    second = v.check(2, plain % (1, CHAT.encode(), MODEL.encode(), 9), 200)
    assert second._body is None and second.est_tokens == len(plain % (1, CHAT.encode(), MODEL.encode(), 9)) // 4 + 1 + 9
    assert second.body == json.loads(plain % (1, CHAT.encode(), MODEL.encode(), 9))["body"]  # decoded when asked
    rng = random.Random(1)
    lines = [chat_line(rng, i) for i in range(400)]
    fast = Validator(settings=Settings(deployment={"mode": "local"}), endpoint=CHAT)
    accepted = [r for n, data in enumerate(lines, 1) if (r := _try(fast, n, data)) is not None]
    assert sum(1 for r in accepted if r._body is None) > 50


def _try(v: Validator, n: int, data: bytes) -> Any:
    try:
        return v.check(n, data, len(data))
    except LineInvalid:
        return None


@pytest.mark.parametrize("extra", [b'"\xff\xfe"', b'"\xc3\x28"'])
def test_invalid_utf8_in_a_field_nobody_reads_is_still_an_encoding_error(extra: bytes) -> None:
    v = Validator(settings=Settings(deployment={"mode": "local"}), endpoint=CHAT)
    line = b'{"custom_id":"%s","method":"POST","url":"%s","body":{"model":"%s","messages":[{"role":"user",' \
           b'"content":"hi"}],"user":%s}}'
    v.check(1, line % (b"a", CHAT.encode(), MODEL.encode(), b'"ok"'), 10)
    bad = line % (b"b", CHAT.encode(), MODEL.encode(), extra)
    with pytest.raises(LineInvalid) as e:
        v.check(2, bad, len(bad))
    assert e.value.error[0] == "invalid_encoding"


def _after_first(endpoint: str) -> Validator:
    v = validator(endpoint)
    plain = b'{"custom_id":"first","method":"POST","url":"%s","body":{"model":"%s","messages":[{"role":"user",' \
            b'"content":"hi"}],"prompt":"hi"}}'
    data = plain % (endpoint.encode(), MODEL.encode())
    if endpoint == CHAT:
        data = data.replace(b',"prompt":"hi"', b"")
    else:
        data = data.replace(b'"messages":[{"role":"user","content":"hi"}],', b"")
    v.check(1, data, len(data))
    return v


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([CHAT, COMPLETIONS]), st.integers(1, 5))
def test_a_block_is_taken_whole_as_its_lines_would_be(seed: int, endpoint: str, plain_odds: int) -> None:
    """plain_block takes a block exactly when `check` would take each of its lines on the fast path, with
    the same estimates; when it does not, it records nothing (the lines are then read one by one)."""
    rng = random.Random(seed)
    make = (lambda i: chat_line(rng, i)) if endpoint == CHAT else (lambda i: other_line(rng, i, endpoint))
    # Mostly plain blocks (odd lines only now and then), so that both outcomes occur.
    lines = [make(i) if rng.randint(1, plain_odds * 3) == 1 else _plain_of(endpoint, i)
             for i in range(rng.randint(1, 12))]
    block, by_line = _after_first(endpoint), _after_first(endpoint)
    before = (set(block.seen), block.models, block.embedding_inputs)
    ests = block.plain_block(lines, [len(x) for x in lines])
    if ests is None:
        assert (block.seen, block.models, block.embedding_inputs) == before
        return
    taken = [by_line.check(n, data, len(data)) for n, data in enumerate(lines, 2)]
    assert all(r._body is None for r in taken)  # each on the fast path
    assert ests == [r.est_tokens for r in taken]
    assert (block.seen, block.models) == (by_line.seen, by_line.models)


def _plain_of(endpoint: str, i: int) -> bytes:
    body = b'"messages":[{"role":"user","content":"hi %d"}]' % i if endpoint == CHAT else b'"prompt":"p"'
    return b'{"custom_id":"p%d","method":"POST","url":"%s","body":{"model":"%s",%s,"max_tokens":%d}}' % (
        i, endpoint.encode(), MODEL.encode(), body, i % 3)


def test_a_block_with_a_repeated_custom_id_is_read_line_by_line_and_records_nothing() -> None:
    """A custom_id twice in one block, or one an earlier block took: plain_block records nothing (the digests it
    added are taken back), and the line path reports the duplicate."""
    v = _after_first(CHAT)
    first = [_plain_of(CHAT, i) for i in range(4)]
    assert v.plain_block(first, [len(x) for x in first]) is not None
    before = set(v.seen)
    for block in ([_plain_of(CHAT, 10), _plain_of(CHAT, 11), _plain_of(CHAT, 10)],  # twice in the block
                  [_plain_of(CHAT, 12), _plain_of(CHAT, 2)]):  # p2: an earlier block's
        assert v.plain_block(block, [len(x) for x in block]) is None
        assert v.seen == before
    with pytest.raises(LineInvalid) as e:
        v.check(9, _plain_of(CHAT, 2), len(_plain_of(CHAT, 2)))
    assert e.value.error[0] == "duplicate_custom_id"


@given(st.lists(st.integers(0, 10**7), max_size=50), st.integers(0, 10**6))
def test_estimate_tokens_each_is_estimate_tokens_plus(sizes: list[int], plus: int) -> None:
    assert estimate_tokens_each(sizes, plus=plus) == [estimate_tokens(n) + plus for n in sizes]
