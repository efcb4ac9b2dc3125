"""Api: the HTTP API (API Gateway v2) in front of the FastAPI Lambda, with access logs and throttling."""

from __future__ import annotations

import json

import aws_cdk as cdk
import jsii
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.lambdas import LambdaBase

API_HANDLER = "functions.api.handler.handler"
# API Gateway's integration timeout is 30 s (hard); the function must answer before it.
API_TIMEOUT = cdk.Duration.seconds(29)

_ACCESS_LOG_FORMAT = json.dumps({
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "requestTime": "$context.requestTime",
    "method": "$context.httpMethod",
    "path": "$context.path",
    "status": "$context.status",
    "protocol": "$context.protocol",
    "responseLength": "$context.responseLength",
    "latencyMs": "$context.responseLatency",
    "integrationLatencyMs": "$context.integrationLatency",
    "integrationError": "$context.integrationErrorMessage",
})


@jsii.implements(apigwv2.IAccessLogSettings)
class _AccessLogs:
    def __init__(self, log_group: logs.ILogGroup) -> None:
        self._destination = apigwv2.LogGroupLogDestination(log_group)

    @property
    def destination(self) -> apigwv2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigateway.AccessLogFormat:
        return apigateway.AccessLogFormat.custom(_ACCESS_LOG_FORMAT)


class Api(Construct):
    """HTTP API `$default` stage → API Lambda (payload v2, which Mangum reads); payload limits in docs/DEPLOY.md."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        lambdas: LambdaBase,
        memory_mb: int,
        rate_limit: int,
        burst_limit: int,
    ) -> None:
        super().__init__(scope, id)
        self.handler = lambdas.function(
            self, "Handler", handler=API_HANDLER, description="nightbatch OpenAI-compatible API (FastAPI via Mangum)",
            timeout=API_TIMEOUT, memory_mb=memory_mb,
        )
        self.http_api = apigwv2.HttpApi(
            self, "HttpApi",
            description="nightbatch: OpenAI-compatible Batch API",
            create_default_stage=False,
            default_integration=integrations.HttpLambdaIntegration(
                "Lambda", self.handler.function, payload_format_version=apigwv2.PayloadFormatVersion.VERSION_2_0,
            ),
        )
        self.access_logs = logs.LogGroup(self, "AccessLogs", retention=lambdas.log_retention,
                                         removal_policy=cdk.RemovalPolicy.DESTROY)
        self.stage = apigwv2.HttpStage(
            self, "DefaultStage",
            http_api=self.http_api,
            stage_name="$default",
            auto_deploy=True,
            access_log_settings=_AccessLogs(self.access_logs),
            throttle=apigwv2.ThrottleSettings(rate_limit=rate_limit, burst_limit=burst_limit),
            detailed_metrics_enabled=True,
        )

    @property
    def url(self) -> str:
        return self.stage.url
