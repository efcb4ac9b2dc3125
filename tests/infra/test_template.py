"""The synthesized template: the resources each concern promises, and their safety-relevant properties."""

from __future__ import annotations

import json
from typing import Any

from tests.infra.cfn import of_type, one_of_type
from tests.infra.synth import ROOT, TEST_CONTEXT, Synth
from tests.support.older_formats import segment_key

CONTEXT = json.loads((ROOT / "cdk.json").read_text())["context"]


def _props(resource: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return resource[1]["Properties"]


def test_no_context_lookups_left(synth: Synth) -> None:
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    assert "missing" not in manifest, "a context lookup would need AWS credentials at synth"
    subnets = of_type(synth.template, "AWS::EC2::Subnet").values()
    # Environment-agnostic (tests/infra/test_deploy_environment.py): CloudFormation picks the AZs at deploy.
    assert all("Fn::GetAZs" in json.dumps(s["Properties"]["AvailabilityZone"]) for s in subnets)


def test_bucket_is_private_encrypted_tls_only_and_expires_files(template: dict[str, Any]) -> None:
    bucket = _props(one_of_type(template, "AWS::S3::Bucket"))
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"}
    assert bucket["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    for prefix in ("files", "batches", "uploads"):
        assert rules[f"expire-{prefix}"]["Prefix"] == f"{prefix}/"
        # M6: upload parts go after 2 days (an Upload lives an hour); files and batch data after 31.
        assert rules[f"expire-{prefix}"]["ExpirationInDays"] == (2 if prefix == "uploads" else 31)
    assert rules["abort-incomplete-multipart"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    policy = _props(one_of_type(template, "AWS::S3::BucketPolicy"))["PolicyDocument"]["Statement"]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in policy)


def test_table_keys_indexes_ttl_pitr(template: dict[str, Any]) -> None:
    table = _props(one_of_type(template, "AWS::DynamoDB::GlobalTable"))
    assert table["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert table["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    assert table["Replicas"][0]["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    indexes = {i["IndexName"]: i["KeySchema"] for i in table["GlobalSecondaryIndexes"]}
    assert indexes == {
        "by_owner": [{"AttributeName": "owner", "KeyType": "HASH"}, {"AttributeName": "owner_sk", "KeyType": "RANGE"}],
        "by_status": [{"AttributeName": "open_status", "KeyType": "HASH"},
                      {"AttributeName": "created_sk", "KeyType": "RANGE"}],
    }
    types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
    assert types == dict.fromkeys(("pk", "owner", "owner_sk", "open_status", "created_sk"), "S")


def test_table_matches_what_the_core_creates_locally(template: dict[str, Any]) -> None:
    """nightbatch.aws.dynamo.create_table is the local stack's copy of this table: they must agree."""
    from nightbatch.aws.dynamo import create_table

    class Recorder:
        kwargs: dict[str, Any] = {}

        def create_table(self, **kwargs: Any) -> None:
            Recorder.kwargs = kwargs

    create_table(Recorder(), "t")
    core = Recorder.kwargs
    table = _props(one_of_type(template, "AWS::DynamoDB::GlobalTable"))
    assert table["KeySchema"] == core["KeySchema"]
    assert sorted(table["AttributeDefinitions"], key=str) == sorted(core["AttributeDefinitions"], key=str)

    def indexes(gsis: list[dict[str, Any]]) -> dict[str, Any]:
        return {g["IndexName"]: (g["KeySchema"], g["Projection"]) for g in gsis}

    assert indexes(table["GlobalSecondaryIndexes"]) == indexes(core["GlobalSecondaryIndexes"])


def test_object_keys_the_core_writes_are_under_granted_prefixes() -> None:
    from infra.storage import PREFIXES
    from nightbatch import layout
    from nightbatch.files.service import file_key

    keys = [layout.manifest_key("b"), segment_key("b", 1), layout.shard_key("b", "00000"),
            layout.done_key("b", "00000"), layout.output_key("b"), layout.error_key("b"), file_key("file-x")]
    assert keys and all(k.startswith(PREFIXES) for k in keys), keys


def test_lambdas_share_runtime_and_have_the_expected_handlers(template: dict[str, Any]) -> None:
    functions = [f["Properties"] for f in of_type(template, "AWS::Lambda::Function").values()]
    assert sorted(f["Handler"] for f in functions) == sorted([
        "functions.api.handler.handler", "functions.tasks.validate.handler", "functions.tasks.plan.handler",
        "functions.tasks.finalize.handler", "functions.tasks.notify.handler", "functions.tasks.sweep.handler",
        "functions.tasks.compose_upload.handler", "functions.tasks.deliver.handler",
        "functions.tasks.capacity.handler",
    ])
    for f in functions:
        assert f["Runtime"] == "python3.14"
        assert f["Architectures"] == ["arm64"]
        assert f["LoggingConfig"]["LogFormat"] == "JSON"
    assert len({json.dumps(f["Code"], sort_keys=True) for f in functions}) == 1, "one bundle for every Lambda"


def test_http_api_has_access_logs_throttling_and_payload_v2(template: dict[str, Any]) -> None:
    stage = _props(one_of_type(template, "AWS::ApiGatewayV2::Stage"))
    assert stage["StageName"] == "$default" and stage["AutoDeploy"] is True
    assert "DestinationArn" in stage["AccessLogSettings"]
    assert "$context.requestId" in stage["AccessLogSettings"]["Format"]
    assert stage["DefaultRouteSettings"]["ThrottlingRateLimit"] == CONTEXT["api"]["rateLimit"]
    assert stage["DefaultRouteSettings"]["ThrottlingBurstLimit"] == CONTEXT["api"]["burstLimit"]
    integration = _props(one_of_type(template, "AWS::ApiGatewayV2::Integration"))
    assert integration["PayloadFormatVersion"] == "2.0"
    assert _props(one_of_type(template, "AWS::ApiGatewayV2::Route"))["RouteKey"] == "$default"


def test_sweeper_runs_every_five_minutes(template: dict[str, Any]) -> None:
    rule = _props(one_of_type(template, "AWS::Events::Rule"))
    assert rule["ScheduleExpression"] == "rate(5 minutes)"
    (target,) = rule["Targets"]
    sweeper = next(k for k, f in of_type(template, "AWS::Lambda::Function").items()
                   if f["Properties"]["Handler"] == "functions.tasks.sweep.handler")
    assert target["Arn"] == {"Fn::GetAtt": [sweeper, "Arn"]}


def _function(template: dict[str, Any], handler: str) -> dict[str, Any]:
    return next(f["Properties"] for f in of_type(template, "AWS::Lambda::Function").values()
                if f["Properties"]["Handler"] == handler)


def test_sweeper_has_time_to_finalize_an_abandoned_batch(template: dict[str, Any]) -> None:
    """The sweeper runs finalize_batch inline (nightbatch/pipeline/sweep.py): it gets Finalize's timeout."""
    sweeper = _function(template, "functions.tasks.sweep.handler")
    finalize = _function(template, "functions.tasks.finalize.handler")
    assert sweeper["Timeout"] == finalize["Timeout"] == 15 * 60
    assert sweeper["MemorySize"] >= finalize["MemorySize"]


def test_gpu_compute_a_queue_per_capacity_with_fair_share(template: dict[str, Any]) -> None:
    envs = of_type(template, "AWS::Batch::ComputeEnvironment")
    by_kind = {e["Properties"]["ComputeResources"]["Type"]: (k, e["Properties"]) for k, e in envs.items()}
    assert set(by_kind) == {"SPOT", "EC2"}
    for _, props in by_kind.values():
        resources = props["ComputeResources"]
        assert props["Type"] == "managed"
        assert resources["MinvCpus"] == 0
        assert resources["InstanceTypes"] == CONTEXT["gpuInstanceTypes"]
        assert resources["Ec2Configuration"] == [{"ImageType": "ECS_AL2023_NVIDIA"}]
        assert resources["MaxvCpus"] == CONTEXT["maxGpus"] * 4
        assert "LaunchTemplate" in resources
    (policy_id, policy), = of_type(template, "AWS::Batch::SchedulingPolicy").items()
    assert policy["Properties"]["FairsharePolicy"]["ShareDecaySeconds"] == 3600
    queues = of_type(template, "AWS::Batch::JobQueue")
    assert len(queues) == 2
    for logical, queue in queues.items():
        props = queue["Properties"]
        (order,) = props["ComputeEnvironmentOrder"]
        kind = "SPOT" if "Spot" in logical else "EC2"
        assert order["ComputeEnvironment"]["Fn::GetAtt"][0] == by_kind[kind][0]
        assert props["SchedulingPolicyArn"] == {"Fn::GetAtt": [policy_id, "Arn"]}
        limits = {a["Reason"]: a for a in props["JobStateTimeLimitActions"]}
        assert set(limits) == {"CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
                               "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE",
                               "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"}
        assert all(a["State"] == "RUNNABLE" and a["Action"] == "CANCEL" for a in limits.values())
        # A Spot job waits for capacity a short bound, then the workflow resubmits it on-demand.
        wait = 30 if kind == "SPOT" else CONTEXT["runnableTimeoutMinutes"]
        assert limits["CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"]["MaxTimeSeconds"] == wait * 60


def test_vpc_is_public_subnets_without_nat(template: dict[str, Any]) -> None:
    assert not of_type(template, "AWS::EC2::NatGateway")
    subnets = of_type(template, "AWS::EC2::Subnet").values()
    assert subnets and all(s["Properties"]["MapPublicIpOnLaunch"] for s in subnets)
    assert of_type(template, "AWS::EC2::FlowLog")


def test_launch_template_mounts_model_cache_and_requires_imdsv2(template: dict[str, Any]) -> None:
    data = _props(one_of_type(template, "AWS::EC2::LaunchTemplate"))["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True and root["Ebs"]["VolumeSize"] == CONTEXT["workerVolumeGiB"]
    assert root["Ebs"]["VolumeType"] == "gp3" and root["Ebs"]["Throughput"] == 1000 and root["Ebs"]["Iops"] == 4000
    user_data = json.dumps(data["UserData"])
    assert "Content-Type: multipart/mixed" in user_data and "/mnt/nightbatch-cache" in user_data


def test_a_job_definition_per_model_gpu_retry_strategy_role_and_cache_volume(template: dict[str, Any]) -> None:
    jobs = of_type(template, "AWS::Batch::JobDefinition")
    assert len(jobs) == len(CONTEXT["models"])
    for job in (j["Properties"] for j in jobs.values()):
        container = job["ContainerProperties"]
        requirements = {r["Type"]: r["Value"] for r in container["ResourceRequirements"]}
        assert requirements["GPU"] == "1" and requirements["VCPU"] == "4" and requirements["MEMORY"] == "14336"
        assert container["LinuxParameters"]["SharedMemorySize"] == 2048
        assert "JobRoleArn" in container
        assert job["RetryStrategy"]["Attempts"] == 3
        assert job["RetryStrategy"]["EvaluateOnExit"] == [
            {"Action": "RETRY", "OnStatusReason": "Host EC2*"}, {"Action": "EXIT", "OnReason": "*"}]
        assert job["Timeout"]["AttemptDurationSeconds"] == CONTEXT["limits"]["max_completion_window_hours"] * 3600
        assert container["Volumes"] == [{"Name": "model-cache", "Host": {"SourcePath": "/mnt/nightbatch-cache"}}]
        assert container["MountPoints"][0]["ContainerPath"] == "/cache"
        assert container["LogConfiguration"]["LogDriver"] == "awslogs"
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        # vLLM's compile caches live on the NVMe model cache with the weights.
        assert env["VLLM_CACHE_ROOT"] == "/cache/vllm" and env["TORCHINDUCTOR_CACHE_DIR"].startswith("/cache/")


def test_plan_names_each_model_s_job_definition(template: dict[str, Any]) -> None:
    plan = next(f["Properties"] for f in of_type(template, "AWS::Lambda::Function").values()
                if f["Properties"]["Handler"] == "functions.tasks.plan.handler")
    mapping = json.dumps(plan["Environment"]["Variables"]["NIGHTBATCH_JOB_DEFINITIONS_JSON"])
    for logical in of_type(template, "AWS::Batch::JobDefinition"):
        assert logical in mapping
    for model in CONTEXT["models"]:
        assert model["name"] in mapping


def test_worker_image_is_built_from_the_repo_root_with_a_lean_context(synth: Synth) -> None:
    assets = json.loads((synth.outdir / f"{synth.stack.stack_name}.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    assert image["source"]["dockerFile"] == "gpu_worker/Dockerfile"
    assert image["source"]["platform"] == "linux/amd64"
    context = synth.outdir / image["source"]["directory"]
    staged = {p.name for p in context.iterdir()}
    # Exactly what the Dockerfile copies (tests/infra/test_worker_image.py checks what feeds the hash).
    assert staged == {"gpu_worker", "nightbatch", "pyproject.toml"}
    # Neither the local stack nor the command line; the chat templates the engine reads come with the models.
    assert not (context / "nightbatch" / "local").exists() and not (context / "nightbatch" / "cli").exists()
    assert (context / "nightbatch" / "models" / "templates" / "smollm2_tools.jinja").is_file()
    assert not list(context.rglob("__pycache__"))


def test_notifications_topic_encrypted_queues_have_dlqs(template: dict[str, Any]) -> None:
    topic = _props(one_of_type(template, "AWS::SNS::Topic"))
    assert "KmsMasterKeyId" in topic
    queues = of_type(template, "AWS::SQS::Queue")
    with_dlq = {k: q for k, q in queues.items() if "RedrivePolicy" in q["Properties"]}
    assert {k.split("Queue")[0] for k in with_dlq} == {"NotificationsWebhook", "Uploads"}
    dlqs = {q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] for q in with_dlq.values()}
    assert dlqs | set(with_dlq) == set(queues)
    assert all(q["Properties"]["SqsManagedSseEnabled"] for q in queues.values())


def _consumers(template: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """Handler -> (event source mapping, queue, function) properties, for each SQS-triggered Lambda."""
    found = {}
    for mapping in of_type(template, "AWS::Lambda::EventSourceMapping").values():
        queue = template["Resources"][mapping["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]]["Properties"]
        function = template["Resources"][mapping["Properties"]["FunctionName"]["Ref"]]["Properties"]
        found[function["Handler"]] = (mapping["Properties"], queue, function)
    return found


def test_compose_upload_lambda_consumes_its_queue_one_message_at_a_time(template: dict[str, Any]) -> None:
    consumers = _consumers(template)
    assert set(consumers) == {"functions.tasks.compose_upload.handler", "functions.tasks.deliver.handler"}
    mapping, queue, function = consumers["functions.tasks.compose_upload.handler"]
    assert mapping["BatchSize"] == 1
    assert queue["VisibilityTimeout"] >= 6 * function["Timeout"]


def test_deliver_lambda_consumes_the_webhook_queue_reporting_item_failures(template: dict[str, Any]) -> None:
    from nightbatch.settings import SETTINGS

    mapping, queue, function = _consumers(template)["functions.tasks.deliver.handler"]
    webhook_queue, _ = one_of_type(template, "AWS::SQS::Queue", "NotificationsWebhookQueue")
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [webhook_queue, "Arn"]}
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert 1 <= mapping["BatchSize"] <= 10
    # Each message is one POST bounded by the receiver timeout, one after the other: the batch fits, with room.
    receiver_timeout = SETTINGS["webhook_timeout_seconds"].info.default
    assert function["Timeout"] >= mapping["BatchSize"] * receiver_timeout + 15
    # A crashed or timed-out invocation's messages must not reappear while it may still be running.
    assert queue["VisibilityTimeout"] >= 6 * function["Timeout"]
    assert queue["RedrivePolicy"]["maxReceiveCount"] >= 3  # then the DLQ, which an alarm watches


def test_alarms_reach_the_topic(template: dict[str, Any]) -> None:
    topic, _ = one_of_type(template, "AWS::SNS::Topic")
    alarms = of_type(template, "AWS::CloudWatch::Alarm")
    assert alarms
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic}]
        assert alarm["Properties"]["TreatMissingData"] == "notBreaching"
    names = {a["Properties"].get("MetricName") for a in alarms.values()}
    assert {"OldestBatchAgeSeconds", "OldestRunnableJobAgeSeconds", "ShardAttempt",
            "ApproximateNumberOfMessagesVisible", "Errors"} <= names
    errors = [a for a in alarms.values() if a["Properties"].get("MetricName") == "Errors"]
    assert len(errors) == len(of_type(template, "AWS::Lambda::Function"))
    visible = [a for a in alarms.values() if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"]
    assert len(visible) == 2  # one per dead-letter queue
    dims = [a["Properties"].get("Dimensions") for a in alarms.values()
            if a["Properties"].get("MetricName") == "OldestBatchAgeSeconds"]
    assert sorted(d[0]["Value"] for d in dims) == ["finalizing", "validating"]
    dashboard = json.dumps(_props(one_of_type(template, "AWS::CloudWatch::Dashboard"))["DashboardBody"])
    for metric in ("BatchesOpen", "CompletionTokens", "ShardDurationSeconds", "GpuInstancesRunning", "QueueJobs"):
        assert metric in dashboard


def test_state_machine_timeout_logging_tracing(template: dict[str, Any]) -> None:
    machine = _props(one_of_type(template, "AWS::StepFunctions::StateMachine"))
    assert machine["StateMachineType"] == "STANDARD"
    assert machine["LoggingConfiguration"]["Level"] == "ALL"
    assert machine["TracingConfiguration"] == {"Enabled": True}
    assert "StateMachineName" not in machine  # executions, not machines, carry the batch id


def test_every_lambda_is_traced_and_may_write_its_segments(template: dict[str, Any]) -> None:
    """X-Ray API → Step Functions → task Lambdas (functions/tasks/tracing.py): active tracing on every function."""
    policies = of_type(template, "AWS::IAM::Policy").values()
    for f in of_type(template, "AWS::Lambda::Function").values():
        assert f["Properties"]["TracingConfig"] == {"Mode": "Active"}
        role = {"Ref": f["Properties"]["Role"]["Fn::GetAtt"][0]}
        actions = {a for p in policies if role in p["Properties"]["Roles"]
                   for st in p["Properties"]["PolicyDocument"]["Statement"]
                   for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])}
        assert {"xray:PutTraceSegments", "xray:PutTelemetryRecords"} <= actions, f["Properties"]["Handler"]


def test_outputs(template: dict[str, Any]) -> None:
    assert {"ApiUrl", "ApiKeysSecret", "BucketName", "TableName", "StateMachineArn"} <= set(template["Outputs"])
    assert TEST_CONTEXT["shardRetry"]["intervalSeconds"] == 1
