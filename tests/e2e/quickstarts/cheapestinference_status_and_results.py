# Check status
status = requests.get(
    f"http://127.0.0.1:8000/v1/batches/{batch['id']}",
    headers=headers,
).json()
print(f"Status: {status['status']}")
print(f"Progress: {status['request_counts']['completed']}/{status['request_counts']['total']}")


# When complete, download results
if status["status"] == "completed":
    result = requests.get(
        f"http://127.0.0.1:8000/v1/files/{status['output_file_id']}",
        headers=headers,
    )
    result.raise_for_status()

    import json
    for line in result.text.split('\n'):
        if line.strip():
            row = json.loads(line)
            print(f"{row['custom_id']}: {row['response']['body']['choices'][0]['message']['content']}")

