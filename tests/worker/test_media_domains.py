"""The GPU host fetches no media URL outside NIGHTBATCH_MEDIA_ALLOWED_DOMAINS (gpu_worker/engines/vllm_args.py): vLLM
is started with them as its `allowed_media_domains`, parsed once from the setting, and with none at all when the
setting is empty (vLLM reads an empty list as "any host"); it follows no redirect; and no model may widen them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from urllib3.util import parse_url

from gpu_worker.engines.vllm_args import CPU_ENV_DEFAULTS, prepare_platform, split_args
from nightbatch.models.spec import LOCAL_MODELS
from nightbatch.validation.media import allowed_domains

# vLLM imports torch, which warns on import.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
SMOL = next(m for m in LOCAL_MODELS if m.task == "generate")


def media_connector_refuses(domains: list[str], url: str) -> bool:
    """Whether vLLM's own media loader, given these domains, refuses to fetch `url` (its check, no fetch)."""
    from vllm.multimodal.media.connector import MediaConnector

    try:
        MediaConnector(allowed_media_domains=domains)._assert_url_in_allowed_media_domains(parse_url(url))
    except ValueError:
        return True
    return False


def test_vllm_gets_the_allowed_media_domains(tmp_path: Path) -> None:
    engine, _ = split_args(SMOL, tmp_path, on_cpu=True,
                           media_domains=" Images.Example.com, cdn.example.org ,")
    assert engine.allowed_media_domains == ["cdn.example.org", "images.example.com"]
    assert not media_connector_refuses(engine.allowed_media_domains, "https://images.example.com/cat.png")
    assert media_connector_refuses(engine.allowed_media_domains, "http://169.254.169.254/latest/meta-data/")


def test_with_no_allowed_domain_vllm_fetches_from_no_host(tmp_path: Path) -> None:
    """(A model directory that exists: vLLM takes any other path for a hub repo id and may check its form.)"""
    for engine, _ in (split_args(SMOL, tmp_path, on_cpu=True, media_domains=""),
                      split_args(SMOL, tmp_path, on_cpu=True)):
        assert engine.allowed_media_domains
        for url in ("http://169.254.169.254/latest/meta-data/", "https://example.com/a.png", "http://localhost/x"):
            assert media_connector_refuses(engine.allowed_media_domains, url), url
    assert not media_connector_refuses([], "http://169.254.169.254/")  # what an empty list would have meant


def test_a_model_cannot_widen_them_and_redirects_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SMOL.model_copy(update={"engine_args": {"allowed_media_domains": ["169.254.169.254"]}})
    with pytest.raises(ValueError, match="NIGHTBATCH_MEDIA_ALLOWED_DOMAINS"):
        split_args(spec, Path("/models/x"), on_cpu=True)
    monkeypatch.setenv("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "1")
    for name in CPU_ENV_DEFAULTS:  # prepare_platform sets them on a CPU host: as they were, after the test
        monkeypatch.setenv(name, os.environ.get(name, CPU_ENV_DEFAULTS[name]))
    prepare_platform()
    assert os.environ["VLLM_MEDIA_URL_ALLOW_REDIRECTS"] == "0"


def test_the_setting_is_parsed_once_per_value() -> None:
    assert allowed_domains("a.example, b.example") is allowed_domains("a.example, b.example")
