"""Every failure is OpenAI's error envelope with an x-request-id: auth, unknown ids, bad params, limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest
import requests
from openai import OpenAI

if TYPE_CHECKING:
    from tests.conftest import ApiServer

ENVELOPE_KEYS = {"message", "type", "param", "code"}


def assert_error(
    resp: requests.Response,
    status: int,
    *,
    param: Any = ...,
    code: Any = ...,
    type_: str = "invalid_request_error",
) -> dict[str, Any]:
    """The response is `status` with the full envelope, a JSON content type and an x-request-id."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.headers["x-request-id"].startswith("req_")
    body = resp.json()
    assert set(body) == {"error"}
    err: dict[str, Any] = body["error"]
    assert set(err) == ENVELOPE_KEYS
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == type_
    if param is not ...:
        assert err["param"] == param, err
    if code is not ...:
        assert err["code"] == code, err
    return err


@pytest.fixture
def input_file_id(api_server: ApiServer, make_jsonl: Any) -> str:
    resp = requests.post(
        f"{api_server.v1}/files",
        headers=api_server.auth,
        files={"file": ("in.jsonl", make_jsonl(1))},
        data={"purpose": "batch"},
        timeout=30,
    )
    resp.raise_for_status()
    file_id: str = resp.json()["id"]
    return file_id


def create_batch(api_server: ApiServer, body: Any, **kw: Any) -> requests.Response:
    return requests.post(f"{api_server.v1}/batches", headers=api_server.auth, json=body, timeout=30, **kw)


def batch_body(file_id: str, **over: Any) -> dict[str, Any]:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    body.update(over)
    return body


# ------------------------------------------------------------------------------------------- request ids


def test_every_response_has_a_request_id(api_server: ApiServer) -> None:
    ok = requests.get(f"{api_server.v1}/models", headers=api_server.auth, timeout=30)
    missing = requests.get(f"{api_server.v1}/nothing-here", headers=api_server.auth, timeout=30)
    ids = {ok.headers["x-request-id"], missing.headers["x-request-id"]}
    assert len(ids) == 2 and all(i.startswith("req_") for i in ids)
    assert_error(missing, 404)


def test_unknown_route_and_wrong_method_use_the_envelope(api_server: ApiServer) -> None:
    assert_error(requests.put(f"{api_server.v1}/batches", headers=api_server.auth, timeout=30), 405)


# ------------------------------------------------------------------------------------------------- auth


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic nb-test-key"},
        {"Authorization": "Bearer "},
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/files"),
        ("POST", "/files"),
        ("GET", "/files/file-x"),
        ("DELETE", "/files/file-x"),
        ("GET", "/files/file-x/content"),
        ("GET", "/batches"),
        ("POST", "/batches"),
        ("GET", "/batches/batch_x"),
        ("POST", "/batches/batch_x/cancel"),
        ("GET", "/models"),
    ],
)
def test_every_route_needs_a_valid_key(
    api_server: ApiServer, headers: dict[str, str], method: str, path: str
) -> None:
    resp = requests.request(method, f"{api_server.v1}{path}", headers=headers, timeout=30)
    assert_error(resp, 401, code="invalid_api_key")


def test_sdk_with_a_wrong_key_gets_authentication_error(api_server: ApiServer) -> None:
    with pytest.raises(openai.AuthenticationError) as exc:
        api_server.openai(api_key="wrong").files.list()
    assert exc.value.code == "invalid_api_key"
    assert exc.value.request_id is not None


def test_keys_from_the_list_setting_are_accepted(serve_api: Any) -> None:
    api_server = serve_api(api_key="", api_keys="k1, k2")
    for key in ("k1", "k2"):
        resp = requests.get(f"{api_server.v1}/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert resp.status_code == 200
    resp = requests.get(
        f"{api_server.v1}/models", headers={"Authorization": "Bearer nb-test-key"}, timeout=30
    )
    assert_error(resp, 401)


# --------------------------------------------------------------------------------------------------- 404


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/files/file-doesnotexist"),
        ("DELETE", "/files/file-doesnotexist"),
        ("GET", "/files/file-doesnotexist/content"),
        ("GET", "/files/not-even-a-file-id"),
        ("GET", "/batches/batch_doesnotexist"),
        ("POST", "/batches/batch_doesnotexist/cancel"),
        ("GET", "/batches/file-wrongkind"),
        ("GET", "/models/no-such-model"),
    ],
)
def test_unknown_ids_are_404(api_server: ApiServer, method: str, path: str) -> None:
    resp = requests.request(method, f"{api_server.v1}{path}", headers=api_server.auth, timeout=30)
    err = assert_error(resp, 404)
    assert path.split("/")[2] in err["message"]


