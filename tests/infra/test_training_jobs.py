"""The SageMaker backend as synthesized: the RunShardSageMaker task, the Choice, the IAM it needs, a SageMaker-only
stack without VPC or Batch, and every request the task can send checked against botocore's CreateTrainingJob."""

from __future__ import annotations

import json
import re
from typing import Any

import botocore.session
import pytest
from botocore.validate import ParamValidator

from infra.gpu_catalog import GPU_SHAPES
from nightbatch import layout
from nightbatch.ids import new_batch_id
from nightbatch.pipeline import training_jobs
from nightbatch.pipeline.training_jobs import WORKER_ENTRYPOINT
from nightbatch.settings import JobInputs
from tests.infra.cfn import of_type, one_of_type, resolve
from tests.infra.iam_eval import as_list as _list
from tests.infra.iam_eval import role_of_handler as _role_of
from tests.infra.iam_eval import statements_of_role as _statements_of_role
from tests.infra.synth import ROOT, Synth, synthesize
from tests.infra.test_least_privilege import _worker_role

_MODEL = botocore.session.get_session().get_service_model("sagemaker")
CREATE = _MODEL.operation_model("CreateTrainingJob").input_shape
INSTANCE_TYPES = set(CREATE.members["ResourceConfig"].members["InstanceType"].enum)
PREFIX = training_jobs.deployment_job_prefix("nightbatch-prod")  # the synthesized stack's name
BATCH_TYPES = ("AWS::EC2::VPC", "AWS::EC2::LaunchTemplate", "AWS::Batch::ComputeEnvironment",
               "AWS::Batch::JobQueue", "AWS::Batch::JobDefinition", "AWS::Batch::SchedulingPolicy")


def _asl(synth: Synth) -> dict[str, Any]:
    _, machine = one_of_type(synth.template, "AWS::StepFunctions::StateMachine")
    refs = {k: k for k in synth.template["Resources"]}
    text = resolve(machine["Properties"]["DefinitionString"], refs, lambda logical, attr: f"<{logical}.{attr}>")
    return dict(json.loads(text))


def _processor(synth: Synth) -> dict[str, Any]:
    states: dict[str, Any] = _asl(synth)["States"]["Shards"]["ItemProcessor"]["States"]
    return states


@pytest.fixture(scope="module")
def task(sagemaker_synth: Synth) -> dict[str, Any]:
    state: dict[str, Any] = _processor(sagemaker_synth)["RunShardSageMaker"]
    print("\nRunShardSageMaker as synthesized:\n" + json.dumps(state, indent=1))  # the closing note quotes it
    return state


def test_a_sagemaker_only_stack_has_no_vpc_hosts_or_queues(sagemaker_synth: Synth) -> None:
    for cfn_type in BATCH_TYPES:
        assert not of_type(sagemaker_synth.template, cfn_type), cfn_type
    states = _processor(sagemaker_synth)
    assert "RunShard" not in states and "Backend" not in states
    assert states["Backoff"]["Next"] == "RunShardSageMaker"
    statements = [st for policy in of_type(sagemaker_synth.template, "AWS::IAM::Policy").values()
                  for st in policy["Properties"]["PolicyDocument"]["Statement"]]
    assert not any(a.startswith("batch:SubmitJob") for st in statements for a in _list(st["Action"]))


def test_both_chooses_the_backend_capacity_named_and_catches_either_into_capacity(both_synth: Synth) -> None:
    states = _processor(both_synth)
    assert states["Backoff"]["Next"] == "Backend"
    choice = states["Backend"]
    assert choice["Choices"] == [{"Variable": "$.capacity.backend", "StringEquals": "sagemaker",
                                  "Next": "RunShardSageMaker"}]
    assert choice["Default"] == "RunShard"
    for name in ("RunShard", "RunShardSageMaker"):
        assert states[name]["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.shard_error",
                                          "Next": "Capacity"}]
    # The shard's backend and whether it may move reach Capacity from the manifest item.
    new_shard = states["NewShard"]["Parameters"]
    assert {new_shard["backend.$"], new_shard["fallback.$"]} == {"$.backend", "$.fallback"}
    assert states["Capacity"]["Parameters"]["fallback.$"] == "$.fallback"
    assert of_type(both_synth.template, "AWS::Batch::JobQueue")


