"""`nightbatch keys create/list/revoke` as a user runs it: a subprocess against moto's server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.tenant_stack import Stack

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nightbatch", "keys", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTBATCH_", "AWS_"))}
    env.update({"PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state"),
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    return env


def test_create_list_revoke_against_a_deployed_table(make_stack: Any, moto_endpoint: str,
                                                      tmp_path: Path) -> None:
    stack: Stack = make_stack()
    env = {**base_env(tmp_path), "AWS_ENDPOINT_URL": moto_endpoint}
    flags = ["--table", stack.settings.deployment.table, "--region", "us-east-1"]

    made = cli("create", "--name", "ci", "--tenant", "team-a", *flags, env=env)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("nb-") and len(key) >= 46
    assert "shown this once" in made.stderr and key not in made.stderr
    # The printed key works against the API at once, as tenant team-a.
    assert stack.client(key).files.list().data == []

    env_table = {**env, "NIGHTBATCH_TABLE": stack.settings.deployment.table, "NIGHTBATCH_REGION": "us-east-1"}
    other = cli("create", "--name", "ops", "--json", env=env_table)  # table from the environment
    assert other.returncode == 0, other.stderr
    ops = json.loads(other.stdout)
    assert ops["tenant"] == "default" and ops["key"].startswith("nb-")

    listed = cli("list", *flags, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "ci" in listed.stdout and "team-a" in listed.stdout and "ops" in listed.stdout
    assert key not in listed.stdout and ops["key"] not in listed.stdout
    rows = [json.loads(x) for x in cli("list", "--json", *flags, env=env).stdout.splitlines()]
    assert {r["name"] for r in rows} == {"ci", "ops"} and all(r["revoked_at"] is None for r in rows)

    revoked = cli("revoke", "--name", "ci", *flags, env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in revoked.stdout
    with pytest.raises(openai.AuthenticationError):
        stack.client(key).files.list()  # the stack's cache TTL is 0 in tests
    by_id = cli("revoke", ops["id"], *flags, env=env)
    assert by_id.returncode == 0, by_id.stderr
    assert cli("revoke", "--prefix", "nb-", *flags, env=env).returncode == 2  # would match every key
    again = cli("revoke", "--prefix", key[:11], *flags, env=env)
    assert again.returncode == 1 and "no active key matches" in again.stderr


def test_uses_a_running_nightbatch_local(make_stack: Any, moto_endpoint: str, tmp_path: Path) -> None:
    stack: Stack = make_stack()
    env = base_env(tmp_path)
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]  # a fresh shell: the CLI brings its own
    state = tmp_path / "state" / "nightbatch" / "local.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"base_url": stack.base_url, "aws_endpoint_url": moto_endpoint,
                                 "table": stack.settings.deployment.table, "bucket": stack.settings.deployment.bucket,
                                 "region": "us-east-1", "pid": os.getpid()}))
    made = cli("create", "--name", "dev", "--tenant", "team-b", env=env)
    assert made.returncode == 0, made.stderr
    assert "nightbatch local" in made.stderr
    assert stack.client(made.stdout.strip()).files.list().data == []
    assert "dev" in cli("list", env=env).stdout

    # A state file left by a stack that is gone is not used.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    state.write_text(json.dumps({**json.loads(state.read_text()), "pid": int(dead.stdout)}))
    env = {**env, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing"}
    gone = cli("list", env=env)
    assert gone.returncode == 1
    assert "cannot reach table 'nightbatch'" in gone.stderr
