"""Observability: the CloudWatch dashboard and the alarms (to the SNS topic) over native and EMF metrics."""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

# Custom metrics the core emits as CloudWatch EMF (namespace, name -> (dimension name, emitter, meaning)).
NAMESPACE = "nightbatch"
PERIOD = cdk.Duration.minutes(5)
OPEN_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL_STATUSES = ("completed", "failed", "expired", "cancelled")
JOB_STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
EMF_METRICS: Mapping[str, tuple[str | None, str, str]] = {
    "BatchesOpen": ("Status", "sweep", "gauge: open batches per status, every sweep"),
    "OldestBatchAgeSeconds": ("Status", "sweep", "gauge: seconds the oldest batch has been in a status"),
    "BatchesFinished": ("Status", "finalize/validate", "count: batches reaching a terminal status"),
    "RequestsCompleted": (None, "worker", "count: requests answered, per checkpoint"),
    "RequestsFailed": (None, "worker", "count: requests that became error lines, per checkpoint"),
    "PromptTokens": (None, "worker", "count: prompt tokens, per checkpoint"),
    "CompletionTokens": (None, "worker", "count: completion tokens, per checkpoint"),
    "ShardDurationSeconds": (None, "worker", "value: wall time of one shard run, at its end"),
    "ShardAttempt": (None, "worker", "value: 1-based attempt number of the shard run starting now"),
    "WeightsReadySeconds": ("WeightsSource", "worker", "value: container start -> weights ready, per attempt"),
    "EngineReadySeconds": ("WeightsSource", "worker", "value: container start -> engine ready, per attempt"),
    "FirstResultSeconds": ("WeightsSource", "worker", "value: container start -> first result, per attempt"),
    "QueueJobs": ("JobStatus", "sweep", "gauge: jobs in the Batch queue per status"),
    "OldestRunnableJobAgeSeconds": (None, "sweep", "gauge: seconds the oldest RUNNABLE job has waited"),
    "GpuInstancesRunning": (None, "sweep", "gauge: GPU instances in the compute environments"),
}


def emf_metric(name: str, *, statistic: str, dimension_value: str | None = None,
               label: str | None = None) -> cloudwatch.Metric:
    dimension = EMF_METRICS[name][0]
    if (dimension is None) != (dimension_value is None):
        raise ValueError(f"metric {name} takes dimension {dimension!r}")
    return cloudwatch.Metric(
        namespace=NAMESPACE, metric_name=name, statistic=statistic, period=PERIOD, label=label,
        dimensions_map={dimension: dimension_value} if dimension and dimension_value else None,
    )


