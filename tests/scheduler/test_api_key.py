"""The API key check on its own (services/scheduler/api_key.py); tests/e2e/test_api_key.py runs it in a mesh."""

from __future__ import annotations

import pytest

from services.common.errors import Unauthenticated
from services.scheduler.api_key import ApiKey


@pytest.mark.parametrize("authorization, x_api_key", [
    ("Bearer s3cret", None), ("bearer s3cret", None), ("  Bearer   s3cret ", None), (None, "s3cret"),
    ("Bearer wrong", "s3cret"),  # Anthropic's header beside another client's Authorization
])
def test_the_key_is_taken_from_either_header(authorization, x_api_key):
    ApiKey("s3cret").check(authorization, x_api_key)


@pytest.mark.parametrize("authorization, x_api_key, message", [
    (None, None, "needs an API key"), ("", "", "needs an API key"), ("Basic czNjcmV0", None, "needs an API key"),
    ("s3cret", None, "needs an API key"),  # no scheme
    ("Bearer s3cre", None, "not this mesh's"), ("Bearer s3cret2", None, "not this mesh's"),
    (None, "S3CRET", "not this mesh's"),
])
def test_anything_else_is_refused_saying_what_to_send(authorization, x_api_key, message):
    with pytest.raises(Unauthenticated, match=message) as refused:
        ApiKey("s3cret").check(authorization, x_api_key)
    assert refused.value.http_status == 401 and refused.value.grpc_code == "UNAUTHENTICATED"
