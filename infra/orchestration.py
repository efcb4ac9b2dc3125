"""Orchestration: the per-batch Step Functions workflow, its task Lambdas, and the sweeper on a schedule."""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk
from aws_cdk import aws_batch as batch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.environment import settings_environment
from infra.lambdas import LambdaFunction

# Version of the task input/output documents; handlers accept the versions they know, so a deploy
# during running batches does not break executions started by the previous definition.
TASK_VERSION = 1
SWEEP_EVERY = cdk.Duration.minutes(5)

# Entry points on the Lambda bundle, by workflow step.
TASK_HANDLERS: Mapping[str, str] = {
    "validate": "functions.tasks.validate.handler",
    "plan": "functions.tasks.plan.handler",
    "finalize": "functions.tasks.finalize.handler",
    "notify": "functions.tasks.notify.handler",
}
SWEEP_HANDLER = "functions.tasks.sweep.handler"
TASK_TIMEOUTS: Mapping[str, cdk.Duration] = {
    # Validate and Finalize stream whole files (up to 200 MB) through the function.
    "validate": cdk.Duration.minutes(15),
    "plan": cdk.Duration.minutes(5),
    "finalize": cdk.Duration.minutes(15),
    "notify": cdk.Duration.minutes(2),
}


def _batch_ref() -> dict[str, object]:
    return {"version": TASK_VERSION, "batch_id": sfn.JsonPath.string_at("$.batch_id")}


class Orchestration(Construct):
    """Validate → Choice → Plan → Distributed Map (Batch SubmitJob.sync per shard) → Finalize → Notify."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: lambda_.Code,
        environment: Mapping[str, str],
        task_environment: Mapping[str, Mapping[str, str]],
        sweeper_environment: Mapping[str, str],
        bucket: s3.IBucket,
        job_queue: batch.IJobQueue,
        max_concurrency: int,
        shard_retry_attempts: int,
        shard_retry_interval: cdk.Duration,
        shard_retry_backoff: float,
        execution_timeout: cdk.Duration,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, id)
        self.tasks: dict[str, LambdaFunction] = {
            name: LambdaFunction(
                self, f"{name.capitalize()}Function", code=code, handler=handler,
                description=f"nightbatch workflow: {name}",
                environment={**environment, **task_environment.get(name, {})}, timeout=TASK_TIMEOUTS[name],
                log_retention=log_retention,
            )
            for name, handler in TASK_HANDLERS.items()
        }

        def invoke(name: str, **kwargs: object) -> tasks.LambdaInvoke:
            # retry_on_service_exceptions (default on) retries Lambda service errors: decision 3.
            return tasks.LambdaInvoke(
                self, name.capitalize(), lambda_function=self.tasks[name].function,
                payload=sfn.TaskInput.from_object(_batch_ref()), **kwargs,
            )

        validate = invoke("validate", result_selector={"valid.$": "$.Payload.valid"}, result_path="$.validation")
        plan = invoke("plan", result_selector={
            "manifest_key.$": "$.Payload.manifest_key", "shard_count.$": "$.Payload.shard_count",
        }, result_path="$.plan")
        finalize = invoke("finalize", result_path=sfn.JsonPath.DISCARD)
        notify = invoke("notify", result_path=sfn.JsonPath.DISCARD)

        run_shard = tasks.BatchSubmitJob(
            self, "RunShard",
            job_name=sfn.JsonPath.format("{}-{}", sfn.JsonPath.string_at("$.batch_id"),
                                         sfn.JsonPath.string_at("$.shard_id")),
            job_queue_arn=job_queue.job_queue_arn,
            # The model's job definition (GPUs, memory, shared memory), named by Plan in the shard's manifest item.
            job_definition_arn=sfn.JsonPath.string_at("$.job_definition"),
            container_overrides=tasks.BatchContainerOverrides(environment={
                "NIGHTBATCH_BATCH_ID": sfn.JsonPath.string_at("$.batch_id"),
                "NIGHTBATCH_SHARD_ID": sfn.JsonPath.string_at("$.shard_id"),
            }),
            integration_pattern=sfn.IntegrationPattern.RUN_JOB,
            result_path=sfn.JsonPath.DISCARD,
        )
        # Second retry layer; after it the shard is given up: Finalize finds no done marker for it and writes
        # its unrun lines as `shard_failed`, so the iteration must succeed rather than fail the workflow.
        run_shard.add_retry(errors=["States.TaskFailed"], max_attempts=shard_retry_attempts,
                            interval=shard_retry_interval, backoff_rate=shard_retry_backoff)
        run_shard.add_catch(sfn.Pass(self, "ShardGivenUp"), errors=["States.ALL"], result_path="$.shard_error")

        shards = sfn.DistributedMap(
            self, "Shards",
            # A JSON array manifest: S3JsonItemReader (moto's interpreter rejects JSONL manifests).
            item_reader=sfn.S3JsonItemReader(bucket=bucket, key=sfn.JsonPath.string_at("$.plan.manifest_key")),
            max_concurrency=max_concurrency,
            map_execution_type=sfn.StateMachineType.STANDARD,
            result_path=sfn.JsonPath.DISCARD,
        )
        shards.item_processor(run_shard)

        # Finalize is idempotent (conditional writes from the expected status), so a transient failure of its
        # own is retried rather than leaving the batch open for the sweeper.
        finalize.add_retry(errors=["States.TaskFailed"], max_attempts=2, interval=cdk.Duration.seconds(10),
                           backoff_rate=3.0)
        # Finalize always runs: any unexpected failure before it is caught into it.
        for state in (validate, plan, shards):
            state.add_catch(finalize, errors=["States.ALL"], result_path="$.error")

        definition = validate.next(
            sfn.Choice(self, "IsValid")
            .when(sfn.Condition.boolean_equals("$.validation.valid", True), plan.next(shards).next(finalize)
                  .next(notify))
            .otherwise(notify)
        )
        self.log_group = logs.LogGroup(self, "WorkflowLogs", retention=log_retention,
                                       removal_policy=cdk.RemovalPolicy.DESTROY)
        self.state_machine = sfn.StateMachine(
            self, "Workflow",
            comment="nightbatch: one execution per batch, named after the batch id",
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            state_machine_type=sfn.StateMachineType.STANDARD,
            timeout=execution_timeout,
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
        )

        self.sweeper = LambdaFunction(
            self, "Sweeper", code=code, handler=SWEEP_HANDLER,
            description="nightbatch sweeper: re-drives stuck batches, finalizes abandoned ones, cancels their "
                        "queued jobs, emits gauges",
            environment={**environment, **sweeper_environment,
                         **settings_environment({"state_machine_arn": self.state_machine.state_machine_arn})},
            # It finalizes abandoned batches inline (finalize_batch), so it gets Finalize's time.
            timeout=TASK_TIMEOUTS["finalize"], log_retention=log_retention,
        )
        self.schedule = events.Rule(
            self, "SweepSchedule", schedule=events.Schedule.rate(SWEEP_EVERY),
            targets=[targets.LambdaFunction(self.sweeper.function, retry_attempts=0,
                                            event=events.RuleTargetInput.from_object({"version": TASK_VERSION}))],
        )
        self.state_machine.grant_start_execution(self.sweeper.role)
