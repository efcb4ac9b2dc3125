"""cdk.json `userBuckets` (infra/user_buckets.py): the roles get exactly the allow-listed buckets and prefixes,
each only where its code touches them, and the same lists reach the settings the API checks batches against."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.infra.cfn import of_type
from tests.infra.iam_eval import as_list as _list
from tests.infra.iam_eval import role_of_handler as _role_of
from tests.infra.iam_eval import statements_of_role as _statements_of_role
from tests.infra.synth import Synth, synthesize
from tests.infra.test_least_privilege import HANDLERS, _worker_role

KEY = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
USER_BUCKETS = {"read": ["users-data", "users-archive"], "write": ["s3://users-results/nightly"], "kmsKeys": [KEY]}


@pytest.fixture(scope="module")
def user_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    synth = synthesize({"userBuckets": USER_BUCKETS}, tmp_path_factory.mktemp("cdk-users") / "cdk.out")
    assert synth.error is None, synth.error
    return synth


def grants(template: dict[str, Any], role: str) -> dict[str, set[str]]:
    """Action -> the user-bucket (non-deployment) S3 and KMS resources the role's policies grant it on."""
    out: dict[str, set[str]] = {}
    for st in _statements_of_role(template, role):
        for resource in _list(st["Resource"]):
            text = json.dumps(resource)
            if "users-" in text or (":kms:" in text and KEY in text):
                for action in _list(st["Action"]):
                    out.setdefault(action, set()).add(resource)
    return out


def test_only_the_listed_buckets_and_prefixes_are_granted(user_synth: Synth) -> None:
    template = user_synth.template
    data = {"arn:aws:s3:::users-data/*", "arn:aws:s3:::users-archive/*"}
    buckets = {"arn:aws:s3:::users-data", "arn:aws:s3:::users-archive"}
    out = {"arn:aws:s3:::users-results/nightly/*"}
    read = {"s3:GetObject": data, "s3:GetObjectVersion": data}  # an input's accepted version, by its VersionId
    expected = {
        "api": {**read, "s3:ListBucket": buckets, "kms:Decrypt": {KEY}},
        "validate": {**read, "s3:ListBucket": buckets, "kms:Decrypt": {KEY}},
        "finalize": {**read, "s3:PutObject": out, "s3:AbortMultipartUpload": out,
                     "kms:Decrypt": {KEY}, "kms:GenerateDataKey": {KEY}},
        "sweep": {**read, "s3:PutObject": out, "s3:AbortMultipartUpload": out,
                  "kms:Decrypt": {KEY}, "kms:GenerateDataKey": {KEY}},
    }
    for name, handler in HANDLERS.items():
        assert grants(template, _role_of(template, handler)) == expected.get(name, {}), name
    assert grants(template, _worker_role(template)) == {**read, "kms:Decrypt": {KEY}}


def test_the_settings_carry_the_same_lists(user_synth: Synth) -> None:
    for fn in of_type(user_synth.template, "AWS::Lambda::Function").values():
        env = fn["Properties"]["Environment"]["Variables"]
        assert env["NIGHTBATCH_USER_INPUT_BUCKETS"] == "users-data,users-archive"
        assert env["NIGHTBATCH_USER_OUTPUT_PREFIXES"] == "s3://users-results/nightly/"
    # What `nightbatch doctor` names the shared entries from (nightbatch/cli/doctor/sharing.py).
    assert json.loads(user_synth.template["Outputs"]["UserBuckets"]["Value"]) == {
        "read": ["users-data", "users-archive"], "write": ["s3://users-results/nightly/"]}


def test_no_user_bucket_without_the_key(template: dict[str, Any]) -> None:
    text = json.dumps(template)
    assert "arn:aws:s3:::" not in text and "NIGHTBATCH_USER_INPUT_BUCKETS" not in text


@pytest.mark.parametrize(("user_buckets", "message"), [
    ({"read": ["Not_A_Bucket"]}, "is neither a bucket name nor an s3://bucket/prefix/ URI"),
    ({"write": ["users-results/nightly/"]}, "is not an s3://bucket/prefix/ URI"),
    ({"write": ["s3://users-results/*"]}, "'\\*' is not allowed"),
    ({"read": ["s3://lake/teams/../x/"]}, "a '.' or '..' path segment"),
    ({"read": ["s3://lake/teams-{tenant}/"]}, "must be one whole path segment"),
    ({"write": ["s3://lake/{tenant}/{tenant}/"]}, "must be one whole path segment"),
    ({"kmsKeys": ["alias/users"]}, "are not KMS key ARNs"),
    ({"reads": ["users-data"]}, "Extra inputs are not permitted"),
])
def test_a_bad_allow_list_fails_the_synth(user_buckets: dict[str, Any], message: str) -> None:
    import app as cdk_app
    from infra.config import DeployConfig
    from tests.infra.synth import ROOT
    context = {**cdk_app.load_context(ROOT), "userBuckets": user_buckets}
    with pytest.raises(ValueError, match=message):
        DeployConfig.from_context(context.get)


def test_the_allow_list_may_not_be_set_through_limits() -> None:
    import app as cdk_app
    from infra.config import DeployConfig
    from tests.infra.synth import ROOT
    context = {**cdk_app.load_context(ROOT), "limits": {"user_input_buckets": "anyone"}}
    with pytest.raises(ValueError, match="set by the stack"):
        DeployConfig.from_context(context.get)


def test_a_tenant_segment_is_granted_as_a_wildcard_and_listing_is_held_to_the_prefixes(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """IAM cannot tell tenants apart (one role serves them all): `{tenant}` is granted as `*`, and the application
    holds each tenant to its own expansion (nightbatch/tenancy/scope.py)."""
    users = {"read": ["s3://users-lake/teams/{tenant}/", "s3://users-lake/shared/"],
             "write": ["s3://users-out/{tenant}/results/"]}
    synth = synthesize({"userBuckets": users}, tmp_path_factory.mktemp("cdk-tenant") / "cdk.out")
    assert synth.error is None, synth.error
    template = synth.template
    api = _role_of(template, HANDLERS["api"])
    assert grants(template, api)["s3:GetObject"] == {"arn:aws:s3:::users-lake/shared/*",
                                                      "arn:aws:s3:::users-lake/teams/*/*"}
    listing = [st for st in _statements_of_role(template, api) if "s3:ListBucket" in _list(st["Action"])
               and "users-lake" in json.dumps(st["Resource"])]
    assert [st["Condition"] for st in listing] == [{"StringLike": {"s3:prefix": ["shared/*", "teams/*/*"]}}]
    finalize = _role_of(template, HANDLERS["finalize"])
    assert grants(template, finalize)["s3:PutObject"] == {"arn:aws:s3:::users-out/*/results/*"}
    fn = next(iter(of_type(template, "AWS::Lambda::Function").values()))
    env = fn["Properties"]["Environment"]["Variables"]
    assert env["NIGHTBATCH_USER_INPUT_BUCKETS"] == "s3://users-lake/teams/{tenant}/,s3://users-lake/shared/"
