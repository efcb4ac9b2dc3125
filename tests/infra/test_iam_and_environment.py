"""IAM is scoped to this stack's resources; every environment variable is a Settings field the runtime reads."""

from __future__ import annotations

import importlib
import importlib.util
import json
from typing import Any

import pytest

from nightbatch.settings import SETTINGS, Settings
from tests.infra.cfn import of_type, one_of_type, resolve

# Actions AWS offers no resource-level permissions for, so "*" is the only possible resource.
STAR_ALLOWED = {
    "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules", "xray:GetSamplingTargets",
    "logs:CreateLogDelivery", "logs:GetLogDelivery", "logs:UpdateLogDelivery", "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries", "logs:PutResourcePolicy", "logs:DescribeResourcePolicies", "logs:DescribeLogGroups",
    "ecr:GetAuthorizationToken",
    "batch:ListJobs", "batch:DescribeJobs",
    "cloudwatch:PutMetricData",  # conditioned on the namespace (test_training_jobs.py)
}
# The worker reads these two outside Settings (gpu_worker/model_prep.py): the model cache dir and HF's token.
WORKER_ONLY_ENV = {"NIGHTBATCH_MODEL_CACHE", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
REQUIRED = {"mode", "region", "bucket", "table"}


def _statements(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for logical, policy in of_type(template, "AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            found.append((logical, statement))
    return found


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _mentions(resource: Any, logical: str) -> bool:
    return f'"{logical}"' in json.dumps(resource)


def test_star_resources_only_for_actions_without_resource_permissions(template: dict[str, Any]) -> None:
    for logical, statement in _statements(template):
        if "*" in _list(statement["Resource"]):
            assert set(_list(statement["Action"])) <= STAR_ALLOWED, (logical, statement["Action"])
        for action in _list(statement["Action"]):
            assert not action.endswith(":*"), f"{logical} grants a whole service: {action}"


def test_data_access_is_scoped_to_the_bucket_and_table(template: dict[str, Any]) -> None:
    bucket, _ = one_of_type(template, "AWS::S3::Bucket")
    table, _ = one_of_type(template, "AWS::DynamoDB::GlobalTable")
    for logical, statement in _statements(template):
        actions = _list(statement["Action"])
        for resource in _list(statement["Resource"]):
            if any(a.startswith("s3:") for a in actions):
                assert _mentions(resource, bucket), (logical, resource)
            if any(a.startswith("dynamodb:") for a in actions):
                assert _mentions(resource, table), (logical, resource)


def _role_of(template: dict[str, Any], handler: str) -> str:
    fn = next(f for f in of_type(template, "AWS::Lambda::Function").values() if f["Properties"]["Handler"] == handler)
    return str(fn["Properties"]["Role"]["Fn::GetAtt"][0])


def test_drivers_are_scoped_to_their_one_resource(template: dict[str, Any]) -> None:
    machine, _ = one_of_type(template, "AWS::StepFunctions::StateMachine")
    topic, _ = one_of_type(template, "AWS::SNS::Topic")
    queues = {k.split("Queue")[0]: k for k, q in of_type(template, "AWS::SQS::Queue").items()
              if "RedrivePolicy" in q["Properties"]}
    expected: dict[str, dict[str, Any]] = {
        "states:StartExecution": {"Ref": machine},
        "sns:Publish": {"Ref": topic},
    }
    senders = {
        _role_of(template, "functions.tasks.notify.handler"): {queues["NotificationsWebhook"]},
        # Deliver re-queues a failed delivery's next attempt (and an early message) on the queue it consumes.
        _role_of(template, "functions.tasks.deliver.handler"): {queues["NotificationsWebhook"]},
        # The API queues compositions, and `webhooks.test`'s sample event for Deliver (M5).
        _role_of(template, "functions.api.handler.handler"): {queues["Uploads"], queues["NotificationsWebhook"]},
        _role_of(template, "functions.tasks.compose_upload.handler"): {queues["Uploads"]},
    }
    policies = of_type(template, "AWS::IAM::Policy")
    seen = set()
    for logical, statement in _statements(template):
        roles = [r["Ref"] for r in policies[logical]["Properties"]["Roles"]]
        for action, resource in expected.items():
            if action in _list(statement["Action"]):
                assert _list(statement["Resource"]) == [resource], (logical, action)
                seen.add(action)
        if "sqs:SendMessage" in _list(statement["Action"]):
            (role,) = roles
            for resource in _list(statement["Resource"]):
                queue, attribute = resource["Fn::GetAtt"]
                assert attribute == "Arn" and queue in senders[role], (logical, resource)
                senders[role].remove(queue)
    assert seen == set(expected) and not any(senders.values()), senders


def _role_statements(template: dict[str, Any], handler: str) -> list[dict[str, Any]]:
    role = _role_of(template, handler)
    return [statement for logical, statement in _statements(template)
            if {"Ref": role} in template["Resources"][logical]["Properties"]["Roles"]]


def test_sweeper_may_list_the_queue_s_jobs_and_cancel_jobs_and_nothing_else_of_batch(
        template: dict[str, Any]) -> None:
    grants = {(a, resolve(r, {}, lambda lid, attr: f"{lid}.{attr}"))
              for st in _role_statements(template, "functions.tasks.sweep.handler")
              for a in _list(st["Action"]) if a.startswith("batch:") for r in _list(st["Resource"])}
    assert grants == {("batch:ListJobs", "*"), ("batch:CancelJob", "arn:aws:batch:us-east-1:123456789012:job/*")}
    # No other principal touches the queue's jobs outside the workflow's own SubmitJob.sync.
    for logical, statement in _statements(template):
        if {"batch:ListJobs", "batch:CancelJob"} & set(_list(statement["Action"])):
            assert statement in _role_statements(template, "functions.tasks.sweep.handler"), logical


def test_the_workflow_may_follow_and_terminate_the_batch_jobs_it_submits(template: dict[str, Any]) -> None:
    """`batch:submitJob.sync` describes the job until it ends and terminates it when the task is stopped (an
    execution stopped, a cancelled batch's Map): without DescribeJobs/TerminateJob the jobs are not cancelled."""
    machine_roles = [k for k, r in of_type(template, "AWS::IAM::Role").items()
                     if "states.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])]
    grants = {(a, json.dumps(resolve(r, {}, lambda lid, attr: f"{lid}.{attr}")))
              for logical, st in _statements(template) for a in _list(st["Action"]) if a.startswith("batch:")
              if any({"Ref": role} in template["Resources"][logical]["Properties"]["Roles"] for role in machine_roles)
              for r in _list(st["Resource"])}
    assert {a for a, _ in grants} == {"batch:SubmitJob", "batch:DescribeJobs", "batch:TerminateJob"}
    assert {r for a, r in grants if a != "batch:SubmitJob"} == {
        '"*"', '"arn:aws:batch:us-east-1:123456789012:job/*"'}
    assert ("batch:DescribeJobs", '"*"') in grants


def _s3_grants(template: dict[str, Any], handler: str) -> dict[str, set[str]]:
    """Key prefix -> S3 object actions the handler's role holds on it."""
    grants: dict[str, set[str]] = {}
    for statement in _role_statements(template, handler):
        if not all(a.startswith("s3:") for a in _list(statement["Action"])):
            continue
        for resource in _list(statement["Resource"]):
            parts = resource.get("Fn::Join", ["", []])[1] if isinstance(resource, dict) else []
            if parts and isinstance(parts[-1], str) and parts[-1].endswith("/*"):
                grants.setdefault(parts[-1].strip("/*"), set()).update(_list(statement["Action"]))
    return grants


def test_sweeper_reads_and_writes_what_finalize_does_and_deletes_expired_upload_parts(
        template: dict[str, Any]) -> None:
    sweeper = _s3_grants(template, "functions.tasks.sweep.handler")
    finalize = _s3_grants(template, "functions.tasks.finalize.handler")
    assert set(sweeper) == set(finalize) == {"files", "batches", "uploads"}
    assert {p: sweeper[p] for p in ("files", "batches")} == {p: finalize[p] for p in ("files", "batches")}
    assert all({"s3:GetObject", "s3:PutObject", "s3:DeleteObject"} <= sweeper[p] for p in ("files", "batches"))
    # An input read through its Upload's parts; the sweeper also deletes the parts of the Uploads it expires.
    assert finalize["uploads"] == {"s3:GetObject"} and sweeper["uploads"] == {"s3:GetObject", "s3:DeleteObject"}


def test_validate_may_read_upload_parts(template: dict[str, Any]) -> None:
    # ... and tag them as the batch's input (the worker reads only tagged parts), adding to the tags they have.
    assert _s3_grants(template, "functions.tasks.validate.handler")["uploads"] == {
        "s3:GetObject", "s3:GetObjectTagging", "s3:PutObjectTagging"}


def test_only_batch_hosts_use_a_managed_policy(template: dict[str, Any]) -> None:
    for logical, role in of_type(template, "AWS::IAM::Role").items():
        managed = role["Properties"].get("ManagedPolicyArns")
        if managed:
            assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
                "Service": "ec2.amazonaws.com"}, logical
            assert "AmazonEC2ContainerServiceforEC2Role" in json.dumps(managed)


def _lambda_envs(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["Properties"]["Handler"]: f["Properties"]["Environment"]["Variables"]
            for f in of_type(template, "AWS::Lambda::Function").values()}


def _job_env(template: dict[str, Any]) -> dict[str, Any]:
    envs = [{e["Name"]: e["Value"] for e in job["Properties"]["ContainerProperties"]["Environment"]}
            for job in of_type(template, "AWS::Batch::JobDefinition").values()]
    assert envs and all(env == envs[0] for env in envs), "every model's job gets the same environment"
    return envs[0]


BY_ENV = {s.env: s for s in SETTINGS.values()}


def _field(env_name: str) -> str:
    """The setting a variable sets (its name), "" when it sets none (SETTINGS lists only real section fields)."""
    setting = BY_ENV.get(env_name)
    return setting.name if setting else ""


def test_every_lambda_variable_is_a_settings_field(template: dict[str, Any]) -> None:
    for handler, env in _lambda_envs(template).items():
        unknown = {name for name in env if not _field(name)}
        assert not unknown, f"{handler}: {unknown} are not Settings fields"
        assert {_field(n) for n in env} >= REQUIRED, handler
        assert env["NIGHTBATCH_MODE"] == "aws"


def test_each_lambda_gets_what_it_drives(template: dict[str, Any]) -> None:
    envs = _lambda_envs(template)
    assert "NIGHTBATCH_STATE_MACHINE_ARN" in envs["functions.api.handler.handler"]
    assert "NIGHTBATCH_API_KEYS_SECRET" in envs["functions.api.handler.handler"]
    assert "NIGHTBATCH_STATE_MACHINE_ARN" in envs["functions.tasks.sweep.handler"]
    assert "NIGHTBATCH_JOB_QUEUE" in envs["functions.tasks.sweep.handler"]
    notify = envs["functions.tasks.notify.handler"]
    assert {"NIGHTBATCH_TOPIC_ARN", "NIGHTBATCH_WEBHOOK_QUEUE_URL", "NIGHTBATCH_LINK_KEYS_SECRET"} <= set(notify)
    assert {"NIGHTBATCH_UPLOAD_QUEUE_URL", "NIGHTBATCH_LINK_KEYS_SECRET"} <= set(envs["functions.api.handler.handler"])
    assert "NIGHTBATCH_UPLOAD_QUEUE_URL" in envs["functions.tasks.compose_upload.handler"]
    # The API refuses at create what Notify would skip: both apply the same allowed domains.
    api_domains = envs["functions.api.handler.handler"]["NIGHTBATCH_EMAIL_ALLOWED_DOMAINS"]
    assert notify["NIGHTBATCH_EMAIL_ALLOWED_DOMAINS"] == api_domains


def test_deliver_gets_notify_s_environment_but_the_link_signing_pair(template: dict[str, Any]) -> None:
    """Deliver builds the same notifier (queue, topic, sender) as Notify; it signs no download links and puts
    no state-change events (it may not: no events:PutEvents)."""
    envs = _lambda_envs(template)
    notify, deliver = envs["functions.tasks.notify.handler"], envs["functions.tasks.deliver.handler"]
    link_pair = {"NIGHTBATCH_LINK_KEYS_SECRET", "NIGHTBATCH_PUBLIC_BASE_URL"}
    assert link_pair <= set(notify) and "NIGHTBATCH_EVENT_BUS" in notify
    assert deliver == {k: v for k, v in notify.items() if k not in {*link_pair, "NIGHTBATCH_EVENT_BUS"}}
    assert "NIGHTBATCH_WEBHOOK_QUEUE_URL" in deliver


def test_notify_links_point_at_the_http_api_and_share_the_api_s_key(template: dict[str, Any]) -> None:
    envs = _lambda_envs(template)
    api, notify = envs["functions.api.handler.handler"], envs["functions.tasks.notify.handler"]
    http_api, _ = one_of_type(template, "AWS::ApiGatewayV2::Api")
    url = resolve(notify["NIGHTBATCH_PUBLIC_BASE_URL"], {http_api: "abc123"}, lambda lid, attr: f"{lid}.{attr}")
    assert url == "https://abc123.execute-api.us-east-1.amazonaws.com/"
    assert notify["NIGHTBATCH_LINK_KEYS_SECRET"] == api["NIGHTBATCH_LINK_KEYS_SECRET"]
    refs = json.dumps(api["NIGHTBATCH_LINK_KEYS_SECRET"]).split('"')
    (secret,) = {ref for ref in refs if ref.startswith("LinkSecret")}
    assert secret in of_type(template, "AWS::SecretsManager::Secret")


def test_link_keys_are_read_at_run_time_never_in_an_environment(template: dict[str, Any]) -> None:
    """M4: the environment names the secret; the key itself is read from Secrets Manager by the function."""
    (secret,) = [k for k in of_type(template, "AWS::SecretsManager::Secret") if k.startswith("LinkSecret")]
    for handler in ("functions.api.handler.handler", "functions.tasks.notify.handler"):
        env = _lambda_envs(template)[handler]
        assert env["NIGHTBATCH_LINK_KEYS_SECRET"] == {"Ref": secret}, handler
        assert "NIGHTBATCH_LINK_SECRET" not in env
        reads = [st for st in _role_statements(template, handler)
                 if "secretsmanager:GetSecretValue" in _list(st["Action"])]
        assert any(json.dumps({"Ref": secret}) in json.dumps(st["Resource"]) for st in reads), handler
    for fn in of_type(template, "AWS::Lambda::Function").values():
        assert "{{resolve:secretsmanager:" not in json.dumps(fn["Properties"].get("Environment", {}))


def test_job_definition_variables_are_settings_fields_or_worker_constants(template: dict[str, Any]) -> None:
    env = _job_env(template)
    unknown = {n for n in env if n not in WORKER_ONLY_ENV and not _field(n)}
    assert not unknown
    assert {_field(n) for n in env if n not in WORKER_ONLY_ENV} >= REQUIRED
    assert importlib.util.find_spec("gpu_worker.model_prep") is not None
    model_prep = importlib.import_module("gpu_worker.model_prep")
    from infra.gpu_compute import VLLM_CACHE_ENV

    assert {model_prep.CACHE_ENV, *VLLM_CACHE_ENV} == WORKER_ONLY_ENV


class _Placeholder(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return f"ref-{key}"


@pytest.mark.parametrize("which", ["lambdas", "job"])
def test_environment_parses_into_settings(template: dict[str, Any], which: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    envs = list(_lambda_envs(template).values()) if which == "lambdas" else [_job_env(template)]
    for env in envs:
        rendered = resolve(env, _Placeholder(), lambda lid, attr: f"{lid}.{attr}")
        for name, value in rendered.items():
            monkeypatch.setenv(name, str(value))
        settings = Settings()
        assert settings.deployment.mode == "aws"
        assert [m.name for m in settings.serving.models] == [m["name"] for m in json.loads(
            rendered["NIGHTBATCH_MODELS_JSON"])]
        for name in rendered:
            monkeypatch.delenv(name)


def test_lambda_handlers_exist(template: dict[str, Any]) -> None:
    missing = []
    for handler in _lambda_envs(template):
        module, _, attr = handler.rpartition(".")
        if importlib.util.find_spec(module.split(".")[0]) is None or _find(module) is None:
            missing.append(module)
            continue
        assert callable(getattr(importlib.import_module(module), attr)), handler
    assert not missing, f"handlers the template names but the code lacks: {sorted(missing)}"


def _find(module: str) -> object | None:
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
