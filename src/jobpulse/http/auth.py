"""The operator token of ``jobpulse serve`` / ``create_app(token=...)``: pure checks, no I/O.

With a token, the routes that act or reveal the whole namespace (``POST /jobs/{id}/cancel``,
``GET /metrics``) answer 401 unless the request carries ``Authorization: Bearer <token>``.
The comparison is constant-time (``hmac.compare_digest``), so answer times do not reveal how
much of a guess was right. ``exposure_error`` is the rule ``serve`` applies before it binds: an
address beyond loopback needs a token, or an explicit ``insecure``.
"""

from __future__ import annotations

import hmac
import ipaddress

__all__ = ["bearer_allows", "check_token", "exposure_error", "is_loopback"]

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def check_token(token: str | None) -> bytes | None:
    """The token as header bytes, or None for none.

    Raises:
        TypeError: ``token`` is not a string.
        ValueError: ``token`` is empty or holds a character an HTTP header cannot carry in a
            bearer credential (whitespace, control characters, non-ASCII).
    """
    if token is None:
        return None
    if not isinstance(token, str):
        raise TypeError(f"token must be a str, got {type(token).__name__}")
    if not token:
        raise ValueError("token must not be empty")
    if not all("!" <= ch <= "~" for ch in token):
        # The message never repeats the token: it is a secret, and errors get logged.
        raise ValueError("token must be printable ASCII without spaces (it goes in a header)")
    return token.encode("ascii")


def bearer_allows(authorization: str | None, token: bytes | None) -> bool:
    """True when no token is required, or ``authorization`` is ``Bearer <token>``.

    The scheme is case-insensitive (RFC 7235); the token is compared in constant time.
    """
    if token is None:
        return True
    if authorization is None:
        return False
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    try:
        given = credential.strip().encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(given, token)


def is_loopback(host: str) -> bool:
    """True when ``host`` (an address or ``localhost``) only listens on this machine.

    ``""``, ``0.0.0.0`` and ``::`` mean every interface; any other name than ``localhost`` may
    resolve to a public address and counts as beyond loopback.
    """
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def exposure_error(host: str, *, token: str | None, insecure: bool) -> str | None:
    """Why ``serve`` must not bind ``host`` (a sentence for the operator), or None when it may."""
    if token is not None or insecure or is_loopback(host):
        return None
    return (
        f"refusing to serve on {host or 'every interface'} without a token: anyone who reaches "
        "the port could cancel jobs and read /metrics. Pass --token (or set JOBPULSE_TOKEN), "
        "bind 127.0.0.1, or pass --insecure to serve without one"
    )