def test_the_task_runs_the_worker_image_with_its_entry_point_and_capacity_s_choices(task: dict[str, Any]) -> None:
    assert task["Resource"] == "arn:aws:states:::sagemaker:createTrainingJob.sync"
    params = task["Parameters"]
    dockerfile = (ROOT / "gpu_worker" / "Dockerfile").read_text()
    assert f"ENTRYPOINT {json.dumps(list(WORKER_ENTRYPOINT))}" in dockerfile
    # Off until proven (sagemakerFields): SageMaker then starts the ENTRYPOINT with `train`, which the worker takes.
    assert "ContainerEntrypoint" not in params["AlgorithmSpecification"] and "RetryStrategy" not in params
    assert "container-assets" in params["AlgorithmSpecification"]["TrainingImage"]  # the worker image asset
    assert {k: v for k, v in params.items() if k.endswith(".$")} == {
        "TrainingJobName.$": "$.capacity.job_name", "EnableManagedSpotTraining.$": "$.capacity.managed_spot",
        "StoppingCondition.$": "$.capacity.stopping_condition"}
    assert params["ResourceConfig"]["InstanceType.$"] == "$.capacity.instance_type"
    assert params["OutputDataConfig"] == {"S3OutputPath.$": "$.capacity.output_uri"}
    env = params["Environment"]
    # Every job input, from the iteration's state; the deployment's settings only through the document.
    assert {env[f"{JobInputs.env_name(f)}.$"] for f in ("batch_id", "shard_id", "settings_key")} == {
        "$.batch_id", "$.shard_id", "$.capacity.settings_key"}
    assert env[JobInputs.env_name("backend")] == "sagemaker"
    assert "NIGHTBATCH_MODELS_JSON" not in env
    assert env["NIGHTBATCH_WORKER_FAILURE_FILE"] == "/opt/ml/output/failure"
    # The caches on the job's sized volume, at the path SageMaker's contract gives scratch data (/tmp): not
    # /opt/ml/model or output (uploaded at the end), not an undocumented /opt/ml/ directory.
    caches = {k: env[k] for k in ("NIGHTBATCH_MODEL_CACHE", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR",
                                  "TRITON_CACHE_DIR")}
    assert all(v.startswith("/tmp/") for v in caches.values()), caches
    assert task["ResultSelector"] == {"TrainingJobName.$": "$.TrainingJobName",
                                      "TrainingJobStatus.$": "$.TrainingJobStatus"}
    assert task["ResultPath"] == "$.job"


def _role_logical(template: dict[str, Any], principal: str) -> str:
    (role,) = [k for k, r in of_type(template, "AWS::IAM::Role").items()
               if principal in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])]
    return role


def test_the_workflow_may_pass_only_the_job_role_and_run_training_jobs(sagemaker_synth: Synth) -> None:
    template = sagemaker_synth.template
    machine_role = _role_logical(template, "states.amazonaws.com")
    job_role = _role_logical(template, "sagemaker.amazonaws.com")
    statements = _statements_of_role(template, machine_role)
    (passing,) = [st for st in statements if "iam:PassRole" in _list(st["Action"])]
    assert passing["Resource"] == {"Fn::GetAtt": [job_role, "Arn"]}
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    (jobs,) = [st for st in statements if "sagemaker:CreateTrainingJob" in _list(st["Action"])]
    assert sorted(_list(jobs["Action"])) == ["sagemaker:AddTags", "sagemaker:CreateTrainingJob",
                                             "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"]
    # This deployment's jobs, not the account's (other workloads name theirs `batch-…` too).
    assert f":training-job/{PREFIX}*" in json.dumps(jobs["Resource"]) and "batch-*" not in json.dumps(statements)
    (tags,) = [st for st in statements if "sagemaker:ListTags" in _list(st["Action"])]
    assert tags["Resource"] == "*"  # as CDK's own task grants it (ListTags has no resource-level permission)
    (rule,) = [st for st in statements if "events:PutRule" in _list(st["Action"])]
    assert sorted(_list(rule["Action"])) == ["events:DescribeRule", "events:PutRule", "events:PutTargets"]
    assert "rule/StepFunctionsGetEventsForSageMakerTrainingJobsRule" in json.dumps(rule["Resource"])


