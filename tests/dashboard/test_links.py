"""Signed download links: the HMAC, the link endpoint (Bearer, tenant-scoped) and the download redirect."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import requests

from nightbatch.files.links import InvalidLinkError, sign_link, verify_link
from nightbatch.settings import Settings

if TYPE_CHECKING:
    from tests.conftest import ApiServer

SETTINGS = Settings(links={"secret": "s3cret", "ttl_seconds": 300})


def test_a_signed_link_verifies_until_it_expires() -> None:
    link = sign_link(SETTINGS, "file-abc", at=1_000)
    assert link.expires_at == 1_300
    assert link.path == f"/v1/nightbatch/files/file-abc/download?expires=1300&kid=k1&sig={link.sig}"
    verify_link(SETTINGS, "file-abc", "1300", link.sig, kid=link.kid, at=1_299)
    with pytest.raises(InvalidLinkError) as expired:
        verify_link(SETTINGS, "file-abc", "1300", link.sig, kid=link.kid, at=1_300)
    assert (expired.value.status, expired.value.code) == (403, "link_expired")


@pytest.mark.parametrize("file_id, expires, sig_change", [
    ("file-other", "1300", ""),  # another file
    ("file-abc", "9999", ""),  # a longer life
    ("file-abc", "1300", "x"),  # a changed signature
    ("file-abc", "soon", ""),  # not a time at all
])
def test_a_changed_link_is_refused(file_id: str, expires: str, sig_change: str) -> None:
    link = sign_link(SETTINGS, "file-abc", at=1_000)
    with pytest.raises(InvalidLinkError) as refused:
        verify_link(SETTINGS, file_id, expires, link.sig + sig_change, kid=link.kid, at=1_001)
    assert refused.value.code == "invalid_link"


def test_links_are_bound_to_the_secret() -> None:
    link = sign_link(SETTINGS, "file-abc", at=1_000)
    with pytest.raises(InvalidLinkError):
        verify_link(Settings(links={"secret": "another"}), "file-abc", "1300", link.sig, kid=link.kid, at=1_001)
    # Without a configured secret, one process signs and verifies with its own random key.
    unset = Settings()
    own = sign_link(unset, "file-abc", at=1_000)
    verify_link(unset, "file-abc", "1300", own.sig, kid=own.kid, at=1_001)


@pytest.fixture
def output_file(api_server: ApiServer) -> tuple[str, bytes]:
    data = b'{"custom_id": "a"}\n{"custom_id": "b"}\n'
    api_server.services.adapters.blobs.put_bytes("files/file-linkTestOutput0000000000", data)
    api_server.services.files.register("default", file_id="file-linkTestOutput0000000000",
                                     key="files/file-linkTestOutput0000000000", size=len(data),
                                     filename="batch_x_output.jsonl", purpose="batch_output")
    return "file-linkTestOutput0000000000", data


def bearer(api_server: ApiServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_server.api_key}"}


def test_link_then_download_redirects_to_the_bytes(api_server: ApiServer, output_file: tuple[str, bytes]) -> None:
    file_id, data = output_file
    url = f"{api_server.base_url}/v1/nightbatch/files/{file_id}/link"
    r = requests.post(url, headers=bearer(api_server), timeout=10)
    assert r.status_code == 200, r.text
    link = r.json()
    assert set(link) == {"url", "expires_at"}
    assert link["url"].startswith(f"{api_server.base_url}/v1/nightbatch/files/{file_id}/download?expires=")

    first = requests.get(link["url"], allow_redirects=False, timeout=10)
    assert first.status_code == 307
    assert first.headers["cache-control"] == "no-store"
    assert "X-Amz-Signature=" in first.headers["location"]
    followed = requests.get(link["url"], timeout=10)
    assert followed.status_code == 200
    assert followed.content == data
    assert 'filename="batch_x_output.jsonl"' in followed.headers["content-disposition"]


def test_a_tampered_link_is_403_in_openai_shape(api_server: ApiServer, output_file: tuple[str, bytes]) -> None:
    file_id, _ = output_file
    link = sign_link(api_server.services.settings, file_id)
    r = requests.get(f"{api_server.base_url}/v1/nightbatch/files/{file_id}/download",
                     params={"expires": link.expires_at + 60, "sig": link.sig}, timeout=10)
    assert r.status_code == 403
    assert r.json() == {"error": {"message": "This download link is not valid.",
                                  "type": "invalid_request_error", "param": None, "code": "invalid_link"}}
    unsigned = f"{api_server.base_url}/v1/nightbatch/files/{file_id}/download"
    assert requests.get(unsigned, timeout=10).status_code == 403


def test_a_link_needs_the_key_and_a_file_of_the_tenant(api_server: ApiServer, output_file: tuple[str, bytes]) -> None:
    file_id, data = output_file
    url = f"{api_server.base_url}/v1/nightbatch/files/{file_id}/link"
    assert requests.post(url, timeout=10).status_code == 401
    api_server.services.adapters.blobs.put_bytes("files/file-someoneElses00000000000", data)
    api_server.services.files.register("other", file_id="file-someoneElses00000000000",
                                     key="files/file-someoneElses00000000000", size=len(data),
                                     filename="theirs.jsonl", purpose="batch_output")
    for missing in ("file-someoneElses00000000000", "file-doesNotExist00000000000"):
        r = requests.post(f"{api_server.base_url}/v1/nightbatch/files/{missing}/link", headers=bearer(api_server),
                          timeout=10)
        assert r.status_code == 404
        assert r.json()["error"]["message"] == f"No such File object: {missing}"


def test_a_file_made_of_upload_parts_streams_through(api_server: ApiServer) -> None:
    blobs = api_server.services.adapters.blobs
    blobs.put_bytes("uploads/u1/part-1", b'{"custom_id": "1"}\n')
    blobs.put_bytes("uploads/u1/part-2", b'{"custom_id": "2"}\n')
    api_server.services.files.register("default", file_id="file-composedUpload000000000", key="uploads/u1/",
                                     size=38, filename="big.jsonl", purpose="batch",
                                     extra={"parts": ["uploads/u1/part-1", "uploads/u1/part-2"]})
    link = sign_link(api_server.services.settings, "file-composedUpload000000000")
    r = requests.get(api_server.base_url + link.path, allow_redirects=False, timeout=10)
    assert r.status_code == 200
    assert r.content == b'{"custom_id": "1"}\n{"custom_id": "2"}\n'
    assert r.headers["content-disposition"] == 'attachment; filename="big.jsonl"'


def test_the_page_is_served_without_a_key_under_a_strict_policy(api_server: ApiServer) -> None:
    for path in ("/", "/dashboard", "/dashboard/batches/batch_abc"):
        r = requests.get(api_server.base_url + path, timeout=10)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        assert "<title>nightbatch · batches</title>" in r.text
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp
        assert "script-src 'sha256-" in csp
        assert "unsafe-inline" not in csp
