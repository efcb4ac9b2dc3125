"""Every check of a batch create request sits in one room (nightbatch/batches/request.py) and answers the
first problem of a request, in one order, before anything is written."""

from __future__ import annotations

import io
from typing import Any

import pytest

from nightbatch.batches.request import CreateBatchRequest, check_create
from nightbatch.errors import InvalidRequestError
from nightbatch.wiring import Services

# The problems of one request, in the order they are answered: (the field fixed next, its good value, param).
PROBLEMS: list[tuple[str, Any, str]] = [
    ("endpoint", "/v1/chat/completions", "endpoint"),
    ("completion_window", "24h", "completion_window"),
    ("metadata", {"k": "v"}, "metadata.k"),
    ("nightbatch", {"notify": {"email": ["a@example.com"]}}, "nightbatch.colour"),
    # batches/recipients.py's address rule, called from the one room: no domain may be e-mailed here.
    ("nightbatch", {"notify": {"email": []}}, "nightbatch.notify.email"),
    ("output_expires_after", {"anchor": "created_at", "seconds": 3600}, "output_expires_after.anchor"),
]


def test_a_create_request_is_answered_with_its_first_problem_in_order(services: Services) -> None:
    good = services.files.upload("t", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(b"{}\n"), size=3)
    body: dict[str, Any] = {
        "input_file_id": "file-missing", "endpoint": "/v1/images", "completion_window": "2d",
        "metadata": {"k": 1}, "nightbatch": {"colour": "blue"},
        "output_expires_after": {"anchor": "last_active_at", "seconds": 3600},
    }
    seen = []
    for field, fixed, _ in PROBLEMS:
        with pytest.raises(InvalidRequestError) as exc:
            check_create("t", CreateBatchRequest(**body), settings=services.settings, files=services.files)
        seen.append(exc.value.param)
        body[field] = fixed
    body["output_expires_after"] = {"anchor": "created_at", "seconds": 1}  # under the minimum
    with pytest.raises(InvalidRequestError) as exc:
        check_create("t", CreateBatchRequest(**body), settings=services.settings, files=services.files)
    assert exc.value.param == "output_expires_after.seconds"
    body["output_expires_after"]["seconds"] = 3600
    with pytest.raises(InvalidRequestError) as exc:
        check_create("t", CreateBatchRequest(**body), settings=services.settings, files=services.files)
    assert (exc.value.param, exc.value.code) == ("input_file_id", "invalid_value")
    assert seen == [param for _, _, param in PROBLEMS]
    body["input_file_id"] = good.id
    assert check_create("t", CreateBatchRequest(**body), settings=services.settings, files=services.files).hours == 24
    assert list(services.adapters.table.open_ids("validating")) == []  # the checks write nothing


@pytest.mark.parametrize("value", ["random", "", 1, None, ["input"]])
def test_a_bad_output_order_is_a_400_naming_the_param(services: Services, value: Any) -> None:
    good = services.files.upload("t", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(b"{}\n"), size=3)
    req = CreateBatchRequest(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h",
                             nightbatch={"output_order": value})
    with pytest.raises(InvalidRequestError) as exc:
        check_create("t", req, settings=services.settings, files=services.files)
    assert exc.value.param == "nightbatch.output_order"
    assert exc.value.code == "invalid_value"


@pytest.mark.parametrize("value", ["completion", "input"])
def test_a_known_output_order_is_accepted(services: Services, value: str) -> None:
    good = services.files.upload("t", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(b"{}\n"), size=3)
    req = CreateBatchRequest(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h",
                             nightbatch={"output_order": value})
    check_create("t", req, settings=services.settings, files=services.files)
