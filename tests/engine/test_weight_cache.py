"""Weights through the stack's bucket (moto S3): the first job writes through, later jobs read from S3, concurrent
first jobs publish one copy, and safetensors are streamed (the engine args say `runai_streamer`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpu_worker.weight_cache import READY, STREAMER, cache_prefix, resolve_weights, select_files
from nightbatch.models.spec import ModelSpec
from tests.support.hub import hub_not_offline

BUCKET = "nb-data"
SPEC = ModelSpec(name="Tiny-1B-Instruct", source="hf:org/tiny@abc123")
# What a typical hub repository holds: safetensors plus .bin/.pth duplicates and Meta's original/ checkpoint.
REPO = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "generation_config.json": b"{}",
    "tokenizer.json": b"{}",
    "tokenizer_config.json": b"{}",
    "model-00001-of-00002.safetensors": b"w1",
    "model-00002-of-00002.safetensors": b"w2",
    "model.safetensors.index.json": b"{}",
    "pytorch_model.bin": b"dup",
    "original/consolidated.00.pth": b"dup",
    "original/params.json": b"{}",
    "README.md": b"",
}


class FakeHub:
    """The hub's side of `hub_fetch` (no network here): writes the selected files, counts downloads."""

    def __init__(self, repo: dict[str, bytes] = REPO, gate: threading.Barrier | None = None) -> None:
        self.repo, self.gate, self.calls = repo, gate, 0

    def __call__(self, repo_id: str, revision: str, out: Path) -> tuple[str, list[str]]:
        self.calls += 1
        names = select_files(self.repo)
        for name in names:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(self.repo[name])
        if self.gate is not None:
            self.gate.wait(timeout=10)  # every first job has downloaded before any publishes
        return "sha-abc123", names


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def _keys(s3: Any) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def test_only_files_vllm_loads_are_selected() -> None:
    chosen = select_files(REPO)
    assert "pytorch_model.bin" not in chosen and not any(n.startswith("original/") for n in chosen)
    assert "README.md" not in chosen
    assert {"config.json", "tokenizer.json", "model-00001-of-00002.safetensors",
            "model.safetensors.index.json"} <= set(chosen)
    # A repository without safetensors: its .bin weights are what vLLM can load.
    assert select_files(["config.json", "pytorch_model.bin", "original/x.bin"]) == ["config.json",
                                                                                    "pytorch_model.bin"]


def test_first_job_writes_through_and_the_second_reads_from_s3(s3: Any, tmp_path: Path) -> None:
    hub = FakeHub()
    first = resolve_weights(SPEC, bucket=BUCKET, s3=s3, cache_dir=tmp_path / "host1", fetch=hub, streamer=True)
    assert first.source == "hub" and first.load_format is None
    assert (Path(first.path) / "model-00001-of-00002.safetensors").read_bytes() == b"w1"

    base = cache_prefix(SPEC.name, "abc123")
    assert base == "models/Tiny-1B-Instruct@abc123/"
    ready = json.loads(s3.get_object(Bucket=BUCKET, Key=base + READY)["Body"].read())
    assert ready["sha"] == "sha-abc123" and ready["prefix"].startswith(base)
    assert _keys(s3) == sorted([base + READY, *(ready["prefix"] + n for n in select_files(REPO))])

    # Another host: streamed from the bucket; the hub is not asked again.
    second = resolve_weights(SPEC, bucket=BUCKET, s3=s3, cache_dir=tmp_path / "host2", fetch=hub, streamer=True)
    assert (second.source, second.load_format) == ("s3-cache", STREAMER)
    assert second.path == f"s3://{BUCKET}/{ready['prefix']}"
    # Without the streamer (or without safetensors) the files come down to the host's NVMe cache.
    third = resolve_weights(SPEC, bucket=BUCKET, s3=s3, cache_dir=tmp_path / "host3", fetch=hub, streamer=False)
    assert third.source == "s3-cache" and third.load_format is None
    assert (Path(third.path) / "tokenizer.json").is_file() and not (Path(third.path) / "pytorch_model.bin").exists()
    # The first host still has its download and uses it.
    again = resolve_weights(SPEC, bucket=BUCKET, s3=s3, cache_dir=tmp_path / "host1", fetch=hub, streamer=True)
    assert again.source == "nvme-cache"
    assert hub.calls == 1


