"""The `requests` quickstart of seeds/cheapestinference-batch-quickstart.txt, only host and key changed.

Each call below has the exact shape of the quickstart's: the multipart upload with an explicit part content
type, the `json=` create with an explicit Content-Type header, the status GET and the results download with
`GET /v1/files/{output_file_id}` (docs/ARCHITECTURE.md, decision 7: the one deviation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests

from nightbatch.files.service import file_key

if TYPE_CHECKING:
    from tests.conftest import ApiServer

QUICKSTART_LINES = (
    b'{"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
    b'"SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "What is AI?"}]}}\n'
    b'{"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
    b'"SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Explain ML"}]}}\n'
)


def output_line(custom_id: str, content: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": {
            "status_code": 200,
            "request_id": f"req_{custom_id}",
            "body": {
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
            },
        },
        "error": None,
    }


def register_output(api_server: ApiServer, lines: list[dict[str, Any]]) -> str:
    """Writes a batch_output file as Finalize will (execution is another issue) and returns its id."""
    data = b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)
    file_id = "file-quickstartoutput0001"
    api_server.services.adapters.blobs.put_bytes(file_key(file_id), data)
    api_server.services.files.register(
        "default",
        file_id=file_id,
        key=file_key(file_id),
        size=len(data),
        filename="batch_output.jsonl",
        purpose="batch_output",
    )
    return file_id


def test_quickstart_request_shapes(api_server: ApiServer, tmp_path: Path) -> None:
    base = api_server.v1
    headers = {"Authorization": f"Bearer {api_server.api_key}"}
    path = tmp_path / "batch_requests.jsonl"
    path.write_bytes(QUICKSTART_LINES)

    # 2. Upload File
    with open(path, "rb") as f:
        files = {"file": ("batch_requests.jsonl", f, "application/jsonl")}
        data = {"purpose": "batch"}
        resp = requests.post(f"{base}/files", headers=headers, files=files, data=data, timeout=30)
        resp.raise_for_status()
        batch_file = resp.json()
    assert batch_file["filename"] == "batch_requests.jsonl"
    assert batch_file["bytes"] == len(QUICKSTART_LINES)
    assert batch_file["purpose"] == "batch"

    # 3. Create Batch Job
    resp = requests.post(
        f"{base}/batches",
        headers={**headers, "Content-Type": "application/json"},
        json={
            "input_file_id": batch_file["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        timeout=30,
    )
    resp.raise_for_status()
    batch = resp.json()
    assert batch["id"].startswith("batch_")

    # 4. Check Status
    status = requests.get(f"{base}/batches/{batch['id']}", headers=headers, timeout=30).json()
    assert status["status"] == "validating"
    assert f"{status['request_counts']['completed']}/{status['request_counts']['total']}" == "0/0"

    # 5. Download Results (the output file is registered directly: running the batch is another issue)
    output_id = register_output(
        api_server, [output_line("request-1", "AI is..."), output_line("request-2", "ML is...")]
    )
    result = requests.get(f"{base}/files/{output_id}", headers=headers, timeout=30)
    result.raise_for_status()
    answers = {}
    for line in result.text.split("\n"):
        if line.strip():
            row = json.loads(line)
            answers[row["custom_id"]] = row["response"]["body"]["choices"][0]["message"]["content"]
    assert answers == {"request-1": "AI is...", "request-2": "ML is..."}
    assert result.headers["content-type"].startswith("application/jsonl")


def test_seed_compat_answers_json_when_asked(api_server: ApiServer) -> None:
    output_id = register_output(api_server, [output_line("r", "x")])
    resp = requests.get(
        f"{api_server.v1}/files/{output_id}",
        headers={**api_server.auth, "Accept": "application/json"},
        timeout=30,
    )
    assert resp.json()["object"] == "file"
    # The OpenAI SDK always sends Accept: application/json, so files.retrieve keeps returning a FileObject.
    sdk = api_server.openai()
    assert sdk.files.retrieve(output_id).purpose == "batch_output"


def test_seed_compat_leaves_input_files_alone(api_server: ApiServer) -> None:
    resp = requests.post(
        f"{api_server.v1}/files",
        headers=api_server.auth,
        files={"file": ("in.jsonl", QUICKSTART_LINES)},
        data={"purpose": "batch"},
        timeout=30,
    )
    got = requests.get(f"{api_server.v1}/files/{resp.json()['id']}", headers=api_server.auth, timeout=30)
    assert got.json()["object"] == "file"


def test_seed_compat_off_returns_the_file_object(serve_api: Any) -> None:
    api_server = serve_api(seed_compat_file_get=False)
    output_id = register_output(api_server, [output_line("r", "x")])
    resp = requests.get(f"{api_server.v1}/files/{output_id}", headers=api_server.auth, timeout=30)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert body["id"] == output_id
    assert body["object"] == "file"
    assert body["purpose"] == "batch_output"
