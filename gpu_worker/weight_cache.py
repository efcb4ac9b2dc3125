"""Weights from the stack's bucket: the first job of a Hugging Face model writes the files vLLM loads through to
`s3://<bucket>/models/<name>@<revision>/`; later jobs load from there, streamed straight into GPU memory by
vLLM's Run:ai model streamer when the weights are safetensors, downloaded to the NVMe cache otherwise.

Concurrent first jobs: each uploads under its own `<uuid>/` below the model's prefix, then publishes with a
conditional PUT of `READY.json` (If-None-Match: *) naming that prefix. One PUT wins; the others delete their
copy and use the winner's, so the bucket keeps one copy and nobody reads a half-written one.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_worker.model_prep import (
    HF_TOKEN_ENV,
    _dir_name,
    _log,
    _marker_matches,
    _materialize,
    default_cache_dir,
    resolve_model_dir,
)
from nightbatch.models.spec import ModelSpec
from nightbatch.tenancy.scope import parse_s3_uri

MODELS_PREFIX = "models/"
READY = "READY.json"
STREAMER = "runai_streamer"
# What vLLM loads: config, tokenizer, safetensors (+ their index). Not the .bin/.pth duplicates many repos ship
# next to them, nor Meta's `original/` consolidated checkpoint.
ALLOW = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt", "*.jinja")
IGNORE = ("original/*", "*.bin", "*.pth", "*.pt", "*.gguf", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.npz")
# Weights vLLM can load by default when a repository has no safetensors.
FALLBACK_WEIGHTS = ("*.bin",)

# fetch(repo_id, revision, out_dir) -> (commit sha, relative file names written into out_dir)
Fetch = Callable[[str, str, Path], tuple[str, list[str]]]


@dataclass(frozen=True)
class Weights:
    path: str  # a local directory, or an s3:// URI vLLM streams from
    load_format: str | None  # "runai_streamer", or None for vLLM's default loader
    # Where they came from this time: "hub" (first job: then written through), "s3-cache" (the bucket's copy),
    # "nvme-cache" (an earlier job on the same host), "s3-stream"/"s3" (an s3:// source), "local".
    source: str


def select_files(names: Iterable[str]) -> list[str]:
    """The files of a repository vLLM needs; `.bin` weights only when there are no safetensors."""
    names = sorted(names)

    def keep(name: str, allow: Iterable[str], ignore: Iterable[str]) -> bool:
        return any(fnmatch.fnmatch(name, p) for p in allow) and not any(fnmatch.fnmatch(name, p) for p in ignore)

    chosen = [n for n in names if keep(n, ALLOW, IGNORE)]
    if not any(n.endswith(".safetensors") for n in chosen):
        chosen += [n for n in names if keep(n, FALLBACK_WEIGHTS, ("original/*",))]
    return chosen


def cache_prefix(model_name: str, revision: str) -> str:
    return f"{MODELS_PREFIX}{_dir_name(model_name)}@{revision}/"


def streamer_available() -> bool:
    return importlib.util.find_spec("runai_model_streamer") is not None


def resolve_weights(
    spec: ModelSpec,
    *,
    bucket: str = "",
    s3: Any = None,
    cache_dir: Path | None = None,
    fetch: Fetch | None = None,
    streamer: bool | None = None,
) -> Weights:
    """Where vLLM loads `spec`'s weights from. `bucket` empty (the local stack): the plain model_prep path."""
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    use_streamer = streamer_available() if streamer is None else streamer
    if spec.source.startswith("hf:") and bucket and s3 is not None:
        return _through_bucket(spec, bucket, s3, cache, fetch or hub_fetch, use_streamer)
    if spec.source.startswith("s3://") and s3 is not None and use_streamer:
        where = parse_s3_uri(spec.source, "source")
        bucket_name, prefix = where.bucket, where.as_prefix().key
        if any(k.endswith(".safetensors") for k in _list(s3, bucket_name, prefix)):
            return Weights(f"s3://{bucket_name}/{prefix}", STREAMER, "s3-stream")
    source = "s3" if spec.source.startswith("s3://") else "local"
    return Weights(str(resolve_model_dir(spec, cache, s3_client=s3)), None, source)


