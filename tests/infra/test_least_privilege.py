"""M3: the GPU worker holds only its batch data and `batch_*` items; each Lambda only the table actions it calls.
M5: each Lambda's reserved concurrency."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.access import TABLE_ACTIONS
from infra.config import Concurrency
from nightbatch import lambda_quota
from nightbatch.layout import INPUT_TAG_KEY, INPUT_TAGS
from nightbatch.notifications.state_changes import SOURCE
from tests.infra.cfn import of_type
from tests.infra.iam_eval import allows, as_list, role_of_handler, statements_of_role
from tests.infra.synth import synthesize

HANDLERS = {
    "api": "functions.api.handler.handler", "validate": "functions.tasks.validate.handler",
    "plan": "functions.tasks.plan.handler", "finalize": "functions.tasks.finalize.handler",
    "notify": "functions.tasks.notify.handler", "deliver": "functions.tasks.deliver.handler",
    "sweep": "functions.tasks.sweep.handler", "compose_upload": "functions.tasks.compose_upload.handler",
    "capacity": "functions.tasks.capacity.handler",
}




def _worker_role(template: dict[str, Any]) -> str:
    (role,) = {str(d["Properties"]["ContainerProperties"]["JobRoleArn"]["Fn::GetAtt"][0])
               for d in of_type(template, "AWS::Batch::JobDefinition").values()}
    return role


def test_the_worker_writes_batches_only_and_reads_inputs(template: dict[str, Any]) -> None:
    statements = statements_of_role(template, _worker_role(template))
    s3 = [st for st in statements if any(a.startswith("s3:") for a in as_list(st["Action"]))]
    objects = [st for st in s3 if "s3:GetObject" in as_list(st["Action"]) or "s3:PutObject" in as_list(st["Action"])]
    writes = [json.dumps(r) for st in objects if "s3:PutObject" in as_list(st["Action"])
              for r in as_list(st["Resource"]) if "Storage" in json.dumps(r)]
    # Writes: batches/ (results) and the models/ weight cache, never files/ (every tenant's inputs) or uploads/.
    assert writes and all('"/batches/*"' in r or '"/models/*"' in r for r in writes), writes
    # Reads: also the inputs its shards point into (files/, an Upload's parts until composed).
    reads = [json.dumps(r) for st in objects for r in as_list(st["Resource"]) if "Storage" in json.dumps(r)]
    assert {p for p in ("/batches/*", "/models/*", "/files/*", "/uploads/*") if any(p in r for r in reads)} == {
        "/batches/*", "/models/*", "/files/*", "/uploads/*"}
    listing = [st for st in s3 if "s3:ListBucket" in as_list(st["Action"])
               and "Storage" in json.dumps(st["Resource"])]
    assert sorted(json.dumps(st["Condition"]) for st in listing) == sorted(json.dumps(
        {"StringLike": {"s3:prefix": prefixes}}) for prefixes in (["batches/*", "models/*"], ["files/*", "uploads/*"]))


def _may_get(statements: list[dict[str, Any]], bucket: str, key: str, tags: dict[str, str], *,
             action: str = "s3:GetObject") -> bool:
    """Would these Allow statements let `action` (s3:GetObject) read `key` of the bucket, an object tagged `tags`?"""
    return allows(statements, action, f"arn:aws:s3:::bucket/{key}",
                  {f"s3:ExistingObjectTag/{k}": v for k, v in tags.items()}, {bucket: "arn:aws:s3:::bucket"})


@pytest.mark.parametrize("which", ["synth", "sagemaker_synth"])
def test_the_worker_cannot_read_an_input_no_batch_tagged(which: str, request: pytest.FixtureRequest) -> None:
    """Every tenant's files live under files/ (fine-tune data, results, user files): the worker's role reads only
    the objects Validate tagged as an open batch's input, or as an image file its lines name (what
    tests/validation/test_file_image_guards.py checks it tags), and not an image file of another tenant's (moto
    does not evaluate the condition, so the synthesized policy is read here, for the Batch job role and the
    SageMaker job role alike)."""
    template = request.getfixturevalue(which).template
    bucket = next(iter(of_type(template, "AWS::S3::Bucket")))
    batch_roles = {str(d["Properties"]["ContainerProperties"]["JobRoleArn"]["Fn::GetAtt"][0])
                   for d in of_type(template, "AWS::Batch::JobDefinition").values()}
    sagemaker_roles = {r for r, res in of_type(template, "AWS::IAM::Role").items()
                       if "sagemaker.amazonaws.com" in json.dumps(res["Properties"]["AssumeRolePolicyDocument"])}
    roles = batch_roles | sagemaker_roles
    assert len(roles) == 1
    for role in roles:
        statements = statements_of_role(template, role)
        for key in ("files/file-abc", "uploads/upload-abc/parts/part-1"):
            # The object, and its tags (whose tenant the worker checks: gpu_worker/images.py), alike.
            for action in ("s3:GetObject", "s3:GetObjectTagging"):
                assert not _may_get(statements, bucket, key, {}, action=action), (role, key)
                assert not _may_get(statements, bucket, key, {INPUT_TAG_KEY: "other"}, action=action), (role, key)
                assert _may_get(statements, bucket, key, INPUT_TAGS, action=action), (role, key)
            assert not _may_get(statements, bucket, key, INPUT_TAGS, action="s3:PutObjectTagging"), (role, key)
        assert _may_get(statements, bucket, "batches/batch_x/shards/00000.json", {}), role


def test_the_worker_may_only_get_and_update_batch_items(template: dict[str, Any]) -> None:
    table = [st for st in statements_of_role(template, _worker_role(template))
             if any(a.startswith("dynamodb:") for a in as_list(st["Action"]))]
    assert len(table) == 1
    (st,) = table
    assert sorted(as_list(st["Action"])) == ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    assert st["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["batch_*"]}}
    assert not any("/index/" in json.dumps(r) for r in as_list(st["Resource"]))


def test_each_lambda_holds_only_the_table_actions_it_calls(template: dict[str, Any]) -> None:
    for name, handler in HANDLERS.items():
        actions = {a for st in statements_of_role(template, role_of_handler(template, handler))
                   for a in as_list(st["Action"]) if a.startswith("dynamodb:")}
        assert actions == set(TABLE_ACTIONS[name]), name
    for name in ("validate", "plan", "deliver", "compose_upload"):
        assert not {"dynamodb:PutItem", "dynamodb:DeleteItem"} & set(TABLE_ACTIONS[name])
    assert all(a not in {"dynamodb:BatchWriteItem", "dynamodb:Scan"} for acts in TABLE_ACTIONS.values()
               for a in acts)


def test_webhook_secrets_are_sealed_with_the_stack_key_only_deliver_opens_them(
        template: dict[str, Any]) -> None:
    (key,) = [k for k in of_type(template, "AWS::KMS::Key") if k.startswith("SecretsKey")]
    for name in ("api", "notify", "deliver"):
        env = next(f for f in of_type(template, "AWS::Lambda::Function").values()
                   if f["Properties"]["Handler"] == HANDLERS[name])["Properties"]["Environment"]["Variables"]
        assert env["NIGHTBATCH_SECRETS_KMS_KEY"] == {"Fn::GetAtt": [key, "Arn"]}, name
    decrypters = {name for name, handler in HANDLERS.items()
                  for st in statements_of_role(template, role_of_handler(template, handler))
                  if "kms:Decrypt" in as_list(st["Action"]) and key in json.dumps(st["Resource"])}
    assert decrypters == {"deliver"}, "the API only seals; webhooks.test is sent by Deliver (M5)"


def test_reserved_concurrency_keeps_the_workflow_s_room_and_caps_the_api(template: dict[str, Any]) -> None:
    """M5 floods: one key cannot take the account's Lambda concurrency from Validate/Finalize/Notify/Deliver."""
    defaults = Concurrency()
    reserved = {name: next(f for f in of_type(template, "AWS::Lambda::Function").values()
                           if f["Properties"]["Handler"] == handler)["Properties"].get("ReservedConcurrentExecutions")
                for name, handler in HANDLERS.items()}
    assert reserved == {name: defaults.api if name == "api" else defaults.sweep if name == "sweep"
                        else defaults.workflow for name in HANDLERS}


