"""The Lambda asset as the synth builds it for `cdk deploy` (bundling on; without Docker, pip with the runtime's
platform tags, infra/bundling.py) holds only what the runtime and architecture the synthesized template deploys can
load: every installed distribution's wheel tags fit that Python and machine, and every extension module is an
ELF file for that machine, named for that Python (or the stable ABI).

tests/infra/test_lambda_asset.py builds the same requirements for this machine instead, to run every handler from
the asset alone; this one is what a deploy uploads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from packaging.tags import Tag, compatible_tags, cpython_tags, parse_tag

from tests.infra.cfn import of_type
from tests.infra.synth import Synth, synthesize

pytestmark = pytest.mark.slow

MACHINES = {"arm64": "aarch64", "x86_64": "x86_64"}  # Lambda's architecture -> the platform tags' machine
ELF_MACHINES = {"aarch64": 183, "x86_64": 62}  # e_machine of an ELF header
LAMBDA_GLIBC_MINOR = 34  # Amazon Linux 2023 (the python3.12+ runtimes): glibc 2.34


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The synth with the Lambda asset built, as `cdk deploy` would without a container runtime."""
    return synthesize({"aws:cdk:bundling-stacks": ["**"], "lambdaBundling": "local", "nag": False},
                      tmp_path_factory.mktemp("deploy") / "cdk.out")


def target(template: dict[str, Any]) -> tuple[tuple[int, int], str]:
    """(Python version, machine) every function of the template runs on."""
    functions = of_type(template, "AWS::Lambda::Function").values()
    runtimes = {f["Properties"]["Runtime"] for f in functions}
    architectures = {a for f in functions for a in f["Properties"].get("Architectures", ["x86_64"])}
    assert len(runtimes) == 1 and len(architectures) == 1, (runtimes, architectures)
    match = re.fullmatch(r"python(\d+)\.(\d+)", runtimes.pop())
    assert match, "not a Python runtime"
    return (int(match[1]), int(match[2])), MACHINES[architectures.pop()]


def supported(version: tuple[int, int], machine: str) -> set[Tag]:
    interpreter = f"cp{version[0]}{version[1]}"
    platforms = [*(f"manylinux_2_{minor}_{machine}" for minor in range(LAMBDA_GLIBC_MINOR, 16, -1)),
                 f"manylinux2014_{machine}", f"linux_{machine}"]
    return {*cpython_tags(version, abis=[interpreter, "abi3", "none"], platforms=platforms),
            *compatible_tags(version, interpreter, platforms)}


def misbuilt(asset: Path, version: tuple[int, int], machine: str) -> list[str]:
    """What in the asset the target could not load, one line each."""
    ok = supported(version, machine)
    bad = []
    for wheel in sorted(asset.glob("*.dist-info/WHEEL")):
        tags = {t for line in wheel.read_text().splitlines() if line.startswith("Tag:")
                for t in parse_tag(line.split(":", 1)[1].strip())}
        if not tags & ok:
            bad.append(f"{wheel.parent.name}: {sorted(map(str, tags))}")
    abi = re.compile(rf"\.(cpython-{version[0]}{version[1]}-{machine}-linux-gnu|abi3)\.so$")
    for module in sorted(asset.rglob("*.so")):
        header = module.read_bytes()[:20]
        elf_machine = int.from_bytes(header[18:20], "little") if header[:4] == b"\x7fELF" else None
        if elf_machine != ELF_MACHINES[machine]:
            bad.append(f"{module.relative_to(asset)}: ELF machine {elf_machine}")
        elif module.name.count(".") > 1 and not abi.search(module.name):
            bad.append(f"{module.relative_to(asset)}: not for this Python")
    return bad


def test_the_asset_is_built_for_the_runtime_and_architecture_the_template_deploys(deployed: Synth) -> None:
    version, machine = target(deployed.template)
    assert (version, machine) == ((3, 14), "aarch64")  # what infra/bundling.py deploys today
    keys = {f["Properties"]["Code"]["S3Key"] for f in of_type(deployed.template, "AWS::Lambda::Function").values()}
    assert len(keys) == 1  # one asset shared by every function, staged in the cloud assembly as asset.<hash>
    asset = deployed.outdir / f"asset.{keys.pop().removesuffix('.zip')}"
    assert (asset / "nightbatch").is_dir() and (asset / "functions").is_dir()
    assert len(list(asset.glob("*.dist-info"))) > 20 and list(asset.rglob("*.so"))  # compiled dependencies too
    assert misbuilt(asset, version, machine) == []
    # The same files read as another target are refused: the check can fail.
    assert misbuilt(asset, version, "x86_64") and misbuilt(asset, (3, 11), machine)
