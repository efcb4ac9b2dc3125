"""The nightbatch stack: builds each concern's construct, then does the wiring and the scoped grants."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_batch as batch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from infra import access, environment, nag
from infra.access import TABLE_ACTIONS, WORKER_INPUT_PREFIXES, WORKER_PREFIXES, grant_objects, grant_table
from infra.api import Api
from infra.bundling import lambda_code
from infra.config import DeployConfig
from infra.endpoint_runner import EndpointRunner
from infra.gpu_compute import GpuCompute, ModelJob
from infra.lambdas import LambdaBase
from infra.notifications import Notifications
from infra.observability import Observability
from infra.orchestration import Orchestration
from infra.storage import BATCHES_PREFIX, FILES_PREFIX, UPLOADS_PREFIX, Storage
from infra.training_jobs import TrainingJobs
from infra.uploads import UploadComposer
from nightbatch import lambda_quota
from nightbatch.notifications import state_changes
from nightbatch.pipeline.training_jobs import SAGEMAKER_FIELDS_OUTPUT
from nightbatch.tenancy import scope


def _retention(days: int) -> logs.RetentionDays:
    return next((r for r in logs.RetentionDays if r.value == days), logs.RetentionDays.ONE_MONTH)


class NightbatchStack(cdk.Stack):
    """API Gateway → API Lambda; S3 + DynamoDB; Step Functions per batch → AWS Batch GPU workers.

    The constructor reads as the stack's parts in order: the constructs (storage, notifications, GPU compute,
    secrets, the Lambdas and the workflow), the grants, the limits and alarms, and the outputs; each part is one
    method below. What each function's environment holds is `infra.environment`'s; the stack hands it the
    references of what it built."""

    def __init__(self, scope: Construct, id: str, *, config: DeployConfig, repo_root: Path, **kwargs: Any) -> None:
        super().__init__(scope, id, description=f"nightbatch ({config.stage}): OpenAI-compatible Batch API",
                         **kwargs)
        self.config = config
        self.log_retention = _retention(config.log_retention_days)
        self.removal = cdk.RemovalPolicy.RETAIN if config.retain_data else cdk.RemovalPolicy.DESTROY

        self.storage = Storage(self, "Storage", removal_policy=self.removal)
        self.notifications = Notifications(
            self, "Notifications", sender_email=config.notifications.sender_email,
            alarm_email=config.notifications.alarm_email, sender_identity=config.notifications.sender_identity,
            create_sender_identity=config.notifications.create_sender_identity,
        )
        self.runtime = environment.runtime_environment(config, region=self.region,
                                                       bucket=self.storage.bucket.bucket_name,
                                                       table=self.storage.table.table_name)
        self.gpu = self._gpu_compute(repo_root)
        # SageMaker Training Jobs for the models whose `gpuBackend` is sagemaker or both.
        self.training_jobs = (TrainingJobs(self, "TrainingJobs", image=self.gpu.image,
                                           volume_gib=config.worker_volume_gib,
                                           hf_token_secret=self.gpu.hf_token_secret,
                                           fields=config.sagemaker_fields.enabled)
                              if config.uses_sagemaker else None)
        # The runner of endpoint shards (models with an `endpoint`): AWS Batch Fargate in the operator's VPC.
        self.endpoint_runner = self._endpoint_runner(repo_root) if config.uses_endpoint else None
        code = lambda_code(repo_root, config.lambda_bundling, probe=self.bundling_required)
        self._secrets()
        self._functions(code)

        self._grant_objects_and_table()
        self._grant_drivers()
        if self.training_jobs is not None:  # Finalize (and the sweeper's inline Finalize) price managed Spot
            for function in (self.orchestration.tasks["finalize"].function, self.orchestration.sweeper.function):
                self.training_jobs.grant_describe(function)
            self.training_jobs.grant_stop(self.orchestration.sweeper.function)
        functions = self.lambda_functions()
        self._reserve_concurrency(functions)
        self.observability = Observability(
            self, "Observability",
            topic=self.notifications.topic,
            http_api=self.api.http_api,
            functions=functions,
            state_machine=self.orchestration.state_machine,
            dead_letter_queues={"Webhook": self.notifications.webhook_dlq, "Upload": self.uploads.dlq},
            stuck_batch_minutes=config.alarms.stuck_batch_minutes,
            runnable_minutes=config.alarms.runnable_minutes,
            shard_attempts=config.alarms.shard_attempts,
        )
        self._outputs()
        nag.acknowledge(self)

    # --- constructs --------------------------------------------------------------------------------------------

    def _gpu_compute(self, repo_root: Path) -> GpuCompute:
        config = self.config
        return GpuCompute(
            self, "Gpu",
            repo_root=repo_root,
            models=[ModelJob(name=m.spec.name, instance_types=config.instance_types_for(m),
                             gpus=m.gpu.tensor_parallel_size, shared_memory_gib=m.gpu.shared_memory_gib)
                    for m in config.gpu_models if config.backend_for(m) != "sagemaker"],
            use_batch=config.uses_batch,
            max_gpus=config.max_gpus,
            spot=config.capacity.spot,
            on_demand=config.capacity.on_demand,
            root_volume_gib=config.worker_volume_gib,
            root_volume_throughput=config.worker_volume_throughput,
            root_volume_iops=config.worker_volume_iops,
            runnable_timeout=cdk.Duration.minutes(config.runnable_timeout_minutes),
            spot_runnable_timeout=cdk.Duration.minutes(config.spot_runnable_minutes),
            share_weights=config.fair_share.policy_weights(),
            share_decay_seconds=config.fair_share.share_decay_seconds,
            compute_reservation=config.fair_share.compute_reservation,
            job_timeout=cdk.Duration.hours(config.max_window_hours),
            environment=self.runtime,
            hf_token_secret_name=config.hf_token_secret,
            log_retention=self.log_retention,
        )

    def _endpoint_runner(self, repo_root: Path) -> EndpointRunner:
        network = self.config.endpoint_network
        assert network is not None  # DeployConfig requires it when a model has an endpoint
        return EndpointRunner(
            self, "EndpointRunner", repo_root=repo_root, vpc_id=network.vpc_id, subnet_ids=network.subnet_ids,
            security_group_ids=network.security_group_ids, assign_public_ip=network.assign_public_ip,
            max_vcpus=network.max_vcpus, environment=environment.runner_environment(self.runtime, self.config),
            secrets=self.config.endpoint_secrets, job_timeout=cdk.Duration.hours(self.config.max_window_hours),
            log_retention=self.log_retention)

    @property
    def job_queues(self) -> list[batch.IJobQueue]:
        """Every AWS Batch queue a shard's job goes to: the GPU queues, and the endpoint runner's."""
        runner = [self.endpoint_runner.queue] if self.endpoint_runner is not None else []
        return [*self.gpu.queues.values(), *runner]

    def _secrets(self) -> None:
        # Seals webhook signing secrets in the table; kept as long as the table, which holds what it sealed.
        self.secrets_key = kms.Key(self, "SecretsKey", enable_key_rotation=True, removal_policy=self.removal,
                                   description="nightbatch: seals webhook signing secrets stored in the table")
        # Signs download links; the API signs and verifies, Notify signs links it mails. Read from Secrets Manager
        # at run time (nightbatch/files/links.py), so no key sits in a function's configuration, where anyone with
        # lambda:GetFunctionConfiguration could read it. {"current": "k1", "k1": …}: rotate by adding k2.
        self.link_secret = secretsmanager.Secret(
            self, "LinkSecret",
            description="nightbatch: HMAC keys of signed download links (shared by the API and Notify)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                secret_string_template=json.dumps({"current": "k1"}), generate_string_key="k1",
                exclude_punctuation=True, password_length=64),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.api_keys = secretsmanager.Secret(
            self, "ApiKeys",
            description="nightbatch API keys (comma-separated); clients send one as the Bearer token",
            generate_secret_string=secretsmanager.SecretStringGenerator(exclude_punctuation=True, password_length=48),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )

    def _functions(self, code: lambda_.Code) -> None:
        """The upload composer, the webhook deliverer, the workflow's tasks and sweeper, and the API."""
        config = self.config
        lambdas = LambdaBase(code, self.runtime, self.log_retention)
        self.uploads = UploadComposer(self, "Uploads", lambdas=lambdas)
        configuration_set = self.notifications.configuration_set
        channels = environment.channels_environment(
            config, topic_arn=self.notifications.topic.topic_arn,
            webhook_queue_url=self.notifications.webhook_queue.queue_url, secrets_kms_key=self.secrets_key.key_arn,
            configuration_set=None if configuration_set is None else configuration_set.configuration_set_name)
        # The webhook queue's consumer builds the same notifier as Notify; it signs no download links, so it
        # gets neither the link secret nor the API's URL.
        self.deliverer = self.notifications.add_deliverer(lambdas=lambdas.with_environment(channels))
        self.orchestration = Orchestration(
            self, "Orchestration",
            lambdas=lambdas,
            task_environment=environment.task_environments(
                config, self, channels=channels, link_keys_secret=self.link_secret.secret_arn,
                job_definitions={name: jd.job_definition_arn for name, jd in self.gpu.job_definitions.items()},
                job_queues={kind: q.job_queue_arn for kind, q in self.gpu.queues.items()},
                sagemaker_job_prefix=self._sagemaker_job_prefix(),
                endpoint_runner=None if self.endpoint_runner is None else {
                    "queue": self.endpoint_runner.queue.job_queue_arn,
                    "job_definition": self.endpoint_runner.job_definition.job_definition_arn}),
            sweeper_environment=environment.sweeper_environment(
                config, [q.job_queue_arn for q in self.job_queues],
                sagemaker_job_prefix=self._sagemaker_job_prefix()),
            bucket=self.storage.bucket,
            job_queues=self.job_queues,
            use_batch=config.uses_batch,
            use_endpoint=self.endpoint_runner is not None,
            training_jobs=self.training_jobs,
            execution_timeout=cdk.Duration.hours(config.max_window_hours + config.finalize_margin_hours),
        )
        self.api = Api(
            self, "Api",
            lambdas=lambdas.with_environment(environment.api_environment(
                config, link_keys_secret=self.link_secret.secret_arn, upload_queue_url=self.uploads.queue.queue_url,
                state_machine_arn=self.orchestration.state_machine.state_machine_arn,
                api_keys_secret=self.api_keys.secret_arn, secrets_kms_key=self.secrets_key.key_arn,
                webhook_queue_url=self.notifications.webhook_queue.queue_url)),
            memory_mb=config.api.memory_mb,
            rate_limit=config.api.rate_limit,
            burst_limit=config.api.burst_limit,
        )
        # Notify signs download links into its e-mails; they point at this API, unless `limits` names another
        # public URL (a custom domain). No cycle: the HTTP API does not depend on the workflow, its Lambda does.
        if "public_base_url" not in config.limits:
            self.orchestration.tasks["notify"].add_environment(environment.env_name("public_base_url"), self.api.url)

    def _sagemaker_job_prefix(self) -> str:
        return self.training_jobs.job_prefix if self.training_jobs is not None else ""

    @property
    def worker_roles(self) -> list[iam.IRole]:
        """The roles the GPU worker runs as: the Batch job role, the SageMaker job role, or both."""
        roles: list[iam.IRole] = [self.gpu.job_role] if self.config.uses_batch else []
        return roles + ([self.training_jobs.job_role] if self.training_jobs else [])

    @property
    def shard_roles(self) -> list[iam.IRole]:
        """Every role a shard runs as: the GPU worker's, and the endpoint runner's."""
        return self.worker_roles + ([self.endpoint_runner.job_role] if self.endpoint_runner is not None else [])

    def lambda_functions(self) -> dict[str, lambda_.Function]:
        """Every Lambda by its principal's name (TABLE_ACTIONS' keys)."""
        functions = {name: t.function for name, t in self.orchestration.tasks.items()}
        functions.update(sweep=self.orchestration.sweeper.function, api=self.api.handler.function,
                         compose_upload=self.uploads.composer.function, deliver=self.deliverer.function)
        return functions

    # --- grants ------------------------------------------------------------------------------------------------

    def _grant_objects_and_table(self) -> None:
        """Each principal gets its prefixes and the table actions its code calls."""
        tasks, sweeper = self.orchestration.tasks, self.orchestration.sweeper
        api_role = self.api.handler.role
        grant_objects(self.storage.bucket, api_role, (FILES_PREFIX, BATCHES_PREFIX, UPLOADS_PREFIX), write=True)
        # Files and Upload parts are stored with their tenant's tag (tenancy/scope.py).
        access.grant_object_tags(self.storage.bucket, api_role, WORKER_INPUT_PREFIXES, read=False, write=True)
        for name in ("validate", "plan", "finalize", "capacity"):
            grant_objects(self.storage.bucket, tasks[name].role, (FILES_PREFIX, BATCHES_PREFIX), write=True)
        # An uploaded input is read through its parts until composition finishes: by Validate, and by Finalize (the
        # sweeper's inline one too) writing the unrun lines of a batch cancelled or expired before then.
        for reader in (tasks["validate"].role, tasks["finalize"].role, sweeper.role):
            grant_objects(self.storage.bucket, reader, (UPLOADS_PREFIX,), write=False)
        # The sweeper expires abandoned Uploads: their parts are deleted.
        sweeper.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:DeleteObject"], resources=[self.storage.bucket.arn_for_objects(f"{UPLOADS_PREFIX}*")]))
        # Validate tags what a batch's shards read (the worker reads no other input); composition carries the tag over.
        access.grant_object_tags(self.storage.bucket, tasks["validate"].role, WORKER_INPUT_PREFIXES, read=True,
                                 write=True)
        grant_objects(self.storage.bucket, sweeper.role, (FILES_PREFIX, BATCHES_PREFIX), write=True)
        composer = self.uploads.composer.role
        grant_objects(self.storage.bucket, composer, (FILES_PREFIX, UPLOADS_PREFIX), write=True)
        access.grant_object_tags(self.storage.bucket, composer, (UPLOADS_PREFIX,), read=True, write=False)
        access.grant_object_tags(self.storage.bucket, composer, (FILES_PREFIX,), read=True, write=True)
        for sender in (api_role, composer):
            self.uploads.queue.grant_send_messages(sender)
        for worker in self.worker_roles:
            grant_objects(self.storage.bucket, worker, WORKER_PREFIXES, write=True, list_only_prefixes=True)
        if self.endpoint_runner is not None:  # the batches/ objects only: it writes no weights through
            grant_objects(self.storage.bucket, self.endpoint_runner.job_role, (BATCHES_PREFIX,), write=True,
                          list_only_prefixes=True)
        for worker in self.shard_roles:
            grant_objects(self.storage.bucket, worker, WORKER_INPUT_PREFIXES, write=False, list_only_prefixes=True,
                          inputs_only=True)
            access.grant_object_tags(self.storage.bucket, worker, WORKER_INPUT_PREFIXES, read=True, write=False,
                                     inputs_only=True)
        roles = {"api": api_role, "sweep": sweeper.role, "compose_upload": composer,
                 "deliver": self.deliverer.role, **{name: t.role for name, t in tasks.items()}}
        for name, principal in roles.items():
            grant_table(self.storage, principal, TABLE_ACTIONS[name])
        for worker in self.shard_roles:
            grant_table(self.storage, worker, TABLE_ACTIONS["worker"], leading_keys=("batch_*",))
        self.config.user_buckets.grant(roles, self.shard_roles)

    def _grant_drivers(self) -> None:
        """The one thing each principal drives: the workflow, a secret, a key, a topic, a queue, Batch jobs."""
        notify_role, sweeper_role = self.orchestration.tasks["notify"].role, self.orchestration.sweeper.role
        api_role = self.api.handler.role
        self.orchestration.state_machine.grant_start_execution(api_role)
        self.api_keys.grant_read(api_role)
        for reader in (api_role, notify_role):
            self.link_secret.grant_read(reader)
        # The API seals new signing secrets; only Deliver opens them, to sign (also `webhooks.test`'s event).
        self.secrets_key.grant(api_role, "kms:Encrypt")
        self.secrets_key.grant(self.deliverer.role, "kms:Decrypt")
        self.notifications.topic.grant_publish(notify_role)
        for sender in (api_role, notify_role):
            self.notifications.webhook_queue.grant_send_messages(sender)
        self.notifications.grant_send_email(notify_role)
        # The sweeper lists the queue's jobs (ListJobs has no resource-level permissions: "*") and cancels the
        # unstarted ones of stopped batches (nightbatch/aws/batch_jobs.py); nothing else of Batch.
        if self.job_queues:
            sweeper_role.add_to_policy(iam.PolicyStatement(actions=["batch:ListJobs"], resources=["*"]))
            sweeper_role.add_to_policy(iam.PolicyStatement(
                actions=["batch:CancelJob"],
                resources=[self.format_arn(service="batch", resource="job", resource_name="*")],
            ))
        for model in self.config.models:
            for source in (model.spec.source, *model.spec.lora_modules.values()):  # weights, LoRA adapters
                if source.startswith("s3://"):
                    self.grant_model_weights(source)
        self._grant_event_bus()

    def _grant_event_bus(self) -> None:
        """PutEvents on the one bus, with nightbatch's event source only, for the principals that transition a
        batch (the API creates and cancels, Validate, Finalize and the sweeper's Finalize move it, Notify puts the
        terminal change)."""
        bus = self.config.notifications.event_bus
        if not bus:
            return
        arn = bus if bus.startswith("arn:") else self.format_arn(service="events", resource="event-bus",
                                                                  resource_name=bus)
        tasks = self.orchestration.tasks
        for role in (self.api.handler.role, tasks["validate"].role, tasks["finalize"].role, tasks["notify"].role,
                     self.orchestration.sweeper.role):
            assert role is not None
            role.add_to_principal_policy(iam.PolicyStatement(
                actions=["events:PutEvents"], resources=[arn],
                conditions={"StringEquals": {"events:source": [state_changes.SOURCE]}}))

    # --- limits and outputs ------------------------------------------------------------------------------------

    def _reserve_concurrency(self, functions: Mapping[str, lambda_.Function]) -> None:
        # Floods (M5): the workflow keeps its own room; the API is capped so one key cannot starve it.
        limits = self.config.concurrency
        reserved = {name: limits.api if name == "api" else limits.sweep if name == "sweep" else limits.workflow
                    for name in functions}
        self.reserved_concurrency = sum(reserved.values())
        room = lambda_quota.reservable(limits.account_limit)
        if self.reserved_concurrency > room:
            workflow = sorted(n for n in reserved if n not in ("api", "sweep"))
            raise ValueError(
                f"concurrency: the stack reserves {self.reserved_concurrency} concurrent executions (api "
                f"{limits.api} + sweep {limits.sweep} + workflow {limits.workflow} x {len(workflow)}: "
                f"{', '.join(workflow)}), but an account whose quota is concurrency.accountLimit="
                f"{limits.account_limit} lets functions reserve {room} (AWS keeps {lambda_quota.UNRESERVED_MINIMUM} "
                "unreserved): lower concurrency.api, concurrency.workflow or concurrency.sweep (0 = no reservation), "
                f"or raise the account's quota ({lambda_quota.QUOTA_CODE}, `nightbatch doctor` reads it) and set "
                "concurrency.accountLimit to it")
        for name, function in functions.items():
            if reserved[name]:
                cfn = function.node.default_child
                assert isinstance(cfn, lambda_.CfnFunction)
                cfn.reserved_concurrent_executions = reserved[name]

    def _outputs(self) -> None:
        cdk.CfnOutput(self, "ApiUrl", value=f"{self.api.url}v1", description="OpenAI base_url")
        cdk.CfnOutput(self, "ApiKeysSecret", value=self.api_keys.secret_arn,
                      description="aws secretsmanager get-secret-value --secret-id <this> --query SecretString")
        cdk.CfnOutput(self, "BucketName", value=self.storage.bucket.bucket_name)
        cdk.CfnOutput(self, "TableName", value=self.storage.table.table_name)
        cdk.CfnOutput(self, "StateMachineArn", value=self.orchestration.state_machine.state_machine_arn)
        for kind, queue in self.gpu.queues.items():
            cdk.CfnOutput(self, "SpotQueueArn" if kind == "spot" else "OnDemandQueueArn", value=queue.job_queue_arn)
        if self.endpoint_runner is not None:  # the doctor reads the runners' jobs there
            cdk.CfnOutput(self, "EndpointRunnerQueueArn", value=self.endpoint_runner.queue.job_queue_arn)
        if self.training_jobs is not None:  # the doctor reads these types' SageMaker quotas
            cdk.CfnOutput(self, "SageMakerInstanceTypes",
                          value=",".join(sorted(set(self.config.sagemaker_instance_types.values()))))
            # The doctor proves the others and says which to turn on (nightbatch/cli/doctor/sagemaker_fields.py).
            cdk.CfnOutput(self, SAGEMAKER_FIELDS_OUTPUT, value=",".join(self.config.sagemaker_fields.enabled) or "none",
                          description="unlisted CreateTrainingJob fields this deployment sends (cdk.json "
                                      "sagemakerFields)")
        cdk.CfnOutput(self, "TopicArn", value=self.notifications.topic.topic_arn)
        # The doctor checks the account's Lambda quota against it (before a deploy, from the synthesized template).
        cdk.CfnOutput(self, lambda_quota.STACK_OUTPUT, value=str(self.reserved_concurrency),
                      description="Lambda concurrency this stack reserves (its account keeps 100 more unreserved)")
        cdk.CfnOutput(self, "DashboardName", value=self.observability.dashboard.dashboard_name)
        users = self.config.user_buckets
        if users.read or users.write:  # the doctor names the entries every tenant shares
            cdk.CfnOutput(self, scope.STACK_OUTPUT, value=json.dumps({"read": users.read, "write": users.write}),
                          description="cdk.json userBuckets: where batches may read and write in users' buckets")

    def grant_model_weights(self, source: str) -> None:
        where = scope.parse_s3_uri(source, "source")
        bucket_name, prefix = where.bucket, where.key
        objects = f"arn:{self.partition}:s3:::{bucket_name}/{prefix}*"
        for role in self.worker_roles:
            role.add_to_principal_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[objects]))
            role.add_to_principal_policy(iam.PolicyStatement(
                actions=["s3:ListBucket"], resources=[f"arn:{self.partition}:s3:::{bucket_name}"],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            ))
        nag.acknowledge_iam5(self, f"Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}*",
                             "Model weights are read from the configured S3 prefix; the worker lists and reads "
                             "every object under it.")
