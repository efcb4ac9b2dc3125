"""The boto3 session the adapters share: its timestamp parser (nightbatch.aws.session.parse_timestamp)."""

from __future__ import annotations

import threading
from typing import Any
from unittest import mock

import pytest
from botocore import utils as botocore_utils

from nightbatch.aws import Adapters
from nightbatch.aws.session import parse_timestamp


@pytest.mark.parametrize("value", [
    "2026-12-04T00:54:58.000Z", "2026-12-04T00:54:58Z", "2026-12-04T00:54:58.123456+02:00", "2026-12-04T00:54:58",
    "Fri, 04 Dec 2026 00:54:58 GMT", "Fri, 04 Dec 2026 00:54:58 -0000", 1733273698, 1733273698.5, "1733273698",
])
def test_timestamps_parse_as_botocore_parses_them(value: object) -> None:
    ours, theirs = parse_timestamp(value), botocore_utils.parse_timestamp(value)
    assert ours == theirs and ours.utcoffset() == theirs.utcoffset()


def test_the_adapters_clients_parse_s3_timestamps_without_dateutil(adapters: Adapters) -> None:
    """A listing's LastModified and a GET's Last-Modified header, through the fast path (botocore's dateutil
    parser is not called from this thread; moto's server, in another, uses it), as botocore's parser gives them."""
    blobs = adapters.blobs
    blobs.put_bytes("ts/a", b"x")
    slow = botocore_utils._parse_timestamp_with_tzinfo
    callers: list[int] = []

    def watched(*args: Any) -> Any:
        callers.append(threading.get_ident())
        return slow(*args)

    with mock.patch.object(botocore_utils, "_parse_timestamp_with_tzinfo", watched):
        listed = blobs.client.list_objects_v2(Bucket=blobs.bucket, Prefix="ts/")["Contents"][0]["LastModified"]
        got = blobs.client.get_object(Bucket=blobs.bucket, Key="ts/a")["LastModified"]
    assert threading.get_ident() not in callers
    assert listed.tzinfo is not None and got.tzinfo is not None
    assert abs((got - listed).total_seconds()) < 2
    assert got == botocore_utils.parse_timestamp(got.strftime("%a, %d %b %Y %H:%M:%S GMT"))
