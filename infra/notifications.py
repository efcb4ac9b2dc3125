"""Notifications: the SNS topic (batch events and operator alarms), webhook delivery queues, SES sending setup."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_ses as ses
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.lambdas import LambdaBase, LambdaFunction

DELIVER_HANDLER = "functions.tasks.deliver.handler"
# Messages per invocation; each is one POST bounded by NIGHTBATCH_WEBHOOK_TIMEOUT_SECONDS (10 s by default),
# attempted one after the other, so the batch must fit the function's timeout.
DELIVER_BATCH_SIZE = 10
DELIVER_TIMEOUT = cdk.Duration.minutes(2)
# Scheduled retries are new messages (sent with a delay by the consumer), so the visibility timeout only governs
# a message whose invocation crashed or timed out; AWS's advice for a Lambda event source: at least six times
# the function's timeout.
WEBHOOK_VISIBILITY = cdk.Duration.minutes(DELIVER_TIMEOUT.to_minutes() * 6)
WEBHOOK_MAX_RECEIVES = 8


class Notifications(Construct):
    """SNS topic encrypted with its own key, SQS webhook queue + DLQ (+ its consumer, `add_deliverer`), optional
    SES identity + configuration set."""

    def __init__(self, scope: Construct, id: str, *, sender_email: str, alarm_email: str,
                 sender_identity: str = "", create_sender_identity: bool = False) -> None:
        super().__init__(scope, id)
        # A customer managed key, because CloudWatch alarms cannot publish to a topic under aws/sns.
        self.key = kms.Key(
            self, "TopicKey", enable_key_rotation=True, description="nightbatch notification topic",
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey")
        self.topic = sns.Topic(self, "Topic", master_key=self.key, enforce_ssl=True)
        if alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))

        self.webhook_dlq = sqs.Queue(
            self, "WebhookDlq", encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
            retention_period=cdk.Duration.days(14),
        )
        self.webhook_queue = sqs.Queue(
            self,
            "WebhookQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=WEBHOOK_VISIBILITY,
            retention_period=cdk.Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.webhook_dlq, max_receive_count=WEBHOOK_MAX_RECEIVES),
        )

        self.configuration_set: ses.ConfigurationSet | None = None
        # Created only on request: an identity is one per account and region, so a second stage (or an address
        # verified by hand) would fail its deploy with AlreadyExists. By default the stack sends through the
        # existing identity by name.
        self.email_identity: ses.EmailIdentity | None = None
        self.sender_email = sender_email
        self.sender_identity = sender_identity or sender_email
        if sender_email:
            # Named by CloudFormation (unique per stack), so stages sharing a sender deploy side by side.
            self.configuration_set = ses.ConfigurationSet(
                self, "EmailConfig", reputation_metrics=True,
                suppression_reasons=ses.SuppressionReasons.BOUNCES_AND_COMPLAINTS,
            )
            if create_sender_identity:
                # An address: SES mails a verification link after deploy; a domain: publish its DKIM records.
                identity = (ses.Identity.email(self.sender_identity) if "@" in self.sender_identity
                            else ses.Identity.domain(self.sender_identity))
                self.email_identity = ses.EmailIdentity(
                    self, "Sender", identity=identity, configuration_set=self.configuration_set
                )

    def add_deliverer(self, *, lambdas: LambdaBase) -> LambdaFunction:
        """The webhook queue's consumer: one attempt per message; it re-queues retries on the same queue.

        It reports batch item failures, so only the messages whose attempt crashed are redelivered (and counted
        towards the DLQ), never the others of their batch."""
        deliverer = lambdas.function(
            self, "Deliver", handler=DELIVER_HANDLER,
            description="nightbatch notifications: delivers queued webhook events, re-queues retries",
            timeout=DELIVER_TIMEOUT,
        )
        deliverer.function.add_event_source(event_sources.SqsEventSource(
            self.webhook_queue, batch_size=DELIVER_BATCH_SIZE, report_batch_item_failures=True,
        ))
        self.webhook_queue.grant_send_messages(deliverer.role)
        return deliverer

    def grant_send_email(self, grantee: iam.IGrantable) -> None:
        if self.configuration_set is None:
            return
        stack = cdk.Stack.of(self)
        config_set_arn = stack.format_arn(
            service="ses", resource="configuration-set",
            resource_name=self.configuration_set.configuration_set_name,
        )
        # SES authorizes against the identity it sends through: the address's own when it is verified, else
        # its domain's. Both are named, so either setup works.
        identities = dict.fromkeys([self.sender_identity, self.sender_email])
        identity_arns = [stack.format_arn(service="ses", resource="identity", resource_name=name)
                         for name in identities]
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["ses:SendEmail", "ses:SendRawEmail"], resources=[*identity_arns, config_set_arn],
        ))
