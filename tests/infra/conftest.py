"""One synthesized app per session: the template, cdk-nag's validation report and the stack object."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nightbatch.pipeline.training_jobs import UNLISTED_FIELDS
from tests.infra.synth import Synth, synthesize


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.infra)


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    yield synthesize({}, tmp_path_factory.mktemp("cdk") / "cdk.out")


@pytest.fixture(scope="session")
def template(synth: Synth) -> dict[str, Any]:
    return synth.template


def _backend_synth(tmp_path_factory: pytest.TempPathFactory, backend: str, **context: Any) -> Synth:
    synth = synthesize({"gpuBackend": backend, **context}, tmp_path_factory.mktemp(f"cdk-{backend}") / "cdk.out")
    assert synth.error is None, synth.error
    return synth


@pytest.fixture(scope="session")
def sagemaker_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """`gpuBackend: sagemaker`: every model on SageMaker Training Jobs."""
    return _backend_synth(tmp_path_factory, "sagemaker")


@pytest.fixture(scope="session")
def both_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """`gpuBackend: both`: AWS Batch first, SageMaker when Batch cannot place a shard."""
    return _backend_synth(tmp_path_factory, "both")


@pytest.fixture(scope="session")
def sagemaker_fields_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """`gpuBackend: sagemaker` with every unlisted CreateTrainingJob field turned on (`sagemakerFields`), as a
    deployment does once `nightbatch doctor` proved them."""
    return _backend_synth(tmp_path_factory, "sagemaker", sagemakerFields=dict.fromkeys(UNLISTED_FIELDS, True))


# A model on an endpoint, with weights of its own to fall back to on AWS Batch: the runner's compute, IAM and network,
# and the workflow's endpoint branch (tests/infra/test_endpoint_runner.py, test_endpoint_fallback_moto.py). Its URL
# is on loopback at a port chosen for the session (`endpoint_port`): the moto workflow test serves it there.
ENDPOINT_MODEL = "llama-8b"
ENDPOINT_SECRET = "nightbatch/llama-endpoint-key"
ENDPOINT_NETWORK = {"vpcId": "vpc-0123456789abcdef0",
                    "subnetIds": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]}


@pytest.fixture(scope="session")
def endpoint_port() -> int:
    from nightbatch.local.aws import free_port

    return free_port()


@pytest.fixture(scope="session")
def endpoint_synth(tmp_path_factory: pytest.TempPathFactory, endpoint_port: int) -> Synth:
    import app as cdk_app
    from tests.infra.synth import ROOT

    models = [*cdk_app.load_context(ROOT)["models"], {
        "name": ENDPOINT_MODEL, "source": "hf:meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 8192,
        "endpoint": {"url": f"http://127.0.0.1:{endpoint_port}/v1", "model": "meta-llama/Llama-3.1-8B-Instruct",
                     "api_key_secret": ENDPOINT_SECRET,
                     "headers": {"x-gateway-inference-objective": "batch-sheddable"}}}]
    synth = synthesize({"models": models, "endpointNetwork": ENDPOINT_NETWORK},
                       tmp_path_factory.mktemp("cdk-endpoint") / "cdk.out")
    assert synth.error is None, synth.error
    return synth
