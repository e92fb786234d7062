"""The operator token's pure rules (``jobpulse.http.auth``): what a bearer header must hold,
which addresses count as loopback, and when ``serve`` refuses to bind."""

from __future__ import annotations

import pytest

from jobpulse.http.auth import bearer_allows, check_token, exposure_error, is_loopback

SECRET = b"s3cret-token"


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("Bearer s3cret-token", True),
        ("bearer s3cret-token", True),
        ("BEARER  s3cret-token ", True),
        (None, False),
        ("", False),
        ("Bearer", False),
        ("Bearer ", False),
        ("Bearer s3cret-tokenX", False),
        ("Bearer s3cret-toke", False),
        ("Basic s3cret-token", False),
        ("s3cret-token", False),
        ("Bearer s3cret-t\u00f6ken", False),
    ],
)
def test_a_bearer_header_allows_exactly_the_token(header: str | None, allowed: bool) -> None:
    assert bearer_allows(header, SECRET) is allowed


def test_without_a_token_every_request_is_allowed() -> None:
    assert bearer_allows(None, None) is True
    assert bearer_allows("Bearer anything", None) is True


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"]
)
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)
    assert exposure_error(host, token=None, insecure=False) is None


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", "10.0.0.5", "192.168.1.2", "2001:db8::1", "example.com"]
)
def test_beyond_loopback_needs_a_token_or_insecure(host: str) -> None:
    assert not is_loopback(host)
    refusal = exposure_error(host, token=None, insecure=False)
    assert refusal is not None
    assert "--token" in refusal
    assert "JOBPULSE_TOKEN" in refusal
    assert "--insecure" in refusal
    assert exposure_error(host, token="t", insecure=False) is None
    assert exposure_error(host, token=None, insecure=True) is None


def test_check_token() -> None:
    assert check_token(None) is None
    assert check_token("abc-DEF_123.~+/=") == b"abc-DEF_123.~+/="
    for bad in ("", " lead", "a b", "tab\there", "nl\n", "\u00e9t\u00e9"):
        with pytest.raises(ValueError, match="token"):
            check_token(bad)