def test_the_stack_states_what_it_reserves_and_the_synth_refuses_more_than_the_account_allows(
        template: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    """A new account's Lambda quota is far below the 221 (121 reserved + 100 unreserved) the defaults need, and
    CloudFormation would refuse the stack half-way: the synth says so first, naming the keys to lower, and the
    stack outputs its sum for `nightbatch doctor` to check against the account's real quota."""
    reserved = sum(f["Properties"].get("ReservedConcurrentExecutions", 0)
                   for f in of_type(template, "AWS::Lambda::Function").values())
    defaults = Concurrency()
    assert reserved == defaults.api + defaults.sweep + defaults.workflow * (len(HANDLERS) - 2) == 121
    assert template["Outputs"][lambda_quota.STACK_OUTPUT]["Value"] == str(reserved)
    with pytest.raises(ValueError, match=r"reserves 121 .* concurrency.accountLimit=200 lets functions reserve 100 "
                                         r"\(AWS keeps 100 unreserved\): lower concurrency.api, concurrency.workflow"):
        synthesize({"concurrency": {"accountLimit": 200}, "nag": False}, tmp_path_factory.mktemp("c") / "cdk.out")
    lowered = synthesize({"concurrency": {"accountLimit": 200, "api": 20, "workflow": 10, "sweep": 0}, "nag": False},
                         tmp_path_factory.mktemp("c") / "cdk.out").template
    assert lowered["Outputs"][lambda_quota.STACK_OUTPUT]["Value"] == "90"
    none = synthesize({"concurrency": {"accountLimit": 10, "api": 0, "workflow": 0, "sweep": 0}, "nag": False},
                      tmp_path_factory.mktemp("c") / "cdk.out").template
    assert not any("ReservedConcurrentExecutions" in f["Properties"]
                   for f in of_type(none, "AWS::Lambda::Function").values())


def test_only_the_principals_that_move_a_batch_may_put_events_and_only_on_the_default_bus(
        template: dict[str, Any]) -> None:
    """EventBridge state changes (nightbatch/notifications/state_changes.py): events:PutEvents on the default bus's
    ARN, for the API (create, cancel), Validate, Finalize, Notify and the sweeper; no other events action anywhere."""
    putters: dict[str, Any] = {}
    for name, handler in HANDLERS.items():
        for st in statements_of_role(template, role_of_handler(template, handler)):
            actions = as_list(st["Action"])
            if any(str(a).startswith("events:") for a in actions):
                assert actions == ["events:PutEvents"], (name, actions)
                # Only nightbatch's own events: a stolen role cannot forge another service's (aws.* or a partner's).
                assert st["Condition"] == {"StringEquals": {"events:source": [SOURCE]}}, name
                putters[name] = st["Resource"]
    assert set(putters) == {"api", "validate", "finalize", "notify", "sweep"}
    for resource in putters.values():
        assert "event-bus/default" in json.dumps(resource) and "*" not in json.dumps(resource)
    assert not [st for st in statements_of_role(template, _worker_role(template))
                if any(str(a).startswith("events:") for a in as_list(st["Action"]))]
    for name in putters:
        env = next(f for f in of_type(template, "AWS::Lambda::Function").values()
                   if f["Properties"]["Handler"] == HANDLERS[name])["Properties"]["Environment"]["Variables"]
        assert env["NIGHTBATCH_EVENT_BUS"] == "default", name


def test_the_principals_that_store_or_mark_inputs_may_tag_them(template: dict[str, Any]) -> None:
    """The API stores files and Upload parts with their tenant's tag (PutObjectTagging: what a PUT carrying tags
    needs); Validate adds the input tag to an object's tags (reading them first, as its tagged rewrite does);
    composition reads a part's tags and writes the composed object with them (and adds the input tag later).
    Nobody else handles tags (the worker reads an input's, conditioned as its reads: see above)."""
    def tagging(name: str) -> set[tuple[str, str]]:
        return {(a, p) for st in statements_of_role(template, role_of_handler(template, HANDLERS[name]))
                for a in as_list(st["Action"]) if "ObjectTagging" in a
                for r in as_list(st["Resource"]) for p in ("/files/*", "/uploads/*", "/batches/*")
                if p in json.dumps(r)}
    both = {(a, p) for a in ("s3:GetObjectTagging", "s3:PutObjectTagging") for p in ("/files/*", "/uploads/*")}
    assert tagging("validate") == both
    assert tagging("compose_upload") == both - {("s3:PutObjectTagging", "/uploads/*")}
    assert tagging("api") == {("s3:PutObjectTagging", "/files/*"), ("s3:PutObjectTagging", "/uploads/*")}
    for name in set(HANDLERS) - {"validate", "compose_upload", "api"}:
        assert not tagging(name), name
