"""Orchestration: the per-batch Step Functions workflow, its task Lambdas, and the sweeper on a schedule."""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk
import constructs
import jsii
from aws_cdk import aws_batch as batch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.environment import settings_environment
from infra.lambdas import LambdaBase, LambdaFunction
from infra.limits import definition_problems
from infra.training_jobs import TrainingJobs
from nightbatch.pipeline.finalize import FINALIZE_ATTEMPTS
from nightbatch.settings import JobInputs

# Version of the task input/output documents; handlers accept the versions they know, so a deploy
# during running batches does not break executions started by the previous definition.
TASK_VERSION = 1
SWEEP_EVERY = cdk.Duration.minutes(5)
# Where the shard Map writes its iterations' results (Step Functions adds <map run id>/); expired by lifecycle.
MAP_RESULTS_PREFIX = "workflow-results"
# Where the workflow's log group lives (see the log group below).
VENDED_LOGS_PREFIX = "/aws/vendedlogs/states/"

# Entry points on the Lambda bundle, by workflow step.
TASK_HANDLERS: Mapping[str, str] = {
    "validate": "functions.tasks.validate.handler",
    "plan": "functions.tasks.plan.handler",
    "finalize": "functions.tasks.finalize.handler",
    "notify": "functions.tasks.notify.handler",
    "capacity": "functions.tasks.capacity.handler",
}
SWEEP_HANDLER = "functions.tasks.sweep.handler"
NOTIFY_RETRY_ATTEMPTS = 5
# Retries of a step's own failure (States.TaskFailed: an error its code raised, its Lambda timing out) where
# running it again is safe: every task Lambda is idempotent (Validate and Plan redo their work from the batch's
# status, Finalize writes conditionally from the expected status, Capacity decides again from the same input,
# Notify marks what it sent). The shard jobs are not retried in place: a failed job is Capacity's to judge.
# (attempts, interval seconds, backoff). Finalize counts the failures its data causes over its runs, and fails the
# batch at the last one (nightbatch/pipeline/finalize.py).
TASK_RETRIES: Mapping[str, tuple[int, int, float]] = {
    "validate": (2, 10, 3.0),
    "plan": (2, 10, 3.0),
    "capacity": (2, 2, 2.0),
    "finalize": (FINALIZE_ATTEMPTS - 1, 10, 3.0),
}
TASK_TIMEOUTS: Mapping[str, cdk.Duration] = {
    # Validate and Finalize stream whole files (up to 200 MB) through the function.
    "validate": cdk.Duration.minutes(15),
    "plan": cdk.Duration.minutes(5),
    "finalize": cdk.Duration.minutes(15),
    "notify": cdk.Duration.minutes(2),
    "capacity": cdk.Duration.minutes(1),
}


@jsii.implements(constructs.IValidation)
class _DefinitionLimit:
    """Fails the synth when the definition could exceed Step Functions' 1 MiB once deployed."""

    def __init__(self, machine: sfn.StateMachine) -> None:
        self.machine = machine

    def validate(self) -> list[str]:
        definition = cdk.Stack.of(self.machine).resolve(self.machine.node.default_child.definition_string)
        return definition_problems(self.machine.node.path, definition)


def _batch_job_task(scope: Construct, id: str, *, backend: str, job_definition: str,
                    fair_share: bool) -> sfn.CustomState:
    """One attempt as an AWS Batch job (`submitJob.sync`) on the queue Capacity chose, told its shard and where it
    runs. CustomState: CDK's BatchSubmitJob cannot pass ShareIdentifier / SchedulingPriorityOverride, which a
    fair-share queue requires (AWS Batch API Reference, SubmitJob: shareIdentifier)."""
    share = {"ShareIdentifier.$": "$.capacity.share",
             "SchedulingPriorityOverride.$": "$.capacity.priority"} if fair_share else {}
    task = sfn.CustomState(scope, id, state_json={
        "Type": "Task",
        "Resource": f"arn:{cdk.Aws.PARTITION}:states:::batch:submitJob.sync",
        "Parameters": {
            "JobName.$": "States.Format('{}-{}', $.batch_id, $.shard_id)",
            "JobQueue.$": "$.capacity.queue",
            "JobDefinition.$": job_definition,
            **share,
            "RetryStrategy.$": "$.capacity.retry_strategy",
            "ContainerOverrides": {"Environment": [
                {"Name": JobInputs.env_name("batch_id"), "Value.$": "$.batch_id"},
                {"Name": JobInputs.env_name("shard_id"), "Value.$": "$.shard_id"},
                {"Name": JobInputs.env_name("backend"), "Value": backend},
            ]},
        },
        # Keep the iteration's output small (CDK drops a null ResultPath from a CustomState).
        "ResultSelector": {"JobId.$": "$.JobId", "Status.$": "$.Status"},
        "ResultPath": "$.job",
    })
    # Transient Batch API errors (e.g. "Failed to create shareIdentifier") are retried in place.
    task.add_retry(errors=["Batch.ServerException", "Batch.AWSBatchException"], max_attempts=3,
                   interval=cdk.Duration.seconds(5), backoff_rate=2.0)
    return task


