"""The core flow with an openai 1.x SDK; run by tests/api/test_openai_v1.py in its own small venv.

Usage: python openai_v1_flow.py BASE_URL API_KEY FINISHED_BATCH_ID  (prints one JSON object)
"""

from __future__ import annotations

import json
import sys

import openai
from openai import OpenAI


def main(base_url: str, api_key: str, finished_batch_id: str) -> None:
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    out: dict[str, object] = {"version": openai.__version__}
    data = b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    f = client.files.create(file=("in.jsonl", data), purpose="batch")
    client.files.create(file=("other.jsonl", data), purpose="batch")
    out["file"] = f.model_dump()
    out["listed"] = [x.id for x in client.files.list(limit=1, order="asc")]
    out["retrieved"] = client.files.retrieve(f.id).id
    out["content"] = client.files.content(f.id).read().decode()

    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata=None)
    out["batch"] = b.model_dump()
    out["batch_retrieved"] = client.batches.retrieve(b.id).status
    out["batches_listed"] = [x.id for x in client.batches.list(limit=1)]
    out["cancelled"] = client.batches.cancel(b.id).status
    try:
        client.batches.retrieve("batch_missing")
    except openai.NotFoundError as e:
        out["not_found"] = e.status_code

    # Default retries on: the server's x-should-retry: false must stop them.
    retrying = OpenAI(base_url=base_url, api_key=api_key, max_retries=2)
    try:
        retrying.batches.cancel(finished_batch_id)
    except openai.ConflictError as e:
        out["conflict"] = {"status": e.status_code, "body": e.body}
    out["deleted"] = client.files.delete(f.id).deleted
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:4])