def _through_bucket(spec: ModelSpec, bucket: str, s3: Any, cache: Path, fetch: Fetch, streamer: bool) -> Weights:
    repo_id, _, revision = spec.source.removeprefix("hf:").partition("@")
    base = cache_prefix(spec.name, revision or "main")
    local_dir = cache / _dir_name(spec.name)
    hub_key = {"source": spec.source, "via": "hub"}
    ready = read_ready(s3, bucket, base)
    if ready is not None:
        files: list[str] = ready["files"]
        data = str(ready["prefix"])
        s3_key = {"source": f"s3://{bucket}/{data}"}
        if _marker_matches(local_dir, hub_key) or _marker_matches(local_dir, s3_key):
            return Weights(str(local_dir), None, "nvme-cache")  # an earlier job on this host left them
        if streamer and any(f.endswith(".safetensors") for f in files):
            return Weights(f"s3://{bucket}/{data}", STREAMER, "s3-cache")

        def download(out: Path) -> None:
            _log(f"downloading {len(files)} files from s3://{bucket}/{data}")
            for name in files:
                target = out / name
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, data + name, str(target))

        return Weights(str(_materialize(local_dir, s3_key, download)), None, "s3-cache")

    fetched: dict[str, Any] = {}

    def from_hub(out: Path) -> None:
        sha, names = fetch(repo_id, revision or "main", out)
        fetched.update(sha=sha, files=names)
        (out / ".nightbatch-files.json").write_text(json.dumps(fetched))

    local = _materialize(local_dir, hub_key, from_hub)
    if not fetched:  # this host had it already (an earlier job's download): publish what it holds
        fetched.update(json.loads((local / ".nightbatch-files.json").read_text()))
    publish(s3, bucket, base, local, fetched["files"], fetched["sha"])
    return Weights(str(local), None, "hub")


def read_ready(s3: Any, bucket: str, base: str) -> dict[str, Any] | None:
    # Listed first: the worker may list only its prefixes (infra/stack.py), and S3 may then answer a GET of a
    # missing key with 403 rather than NoSuchKey.
    if not s3.list_objects_v2(Bucket=bucket, Prefix=base + READY, MaxKeys=1).get("KeyCount", 0):
        return None
    try:
        body = s3.get_object(Bucket=bucket, Key=base + READY)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    ready: dict[str, Any] = json.loads(body)
    return ready


def publish(s3: Any, bucket: str, base: str, local: Path, files: list[str], sha: str) -> dict[str, Any]:
    """Write `files` through to the bucket once per model revision; returns the published READY document."""
    existing = read_ready(s3, bucket, base)
    if existing is not None:  # another job published while this one downloaded
        return existing
    data = f"{base}{uuid.uuid4().hex[:12]}/"
    started = time.monotonic()
    for name in files:
        s3.upload_file(str(local / name), bucket, data + name)
    ready = {"prefix": data, "files": files, "sha": sha, "published_at": int(time.time())}
    try:
        s3.put_object(Bucket=bucket, Key=base + READY, Body=json.dumps(ready).encode(), IfNoneMatch="*",
                      ContentType="application/json")
    except s3.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "ConditionalRequestConflict"):
            raise
        _log(f"another job published s3://{bucket}/{base} first; removing this job's copy")
        for key in _list(s3, bucket, data):
            s3.delete_object(Bucket=bucket, Key=key)
        winner = read_ready(s3, bucket, base)
        if winner is None:
            raise
        return winner
    _log(f"wrote {len(files)} files through to s3://{bucket}/{data} in {time.monotonic() - started:.1f} s")
    return ready


def _list(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return keys


def hub_fetch(repo_id: str, revision: str, out: Path) -> tuple[str, list[str]]:
    """Download only the files vLLM loads from the Hugging Face Hub into `out`."""
    from huggingface_hub import HfApi, snapshot_download

    token = os.environ.get(HF_TOKEN_ENV) or None
    info = HfApi().model_info(repo_id, revision=revision, token=token)
    names = select_files(s.rfilename for s in info.siblings or [])
    _log(f"downloading {len(names)} files of {repo_id}@{info.sha} from the hub")
    snapshot_download(repo_id=repo_id, revision=info.sha, allow_patterns=names, local_dir=out, token=token)
    return str(info.sha), names


ADAPTER_CONFIG = "adapter_config.json"


def resolve_adapters(spec: ModelSpec, *, s3: Any = None, cache_dir: Path | None = None) -> dict[str, str]:
    """Local directories of `spec`'s LoRA adapters (name -> path): an s3:// source is downloaded once into the
    cache beside the models (kept while its objects are unchanged), a local directory is used in place."""
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    dirs: dict[str, str] = {}
    for name, source in spec.lora_modules.items():
        # model_prep's S3 download, keyed by the adapter's own name under the model's.
        holder = ModelSpec(name=f"{spec.name}@lora-{name}", source=source)
        path = resolve_model_dir(holder, cache, s3_client=s3) if source.startswith("s3://") else Path(source)
        if not (path / ADAPTER_CONFIG).is_file():
            raise ValueError(f"model {spec.name!r}: adapter {name!r} ({source}) has no {ADAPTER_CONFIG}")
        dirs[name] = str(path)
    return dirs
