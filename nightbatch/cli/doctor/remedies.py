"""What to do about each problem the doctor can name: the text and the exact command where there is one."""

from __future__ import annotations

import re

from nightbatch import lambda_quota

HF_TOKEN_ENV = "HF_TOKEN"  # the job definition's secret (infra/gpu_compute.py)
# A job's log line (or a training job's FailureReason) saying Hugging Face refused the model: GATED_MODEL below.
HF_ERRORS = re.compile(r"GatedRepoError|401 Client Error|403 Client Error|Invalid user token|"
                       r"Access to model .* is restricted|You are trying to access a gated repo", re.IGNORECASE)

# (instance family, Spot) → (EC2 quota code, its name in Service Quotas). Values are vCPUs.
QUOTAS: dict[tuple[str, bool], tuple[str, str]] = {
    ("G", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("G", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("P", False): ("L-417A185B", "Running On-Demand P instances"),
    ("P", True): ("L-7212CCBC", "All P Spot Instance Requests"),
}
_SIZE = re.compile(r"\.(\d*)xlarge\Z")


def gpu_vcpus(instance_type: str) -> int:
    """vCPUs of a GPU instance type by its size (xlarge = 4, 2xlarge = 8, 12xlarge = 48, 48xlarge = 192)."""
    m = _SIZE.search(instance_type)
    if not m:
        return 4
    return 4 * int(m.group(1) or 1)


def quota_remedy(code: str, name: str, vcpus: int, region: str) -> str:
    return (f"new accounts have 0 vCPUs for GPU instances: ask for at least {vcpus} in Service Quotas → Amazon EC2 → "
            f"'{name}', or `aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
            f"{code} --desired-value {vcpus} --region {region}` (approval can take a day)")


def lambda_quota_remedy(desired: int, fits: int, quota: int, region: str) -> str:
    """The account's Lambda concurrency cannot hold what the stack reserves (cdk.json `concurrency`)."""
    return (f"new accounts get a small Lambda concurrency quota: ask for {desired} in Service Quotas → AWS Lambda → "
            f"'{lambda_quota.QUOTA_NAME}', or {lambda_quota.quota_request(desired, region)} (approval can take a "
            f"day); or lower cdk.json `concurrency` (api, workflow for each workflow Lambda, sweep; 0 = no "
            f"reservation) to at most {max(0, fits)} in all, set `concurrency.accountLimit` to {quota}, and "
            "synthesize again")


def spot_role_missing() -> str:
    return ("create the EC2 Spot service-linked role once per account: `aws iam create-service-linked-role "
            "--aws-service-name spot.amazonaws.com`, then re-enable the Spot compute environment if it is INVALID")


def ses_sandbox(region: str) -> str:
    return (f"request SES production access in {region} (SES console → Account dashboard → Request production "
            "access), or verify each recipient; webhooks and SNS are not affected")


def hf_secret_missing(secret: str) -> str:
    name = secret.rsplit(":secret:", 1)[-1]
    name = re.sub(r"-[A-Za-z0-9]{6}$", "", name) if ":secret:" in secret else name
    return (f"create it with your Hugging Face token: `aws secretsmanager create-secret --name {name} "
            "--secret-string hf_...` (the model's `tokenSecret` in cdk.json names it)")


IMAGE_PULL = ("the GPU host could not pull the worker image: check that the image still exists in ECR (a "
              "`cdk deploy` that failed half-way, or a lifecycle rule, can leave the job definition pointing at "
              "a missing tag — deploy again), that the instance role may pull from ECR, and that the hosts can "
              "reach ECR (public subnets with a public IP, or VPC endpoints)")
SECRET_PULL = ("ECS could not read a secret the job definition names (usually the Hugging Face token): create the "
               "secret named by the model's `tokenSecret`, or remove `tokenSecret` for a public model")
GATED_MODEL = ("the model is gated or private on Hugging Face: accept its licence on huggingface.co with the "
               "account whose token you use, store the token (`aws secretsmanager create-secret --name "
               "nightbatch/hf-token --secret-string hf_...`) and set `\"tokenSecret\": \"nightbatch/hf-token\"` on "
               "the model in cdk.json, then `cdk deploy`")


def sagemaker_quota_remedy(code: str, name: str, region: str) -> str:
    where = f"SageMaker training quotas are per instance type and often 0 in new accounts: ask for at least 1 in " \
            f"Service Quotas → Amazon SageMaker → '{name}'"
    if not code:
        return where
    return (f"{where}, or `aws service-quotas request-service-quota-increase --service-code sagemaker --quota-code "
            f"{code} --desired-value 1 --region {region}`")


SAGEMAKER_CAPACITY = ("SageMaker had no capacity for the instance type (InsufficientCapacityError): the shard is "
                      "retried; for a lasting shortage add instance types (`gpuInstanceTypes`), allow on-demand, "
                      "or use `gpuBackend: both` so AWS Batch takes the other shards")
SPOT_WAIT = ("the managed-Spot job waited past MaxWaitTimeInSeconds (MaxWaitTimeExceeded): Capacity reruns the "
             "shard on-demand when the batch's slack runs low; if it recurs, allow on-demand (cdk.json `capacity`)")
SAGEMAKER_LOG = ("read the job's log: `aws logs tail /aws/sagemaker/TrainingJobs --log-stream-name-prefix {job} "
                 "--follow` (its FailureReason is the worker's /opt/ml/output/failure)")
