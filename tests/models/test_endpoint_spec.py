"""A model's `endpoint` refuses what would break its requests: header names that are not HTTP tokens (a trailing
newline included), nightbatch's own headers, and values that could start another header."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nightbatch.models.endpoint import EndpointSpec

URL = "http://10.0.3.7:8000/v1"


@pytest.mark.parametrize("name", ["X-Objective\n", "X Objective", "", "X-Obj:ective"])
def test_a_header_name_that_is_not_a_token_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="not a valid HTTP header name"):
        EndpointSpec.model_validate({"url": URL, "headers": {name: "batch"}})


def test_nightbatchs_own_headers_and_line_breaks_in_values_are_refused() -> None:
    with pytest.raises(ValidationError, match="set by nightbatch itself"):
        EndpointSpec.model_validate({"url": URL, "headers": {"Authorization": "Bearer x"}})
    with pytest.raises(ValidationError):
        EndpointSpec.model_validate({"url": URL, "headers": {"X-Objective": "batch\r\nX-Other: 1"}})


def test_a_token_header_is_kept() -> None:
    spec = EndpointSpec.model_validate({"url": URL, "headers": {"x-gateway-inference-objective": "batch-sheddable"}})
    assert spec.headers == {"x-gateway-inference-objective": "batch-sheddable"}
