"""Files API via the stock OpenAI SDK over real HTTP: upload, auto-paged list, retrieve, content, delete."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import openai
import pytest
from openai import OpenAI

if TYPE_CHECKING:
    from tests.conftest import ApiServer

FILE_FIELDS = {
    "id",
    "object",
    "bytes",
    "created_at",
    "filename",
    "purpose",
    "status",
    "expires_at",
    "status_details",
}


def test_upload_returns_a_file_object(openai_client: OpenAI, make_jsonl: Callable[..., bytes]) -> None:
    data = make_jsonl(3)
    f = openai_client.files.create(file=("input.jsonl", data, "application/jsonl"), purpose="batch")
    assert f.id.startswith("file-")
    assert f.object == "file"
    assert f.bytes == len(data)
    assert f.filename == "input.jsonl"
    assert f.purpose == "batch"
    assert f.status == "processed"
    # purpose=batch files expire after 30 days by default.
    assert f.expires_at == f.created_at + 30 * 86400
    assert set(f.model_dump()) >= FILE_FIELDS


def test_upload_bytes_without_a_name_is_called_upload(openai_client: OpenAI) -> None:
    f = openai_client.files.create(file=io.BytesIO(b"{}\n"), purpose="user_data")
    assert f.filename == "upload"
    # L5: every purpose expires (OpenAI keeps non-batch files): the bucket lifecycle removes bytes after 31 days,
    # so an item must not outlive its object.
    assert f.expires_at == f.created_at + 30 * 86400


def test_upload_with_expires_after(openai_client: OpenAI) -> None:
    f = openai_client.files.create(
        file=("a.jsonl", b"{}\n"), purpose="batch", expires_after={"anchor": "created_at", "seconds": 7200}
    )
    assert f.expires_at == f.created_at + 7200


def test_retrieve_content_and_delete(openai_client: OpenAI, make_jsonl: Callable[..., bytes]) -> None:
    data = make_jsonl(5)
    f = openai_client.files.create(file=("in.jsonl", data), purpose="batch")

    assert openai_client.files.retrieve(f.id) == f
    assert openai_client.files.content(f.id).read() == data

    deleted = openai_client.files.delete(f.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (f.id, "file", True)
    with pytest.raises(openai.NotFoundError):
        openai_client.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.files.content(f.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.files.delete(f.id)


def test_content_of_a_larger_file_streams_back_identical(openai_client: OpenAI) -> None:
    data = bytes(range(256)) * 4096 * 3  # 3 MiB, spans many stream chunks
    f = openai_client.files.create(file=("blob.bin", data), purpose="user_data")
    with openai_client.files.with_streaming_response.content(f.id) as resp:
        assert int(resp.headers["content-length"]) == len(data)
        got = b"".join(resp.iter_bytes())
    assert got == data


@pytest.fixture
def seven_files(openai_client: OpenAI, api_server: ApiServer) -> list[str]:
    """Seven files with distinct created_at (oldest first): five batch, two user_data."""
    ids = []
    base = int(time.time()) - 60  # recent: batch files expire 30 days after creation
    for i in range(7):
        purpose = "user_data" if i in (2, 5) else "batch"
        # Distinct seconds make the expected order unambiguous; ids break ties within a second anyway.
        f = api_server.services.files.register(
            "default",
            file_id=f"file-{i:02d}paging",
            key=f"files/paging-{i}",
            size=1,
            filename=f"{i}.jsonl",
            purpose=purpose,
            created_at=base + i,
        )
        ids.append(f.id)
    return ids


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_auto_paging_yields_each_file_once_and_ends(
    openai_client: OpenAI, api_server: ApiServer, seven_files: list[str], order: str
) -> None:
    seen = [f.id for f in openai_client.files.list(limit=2, order=order)]
    expected = seven_files if order == "asc" else seven_files[::-1]
    assert seen == expected
    pages = [r for r in api_server.requests if r.path == "/v1/files" and r.method == "GET"]
    assert len(pages) == 4  # 2+2+2+1, and the pager stopped on has_more=false
    assert all(f"order={order}" in p.query and "limit=2" in p.query for p in pages)


def test_default_order_is_newest_first(openai_client: OpenAI, seven_files: list[str]) -> None:
    page = openai_client.files.list()
    assert [f.id for f in page.data] == seven_files[::-1]
    assert page.has_more is False


def test_purpose_filter_pages_through_matching_files_only(
    openai_client: OpenAI, seven_files: list[str]
) -> None:
    batch_ids = [fid for i, fid in enumerate(seven_files) if i not in (2, 5)]
    assert [f.id for f in openai_client.files.list(purpose="batch", limit=2, order="asc")] == batch_ids
    assert [f.id for f in openai_client.files.list(purpose="user_data", limit=1)] == [
        seven_files[5],
        seven_files[2],
    ]


def test_list_envelope(openai_client: OpenAI, seven_files: list[str]) -> None:
    raw = openai_client.files.with_raw_response.list(limit=3, order="asc").http_response.json()
    assert raw["object"] == "list"
    assert raw["has_more"] is True
    assert raw["first_id"] == seven_files[0]
    assert raw["last_id"] == seven_files[2]
    assert [d["id"] for d in raw["data"]] == seven_files[:3]


def test_empty_list_has_null_ids_and_no_more(openai_client: OpenAI) -> None:
    raw = openai_client.files.with_raw_response.list().http_response.json()
    assert raw == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def test_after_is_exclusive(openai_client: OpenAI, seven_files: list[str]) -> None:
    page = openai_client.files.list(after=seven_files[3], order="asc", limit=10)
    assert [f.id for f in page.data] == seven_files[4:]
    page = openai_client.files.list(after=seven_files[3], order="desc", limit=10)
    assert [f.id for f in page.data] == seven_files[:3][::-1]


def test_expired_file_is_gone_on_read(openai_client: OpenAI, api_server: ApiServer) -> None:
    # docs/ARCHITECTURE.md, decision 11: expiry is enforced on read, before DynamoDB's TTL sweeps the item.
    old = api_server.services.files.register(
        "default",
        file_id="file-expiredone",
        key="files/x",
        size=1,
        filename="x.jsonl",
        purpose="batch",
        created_at=int(time.time()) - 31 * 86400,
    )
    with pytest.raises(openai.NotFoundError):
        openai_client.files.retrieve(old.id)
    assert openai_client.files.list().data == []