def test_the_sagemaker_job_role_holds_what_the_batch_job_role_holds(both_synth: Synth) -> None:
    template = both_synth.template
    sagemaker = _statements_of_role(template, _role_logical(template, "sagemaker.amazonaws.com"))
    batch = _statements_of_role(template, _worker_role(template))

    def data(statements: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(st, sort_keys=True) for st in statements
                      if any(a.split(":")[0] in ("s3", "dynamodb") for a in _list(st["Action"])))

    assert data(sagemaker) == data(batch) and data(sagemaker)
    others = {a for st in sagemaker for a in _list(st["Action"]) if a.split(":")[0] not in ("s3", "dynamodb")}
    assert others == {"ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                      "ecr:GetAuthorizationToken", "logs:CreateLogGroup", "logs:CreateLogStream",
                      "logs:PutLogEvents", "logs:DescribeLogStreams", "cloudwatch:PutMetricData"}
    assert not any(a.endswith("*") for st in sagemaker for a in _list(st["Action"]))
    # SageMaker publishes the job's metrics as this role: in its own namespace only.
    (metrics,) = [st for st in sagemaker if "cloudwatch:PutMetricData" in _list(st["Action"])]
    assert _list(metrics["Action"]) == ["cloudwatch:PutMetricData"] and metrics["Resource"] == "*"
    assert metrics["Condition"] == {"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}}
    assert not [st for st in batch if "cloudwatch:PutMetricData" in _list(st["Action"])]
    # The same image as the Batch job definitions'.
    (image,) = {json.dumps(d["Properties"]["ContainerProperties"]["Image"])
                for d in of_type(template, "AWS::Batch::JobDefinition").values()}
    _, machine = one_of_type(template, "AWS::StepFunctions::StateMachine")
    (asset_hash,) = re.findall(r"[0-9a-f]{64}", image)
    assert asset_hash in json.dumps(machine["Properties"]["DefinitionString"])


def _resolve_paths(node: Any, state: dict[str, Any]) -> Any:
    """The Parameters with every `"key.$": "$.a.b"` replaced by the state's value, as Step Functions does."""
    if isinstance(node, list):
        return [_resolve_paths(v, state) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.endswith(".$"):
            found: Any = state
            for part in value.removeprefix("$.").split("."):
                found = found[part]
            out[key[:-2]] = found
        else:
            out[key] = _resolve_paths(value, state)
    return out


@pytest.mark.parametrize("spot", [True, False])
@pytest.mark.parametrize("seconds_left", [60.0, 3600.0, 168 * 3600.0])
def test_every_request_the_task_sends_is_a_valid_create_training_job(
        task: dict[str, Any], spot: bool, seconds_left: float) -> None:
    batch_id = new_batch_id()
    shard_id = "99999"  # the widest shard id Plan writes, with the widest prefix and attempt
    state = {"batch_id": batch_id, "shard_id": shard_id, "capacity": {
        "job_name": training_jobs.job_name("nb-abcdefgh-", batch_id, shard_id, 99999),
        "instance_type": "ml.g6e.48xlarge",
        "managed_spot": spot, "settings_key": layout.worker_settings_key(batch_id),
        "output_uri": f"s3://{'b' * 63}/{layout.training_output_prefix(batch_id)}",
        "stopping_condition": training_jobs.stopping_condition(
            spot=spot, seconds_left=seconds_left, budget_seconds=seconds_left / 2, max_pending_seconds=60)}}
    refs: dict[str, str] = {}
    request = resolve(_resolve_paths(task["Parameters"], state), refs,
                      lambda logical, attr: f"arn:aws:iam::123456789012:role/{logical[:64]}")
    request["Environment"] = {k: "x" * 63 if isinstance(v, dict) else v for k, v in request["Environment"].items()}
    report = ParamValidator().validate(request, CREATE)
    assert not report.has_errors(), report.generate_report()
    # What botocore does not check: lengths, patterns and the API's own rules.
    name = request["TrainingJobName"]
    assert len(name) <= 63 and re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", name)
    env = request["Environment"]
    assert len(env) <= 100
    assert all(re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", k) and len(k) <= 512 and len(v) <= 512
               for k, v in env.items())
    assert request["ResourceConfig"]["InstanceType"] in INSTANCE_TYPES
    stop = request["StoppingCondition"]
    assert 1 <= stop["MaxRuntimeInSeconds"] <= training_jobs.MAX_RUNTIME_SECONDS
    if spot:
        assert stop["MaxWaitTimeInSeconds"] >= stop["MaxRuntimeInSeconds"] and "MaxPendingTimeInSeconds" not in stop
    else:
        assert "MaxWaitTimeInSeconds" not in stop
        assert training_jobs.MIN_PENDING_SECONDS <= stop["MaxPendingTimeInSeconds"] <= \
            training_jobs.MAX_PENDING_SECONDS
    assert "InstancePreferences" not in request["ResourceConfig"]  # never with managed Spot


def test_every_gpu_type_a_model_may_name_exists_for_training_jobs() -> None:
    """Capacity's instance type is `ml.` + the model's type: a type added to the catalog must exist there too."""
    assert sorted(t for t in GPU_SHAPES if f"ml.{t}" not in INSTANCE_TYPES) == []


def test_capacity_is_told_each_model_s_sagemaker_type(both_synth: Synth) -> None:
    functions = of_type(both_synth.template, "AWS::Lambda::Function").values()
    capacity = next(f for f in functions if f["Properties"]["Handler"] == "functions.tasks.capacity.handler")
    config = json.loads(capacity["Properties"]["Environment"]["Variables"]["NIGHTBATCH_SAGEMAKER_JSON"])
    assert config["instance_types"] == {"Qwen2.5-7B-Instruct": "ml.g6.xlarge", "bge-small-en-v1.5": "ml.g6.xlarge"}
    assert set(config["instance_types"].values()) <= INSTANCE_TYPES
    plan = next(f for f in functions if f["Properties"]["Handler"] == "functions.tasks.plan.handler")
    assert json.loads(plan["Properties"]["Environment"]["Variables"]["NIGHTBATCH_BACKENDS_JSON"]) == {
        "Qwen2.5-7B-Instruct": "both", "bge-small-en-v1.5": "both"}


@pytest.mark.slow
def test_gated_and_s3_weights_on_sagemaker(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The worker reads the HF token itself on SageMaker, and may read S3 weights; nag still acknowledges all."""
    variant = synthesize({
        "gpuBackend": "sagemaker",
        "models": [{"name": "llama", "source": "s3://my-weights/llama/8b/"},
                   {"name": "gated", "source": "hf:meta-llama/Llama-3.1-8B-Instruct", "tokenSecret": "nb/hf"}],
    }, tmp_path_factory.mktemp("sagemaker-variant") / "cdk.out")
    assert variant.error is None, variant.error
    template = variant.template
    env = _processor(variant)["RunShardSageMaker"]["Parameters"]["Environment"]
    assert env["NIGHTBATCH_WORKER_HF_TOKEN_SECRET"] == "nb/hf"
    statements = _statements_of_role(template, _role_logical(template, "sagemaker.amazonaws.com"))
    actions = {a for st in statements for a in _list(st["Action"])}
    assert {"secretsmanager:GetSecretValue", "s3:GetObject"} <= actions
    assert any("my-weights/llama/8b/*" in json.dumps(st["Resource"]) for st in statements)


def test_finalize_and_the_sweeper_may_read_training_jobs_and_the_doctor_gets_their_types(
        sagemaker_synth: Synth) -> None:
    template = sagemaker_synth.template
    for handler, actions in (("functions.tasks.finalize.handler", ["sagemaker:DescribeTrainingJob"]),
                             ("functions.tasks.sweep.handler", ["sagemaker:DescribeTrainingJob",
                                                                "sagemaker:StopTrainingJob"])):
        statements = _statements_of_role(template, _role_of(template, handler))
        (describe,) = [st for st in statements if "sagemaker:DescribeTrainingJob" in _list(st["Action"])]
        assert sorted(_list(describe["Action"])) == actions
        assert f":training-job/{PREFIX}*" in json.dumps(describe["Resource"])
    types = template["Outputs"]["SageMakerInstanceTypes"]["Value"]
    assert types and all(t.startswith("ml.") and t[3:] in GPU_SHAPES for t in types.split(",")), types


def test_the_sweeper_may_stop_this_deployment_s_training_jobs_only(sagemaker_synth: Synth) -> None:
    template = sagemaker_synth.template
    statements = _statements_of_role(template, _role_of(template, "functions.tasks.sweep.handler"))
    (stop,) = [st for st in statements if "sagemaker:StopTrainingJob" in _list(st["Action"])]
    assert sorted(_list(stop["Action"])) == ["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"]
    assert f":training-job/{PREFIX}*" in json.dumps(stop["Resource"])
    (listing,) = [st for st in statements if "sagemaker:ListTrainingJobs" in _list(st["Action"])]
    assert listing["Resource"] == "*"  # ListTrainingJobs takes no resource-level permission
    functions = of_type(template, "AWS::Lambda::Function").values()
    for handler in ("functions.tasks.sweep.handler", "functions.tasks.capacity.handler",
                    "functions.tasks.plan.handler"):
        function = next(f for f in functions if f["Properties"]["Handler"] == handler)
        config = json.loads(function["Properties"]["Environment"]["Variables"]["NIGHTBATCH_SAGEMAKER_JSON"])
        assert config["job_prefix"] == PREFIX, handler


def test_a_model_s_sagemaker_quota_caps_its_batches_concurrency(tmp_path_factory: pytest.TempPathFactory) -> None:
    variant = synthesize({"gpuBackend": "sagemaker", "models": [
        {"name": "small", "source": "hf:HuggingFaceTB/SmolLM2-135M-Instruct", "sagemakerMaxJobs": 2},
        {"name": "other", "source": "hf:BAAI/bge-small-en-v1.5", "task": "embed"}]},
        tmp_path_factory.mktemp("sagemaker-cap") / "cdk.out")
    assert variant.error is None, variant.error
    functions = of_type(variant.template, "AWS::Lambda::Function").values()
    plan = next(f for f in functions if f["Properties"]["Handler"] == "functions.tasks.plan.handler")
    config = json.loads(plan["Properties"]["Environment"]["Variables"]["NIGHTBATCH_SAGEMAKER_JSON"])
    assert config["max_jobs"] == {"small": 2}


def test_every_stack_shape_outputs_what_the_doctor_reads(synth: Synth, sagemaker_synth: Synth,
                                                          both_synth: Synth) -> None:
    """`nightbatch doctor --stack` finds the stack's queues (or its SageMaker types) and state machine by output
    name: a rename on either side would leave the doctor blind to the account behind the stack."""
    from nightbatch.cli.doctor.aws import QUEUE_OUTPUTS, StackWatcher

    for s in (synth, sagemaker_synth, both_synth):
        outputs = {k: "x" for k in s.template["Outputs"]}
        watcher = StackWatcher(account=None, stack="nightbatch", outputs=outputs)  # type: ignore[arg-type]
        assert "ApiUrl" in outputs and "StateMachineArn" in outputs
        uses_batch = any(r["Type"] == "AWS::Batch::JobQueue" for r in s.template["Resources"].values())
        assert bool(watcher.queues) == uses_batch, sorted(outputs)
        assert uses_batch or "SageMakerInstanceTypes" in outputs
    assert set(QUEUE_OUTPUTS) <= set(synth.template["Outputs"])


def _sagemaker_json(template: dict[str, Any]) -> dict[str, Any]:
    (capacity,) = [f for f in of_type(template, "AWS::Lambda::Function").values()
                   if f["Properties"]["Handler"] == "functions.tasks.capacity.handler"]
    return dict(json.loads(capacity["Properties"]["Environment"]["Variables"]["NIGHTBATCH_SAGEMAKER_JSON"]))


def test_the_fields_step_functions_does_not_list_are_sent_only_when_turned_on(
        sagemaker_synth: Synth, sagemaker_fields_synth: Synth) -> None:
    """ContainerEntrypoint, RetryStrategy and MaxPendingTimeInSeconds are not in the Step Functions documentation's
    list for createTrainingJob.sync: by default none is sent (a refused fixed field would fail the deploy, a refused
    run-time one every on-demand shard); `sagemakerFields` turns each on once the doctor proved it, and the stack
    says which it sends."""
    default = _processor(sagemaker_synth)["RunShardSageMaker"]["Parameters"]
    assert "ContainerEntrypoint" not in default["AlgorithmSpecification"] and "RetryStrategy" not in default
    assert _sagemaker_json(sagemaker_synth.template)["max_pending_seconds"] == 0
    assert sagemaker_synth.template["Outputs"][training_jobs.SAGEMAKER_FIELDS_OUTPUT]["Value"] == "none"
    on = _processor(sagemaker_fields_synth)["RunShardSageMaker"]["Parameters"]
    assert on["AlgorithmSpecification"]["ContainerEntrypoint"] == list(WORKER_ENTRYPOINT)
    assert on["RetryStrategy"] == {"MaximumRetryAttempts": training_jobs.RETRY_ATTEMPTS}
    assert _sagemaker_json(sagemaker_fields_synth.template)["max_pending_seconds"] == 240 * 60  # runnableTimeout
    assert sagemaker_fields_synth.template["Outputs"][training_jobs.SAGEMAKER_FIELDS_OUTPUT]["Value"] == \
        ",".join(training_jobs.UNLISTED_FIELDS)
    # On-demand without MaxPendingTimeInSeconds: SageMaker's own bound is MaxRuntime.
    assert training_jobs.stopping_condition(spot=False, seconds_left=7200, budget_seconds=7200,
                                            max_pending_seconds=0) == {"MaxRuntimeInSeconds": 7200}
    with pytest.raises(ValueError, match="Environment"):
        training_jobs.with_fields({}, ["Environment"])