def test_a_batch_id_is_not_a_file_id(api_server: ApiServer, input_file_id: str) -> None:
    batch_id = create_batch(api_server, batch_body(input_file_id)).json()["id"]
    assert_error(requests.get(f"{api_server.v1}/files/{batch_id}", headers=api_server.auth, timeout=30), 404)
    assert_error(
        requests.get(f"{api_server.v1}/batches/{input_file_id}", headers=api_server.auth, timeout=30), 404
    )


# ------------------------------------------------------------------------------------ batch create params


# (param, a bad value, what the message must name): the endpoint error lists a supported endpoint.
BAD_CREATE_VALUES = [
    *[("endpoint", v, "/v1/chat/completions")
      for v in ["/v1/responses/", "/v1/chat/completions/", "v1/embeddings", "", "/v1/invalid"]],
    *[("completion_window", v, "completion_window")
      for v in ["0h", "169h", "24", "1d", "", "24H", " 24h", "-1h", "1.5h", "0024h", "7d"]],
]


@pytest.mark.parametrize(("param", "value", "named"), BAD_CREATE_VALUES)
def test_bad_create_value(api_server: ApiServer, input_file_id: str, param: str, value: str, named: str) -> None:
    err = assert_error(
        create_batch(api_server, batch_body(input_file_id, **{param: value})),
        400,
        param=param,
        code="invalid_value",
    )
    assert named in err["message"]


def test_non_string_completion_window(api_server: ApiServer, input_file_id: str) -> None:
    resp = create_batch(api_server, batch_body(input_file_id, completion_window=24))
    assert_error(resp, 400, param="completion_window")


def test_metadata_with_more_than_16_pairs(api_server: ApiServer, input_file_id: str) -> None:
    ok = {f"k{i}": "v" for i in range(16)}
    assert create_batch(api_server, batch_body(input_file_id, metadata=ok)).status_code == 200
    too_many = {f"k{i}": "v" for i in range(17)}
    assert_error(
        create_batch(api_server, batch_body(input_file_id, metadata=too_many)),
        400,
        param="metadata",
        code="invalid_value",
    )


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (["a"], "an array"),
        (1, "a number"),
        (True, "a boolean"),
        ({"a": "b"}, "an object"),
        (None, "null"),
    ],
)
def test_metadata_values_must_be_strings(
    api_server: ApiServer, input_file_id: str, value: Any, kind: str
) -> None:
    resp = create_batch(api_server, batch_body(input_file_id, metadata={"tags": value}))
    err = assert_error(resp, 400, param="metadata.tags", code="invalid_type")
    assert err["message"] == f"Invalid type for 'metadata.tags': expected a string, but got {kind} instead."


def test_metadata_lengths(api_server: ApiServer, input_file_id: str) -> None:
    edge = {"k" * 64: "v" * 512}
    assert create_batch(api_server, batch_body(input_file_id, metadata=edge)).status_code == 200
    long_key = create_batch(api_server, batch_body(input_file_id, metadata={"k" * 65: "v"}))
    assert_error(long_key, 400, code="invalid_value")
    long_value = create_batch(api_server, batch_body(input_file_id, metadata={"k": "v" * 513}))
    assert_error(long_value, 400, param="metadata.k", code="invalid_value")


@pytest.mark.parametrize("metadata", [["a"], "x", 3])
def test_metadata_must_be_an_object(api_server: ApiServer, input_file_id: str, metadata: Any) -> None:
    assert_error(
        create_batch(api_server, batch_body(input_file_id, metadata=metadata)), 400, param="metadata"
    )


@pytest.mark.parametrize("seconds", [0, 3599, 2_592_001, -5])
def test_output_expires_after_out_of_range(api_server: ApiServer, input_file_id: str, seconds: int) -> None:
    body = batch_body(input_file_id, output_expires_after={"anchor": "created_at", "seconds": seconds})
    assert_error(
        create_batch(api_server, body), 400, param="output_expires_after.seconds", code="invalid_value"
    )


