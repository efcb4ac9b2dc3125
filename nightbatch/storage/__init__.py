"""AWS adapters: the only package that imports boto3. Each takes its boto3 client as a constructor argument."""

from botocore.exceptions import BotoCoreError, ClientError

from nightbatch.storage.dynamo import Table
from nightbatch.storage.s3 import BlobStore, LineWriter
from nightbatch.storage.session import Adapters, make_adapters

__all__ = ["AWS_ERRORS", "Adapters", "BlobStore", "LineWriter", "Table", "make_adapters"]

# What an AWS call raises for AWS's or the network's reasons (throttling, 5xx, a timeout, a refused call):
# worth retrying later, unlike an error in the code or the data.
AWS_ERRORS: tuple[type[Exception], ...] = (BotoCoreError, ClientError, OSError)
