"""The real app over HTTP with the local workflow (engines off: every line fails, so the errors file is the
result), through the OpenAI SDK: a batch over an allow-listed `s3://` prefix of several objects completes without
a byte of them copied, its files land under the allow-listed output prefix, and another bucket is a 400."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import openai
import pytest
import requests

from tests.support.tenant_stack import BOOTSTRAP_KEY, Stack, chat_lines, wait_for


def users_prefix(make_stack: Callable[..., Stack], lines: int, objects: int) -> tuple[Stack, str, str, list[bytes]]:
    """A stack (local workflow, engines off) allow-listing a users' bucket to read and a prefix to write, and
    `objects` JSONL objects of `lines` lines under `in/` (custom_ids p<object>-<line>)."""
    users, results = f"users-{uuid.uuid4().hex[:8]}", f"results-{uuid.uuid4().hex[:8]}"
    stack = make_stack(workflow="local", user_input_buckets=users, user_output_prefixes=f"s3://{results}/out/")
    s3 = stack.services.adapters.client("s3")
    for bucket in (users, results):
        s3.create_bucket(Bucket=bucket)
    parts = [chat_lines(lines, prefix=f"p{n}") for n in range(objects)]
    for n, data in enumerate(parts):
        s3.put_object(Bucket=users, Key=f"in/{n}.jsonl", Body=data)
    return stack, users, results, parts


def test_a_batch_over_the_users_prefix_through_the_sdk(make_stack: Callable[..., Stack]) -> None:
    stack, users, results, parts = users_prefix(make_stack, 4, 3)
    s3 = stack.services.adapters.client("s3")
    written: list[int] = []

    def count(params: dict[str, Any], **_: Any) -> None:  # every write to the user's input bucket
        if params.get("Bucket") == users:
            written.append(1)

    events = stack.services.adapters.blobs.client.meta.events
    for op in ("PutObject", "UploadPart", "CopyObject"):
        events.register(f"provide-client-params.s3.{op}", count)
    client = stack.client(BOOTSTRAP_KEY)
    batch = client.batches.create(input_file_id="", endpoint="/v1/chat/completions", completion_window="24h",
                                  extra_body={"nightbatch": {"input_uri": f"s3://{users}/in/",
                                                             "output_uri": f"s3://{results}/out/"}})
    f = client.files.retrieve(batch.input_file_id)
    assert (f.filename, f.bytes, f.purpose) == (f"s3://{users}/in/", sum(map(len, parts)), "batch")
    done = wait_for(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b)
    assert done.status == "completed" and done.request_counts.total == 12 and done.error_file_id
    assert not written
    where = (done.model_extra or {})["nightbatch"]["output_uri"]
    assert where == f"s3://{results}/out/{batch.id}/"
    copied = s3.get_object(Bucket=results, Key=f"out/{batch.id}/errors.jsonl")["Body"].read()
    assert copied == client.files.content(done.error_file_id).read()
    assert sorted(json.loads(x)["custom_id"] for x in copied.splitlines()) == sorted(
        f"p{n}-{i}" for n in range(3) for i in range(4))

    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id="", endpoint="/v1/chat/completions", completion_window="24h",
                              extra_body={"nightbatch": {"input_uri": f"s3://{results}/out/"}})
    assert e.value.body["param"] == "nightbatch.input_uri"  # type: ignore[index]
    assert e.value.body["code"] == "bucket_not_allowed"  # type: ignore[index]


def test_each_tenant_reaches_only_its_own_prefix(make_stack: Callable[..., Stack]) -> None:
    """`{tenant}` entries: team-a names team-b's input, output or a parent prefix and gets a 400 naming the
    parameter; its own prefix works (the finding: one list for the whole deployment let any tenant read any
    other's objects and serve them back through the content route)."""
    lake, out = f"users-lake-{uuid.uuid4().hex[:8]}", f"users-out-{uuid.uuid4().hex[:8]}"
    stack = make_stack(workflow="recording", user_input_buckets=f"s3://{lake}/teams/{{tenant}}/",
                       user_output_prefixes=f"s3://{out}/{{tenant}}/")
    s3 = stack.services.adapters.client("s3")
    for bucket in (lake, out):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=lake, Key="teams/team-a/in.jsonl", Body=chat_lines(2, prefix="a"))
    s3.put_object(Bucket=lake, Key="teams/team-b/secret.jsonl", Body=chat_lines(2, prefix="b"))
    a = stack.client(stack.new_key("team-a"))

    def create(**options: str) -> Any:
        return a.batches.create(input_file_id="", endpoint="/v1/chat/completions", completion_window="24h",
                                extra_body={"nightbatch": options})

    mine = create(input_uri=f"s3://{lake}/teams/team-a/in.jsonl", output_uri=f"s3://{out}/team-a/")
    assert (mine.model_extra or {})["nightbatch"]["output_uri"] == f"s3://{out}/team-a/{mine.id}/"
    for options, param in (({"input_uri": f"s3://{lake}/teams/team-b/secret.jsonl"}, "nightbatch.input_uri"),
                           ({"input_uri": f"s3://{lake}/teams/"}, "nightbatch.input_uri"),
                           ({"input_uri": f"s3://{lake}/teams/team-a/../team-b/secret.jsonl"},
                            "nightbatch.input_uri"),
                           ({"input_uri": f"s3://{lake}/teams/team-a/in.jsonl",
                             "output_uri": f"s3://{out}/team-b/"}, "nightbatch.output_uri"),
                           ({"input_uri": f"s3://{lake}/teams/team-a/in.jsonl",
                             "output_uri": f"s3://{out}/team-a/%2e%2e/team-b/"}, "nightbatch.output_uri")):
        with pytest.raises(openai.BadRequestError) as e:
            create(**options)
        assert e.value.body["param"] == param, options  # type: ignore[index]
    assert [f.filename for f in a.files.list()] == [f"s3://{lake}/teams/team-a/in.jsonl"]