def test_output_expires_after_bad_anchor(api_server: ApiServer, input_file_id: str) -> None:
    body = batch_body(input_file_id, output_expires_after={"anchor": "completed_at", "seconds": 3600})
    assert_error(
        create_batch(api_server, body), 400, param="output_expires_after.anchor", code="invalid_value"
    )


@pytest.mark.parametrize("missing", ["input_file_id", "endpoint", "completion_window"])
def test_missing_required_parameter(api_server: ApiServer, input_file_id: str, missing: str) -> None:
    body = batch_body(input_file_id)
    del body[missing]
    err = assert_error(create_batch(api_server, body), 400, param=missing, code="missing_required_parameter")
    assert missing in err["message"]


def test_malformed_json_body(api_server: ApiServer) -> None:
    resp = requests.post(
        f"{api_server.v1}/batches",
        data=b'{"input_file_id": ',
        headers={**api_server.auth, "Content-Type": "application/json"},
        timeout=30,
    )
    err = assert_error(resp, 400, code="invalid_json")
    assert "JSON" in err["message"]


@pytest.mark.parametrize("body", [b"[]", b'"x"', b"null", b"3"])
def test_json_body_that_is_not_an_object(api_server: ApiServer, body: bytes) -> None:
    resp = requests.post(
        f"{api_server.v1}/batches",
        data=body,
        headers={**api_server.auth, "Content-Type": "application/json"},
        timeout=30,
    )
    assert_error(resp, 400)


def post_raw(api_server: ApiServer, path: str, data: bytes, content_type: str | None) -> requests.Response:
    """POST exactly `data` to /v1/<path> with the key and this Content-Type (none when None)."""
    headers = {**api_server.auth, **({"Content-Type": content_type} if content_type else {})}
    return requests.post(f"{api_server.v1}/{path}", data=data, headers=headers, timeout=30)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_wrong_content_type_for_batch_create(
    api_server: ApiServer, input_file_id: str, content_type: str | None
) -> None:
    assert_error(post_raw(api_server, "batches", b'{"input_file_id": "x"}', content_type), 400)


def test_empty_body_with_json_content_type_on_create(api_server: ApiServer) -> None:
    assert_error(post_raw(api_server, "batches", b"", "application/json"), 400)