def test_concurrent_first_jobs_publish_one_copy(s3: Any, tmp_path: Path) -> None:
    jobs = 3
    hub = FakeHub(gate=threading.Barrier(jobs))
    results: list[Any] = [None] * jobs

    def run(i: int) -> None:
        results[i] = resolve_weights(SPEC, bucket=BUCKET, s3=s3, cache_dir=tmp_path / f"host{i}", fetch=hub,
                                     streamer=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(r is not None and r.source == "hub" for r in results)
    base = cache_prefix(SPEC.name, "abc123")
    ready = json.loads(s3.get_object(Bucket=BUCKET, Key=base + READY)["Body"].read())
    copies = {k[len(base):].split("/", 1)[0] for k in _keys(s3) if k != base + READY}
    assert copies == {ready["prefix"][len(base):].rstrip("/")}, "one published copy, the losers' removed"
    assert len(_keys(s3)) == len(select_files(REPO)) + 1


def test_s3_source_with_safetensors_streams_from_it(s3: Any, tmp_path: Path) -> None:
    for name in ("config.json", "model.safetensors"):
        s3.put_object(Bucket=BUCKET, Key=f"weights/llama/{name}", Body=b"{}")
    spec = ModelSpec(name="llama", source=f"s3://{BUCKET}/weights/llama")
    w = resolve_weights(spec, s3=s3, cache_dir=tmp_path, streamer=True)
    assert (w.path, w.load_format, w.source) == (f"s3://{BUCKET}/weights/llama/", STREAMER, "s3-stream")
    plain = resolve_weights(spec, s3=s3, cache_dir=tmp_path, streamer=False)
    assert plain.load_format is None and (Path(plain.path) / "model.safetensors").is_file()


def test_streamer_path_builds_runai_engine_args() -> None:
    with hub_not_offline():
        _streamer_path_builds_runai_engine_args()


def _streamer_path_builds_runai_engine_args() -> None:
    from gpu_worker.engines.vllm_args import split_args

    uri = f"s3://{BUCKET}/models/Tiny-1B-Instruct@abc123/0123/"
    engine, _ = split_args(SPEC, uri, on_cpu=False, load_format=STREAMER)
    assert engine.model == uri and engine.load_format == STREAMER
    local, _ = split_args(SPEC, Path("/cache/models/x"), on_cpu=False)
    assert local.load_format != STREAMER


def test_lora_adapters_come_from_s3_once_and_local_directories_in_place(s3: Any, tmp_path: Path) -> None:
    from gpu_worker.weight_cache import resolve_adapters

    for name, data in (("adapter_config.json", b'{"r": 8}'), ("adapter_model.safetensors", b"lora")):
        s3.put_object(Bucket=BUCKET, Key=f"adapters/sql/{name}", Body=data)
    local = tmp_path / "poem"
    local.mkdir()
    (local / "adapter_config.json").write_text("{}")
    spec = ModelSpec(name="Tiny-1B-Instruct", source="hf:org/tiny",
                     lora_modules={"sql": f"s3://{BUCKET}/adapters/sql", "poem": str(local)})
    dirs = resolve_adapters(spec, s3=s3, cache_dir=tmp_path / "cache")
    assert dirs["poem"] == str(local)
    assert Path(dirs["sql"]).parent == tmp_path / "cache"
    assert (Path(dirs["sql"]) / "adapter_model.safetensors").read_bytes() == b"lora"
    assert resolve_adapters(spec, s3=s3, cache_dir=tmp_path / "cache") == dirs  # cached: same directory
    broken = spec.model_copy(update={"lora_modules": {"x": str(tmp_path)}})
    with pytest.raises(ValueError, match=r"adapter 'x'.*adapter_config\.json"):
        resolve_adapters(broken, s3=s3, cache_dir=tmp_path / "cache")


def test_lora_turns_on_in_the_engine_args_with_vllm_s_static_adapters(tmp_path: Path) -> None:
    from gpu_worker.engines.vllm_args import split_args

    spec = SPEC.model_copy(update={"lora_modules": {"sql": "s3://b/sql"}, "max_loras": 2, "max_lora_rank": 8})
    engine, frontend = split_args(spec, tmp_path, on_cpu=False, lora_dirs={"sql": "/cache/sql"})
    assert (engine.enable_lora, engine.max_loras, engine.max_lora_rank) == (True, 2, 8)
    on_cpu, _ = split_args(spec, tmp_path, on_cpu=True, lora_dirs={"sql": "/cache/sql"})
    assert on_cpu.max_loras == 3  # a slot no adapter takes (gpu_worker/engines/lora.py)
    (module,) = frontend.lora_modules
    assert (module.name, module.path, module.base_model_name) == ("sql", "/cache/sql", SPEC.name)
    plain, plain_frontend = split_args(SPEC, tmp_path, on_cpu=True)
    assert not plain.enable_lora and not plain_frontend.lora_modules
    with pytest.raises(ValueError, match=r"adapter.*sql.*no local directory"):
        split_args(spec, tmp_path, on_cpu=True, lora_dirs={})
