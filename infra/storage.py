"""Storage: the one data bucket and the one DynamoDB table (docs/ARCHITECTURE.md, decisions 1 and 11)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_s3 as s3
from constructs import Construct

from nightbatch.layout import BATCHES_PREFIX, FILES_PREFIX, OBJECT_EXPIRY_DAYS, UPLOADS_PREFIX

__all__ = ["BATCHES_PREFIX", "FILES_PREFIX", "OBJECT_EXPIRY_DAYS", "PREFIXES", "UPLOADS_PREFIX", "Storage"]

# Key prefixes the core writes under (nightbatch.layout); IAM grants are scoped to them.
PREFIXES = (FILES_PREFIX, BATCHES_PREFIX, UPLOADS_PREFIX)
# Model weights the GPU worker writes through from Hugging Face (gpu_worker/weight_cache.py); never expired.
MODELS_PREFIX = "models/"

# OBJECT_EXPIRY_DAYS (nightbatch.layout): files expire after 30 days by default (docs/ARCHITECTURE.md, decision 11);
# the extra day lets the TTL delete metadata first.
# Upload parts: an Upload lives an hour and its File is composed into files/ within minutes, so parts left
# after two days belong to abandoned Uploads (the sweeper deletes those sooner) and only cost storage.
UPLOADS_EXPIRY_DAYS = 2
EXPIRY_DAYS = {FILES_PREFIX: OBJECT_EXPIRY_DAYS, BATCHES_PREFIX: OBJECT_EXPIRY_DAYS,
               UPLOADS_PREFIX: UPLOADS_EXPIRY_DAYS}


class Storage(Construct):
    """Private, encrypted, TLS-only bucket with expiry lifecycle; on-demand table with PITR, TTL and two GSIs."""

    def __init__(self, scope: Construct, id: str, *, removal_policy: cdk.RemovalPolicy) -> None:
        super().__init__(scope, id)
        self.bucket = s3.Bucket(
            self,
            "Data",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=False,
            removal_policy=removal_policy,
            auto_delete_objects=False,
            lifecycle_rules=[
                *(
                    s3.LifecycleRule(
                        id=f"expire-{prefix.rstrip('/')}",
                        prefix=prefix,
                        expiration=cdk.Duration.days(EXPIRY_DAYS[prefix]),
                    )
                    for prefix in PREFIXES
                ),
                # The shard Map's result files (infra/orchestration.py MAP_RESULTS_PREFIX): diagnostics only.
                s3.LifecycleRule(id="expire-workflow-results", prefix="workflow-results/",
                                 expiration=cdk.Duration.days(OBJECT_EXPIRY_DAYS)),
                s3.LifecycleRule(
                    id="abort-incomplete-multipart",
                    abort_incomplete_multipart_upload_after=cdk.Duration.days(1),
                ),
            ],
        )
        self.table = dynamodb.TableV2(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            billing=dynamodb.Billing.on_demand(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute="ttl",
            removal_policy=removal_policy,
            global_secondary_indexes=[
                dynamodb.GlobalSecondaryIndexPropsV2(
                    index_name="by_owner",
                    partition_key=dynamodb.Attribute(name="owner", type=dynamodb.AttributeType.STRING),
                    sort_key=dynamodb.Attribute(name="owner_sk", type=dynamodb.AttributeType.STRING),
                ),
                # Sparse: only open batches carry `open_status`, so the sweeper reads just those.
                dynamodb.GlobalSecondaryIndexPropsV2(
                    index_name="by_status",
                    partition_key=dynamodb.Attribute(name="open_status", type=dynamodb.AttributeType.STRING),
                    sort_key=dynamodb.Attribute(name="created_sk", type=dynamodb.AttributeType.STRING),
                    projection_type=dynamodb.ProjectionType.KEYS_ONLY,
                ),
            ],
        )
        self.index_names = ("by_owner", "by_status")