def _batch_ref() -> dict[str, object]:
    return {"version": TASK_VERSION, "batch_id": sfn.JsonPath.string_at("$.batch_id")}


class Orchestration(Construct):
    """Validate → Choice → Plan → Distributed Map (Batch SubmitJob.sync per shard) → Finalize → Notify."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        lambdas: LambdaBase,
        task_environment: Mapping[str, Mapping[str, str]],
        sweeper_environment: Mapping[str, str],
        bucket: s3.IBucket,
        job_queues: list[batch.IJobQueue],
        execution_timeout: cdk.Duration,
        use_batch: bool = True,
        training_jobs: TrainingJobs | None = None,
        use_endpoint: bool = False,
    ) -> None:
        super().__init__(scope, id)
        self.tasks: dict[str, LambdaFunction] = {
            name: lambdas.function(
                self, f"{name.capitalize()}Function", handler=handler, description=f"nightbatch workflow: {name}",
                environment=task_environment.get(name, {}), timeout=TASK_TIMEOUTS[name],
            )
            for name, handler in TASK_HANDLERS.items()
        }

        def invoke(name: str, **kwargs: object) -> tasks.LambdaInvoke:
            # retry_on_service_exceptions (default on) retries Lambda service errors (docs/ARCHITECTURE.md,
            # decision 3).
            return tasks.LambdaInvoke(
                self, name.capitalize(), lambda_function=self.tasks[name].function,
                payload=sfn.TaskInput.from_object(_batch_ref()), **kwargs,
            )

        validate = invoke("validate", result_selector={"valid.$": "$.Payload.valid"}, result_path="$.validation")
        plan = invoke("plan", result_selector={
            "manifest_key.$": "$.Payload.manifest_key", "shard_count.$": "$.Payload.shard_count",
            "max_concurrency.$": "$.Payload.max_concurrency",
        }, result_path="$.plan")
        finalize = invoke("finalize", result_path=sfn.JsonPath.DISCARD)
        notify = invoke("notify", result_path=sfn.JsonPath.DISCARD)

        # Per shard: Capacity decides the queue (Spot first, on-demand when the batch's slack runs out or Spot fails
        # it), priority (earliest deadline first) and share (tenant); RunShard submits the model's job there. A
        # failed attempt goes back to Capacity, which moves it, retries it with backoff, or gives it up: then
        # Finalize finds no done marker and writes its unrun lines as `shard_failed`, so the iteration succeeds.
        fields = ("batch_id", "shard_id", "job_definition", "backend", "fallback", "gpu_fallback", "est_tokens",
                  "capacity", "shard_error")
        new_shard = sfn.Pass(self, "NewShard", parameters={
            "version": 1, **{f"{f}.$": f"$.{f}" for f in fields[:-2]}, "capacity": {}, "shard_error": {}})
        capacity = tasks.LambdaInvoke(
            self, "Capacity", lambda_function=self.tasks["capacity"].function,
            payload=sfn.TaskInput.from_object({"version": 1, **{f"{f}.$": f"$.{f}" for f in fields}}),
            payload_response_only=True, result_path="$.capacity",
        )
        # A caught failure's Cause is the whole Batch job description (kilobytes): the given-up iteration keeps
        # only the shard id and Capacity's decision, so its result stays bounded whatever the number of shards.
        given_up = sfn.Pass(self, "ShardGivenUp", parameters={
            "shard_id": sfn.JsonPath.string_at("$.shard_id"),
            "capacity": sfn.JsonPath.object_at("$.capacity"),
        })
        wait = sfn.Wait(self, "Backoff", time=sfn.WaitTime.seconds_path("$.capacity.wait_seconds"))
        # A GPU attempt: the model's job definition (GPUs, memory, shared memory), named by Plan in the manifest item.
        run_shard = _batch_job_task(self, "RunShard", backend="batch", job_definition="$.job_definition",
                                    fair_share=True)
        if use_batch:  # else it stays out of the graph (a catch would bind it): a SageMaker-only stack
            run_shard.add_catch(capacity, errors=["States.ALL"], result_path="$.shard_error")
        # The other backends, Capacity naming each attempt's: SageMaker (infra/training_jobs.py) and the endpoint
        # runner (infra/endpoint_runner.py).
        others: dict[str, sfn.CustomState] = {}
        if training_jobs is not None:
            others["sagemaker"] = training_jobs.task(self, "RunShardSageMaker", bucket_name=bucket.bucket_name)
        if use_endpoint:
            # The runner's job on its Fargate queue, both named by Capacity; first come, first served (the server's
            # admission paces it), so no share or priority.
            others["endpoint"] = _batch_job_task(self, "RunShardEndpoint", backend="endpoint",
                                                 job_definition="$.capacity.job_definition", fair_share=False)
        for task in others.values():
            task.add_catch(capacity, errors=["States.ALL"], result_path="$.shard_error")
        run: sfn.IChainable = run_shard
        if others and not use_batch and len(others) == 1:
            run = next(iter(others.values()))
        elif others:
            choice = sfn.Choice(self, "Backend")
            for name, task in others.items():
                choice.when(sfn.Condition.string_equals("$.capacity.backend", name), task)
            run = choice.otherwise(run_shard if use_batch else next(iter(others.values())))
        # Capacity failing past its retries gives the shard up (its lines end `shard_failed` in Finalize) rather
        # than failing the iteration: the Map tolerates no failed iteration, and a failed Map Run would stop every
        # other running shard and its job.
        capacity.add_catch(given_up, errors=["States.ALL"], result_path="$.capacity_error")
        capacity.next(sfn.Choice(self, "RunOrGiveUp")
                      .when(sfn.Condition.string_equals("$.capacity.action", "give_up"), given_up)
                      .otherwise(wait.next(run)))
        self._job_queues = job_queues

        shards = sfn.DistributedMap(
            self, "Shards",
            # A JSON array manifest: S3JsonItemReader (moto's interpreter rejects JSONL manifests).
            item_reader=sfn.S3JsonItemReader(bucket=bucket, key=sfn.JsonPath.string_at("$.plan.manifest_key")),
            # Plan's: maxGpus, or less for a model whose SageMaker quota is lower (`sagemakerMaxJobs`).
            max_concurrency_path="$.plan.max_concurrency",
            map_execution_type=sfn.StateMachineType.STANDARD,
            # The iterations' results go to S3, never into the state: a Distributed Map's output otherwise holds
            # every child's result and, past 256 KiB, fails the execution with States.DataLimitExceeded (which
            # no Catch can catch) before Finalize. ResultPath alone does not prevent it.
            result_writer_v2=sfn.ResultWriterV2(bucket=bucket, prefix=MAP_RESULTS_PREFIX),
            result_path=sfn.JsonPath.DISCARD,
        )
        shards.item_processor(new_shard.next(capacity))

        for name, state in (("validate", validate), ("plan", plan), ("capacity", capacity), ("finalize", finalize)):
            attempts, interval, backoff = TASK_RETRIES[name]
            state.add_retry(errors=["States.TaskFailed"], max_attempts=attempts,
                            interval=cdk.Duration.seconds(interval), backoff_rate=backoff)
        # Notify is idempotent (each channel marks what it sent), so any failure of its own — an SES throttle, an
        # SQS send — is retried with backoff for about a quarter of an hour; after that the sweeper re-drives the
        # event, which stays open until every channel is done (nightbatch.pipeline.sweep).
        notify.add_retry(errors=["States.TaskFailed"], max_attempts=NOTIFY_RETRY_ATTEMPTS,
                         interval=cdk.Duration.seconds(30), backoff_rate=2.0, max_delay=cdk.Duration.minutes(5))
        # Finalize always runs: any unexpected failure before it is caught into it.
        for state in (validate, plan, shards):
            state.add_catch(finalize, errors=["States.ALL"], result_path="$.error")
        # Past their retries, Finalize and Notify end the execution with a failure that says who takes over.
        finalize.add_catch(sfn.Fail(
            self, "FinalizeFailed", error="FinalizeFailed",
            cause="Finalize failed after its retries (its Lambda's log says why): the batch stays finalizing until "
                  "the sweeper finalizes it, once its completion window has passed"), errors=["States.ALL"],
            result_path="$.error")
        notify.add_catch(sfn.Fail(
            self, "NotifyFailed", error="NotifyFailed",
            cause="Notify failed after its retries (its Lambda's log says why): the sweeper notifies the batch's "
                  "still-open event again until every channel is done"), errors=["States.ALL"], result_path="$.error")

        definition = validate.next(
            sfn.Choice(self, "IsValid")
            .when(sfn.Condition.boolean_equals("$.validation.valid", True), plan.next(shards).next(finalize)
                  .next(notify))
            .otherwise(notify)
        )
        # Under /aws/vendedlogs/: Step Functions delivers its logs through CloudWatch Logs' vended delivery, which
        # otherwise adds the group to the account's one logs resource policy (5,120 characters, shared with every
        # other vended source); past that limit the state machine cannot be created. The prefix needs no policy.
        self.log_group = logs.LogGroup(self, "WorkflowLogs", retention=lambdas.log_retention,
                                       log_group_name=f"{VENDED_LOGS_PREFIX}{cdk.Stack.of(self).stack_name}-workflow",
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

        self.node.add_validation(_DefinitionLimit(self.state_machine))

        self.sweeper = lambdas.function(
            self, "Sweeper", handler=SWEEP_HANDLER,
            description="nightbatch sweeper: re-drives stuck batches, finalizes abandoned ones, cancels their "
                        "queued jobs, emits gauges",
            environment={**sweeper_environment,
                         **settings_environment({"state_machine_arn": self.state_machine.state_machine_arn,
                                                 "notify_function": self.tasks["notify"].function.function_name})},
            # It finalizes abandoned batches inline (finalize_batch), so it gets Finalize's time.
            timeout=TASK_TIMEOUTS["finalize"],
        )
        self.schedule = events.Rule(
            self, "SweepSchedule", schedule=events.Schedule.rate(SWEEP_EVERY),
            targets=[targets.LambdaFunction(self.sweeper.function, retry_attempts=0,
                                            event=events.RuleTargetInput.from_object({"version": TASK_VERSION}))],
        )
        self.state_machine.grant_start_execution(self.sweeper.role)
        if training_jobs is not None:
            training_jobs.grant_run(self.state_machine)
        if use_batch or use_endpoint:
            self._grant_batch()
        self.tasks["notify"].function.grant_invoke(self.sweeper.role)

    def _grant_batch(self) -> None:
        # What `batch:submitJob.sync` needs (Step Functions' IAM guide for AWS Batch; the CustomState grants
        # nothing itself): SubmitJob, DescribeJobs to follow the job, TerminateJob to end it when the execution
        # is stopped or the Map cancels the iteration (without it the job runs on, billed), and the managed rule.
        stack = cdk.Stack.of(self)
        self.state_machine.add_to_role_policy(iam.PolicyStatement(actions=["batch:SubmitJob"], resources=[
            stack.format_arn(service="batch", resource="job-definition", resource_name="*"),
            *(q.job_queue_arn for q in self._job_queues)]))
        # DescribeJobs takes no resource-level permission; job ids are Batch's, minted at submit time.
        self.state_machine.add_to_role_policy(iam.PolicyStatement(actions=["batch:DescribeJobs"], resources=["*"]))
        self.state_machine.add_to_role_policy(iam.PolicyStatement(actions=["batch:TerminateJob"], resources=[
            stack.format_arn(service="batch", resource="job", resource_name="*")]))
        self.state_machine.add_to_role_policy(iam.PolicyStatement(
            actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
            resources=[stack.format_arn(service="events", resource="rule",
                                        resource_name="StepFunctionsGetEventsForBatchJobsRule")]))
