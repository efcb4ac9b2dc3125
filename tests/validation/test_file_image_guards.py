"""Images by file id at Validate (nightbatch/validation/file_images.py): the file must be the batch tenant's, live,
of purpose vision or user_data, and within the per-image limit; each other case is a line-numbered error naming the
param, and another tenant's file reads exactly like a missing one. Each distinct id is looked up once."""

from __future__ import annotations

import io
from typing import Any

import pytest

from nightbatch import layout
from nightbatch.aws.records import FileRecord
from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.tenancy.scope import tenant_tags
from nightbatch.validation.file_images import FileImages
from nightbatch.validation.invalid import LineInvalid
from nightbatch.wiring import Services
from tests.support.pipeline_world import jsonl, make_batch
from tests.worker.test_file_images import PNG, file_line


def upload(services: Services, data: bytes = PNG, *, purpose: str = "vision", tenant: str = "default") -> str:
    return services.files.create(tenant, filename="cat.png", purpose=purpose, fileobj=io.BytesIO(data),
                                 size=len(data)).id


def lines(*refs: tuple[str, str], responses: bool = False) -> bytes:
    url = "/v1/responses" if responses else "/v1/chat/completions"
    return jsonl([dict(file_line(c, f, responses=responses), method="POST", url=url) for c, f in refs])


def test_validate_takes_the_tenants_image_files_and_tags_them_for_the_worker(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    cat, notes = upload(services), upload(services, b"a PDF, say", purpose="user_data")
    reads: list[str] = []
    table = services.adapters.table
    get_owned = table.get_owned

    def counted(kind: type[Any], tenant: str, record_id: str | None) -> Any:
        if kind is FileRecord and record_id in (cat, notes):
            reads.append(record_id)
        return get_owned(kind, tenant, record_id)

    monkeypatch.setattr(table, "get_owned", counted)
    for responses in (False, True):
        batch_id = make_batch(services, lines(*[(f"r{i}", cat) for i in range(20)], ("n", notes),
                                              responses=responses),
                              endpoint="/v1/responses" if responses else "/v1/chat/completions")
        reads.clear()
        assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid is True
        assert sorted(reads) == sorted([cat, notes])  # once per distinct file, not once per line
    for file_id in (cat, notes):  # what lets the worker's role read them (infra/access.py), and whose they are
        assert services.adapters.blobs.tags(layout.file_key(file_id)) == {**layout.INPUT_TAGS,
                                                                          **tenant_tags("default")}


def test_validate_refuses_image_files_that_are_not_the_batchs_to_use(services: Services) -> None:
    services.settings.validation.max_image_bytes = 300
    theirs = upload(services, tenant="other")
    batch_input, big, ok = upload(services, purpose="batch"), upload(services, b"\x00" * 301), upload(services)
    deleted = upload(services)
    services.files.delete("default", deleted)
    refs = [("ok", ok), ("missing", "file-doesnotexist"), ("theirs", theirs), ("purpose", batch_input),
            ("big", big), ("deleted", deleted), ("shape", "file-no/such")]
    for responses, param in ((True, "body.input[0].content[1].file_id"),
                             (False, "body.messages[0].content[1].image_url.url")):
        batch_id = make_batch(services, lines(*refs, responses=responses),
                              endpoint="/v1/responses" if responses else "/v1/chat/completions")
        assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid is False
        batch = services.batches.get("default", batch_id)
        assert batch.errors is not None
        errors = batch.errors.data
        assert [(e.line, e.code, e.param) for e in errors] == [
            (2, "file_not_found", param), (3, "file_not_found", param), (4, "invalid_value", param),
            (5, "image_too_large", param), (6, "file_not_found", param), (7, "invalid_value", param)]
        messages = [e.message for e in errors]
        # Another tenant's file is answered as the Files API answers it: as if it did not exist.
        assert messages[1] == f"No such File object: {theirs}"
        assert messages[0] == "No such File object: file-doesnotexist"
        assert "has purpose 'batch'" in messages[2] and "'vision' or 'user_data'" in messages[2]
        assert messages[3] == f"The image file {big} is 301 bytes, over the limit of 300 bytes per image."
    # Never opened to the worker: no input tag, and still the other tenant's.
    assert services.adapters.blobs.tags(layout.file_key(theirs)) == tenant_tags("other")


def test_the_cache_of_file_verdicts_is_bounded() -> None:
    looked: list[str] = []

    def lookup(file_id: str) -> None:
        looked.append(file_id)

    files = FileImages(lookup, max_bytes=10, cached=2)
    for file_id in ("file-a", "file-b", "file-a", "file-c", "file-a", "file-b"):
        with pytest.raises(LineInvalid):
            files.check(file_id, "p")
    assert looked == ["file-a", "file-b", "file-c", "file-b"]  # b was the least recently used when c came