@pytest.mark.parametrize("uri", ["s3://users-x/\ud800.jsonl", "s3://users-x/a\u0007b.jsonl"])
@pytest.mark.parametrize("field", ["input_uri", "output_uri"])
def test_an_unencodable_or_control_character_uri_is_a_400_not_a_500(make_stack: Callable[..., Stack],
                                                                   uri: str, field: str) -> None:
    """A lone surrogate arrives as the JSON escape `\\ud800`, which Python decodes into a str that cannot be
    encoded: it was a 500 wherever the URI reached an encoder."""
    stack = make_stack(user_input_buckets="users-x", user_output_prefixes="s3://users-x/out/")
    options = {field: uri} if field == "input_uri" else {"input_uri": "s3://users-x/in.jsonl", field: uri}
    body = json.dumps({"input_file_id": "", "endpoint": "/v1/chat/completions", "completion_window": "24h",
                       "nightbatch": options})  # ASCII: the surrogate travels as its escape
    resp = requests.post(f"{stack.base_url}/batches", data=body, timeout=30, headers={
        "Authorization": f"Bearer {BOOTSTRAP_KEY}", "Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == f"nightbatch.{field}"


def test_a_retry_of_a_batch_read_in_place_copies_its_lines_and_keeps_its_output_uri(
        make_stack: Callable[..., Stack]) -> None:
    """The retry's input is a new file of the selected lines, so it does not inherit `input_uri` (that and the
    file id together were a 400); `output_uri` carries over, under the new batch's id."""
    stack, users, results, parts = users_prefix(make_stack, 3, 2)
    s3 = stack.services.adapters.client("s3")
    client = stack.client(BOOTSTRAP_KEY)
    batch = client.batches.create(input_file_id="", endpoint="/v1/chat/completions", completion_window="24h",
                                  extra_body={"nightbatch": {"input_uri": f"s3://{users}/in/",
                                                             "output_uri": f"s3://{results}/out/",
                                                             "output_order": "input"}})
    done = wait_for(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b)
    assert done.status == "completed" and done.request_counts.failed == 6  # engines off: every line shard_failed

    retry = client.post(f"/nightbatch/batches/{batch.id}/retry", cast_to=openai.types.Batch,
                        body={"custom_ids": ["p1-2", "p0-1"]})
    options = (retry.model_extra or {})["nightbatch"]
    assert "input_uri" not in options and options["retry_of"] == batch.id
    assert options["output_uri"] == f"s3://{results}/out/{retry.id}/"
    assert options["output_order"] == "input"
    new_input = client.files.retrieve(retry.input_file_id)
    assert new_input.id != batch.input_file_id and new_input.filename == f"{batch.id}_retry.jsonl"
    lines = parts[0].splitlines(keepends=True)[1:2] + parts[1].splitlines(keepends=True)[2:3]
    assert client.files.content(retry.input_file_id).read() == b"".join(lines)  # the original bytes, input order
    ended = wait_for(lambda: (b := client.batches.retrieve(retry.id)).status in ("completed", "failed") and b)
    assert ended.status == "completed" and ended.request_counts.total == 2 and ended.error_file_id
    copied = s3.get_object(Bucket=results, Key=f"out/{retry.id}/errors.jsonl")["Body"].read()
    assert [json.loads(x)["custom_id"] for x in copied.splitlines()] == ["p0-1", "p1-2"]
