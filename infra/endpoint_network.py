"""cdk.json `endpointNetwork`: the operator's VPC the endpoint runners run in (infra/endpoint_runner.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class EndpointNetwork(BaseModel):
    """Where the runners of endpoint models run (an AWS Batch Fargate compute environment): the operator's VPC from
    which the endpoints are reachable. Its subnets need a way to S3, DynamoDB, Secrets Manager, ECR and CloudWatch
    Logs: a NAT gateway, VPC endpoints, or public subnets with `assignPublicIp`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    vpc_id: str = Field(alias="vpcId", pattern=r"^vpc-[0-9a-f]{8,17}$")
    subnet_ids: tuple[str, ...] = Field(alias="subnetIds", min_length=1)
    # Security groups the runners run in; empty: one the stack creates in the VPC, all egress, no ingress.
    security_group_ids: tuple[str, ...] = Field((), alias="securityGroupIds")
    assign_public_ip: bool = Field(False, alias="assignPublicIp")
    # Runners at once (each 0.5 vCPU): the Fargate compute environment's cap.
    max_vcpus: int = Field(16, alias="maxVcpus", ge=1, le=4096)

    @field_validator("subnet_ids", "security_group_ids")
    @classmethod
    def _ids(cls, ids: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        prefix, kind = {"subnet_ids": ("subnet-", "subnet"), "security_group_ids": ("sg-", "security group")}[
            str(info.field_name)]
        bad = [i for i in ids if not i.startswith(prefix)]
        if bad:
            raise ValueError(f"endpointNetwork: {bad} are not {kind} ids")
        return ids
