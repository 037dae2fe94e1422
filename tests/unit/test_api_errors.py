"""Per-status API errors (vwserver.errors.api_error): one class per answer a loop branches on,
built in one place from the answer's Status — for HTTP answers and watch ERROR events alike."""

from __future__ import annotations

import pytest

from vwserver.errors import (
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiGone,
    ApiInvalid,
    ApiNotFound,
    ApiServerError,
    ApiTooManyRequests,
    ApiUnauthorized,
    VWServerError,
    api_error,
)


@pytest.mark.parametrize(
    ("code", "cls", "transient"),
    [
        (401, ApiUnauthorized, False),
        (403, ApiForbidden, False),
        (404, ApiNotFound, False),
        (409, ApiConflict, False),
        (410, ApiGone, False),
        (422, ApiInvalid, False),
        (429, ApiTooManyRequests, True),
        (500, ApiServerError, True),
        (503, ApiServerError, True),
        (400, ApiError, False),
        (408, ApiError, True),
    ],
)
def test_the_code_picks_the_class(code: int, cls: type[ApiError], transient: bool) -> None:
    error = api_error(code, {"reason": "R", "message": "m"}, url="https://kcp/x")
    assert type(error) is cls
    assert isinstance(error, ApiError) and isinstance(error, VWServerError)
    assert (error.code, error.reason, error.message, error.url) == (code, "R", "m", "https://kcp/x")
    assert error.transient is transient
    assert str(error) == f"{code} R from https://kcp/x: m"


def test_without_a_status_the_body_is_the_message() -> None:
    error = api_error(502, None, url="u", body=b"<html>bad gateway</html>" + b"x" * 500)
    assert isinstance(error, ApiServerError)
    assert error.reason == ""
    assert error.message.startswith("<html>bad gateway") and len(error.message) == 200
    assert str(error).startswith("502 error from u: <html>")
