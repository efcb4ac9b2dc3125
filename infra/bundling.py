"""Lambda code asset: the runtime deps pip-installed for the Lambda platform, the code, and its byte-code where
the bundling interpreter is the runtime's own Python.

Two ways to the same files:
- in the Lambda build image (Docker bundling; `cdk deploy` needs Docker for the worker image anyway): pip, the
  code, and .pyc files compiled by the runtime's Python (infra/asset_files.py runs inside the image);
- without Docker (PipLocalBundler): pip with Lambda's platform tags and the code, plus .pyc files only when this
  interpreter's version is the runtime's (Lambda ignores a .pyc of another version, so it would be dead weight).
Without .pyc files Lambda compiles every module it imports on every cold start (/var/task is read-only), which
is most of the API's cold start (issue #17). Context `lambdaBundling` chooses: `auto` (default: local when this
Python is the runtime's, else Docker when a container runtime answers, else local without .pyc), `docker`
or `local`.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

from infra.asset_files import code_files, compile_asset, copy_code

# The pyproject extra the Lambdas install on top of the core dependencies.
LAMBDA_EXTRA = "api"

RUNTIME = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE = lambda_.Architecture.ARM_64
# pip's platform tag for the architecture the functions run on (manylinux2014 wheels need glibc 2.17; the runtime's
# Amazon Linux 2023 has 2.34). tests/infra/test_lambda_asset_target.py checks the built asset against the template.
PIP_PLATFORMS = {"arm64": "manylinux2014_aarch64", "x86_64": "manylinux2014_x86_64"}
PIP_PLATFORM = PIP_PLATFORMS[ARCHITECTURE.name]
RUNTIME_PYTHON = RUNTIME.name.removeprefix("python")
ASSET_SCRIPT = "infra/asset_files.py"  # what Docker bundling runs (relative to the repository root)

BundlingMode = Literal["auto", "docker", "local"]


def lambda_requirements(pyproject: Path) -> list[str]:
    """The core dependencies plus the `api` extra: exactly what the Lambdas import (tests/infra/test_lambda_asset.py
    imports and runs every handler from an asset built with these and nothing else)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][LAMBDA_EXTRA]]


@jsii.implements(cdk.ILocalBundling)
class PipLocalBundler:
    """`pip install --target` with Lambda's platform tags, then a copy of the project's Lambda packages."""

    def __init__(self, *, root: Path, requirements: Sequence[str], python_version: str,
                 platform: str = PIP_PLATFORM, compile: bool = False, decline: bool = False) -> None:
        self.root = root
        self.requirements = list(requirements)
        self.python_version = python_version
        self.platform = platform
        # .pyc files only for the interpreter that will read them (see the module docstring).
        self.compile = compile and python_version == local_python()
        self.decline = decline  # leave the bundling to the Lambda build image

    def pip_command(self, output_dir: str) -> list[str]:
        return [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--target", output_dir, "--platform", self.platform, "--python-version", self.python_version,
            "--implementation", "cp", "--only-binary=:all:", "--no-compile", "--upgrade", "--no-warn-conflicts",
            *self.requirements,
        ]

    def try_bundle(self, output_dir: str, *, image: Any = None, **_: Any) -> bool:
        if self.decline:
            return False
        if self.requirements:
            subprocess.run(self.pip_command(output_dir), check=True)
        copy_code(self.root, Path(output_dir))
        if self.compile:
            compile_asset(Path(output_dir))
        return True


def local_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def container_runtime_works() -> bool:
    """The container CLI the CDK would bundle with (CDK_DOCKER, as the CDK reads it) is installed and its daemon
    answers (a docker CLI without a running daemon is common on CI machines)."""
    cli = shutil.which(os.environ.get("CDK_DOCKER", "docker"))
    if cli is None:
        return False
    try:
        return subprocess.run([cli, "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def use_docker(mode: BundlingMode, probe: bool = True) -> bool:
    """`probe=False` (nothing is bundled in this synth) decides `auto` without asking the container runtime."""
    if mode == "auto":
        return probe and local_python() != RUNTIME_PYTHON and container_runtime_works()
    return mode == "docker"


def image_command(requirements: Sequence[str]) -> list[str]:
    """Docker bundling: the same pip flags as the local bundler, then the code and its .pyc files, inside the
    Lambda build image (its python3 is the runtime's). /asset-input is the repository root."""
    pip = PipLocalBundler(root=Path("/asset-input"), requirements=requirements, python_version=RUNTIME_PYTHON)
    install = ["python3", *pip.pip_command("/asset-output")[1:], "--no-cache-dir"] if requirements else ["true"]
    copy = ["python3", f"/asset-input/{ASSET_SCRIPT}", "/asset-input", "/asset-output", "--compile"]
    return ["bash", "-c", f"{shlex.join(install)} && {shlex.join(copy)}"]


def source_hash(root: Path, requirements: Sequence[str], platform: str, python_version: str,
                compiled: bool = False) -> str:
    """Fingerprint of exactly what goes into the bundle, so unrelated repo changes don't redeploy Lambdas."""
    digest = hashlib.sha256()
    for item in (*requirements, platform, python_version, "pyc" if compiled else "py"):
        digest.update(item.encode() + b"\0")
    for path in (root / ASSET_SCRIPT, *code_files(root)):  # the script Docker bundling runs
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def lambda_code(root: Path, mode: BundlingMode = "auto", *, probe: bool = True) -> lambda_.Code:
    """One asset shared by every nightbatch Lambda (the handlers differ, the bundle does not)."""
    requirements = lambda_requirements(root / "pyproject.toml")
    docker = use_docker(mode, probe)
    compiled = docker or local_python() == RUNTIME_PYTHON
    return lambda_.Code.from_asset(
        str(root),
        asset_hash=source_hash(root, requirements, PIP_PLATFORM, RUNTIME_PYTHON, compiled),
        asset_hash_type=cdk.AssetHashType.CUSTOM,
        bundling=cdk.BundlingOptions(
            image=RUNTIME.bundling_image,
            command=image_command(requirements),
            environment={"HOME": "/tmp"},  # the container runs as the deploying user, who has no home there
            local=PipLocalBundler(root=root, requirements=requirements, python_version=RUNTIME_PYTHON,
                                  compile=compiled, decline=docker),
        ),
    )
