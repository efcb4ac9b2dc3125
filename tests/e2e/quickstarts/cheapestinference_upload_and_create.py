import os
import requests

headers = {
  "Authorization": f"Bearer {os.environ['CHEAPESTINFERENCE_API_KEY']}"
}

# Upload input file
with open("batch_requests.jsonl", "rb") as f:
    files = {"file": ("batch_requests.jsonl", f, "application/jsonl")}
    data = {"purpose": "batch"}
    resp = requests.post(
        "http://127.0.0.1:8000/v1/files",
        headers=headers,
        files=files,
        data=data,
    )
    resp.raise_for_status()
    batch_file = resp.json()


# Create batch
resp = requests.post(
    "http://127.0.0.1:8000/v1/batches",
    headers={**headers, "Content-Type": "application/json"},
    json={
        "input_file_id": batch_file["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    },
)
resp.raise_for_status()
batch = resp.json()
print(f"Batch ID: {batch['id']}")

