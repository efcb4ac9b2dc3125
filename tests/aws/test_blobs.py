"""The S3 adapter against moto: puts and streamed gets, the multipart LineWriter, prefixes, pre-signed links."""

from __future__ import annotations

import io

import pytest
import requests

from nightbatch.aws import Adapters
from nightbatch.aws.s3 import PART_BYTES


def test_put_get_size_delete(adapters: Adapters) -> None:
    blobs = adapters.blobs
    blobs.put_bytes("a/b.jsonl", b"hello\n")
    assert blobs.get_bytes("a/b.jsonl") == b"hello\n"
    assert blobs.size("a/b.jsonl") == 6
    assert blobs.exists("a/b.jsonl")
    blobs.delete("a/b.jsonl")
    assert blobs.get_bytes("a/b.jsonl") is None
    assert blobs.size("a/b.jsonl") is None
    assert not blobs.exists("a/b.jsonl")


def test_put_fileobj_and_chunked_reads(adapters: Adapters) -> None:
    blobs = adapters.blobs
    data = bytes(range(256)) * 1000
    blobs.put_fileobj("f", io.BytesIO(data))
    chunks = list(blobs.iter_chunks("f", chunk=10_000))
    assert b"".join(chunks) == data
    assert len(chunks) == 26
    assert b"".join(blobs.iter_chunks("f", start=255_990)) == data[255_990:]


def test_list_and_delete_prefix(adapters: Adapters) -> None:
    blobs = adapters.blobs
    for k in ("p/1", "p/2", "p/sub/3", "q/1"):
        blobs.put_bytes(k, b"x")
    assert sorted(blobs.list_keys("p/")) == ["p/1", "p/2", "p/sub/3"]
    assert [o["Key"] for o in blobs.list_objects("p/", page=2)] == ["p/1", "p/2", "p/sub/3"]  # pages followed
    assert [o["Size"] for o in blobs.list_objects("", page=1)] == [1, 1, 1, 1]
    blobs.delete_prefix("p/")
    assert list(blobs.list_keys("p/")) == []
    assert list(blobs.list_keys("q/")) == ["q/1"]


def test_line_writer_small_is_one_put(adapters: Adapters) -> None:
    blobs = adapters.blobs
    with blobs.writer("out/small.jsonl") as w:
        w.write_lines([b'{"a":1}\n', b'{"a":2}\n'])
        assert w.upload_id is None
    assert blobs.get_bytes("out/small.jsonl") == b'{"a":1}\n{"a":2}\n'
    assert w.bytes_written == 16


def test_line_writer_empty_writes_an_empty_object(adapters: Adapters) -> None:
    w = adapters.blobs.writer("out/empty")
    assert w.close() == 0
    assert adapters.blobs.get_bytes("out/empty") == b""


def test_line_writer_multipart_round_trip(adapters: Adapters) -> None:
    blobs = adapters.blobs
    line = b'{"custom_id":"x","pad":"' + b"y" * 1000 + b'"}\n'
    n = (2 * PART_BYTES + PART_BYTES // 2) // len(line)  # ~20 MiB: two full parts and a short last one
    expected = line * n
    with blobs.writer("out/big.jsonl") as w:
        for _ in range(n):
            w.write(line)
        assert w.upload_id is not None  # switched to multipart once the buffer passed one part
    assert len(w.parts) == 3
    assert blobs.size("out/big.jsonl") == len(expected)
    assert b"".join(blobs.iter_chunks("out/big.jsonl")) == expected


def test_line_writer_aborts_on_error(adapters: Adapters) -> None:
    blobs = adapters.blobs
    with pytest.raises(RuntimeError), blobs.writer("out/aborted") as w:
        w.write(b"z" * (PART_BYTES + 1))
        raise RuntimeError("worker died")
    assert not blobs.exists("out/aborted")
    uploads = blobs.client.list_multipart_uploads(Bucket=blobs.bucket).get("Uploads", [])
    assert [u for u in uploads if u["Key"] == "out/aborted"] == []


def test_presigned_get_downloads_the_bytes(adapters: Adapters) -> None:
    blobs = adapters.blobs
    blobs.put_bytes("out/results.jsonl", b'{"ok":true}\n')
    url = blobs.presign_get("out/results.jsonl", filename='res"ults.jsonl')
    resp = requests.get(url, timeout=30)
    assert resp.status_code == 200
    assert resp.content == b'{"ok":true}\n'
    assert resp.headers["content-disposition"] == 'attachment; filename="res_ults.jsonl"'


def test_tags_survive_a_multipart_rewrite(adapters: Adapters) -> None:
    """rewrite's copy onto itself past the transfer's multipart threshold (8 MiB) would drop the object's tags:
    the ones it had and the ones asked for are written in the same call. Tagging adds to the tags an object has
    (S3 sets a whole set at once): an object's tenant stays when it is marked a batch's input."""
    blobs = adapters.blobs
    data = b"y" * (9 * 1024 * 1024)
    blobs.put_bytes("files/big", data, tags={"nightbatch-tenant": "team-a"})
    assert blobs.tag("files/big", {"old": "1"})
    assert blobs.tags("files/big") == {"nightbatch-tenant": "team-a", "old": "1"}
    blobs.rewrite("files/big", {"kept-for": "b"}, tags={"nightbatch-input": "batch"})
    assert blobs.tags("files/big") == {"nightbatch-tenant": "team-a", "old": "1", "nightbatch-input": "batch"}
    assert blobs.get_bytes("files/big") == data
    assert not blobs.tag("files/missing", {"k": "v"}) and blobs.tags("files/missing") == {}
