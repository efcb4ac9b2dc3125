"""AWS adapters: the only package that imports boto3. Each takes its boto3 client as a constructor argument."""

from nightbatch.aws.dynamo import Table
from nightbatch.aws.s3 import BlobStore, LineWriter
from nightbatch.aws.session import Adapters, make_adapters

__all__ = ["Adapters", "BlobStore", "LineWriter", "Table", "make_adapters"]

