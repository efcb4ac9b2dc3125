"""The batch commands run as a user runs them (a child process) against a live API on loopback."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightbatch import layout
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.local.aws import free_port
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.wiring import Services
from tests.pipeline.test_pipeline import run_to_shards
from tests.results.test_partial_results import result
from tests.support.lifecycle import drive

if TYPE_CHECKING:
    from tests.conftest import ApiServer

MODEL = "SmolLM2-135M-Instruct"
USAGE = {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 42}


def request_line(i: int, url: str = "/v1/chat/completions") -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Question {i}"}], "max_tokens": 8}
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}) + "\n"


def requests_file(path: Path, n: int) -> Path:
    path.write_text("".join(request_line(i) for i in range(n)))
    return path


def create_batch(services: Services, n: int = 3, **metadata: str) -> str:
    data = "".join(request_line(i) for i in range(n)).encode()
    f = services.files.create("default", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(data),
                              size=len(data))
    req = CreateBatchRequest(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                             metadata=metadata or None)
    return services.batches.create("default", req).id


def finish(services: Services, batch_id: str, output: bytes, errors: bytes) -> None:
    """What Finalize leaves behind: output and error files registered, counts and usage from them."""
    ids = {}
    for kind, data in (("output", output), ("error", errors)):
        file_id = f"file-{kind}{batch_id[6:26]}"
        services.adapters.blobs.put_bytes(f"files/{file_id}", data)
        services.files.register("default", file_id=file_id, key=f"files/{file_id}", size=len(data),
                                filename=f"{batch_id}_{kind}.jsonl", purpose="batch_output")
        ids[f"{kind}_file_id"] = file_id
    drive(services, batch_id, "in_progress", request_counts={"total": 3, "completed": 0, "failed": 0})
    drive(services, batch_id, "finalizing", "completed",
          request_counts={"total": 3, "completed": 2, "failed": 1}, usage=USAGE, **ids)


def input_bytes(services: Services, batch_id: str) -> bytes:
    batch = services.batches.get("default", batch_id)
    return b"".join(services.files.chunks(services.files.item("default", batch.input_file_id)))


def created_id(text: str) -> str:
    m = re.search(r"Created batch (batch_[0-9a-f]+) \(validating\)", text)
    assert m, text
    return m[1]


def test_submit_uploads_the_file_and_creates_the_batch(cli: Any, api_server: ApiServer, tmp_path: Path) -> None:
    path = requests_file(tmp_path / "requests.jsonl", 3)
    r = cli("submit", str(path), "--metadata", "job=nightly", "team=search")
    assert (r.code, r.err) == (0, "")
    batch_id = created_id(r.out)
    assert re.search(r"^Uploaded requests\.jsonl \(\d+ B\) as file-\w+ in \d+\.\ds$", r.out, re.M)
    assert f"nightbatch status {batch_id} --wait" in r.out
    batch = api_server.services.batches.get("default", batch_id)
    assert batch.endpoint == "/v1/chat/completions"  # taken from the first request in the file
    assert batch.metadata == {"job": "nightly", "team": "search"}
    assert input_bytes(api_server.services, batch_id) == path.read_bytes()


def test_submit_json_prints_only_the_batch_on_stdout(cli: Any, tmp_path: Path) -> None:
    path = requests_file(tmp_path / "requests.jsonl", 2)
    r = cli("submit", str(path), "--endpoint", "/v1/chat/completions", "--window", "48h", "--json")
    assert r.code == 0, r.err
    batch = json.loads(r.out)
    assert (batch["object"], batch["status"], batch["completion_window"]) == ("batch", "validating", "48h")
    assert f"Created batch {batch['id']}" in r.err


def test_a_file_over_the_part_size_goes_up_in_parts(cli: Any, api_server: ApiServer, tmp_path: Path) -> None:
    path = requests_file(tmp_path / "big.jsonl", 40)
    r = cli("submit", str(path), "--part-size", "2KiB")
    assert r.code == 0, r.err
    assert re.search(r"in \d+ parts of 2\.0 KiB", r.out)
    # Until the server has the Uploads API, the CLI says so and sends the file in one request.
    assert input_bytes(api_server.services, created_id(r.out)) == path.read_bytes()


def test_status_list_and_cancel(cli: Any, api_server: ApiServer) -> None:
    running = create_batch(api_server.services, 20, job="backfill")
    drive(api_server.services, running, "in_progress", request_counts={"total": 20, "completed": 0, "failed": 0},
          model=MODEL, live_completed=7, live_failed=1, live_input_tokens=400, live_output_tokens=120)
    fresh = create_batch(api_server.services)

    r = cli("status", running)
    assert r.code == 0, r.err
    assert r.out.splitlines()[0] == f"{running}  in_progress"
    assert "  endpoint    /v1/chat/completions  (model SmolLM2-135M-Instruct)" in r.out
    assert "  requests    7 completed, 1 failed, 20 total" in r.out
    assert "  tokens      520 so far" in r.out  # the workers' live counters
    assert "  metadata    job=backfill" in r.out

    r = cli("list")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "PROGRESS", "CREATED", "ENDPOINT"]
    newest_first = [b.id for b in api_server.services.batches.list("default", limit=100, after=None).data]
    assert [line.split()[0] for line in lines[1:]] == newest_first
    assert any(line.split()[:3] == [running, "in_progress", "8/20"] for line in lines)
    assert len(cli("list", "--limit", "1").out.splitlines()) == 2

    r = cli("cancel", running)
    assert (r.code, r.out) == (0, f"{running}  cancelling\n")
    assert cli("cancel", running).out == f"{running}  cancelling\n"  # cancelling again is a no-op
    assert api_server.services.batches.get("default", running).status == "cancelling"
    assert api_server.services.batches.get("default", fresh).status == "validating"


def test_results_stream_to_a_file_or_stdout(cli: Any, api_server: ApiServer, tmp_path: Path) -> None:
    batch_id = create_batch(api_server.services)
    output = b'{"custom_id": "req-0"}\n{"custom_id": "req-1"}\n'
    errors = b'{"custom_id": "req-2", "response": {"status_code": 400}}\n'
    finish(api_server.services, batch_id, output, errors)

    out = tmp_path / "results.jsonl"
    r = cli("results", batch_id, "-o", str(out))
    assert r.code == 0, r.err
    assert out.read_bytes() == output
    assert not out.with_name("results.jsonl.part").exists()
    assert r.err.startswith(f"Wrote 2 lines (46 B) of file-output{batch_id[6:26]} to {out}")
    assert cli("results", batch_id).out.encode() == output
    assert cli("results", batch_id, "--errors").out.encode() == errors


def test_results_before_the_end_say_why_not(cli: Any, api_server: ApiServer) -> None:
    batch_id = create_batch(api_server.services)
    r = cli("results", batch_id)
    assert r.code == 1
    assert r.err == (f"nightbatch results: error: {batch_id} is validating and has no output file. "
                     f"Wait for it with `nightbatch status {batch_id} --wait`, or read what has finished so "
                     f"far with `nightbatch results {batch_id} --partial`.\n")


def test_results_partial_while_running_then_complete(cli: Any, api_server: ApiServer, tmp_path: Path) -> None:
    services = api_server.services
    batch_id = create_batch(services, 4)
    shard = run_to_shards(services, batch_id)[0]
    lines = [result(batch_id, f"req-{i}", 200 if i else 400, f"a{i}") for i in range(3)]
    services.adapters.blobs.put_bytes(layout.checkpoint_key(layout.results_prefix(batch_id, shard), 0, "a"),
                                      b"".join(lines))
    r = cli("results", batch_id, "--partial")
    assert (r.code, r.out.encode()) == (0, lines[1] + lines[2]), r.err
    assert r.err == f"Wrote 2 output lines ({len(lines[1] + lines[2])} B, so far; the batch is in_progress) " \
                    f"of {batch_id} to stdout\n"
    out = tmp_path / "errors.jsonl"
    r = cli("results", batch_id, "--partial", "--errors", "-o", str(out))
    assert r.code == 0 and out.read_bytes() == lines[0], r.err
    services.batches.cancel("default", batch_id)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    r = cli("results", batch_id, "--partial")
    assert r.out.encode() == lines[1] + lines[2] and "B, complete) of" in r.err
    r = cli("results", "batch_" + "0" * 32, "--partial")
    assert r.code == 1 and "No batch found" in r.err


def test_submit_wait_follows_the_batch_until_it_completes(cli: Any, api_server: ApiServer, tmp_path: Path) -> None:
    path = requests_file(tmp_path / "requests.jsonl", 3)
    proc = cli.start("submit", str(path), "--wait", "--poll-interval", "0.2")
    assert proc.stdout is not None
    seen = ""
    while "Created batch" not in seen:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1]
        seen += line
    batch_id = created_id(seen)
    # Each state lasts several polls, even on a busy machine.
    time.sleep(1)
    drive(api_server.services, batch_id, "in_progress", request_counts={"total": 3, "completed": 0, "failed": 0})
    time.sleep(1)
    api_server.services.adapters.table.update(batch_id, set_={"live_completed": 2})
    time.sleep(1)
    finish(api_server.services, batch_id, b'{"custom_id": "req-0"}\n', b'{"custom_id": "req-2"}\n')
    # Read on through the same buffered pipe (communicate() would drop what readline() read ahead).
    assert proc.stderr is not None
    rest, err = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert (proc.wait(timeout=30), err) == (0, "")

    # Not a terminal: plain timestamped lines, one per change of status.
    progress = [line.split(maxsplit=1)[1] for line in rest.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    statuses = [p.split()[0] for p in progress]
    assert statuses[0] == "validating" and statuses[-1] == "completed"
    assert "in_progress" in statuses
    assert "\r" not in rest
    assert progress[-1].startswith("completed  3/3 done · 1 failed")
    summary = rest.splitlines()[-3:]
    assert re.match(rf"{batch_id} completed in \d+s: 2 completed, 1 failed, 3 total · 42 tokens$", summary[0])
    assert summary[1] == f"  results: nightbatch results {batch_id} -o results.jsonl"
    assert summary[2] == f"  errors:  nightbatch results {batch_id} --errors -o errors.jsonl"


def test_waiting_on_a_failed_batch_exits_1_and_shows_its_errors(cli: Any, api_server: ApiServer) -> None:
    batch_id = create_batch(api_server.services)
    drive(api_server.services, batch_id, "failed", errors={"object": "list", "data": [
        {"code": "invalid_json_line", "message": "Line 2 is not valid JSON.", "param": None, "line": 2}]})
    r = cli("status", batch_id, "--wait")
    assert r.code == 1
    # Created and failed within moments, but the two timestamps may straddle a second: no exact duration.
    assert re.search(rf"^{batch_id} failed in \d+s: none$", r.out, re.M), r.out
    assert "  line 2: invalid_json_line: Line 2 is not valid JSON." in r.out


def test_where_the_server_and_key_come_from(cli: Any, api_server: ApiServer, tmp_path: Path) -> None:
    no_server = {"NIGHTBATCH_BASE_URL": ""}
    r = cli("list", env=no_server)
    assert (r.code, r.err) == (1, "nightbatch list: error: no server given: pass --base-url or set "
                                  "NIGHTBATCH_BASE_URL (or start one here with `nightbatch local`)\n")
    # A running `nightbatch local` records its URL; the key still comes from the flag or the environment.
    state = tmp_path / "state" / "nightbatch" / "local.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"base_url": f"{api_server.base_url}/v1", "pid": subprocess.os.getpid()}))
    assert cli("list", env=no_server).code == 0
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    state.write_text(json.dumps({"base_url": f"{api_server.base_url}/v1", "pid": int(gone.stdout)}))
    assert "no server given" in cli("list", env=no_server).err  # left behind by a stack that died

    assert cli("list", "--base-url", api_server.base_url, env=no_server).code == 0  # /v1 is added when missing
    r = cli("list", env={"NIGHTBATCH_API_KEY": ""})
    assert (r.code, r.err) == (1, "nightbatch list: error: no API key given: pass --api-key or set "
                                  "NIGHTBATCH_API_KEY (`nightbatch local` prints its key when it starts)\n")


def test_failures_are_one_line_and_exit_1(cli: Any, api_server: ApiServer, tmp_path: Path) -> None:
    batch_id = create_batch(api_server.services)
    finish(api_server.services, batch_id, b"{}\n", b"{}\n")
    port = free_port()
    cases = {
        ("cancel", batch_id): "Cannot cancel a batch with status 'completed'. (HTTP 409)",
        ("status", "batch_nope"): "No batch found with id 'batch_nope'. (HTTP 404)",
        ("list", "--api-key", "nb-wrong"): "Incorrect API key provided.",
        ("list", "--base-url", f"http://127.0.0.1:{port}"): f"cannot reach http://127.0.0.1:{port}",
        ("submit", str(tmp_path / "missing.jsonl")): "No such file or directory",
    }
    # Independent runs, started together: each child spends most of its time importing the SDK.
    runs = {args: cli.start(*args) for args in cases}
    for args, message in cases.items():
        _, err = runs[args].communicate(timeout=60)
        assert runs[args].returncode == 1, (args, err)
        assert err.startswith(f"nightbatch {args[0]}: error: "), (args, err)
        assert message in err, (args, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