def test_cancel_with_an_empty_json_body_works(api_server: ApiServer, input_file_id: str) -> None:
    # What the SDK sends: no body, Content-Length: 0, content-type: application/json.
    batch_id = create_batch(api_server, batch_body(input_file_id)).json()["id"]
    resp = requests.post(
        f"{api_server.v1}/batches/{batch_id}/cancel",
        data=b"",
        headers={**api_server.auth, "Content-Type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 200
    assert resp.json()["status"] == "cancelling"


# ---------------------------------------------------------------------------------------------- listing


@pytest.mark.parametrize("limit", ["0", "101", "-1", "abc", "1.5"])
def test_batch_list_limit_out_of_range(api_server: ApiServer, limit: str) -> None:
    resp = requests.get(
        f"{api_server.v1}/batches", params={"limit": limit}, headers=api_server.auth, timeout=30
    )
    assert_error(resp, 400, param="limit")


@pytest.mark.parametrize("limit", ["0", "10001", "x"])
def test_file_list_limit_out_of_range(api_server: ApiServer, limit: str) -> None:
    resp = requests.get(
        f"{api_server.v1}/files", params={"limit": limit}, headers=api_server.auth, timeout=30
    )
    assert_error(resp, 400, param="limit")


def test_file_list_bad_order(api_server: ApiServer) -> None:
    resp = requests.get(f"{api_server.v1}/files", params={"order": "up"}, headers=api_server.auth, timeout=30)
    assert_error(resp, 400, param="order", code="invalid_value")


@pytest.mark.parametrize("path", ["/files", "/batches"])
def test_unknown_after_cursor(api_server: ApiServer, path: str) -> None:
    resp = requests.get(
        f"{api_server.v1}{path}", params={"after": "file-nope"}, headers=api_server.auth, timeout=30
    )
    assert_error(resp, 400, param="after")


# ---------------------------------------------------------------------------------------------- uploads


@pytest.mark.parametrize("purpose", ["batch_output", "nonsense", "", "BATCH"])
def test_upload_with_an_invalid_purpose(api_server: ApiServer, purpose: str) -> None:
    resp = requests.post(
        f"{api_server.v1}/files",
        headers=api_server.auth,
        files={"file": ("a.jsonl", b"{}\n")},
        data={"purpose": purpose},
        timeout=30,
    )
    assert_error(resp, 400, param="purpose")


def test_upload_without_a_file(api_server: ApiServer) -> None:
    resp = requests.post(
        f"{api_server.v1}/files",
        headers=api_server.auth,
        files={"other": ("a.jsonl", b"{}\n")},
        data={"purpose": "batch"},
        timeout=30,
    )
    assert_error(resp, 400, param="file", code="missing_required_parameter")


def test_upload_without_a_purpose(api_server: ApiServer) -> None:
    resp = requests.post(
        f"{api_server.v1}/files", headers=api_server.auth, files={"file": ("a.jsonl", b"{}\n")}, timeout=30
    )
    assert_error(resp, 400, param="purpose", code="missing_required_parameter")


def test_upload_with_a_text_field_as_file(api_server: ApiServer) -> None:
    resp = requests.post(
        f"{api_server.v1}/files",
        headers=api_server.auth,
        data={"purpose": "batch", "file": "not a file part"},
        timeout=30,
    )
    assert_error(resp, 400, param="file")


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
def test_upload_that_is_not_multipart(api_server: ApiServer, content_type: str | None) -> None:
    assert_error(post_raw(api_server, "files", b'{"purpose": "batch"}', content_type), 400)


def test_multipart_with_a_broken_body(api_server: ApiServer) -> None:
    resp = post_raw(api_server, "files", b"--xyz\r\nContent-Disposition: form-data; name=",
                    "multipart/form-data; boundary=xyz")
    assert_error(resp, 400)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expires_after[seconds]", "10"),
        ("expires_after[seconds]", "abc"),
        ("expires_after[anchor]", "now"),
    ],
)
def test_upload_with_bad_expiry(api_server: ApiServer, field: str, value: str) -> None:
    data = {"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    data[field] = value
    resp = requests.post(
        f"{api_server.v1}/files",
        headers=api_server.auth,
        files={"file": ("a.jsonl", b"{}\n")},
        data=data,
        timeout=30,
    )
    assert_error(resp, 400, param=field)


def test_upload_over_the_limit_is_413(serve_api: Any) -> None:
    api_server = serve_api(max_upload_bytes=1024 * 1024)
    client: OpenAI = api_server.openai()
    ok = client.files.create(file=("ok.jsonl", b"x" * (1024 * 1024)), purpose="batch")
    assert ok.bytes == 1024 * 1024
    with pytest.raises(openai.APIStatusError) as exc:
        client.files.create(file=("big.jsonl", b"x" * (1024 * 1024 + 1)), purpose="batch")
    assert exc.value.status_code == 413
    err = exc.value.body
    assert isinstance(err, dict) and set(err) == ENVELOPE_KEYS
    assert "1 MiB" in err["message"] or "1048576" in err["message"]
    assert "Uploads API" in err["message"]
    assert exc.value.response.headers["x-request-id"].startswith("req_")


def test_upload_far_over_the_limit_is_413_before_reading_it(serve_api: Any) -> None:
    api_server = serve_api(max_upload_bytes=1024 * 1024)
    resp = requests.post(
        f"{api_server.v1}/files",
        headers=api_server.auth,
        files={"file": ("big.jsonl", b"x" * (3 * 1024 * 1024))},
        data={"purpose": "batch"},
        timeout=30,
    )
    err = assert_error(resp, 413, code="payload_too_large")
    assert "1 MiB" in err["message"] and "Uploads API" in err["message"]


def test_json_body_over_the_limit_is_413(api_server: ApiServer) -> None:
    resp = requests.post(
        f"{api_server.v1}/batches",
        headers=api_server.auth,
        json={"input_file_id": "x" * (2 * 1024 * 1024)},
        timeout=30,
    )
    assert_error(resp, 413)