class Observability(Construct):
    """One dashboard for operators, and alarms that reach the notification topic before users notice."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        topic: sns.ITopic,
        http_api: apigwv2.HttpApi,
        functions: Mapping[str, lambda_.IFunction],
        state_machine: sfn.IStateMachine,
        dead_letter_queues: Mapping[str, sqs.IQueue],
        stuck_batch_minutes: int,
        runnable_minutes: int,
        shard_attempts: int,
    ) -> None:
        super().__init__(scope, id)
        action = actions.SnsAction(topic)
        self.alarms: dict[str, cloudwatch.Alarm] = {}

        def alarm(name: str, metric: cloudwatch.IMetric, threshold: float, description: str,
                  comparison: cloudwatch.ComparisonOperator = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                  ) -> None:
            created = cloudwatch.Alarm(
                self, name, metric=metric, threshold=threshold, evaluation_periods=1, datapoints_to_alarm=1,
                comparison_operator=comparison, alarm_description=description,
                # Gauges are only emitted while there is something to report: silence is healthy.
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            created.add_alarm_action(action)
            self.alarms[name] = created

        for status in ("validating", "finalizing"):
            alarm(f"Stuck{status.capitalize()}",
                  emf_metric("OldestBatchAgeSeconds", statistic="Maximum", dimension_value=status),
                  stuck_batch_minutes * 60, f"A batch has been {status} for more than {stuck_batch_minutes} min.")
        alarm("JobsRunnableTooLong", emf_metric("OldestRunnableJobAgeSeconds", statistic="Maximum"),
              runnable_minutes * 60,
              f"A GPU job has waited RUNNABLE for more than {runnable_minutes} min (no capacity or GPU quota?).")
        alarm("ShardRetried", emf_metric("ShardAttempt", statistic="Maximum"), shard_attempts,
              f"A shard started its attempt number > {shard_attempts}.")
        for name, dlq in dead_letter_queues.items():
            alarm(f"{name}DlqNotEmpty", dlq.metric_approximate_number_of_messages_visible(
                period=PERIOD, statistic="Maximum"), 0, f"{name} messages gave up retrying; they wait in the DLQ.")
        failed_executions = cloudwatch.MathExpression(
            expression="failed + timedout + aborted", period=PERIOD, label="failed executions",
            using_metrics={
                "failed": state_machine.metric_failed(period=PERIOD, statistic="Sum"),
                "timedout": state_machine.metric_timed_out(period=PERIOD, statistic="Sum"),
                "aborted": state_machine.metric_aborted(period=PERIOD, statistic="Sum"),
            },
        )
        alarm("WorkflowFailed", failed_executions, 0, "A batch workflow execution failed, timed out or aborted.")
        for name, function in functions.items():
            alarm(f"{name.title().replace('_', '')}Errors", function.metric_errors(period=PERIOD, statistic="Sum"), 0,
                  f"The {name} Lambda raised errors.")

        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=cdk.Duration.hours(24))
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Open batches by status", width=12,
                left=[emf_metric("BatchesOpen", statistic="Maximum", dimension_value=s, label=s)
                      for s in OPEN_STATUSES],
            ),
            cloudwatch.GraphWidget(
                title="Finished batches by status", width=12,
                left=[emf_metric("BatchesFinished", statistic="Sum", dimension_value=s, label=s)
                      for s in TERMINAL_STATUSES],
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Requests per second", width=8, left=[
                _per_second(emf_metric("RequestsCompleted", statistic="Sum"), "completed/s", "rc"),
                _per_second(emf_metric("RequestsFailed", statistic="Sum"), "failed/s", "rf"),
            ]),
            cloudwatch.GraphWidget(title="Tokens per second", width=8, left=[
                _per_second(emf_metric("CompletionTokens", statistic="Sum"), "completion tokens/s", "ct"),
                _per_second(emf_metric("PromptTokens", statistic="Sum"), "prompt tokens/s", "pt"),
            ]),
            cloudwatch.GraphWidget(title="Shard duration (s)", width=8, left=[
                emf_metric("ShardDurationSeconds", statistic=s, label=s) for s in ("Average", "p90", "Maximum")
            ]),
        )
        # Cold start by phase and by where the weights came from (gpu_worker/weight_cache.py sources).
        self.dashboard.add_widgets(cloudwatch.GraphWidget(title="Cold start p90 (s from container start)", width=24,
                                                          left=[
            emf_metric(name, statistic="p90", dimension_value=source, label=f"{name[:-7]} ({source})")
            for name in ("WeightsReadySeconds", "EngineReadySeconds", "FirstResultSeconds")
            for source in ("hub", "s3-cache", "nvme-cache")
        ]))
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="GPU instances running", width=8,
                                   left=[emf_metric("GpuInstancesRunning", statistic="Maximum")]),
            cloudwatch.GraphWidget(title="Batch queue depth", width=8, left=[
                emf_metric("QueueJobs", statistic="Maximum", dimension_value=s, label=s) for s in JOB_STATUSES
            ]),
            cloudwatch.GraphWidget(title="Workflow executions", width=8, left=[
                state_machine.metric_started(period=PERIOD, statistic="Sum", label="started"),
                state_machine.metric_succeeded(period=PERIOD, statistic="Sum", label="succeeded"),
                failed_executions,
            ]),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Lambda errors", width=8, left=[
                f.metric_errors(period=PERIOD, statistic="Sum", label=n) for n, f in functions.items()
            ]),
            cloudwatch.GraphWidget(title="Lambda duration p90 (ms)", width=8, left=[
                f.metric_duration(period=PERIOD, statistic="p90", label=n) for n, f in functions.items()
            ]),
            cloudwatch.GraphWidget(title="API requests and 5xx", width=8, left=[
                http_api.metric_count(period=PERIOD, statistic="Sum", label="requests"),
                http_api.metric_server_error(period=PERIOD, statistic="Sum", label="5xx"),
            ], right=[dlq.metric_approximate_number_of_messages_visible(
                period=PERIOD, statistic="Maximum", label=f"{name} DLQ") for name, dlq in dead_letter_queues.items()]),
        )
        self.dashboard.add_widgets(cloudwatch.AlarmStatusWidget(
            title="Alarms", width=24, alarms=list(self.alarms.values()),
        ))


def _per_second(metric: cloudwatch.Metric, label: str, key: str) -> cloudwatch.MathExpression:
    return cloudwatch.MathExpression(expression=f"{key} / PERIOD({key})", using_metrics={key: metric},
                                     label=label, period=PERIOD)
