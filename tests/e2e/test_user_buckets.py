"""A batch over the user's own bucket on the local stack (docs/USER_BUCKETS.md), with the stock OpenAI SDK: the
input read in place from an `s3://` prefix of two JSONL objects, the output copied under the user's prefix. A
bucket of the stack's embedded AWS stands in for the user's; the session stack allow-lists it
(tests/support/local_stack.py), as cdk.json `userBuckets` does in AWS."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from tests.e2e.conftest import LocalStack
from tests.e2e.sdk import wait
from tests.support.local_stack import USER_BUCKET, USER_OUTPUT_PREFIX

pytestmark = pytest.mark.e2e
CHAT = "SmolLM2-135M-Instruct"


def line(i: int) -> bytes:
    return json.dumps({"custom_id": f"u-{i}", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": CHAT, "messages": [{"role": "user", "content": f"Say {i}"}],
                                "max_tokens": 4}}).encode() + b"\n"


def under(s3: Any, bucket: str, prefix: str) -> tuple[int, int]:
    """(objects, bytes) under a prefix."""
    objects = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            objects, size = objects + 1, size + obj["Size"]
    return objects, size


def test_a_batch_reads_the_users_prefix_in_place_and_writes_under_theirs(local_stack: LocalStack) -> None:
    state = json.loads(local_stack.state.read_text()) if local_stack.state else {}
    s3 = boto3.client("s3", endpoint_url=local_stack.aws_endpoint_url, region_name=state["region"],
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket=USER_BUCKET)
    s3.put_object(Bucket=USER_BUCKET, Key="prompts/a.jsonl", Body=b"".join(line(i) for i in range(3)))
    s3.put_object(Bucket=USER_BUCKET, Key="prompts/b.jsonl", Body=b"".join(line(i) for i in range(3, 5)))
    files_before = under(s3, state["bucket"], "files/")

    client = local_stack.client()
    batch = client.batches.create(
        input_file_id="", endpoint="/v1/chat/completions", completion_window="24h",
        extra_body={"nightbatch": {"input_uri": f"s3://{USER_BUCKET}/prompts/", "output_uri": USER_OUTPUT_PREFIX}})
    done = wait(client, batch.id, timeout=300)

    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (5, 5)
    assert under(s3, state["bucket"], "files/") == files_before  # the input was read where it is, not copied
    where = ((done.model_extra or {}).get("nightbatch") or {}).get("output_uri")
    assert where == f"{USER_OUTPUT_PREFIX}{batch.id}/"
    copied = s3.get_object(Bucket=USER_BUCKET, Key=f"results/{batch.id}/output.jsonl")["Body"].read()
    assert done.output_file_id is not None and copied == client.files.content(done.output_file_id).read()
    assert sorted(json.loads(x)["custom_id"] for x in copied.splitlines()) == [f"u-{i}" for i in range(5)]
