"""The one helper that builds every nightbatch Lambda: same bundle, runtime, arch, logging, active X-Ray tracing;
a role of its own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import aws_cdk as cdk
import constructs
import jsii
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.bundling import ARCHITECTURE, RUNTIME
from infra.limits import environment_problems


@jsii.implements(constructs.IValidation)
class _EnvironmentLimit:
    """Fails the synth when a function's environment could exceed Lambda's 4 KB once deployed."""

    def __init__(self, owner: LambdaFunction) -> None:
        self.owner = owner

    def validate(self) -> list[str]:
        variables = cdk.Stack.of(self.owner).resolve(self.owner.environment)
        return environment_problems(self.owner.node.path, variables)


class LambdaFunction(Construct):
    """A Lambda whose role holds no managed policy: it may write its own log group and nothing else until granted.

    Avoiding AWSLambdaBasicExecutionRole keeps every permission in the template and scoped (cdk-nag IAM4).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: lambda_.Code,
        handler: str,
        description: str,
        environment: Mapping[str, str],
        timeout: cdk.Duration,
        memory_mb: int = 1024,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, id)
        self.environment = dict(environment)
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention, removal_policy=cdk.RemovalPolicy.DESTROY
        )
        self.role = iam.Role(
            self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=description
        )
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[self.log_group.log_group_arn],
        ))
        self.function = lambda_.Function(
            self,
            "Function",
            code=code,
            handler=handler,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            description=description,
            environment=dict(environment),
            timeout=timeout,
            memory_size=memory_mb,
            role=self.role,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            # X-Ray: the API's invocation starts the trace, Step Functions carries it to the task Lambdas
            # (functions/tasks/tracing.py). CDK grants xray:PutTraceSegments/PutTelemetryRecords to the role.
            tracing=lambda_.Tracing.ACTIVE,
        )
        self.node.add_validation(_EnvironmentLimit(self))

    def add_environment(self, name: str, value: str) -> None:
        self.environment[name] = value
        self.function.add_environment(name, value)


@dataclass(frozen=True)
class LambdaBase:
    """What every Lambda of one stack shares: the code asset, the runtime environment and the log retention.

    The constructs that own Lambdas take one of these and add only what is theirs (handler, timeout, variables)."""

    code: lambda_.Code
    environment: Mapping[str, str]
    log_retention: logs.RetentionDays
    extra: Mapping[str, str] = field(default_factory=dict)

    def with_environment(self, variables: Mapping[str, str]) -> LambdaBase:
        """The same base with more variables for every function built from it."""
        return LambdaBase(self.code, self.environment, self.log_retention, {**self.extra, **variables})

    def function(self, scope: Construct, id: str, *, handler: str, description: str, timeout: cdk.Duration,
                 environment: Mapping[str, str] | None = None, memory_mb: int = 1024) -> LambdaFunction:
        return LambdaFunction(scope, id, code=self.code, handler=handler, description=description,
                              environment={**self.environment, **self.extra, **(environment or {})},
                              timeout=timeout, memory_mb=memory_mb, log_retention=self.log_retention)
