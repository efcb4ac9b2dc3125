"""Two tenants through the OpenAI SDK over real HTTP: another tenant's ids are indistinguishable from unknown ids."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.tenant_stack import BOOTSTRAP_KEY, Stack, chat_lines, wait_for

UNKNOWN_FILE = "file-AAAAAAAAAAAAAAAAAAAAAAAA"
UNKNOWN_BATCH = "batch_00000000000000000000000000000000"


def error_of(call: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    resp = info.value.response
    return resp.status_code, resp.json()["error"], dict(resp.headers)


def same_answer(a: Any, b: Any, a_id: str, b_id: str) -> None:
    """Status and error envelope equal, once each id is replaced by a placeholder."""
    sa, ea, _ = error_of(a)
    sb, eb, _ = error_of(b)
    assert sa == sb
    ea = {k: (v.replace(a_id, "<id>") if isinstance(v, str) else v) for k, v in ea.items()}
    eb = {k: (v.replace(b_id, "<id>") if isinstance(v, str) else v) for k, v in eb.items()}
    assert ea == eb


@pytest.fixture
def two(make_stack: Any) -> tuple[Stack, openai.OpenAI, openai.OpenAI]:
    stack = make_stack()
    a = stack.client(stack.new_key("team-a", "a"))
    b = stack.client(stack.new_key("team-b", "b"))
    return stack, a, b


def test_cross_tenant_ids_answer_exactly_like_unknown_ids(two: Any) -> None:
    _stack, a, b = two
    fa = a.files.create(file=("in.jsonl", chat_lines(2)), purpose="batch")
    ba = a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h")

    same_answer(lambda: b.files.retrieve(fa.id), lambda: b.files.retrieve(UNKNOWN_FILE), fa.id, UNKNOWN_FILE)
    same_answer(lambda: b.files.content(fa.id).read(), lambda: b.files.content(UNKNOWN_FILE).read(),
                fa.id, UNKNOWN_FILE)
    same_answer(lambda: b.files.delete(fa.id), lambda: b.files.delete(UNKNOWN_FILE), fa.id, UNKNOWN_FILE)
    same_answer(lambda: b.batches.retrieve(ba.id), lambda: b.batches.retrieve(UNKNOWN_BATCH), ba.id,
                UNKNOWN_BATCH)
    same_answer(lambda: b.batches.cancel(ba.id), lambda: b.batches.cancel(UNKNOWN_BATCH), ba.id, UNKNOWN_BATCH)
    status, err, _ = error_of(lambda: b.batches.retrieve(ba.id))
    assert status == 404 and err["type"] == "invalid_request_error"

    # docs/ARCHITECTURE.md, decision 10: another tenant's input file gets the nonexistent file's answer.
    same_answer(
        lambda: b.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h"),
        lambda: b.batches.create(input_file_id=UNKNOWN_FILE, endpoint="/v1/chat/completions",
                                 completion_window="24h"),
        fa.id, UNKNOWN_FILE,
    )
    status, err, _ = error_of(lambda: b.batches.create(
        input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h"))
    assert (status, err["param"]) == (400, "input_file_id")

    # Pagination cursors from another tenant are unknown cursors too.
    same_answer(lambda: b.batches.list(after=ba.id), lambda: b.batches.list(after=UNKNOWN_BATCH), ba.id,
                UNKNOWN_BATCH)
    same_answer(lambda: b.files.list(after=fa.id), lambda: b.files.list(after=UNKNOWN_FILE), fa.id,
                UNKNOWN_FILE)

    # Nothing B did touched A's objects.
    assert a.files.retrieve(fa.id).id == fa.id
    assert a.batches.retrieve(ba.id).status != "cancelling"


def test_lists_are_disjoint(two: Any) -> None:
    stack, a, b = two
    default = stack.client(BOOTSTRAP_KEY)
    ids: dict[str, set[str]] = {"a": set(), "b": set(), "default": set()}
    batches: dict[str, set[str]] = {"a": set(), "b": set(), "default": set()}
    for name, client in (("a", a), ("b", b), ("default", default)):
        for i in range(2):
            f = client.files.create(file=(f"{name}-{i}.jsonl", chat_lines(1)), purpose="batch")
            ids[name].add(f.id)
            batches[name].add(client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id)
    for name, client in (("a", a), ("b", b), ("default", default)):
        assert {f.id for f in client.files.list()} == ids[name]
        assert {f.id for f in client.files.list(purpose="batch", order="asc")} == ids[name]
        assert {x.id for x in client.batches.list()} == batches[name]
        # Paging one at a time walks only this tenant's objects.
        assert {x.id for x in client.batches.list(limit=1)} == batches[name]
    # A stored key for tenant "default" sees what the bootstrap key sees.
    other_default = stack.client(stack.new_key("default", "second-default"))
    assert {f.id for f in other_default.files.list()} == ids["default"]


def test_output_and_error_files_belong_to_the_batch_tenant(make_stack: Any) -> None:
    stack = make_stack(workflow="local")  # the real pipeline; engines off, so every line ends in the error file
    a = stack.client(stack.new_key("team-a", "a"))
    b = stack.client(stack.new_key("team-b", "b"))
    f = a.files.create(file=("in.jsonl", chat_lines(3)), purpose="batch")
    batch = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(lambda: (x := a.batches.retrieve(batch.id)).status in ("completed", "failed") and x)
    assert done.status == "completed", done
    assert done.error_file_id
    assert len(a.files.content(done.error_file_id).text.splitlines()) == 3
    assert done.error_file_id in {x.id for x in a.files.list()}
    assert done.error_file_id not in {x.id for x in b.files.list()}
    status, err, _ = error_of(lambda: b.files.retrieve(done.error_file_id))
    assert status == 404 and err["message"] == f"No such File object: {done.error_file_id}"
    status, _, _ = error_of(lambda: b.files.content(done.error_file_id).read())
    assert status == 404


def test_raw_http_without_or_with_a_bad_key_is_401(two: Any) -> None:
    stack, _, _ = two
    for headers in ({}, {"Authorization": "Bearer nb-not-a-real-key"}, {"Authorization": "Basic abc"}):
        r = httpx.get(f"{stack.base_url}/files", headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_lists_are_newest_first_within_one_second(two: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenAI's lists are newest first; items made in the same second used to tie-break on their random ids
    (found with AsyncOpenAI's `batches.list`)."""
    import nightbatch.batches.service
    import nightbatch.files.service

    for module in (nightbatch.files.service, nightbatch.batches.service):
        monkeypatch.setattr(module, "now", lambda: 1_800_000_000)  # every item made in one second
    _stack, a, _b = two
    files = [a.files.create(file=(f"in{i}.jsonl", chat_lines(1)), purpose="batch") for i in range(6)]
    assert {f.created_at for f in files} == {1_800_000_000}
    batches = [a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
               for f in files]
    listed = [f.id for f in a.files.list(limit=100) if f.id in {x.id for x in files}]
    assert listed == [f.id for f in reversed(files)]
    assert [b.id for b in a.batches.list(limit=100)] == [b.id for b in reversed(batches)]
    page = a.batches.list(limit=2, after=batches[3].id)  # the cursor keeps the order
    assert [b.id for b in page.data] == [batches[2].id, batches[1].id]
