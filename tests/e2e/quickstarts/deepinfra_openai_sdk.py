import json
import os
import time

from openai import OpenAI

# Point the OpenAI client at DeepInfra
client = OpenAI(
    base_url="http://127.0.0.1:8000/v1",
    api_key=os.environ["DEEPINFRA_TOKEN"],
)

INPUT_FILE = "batch_input.jsonl"

# 1. Upload the JSONL file with purpose="batch".
with open(INPUT_FILE, "rb") as f:
    input_file = client.files.create(file=f, purpose="batch")
print(f"Uploaded input file: {input_file.id}")

# 2. Create the batch job.
batch = client.batches.create(
    input_file_id=input_file.id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
)
print(f"Created batch: {batch.id}")

# 3. Poll until the batch reaches a terminal state.
TERMINAL = {"completed", "failed", "expired", "cancelled"}
while batch.status not in TERMINAL:
    time.sleep(10)
    batch = client.batches.retrieve(batch.id)
    counts = batch.request_counts
    if counts:  # None while the batch is still `validating`
        print(f"status={batch.status} completed={counts.completed}/{counts.total}")
    else:
        print(f"status={batch.status}")

if batch.status != "completed":
    raise SystemExit(f"Batch did not complete: status={batch.status}")

# 4. Download and print the results.
output = client.files.content(batch.output_file_id)
for line in output.text.splitlines():
    result = json.loads(line)
    custom_id = result["custom_id"]
    content = result["response"]["body"]["choices"][0]["message"]["content"]
    print(f"{custom_id}: {content}")
