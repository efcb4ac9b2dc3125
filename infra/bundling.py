"""Lambda code asset built without Docker: pip installs the runtime deps for the Lambda platform, then the code."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

# The packages Lambda runs; gpu_worker, infra and tests never ship in the Lambda bundle.
LAMBDA_PACKAGES = ("nightbatch", "functions")
# The pyproject extra the Lambdas install on top of the core dependencies.
LAMBDA_EXTRA = "api"
_SKIP_PARTS = frozenset({"__pycache__", "tests"})
# The local stack (moto server, CPU engines) never runs in Lambda.
_SKIP_DIRS = ("nightbatch/local/",)
# ... except the chat templates the settings resolve (nightbatch.settings imports nightbatch.local.templates).
_KEEP = ("nightbatch/local/__init__.py", "nightbatch/local/templates/")

RUNTIME = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE = lambda_.Architecture.ARM_64
PIP_PLATFORM = "manylinux2014_aarch64"


def lambda_requirements(pyproject: Path) -> list[str]:
    """The core dependencies plus the `api` extra: exactly what the Lambdas import (tests/infra/test_lambda_asset.py
    imports and runs every handler from an asset built with these and nothing else)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][LAMBDA_EXTRA]]


def _code_files(root: Path) -> Iterable[Path]:
    for package in LAMBDA_PACKAGES:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            relative = path.relative_to(root)
            if (path.is_file() and not _SKIP_PARTS.intersection(relative.parts)
                    and (not relative.as_posix().startswith(_SKIP_DIRS) or relative.as_posix().startswith(_KEEP))
                    and path.suffix not in (".pyc", ".pyo")):
                yield path


@jsii.implements(cdk.ILocalBundling)
class PipLocalBundler:
    """`pip install --target` with Lambda's platform tags, then a copy of the project's Lambda packages."""

    def __init__(self, *, root: Path, requirements: Sequence[str], python_version: str,
                 platform: str = PIP_PLATFORM) -> None:
        self.root = root
        self.requirements = list(requirements)
        self.python_version = python_version
        self.platform = platform

    def pip_command(self, output_dir: str) -> list[str]:
        return [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--target", output_dir, "--platform", self.platform, "--python-version", self.python_version,
            "--implementation", "cp", "--only-binary=:all:", "--no-compile", "--upgrade", "--no-warn-conflicts",
            *self.requirements,
        ]

    def try_bundle(self, output_dir: str, *, image: Any = None, **_: Any) -> bool:
        if self.requirements:
            subprocess.run(self.pip_command(output_dir), check=True)
        for path in _code_files(self.root):
            target = Path(output_dir) / path.relative_to(self.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        return True


def source_hash(root: Path, requirements: Sequence[str], platform: str, python_version: str) -> str:
    """Fingerprint of exactly what goes into the bundle, so unrelated repo changes don't redeploy Lambdas."""
    digest = hashlib.sha256()
    for item in (*requirements, platform, python_version):
        digest.update(item.encode() + b"\0")
    for path in _code_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def lambda_code(root: Path) -> lambda_.Code:
    """One asset shared by every nightbatch Lambda (the handlers differ, the bundle does not)."""
    python_version = RUNTIME.name.removeprefix("python")
    requirements = lambda_requirements(root / "pyproject.toml")
    return lambda_.Code.from_asset(
        str(root),
        asset_hash=source_hash(root, requirements, PIP_PLATFORM, python_version),
        asset_hash_type=cdk.AssetHashType.CUSTOM,
        bundling=cdk.BundlingOptions(
            # Used only if local bundling declines, i.e. never; kept because the option is required.
            image=RUNTIME.bundling_image,
            local=PipLocalBundler(root=root, requirements=requirements, python_version=python_version),
        ),
    )
