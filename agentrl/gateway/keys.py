"""The gateway's API keys: the server's own key (``GatewayConfig.api_key``) and the per-session keys issued to
training episodes (:meth:`agentrl.gateway.Gateway.open_session`).

Invariants: a credential is never an identifier. A bearer token names a session only as an issued key (the
session it was issued for) or through the ``<session>`` after ``<key>:``; the token itself never becomes a session
id, so no key reaches ``/v1/sessions`` or a trajectory. The server key is compared in constant time (SHA-256 digests
through :func:`hmac.compare_digest`); issued keys are looked up by their SHA-256, so lookup time reveals nothing
about a key, and only their digests are kept. An issued-looking token (``sk-agentrl-...``) that is not live (its
session ended, which revokes it) is refused even when the server has no key of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from agentrl.gateway.config import ISSUED_PREFIX
from agentrl.gateway.protocol import APIError


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _refused(message: str) -> APIError:
    return APIError(401, message, "authentication_error", None, "invalid_api_key")


class Keys:
    """The server key and the live issued keys (``len()``: how many are live)."""

    def __init__(self, server_key: str | None):
        self.server_key = server_key
        self._issued: dict[str, str] = {}  # sha256(issued key) -> session id

    def __len__(self) -> int:
        return len(self._issued)

    def issue(self, sid: str) -> tuple[str, str]:
        """A new key that authenticates as (and only as) session ``sid``: ``(key, its digest for revoke())``."""
        key = ISSUED_PREFIX + secrets.token_urlsafe(24)
        self._issued[_digest(key)] = sid
        return key, _digest(key)

    def revoke(self, digest: str) -> None:
        self._issued.pop(digest, None)

    def check(self, authorization: str, api_key_header: str) -> tuple[str | None, str | None]:
        """Checks a request's key (``Authorization: Bearer ...`` or ``api-key``); returns ``(session the key names
        or None, issued-key session or None)``; raises :class:`APIError` 401."""
        bearer = authorization[:7].lower() == "bearer "
        token = authorization[7:].strip() if bearer else api_key_header
        if token and not (token.isascii() and token.isprintable()):
            raise _refused("invalid API key: a key is printable ASCII")
        if token:
            sid = self._issued.get(_digest(token))
            if sid is not None:
                return sid, sid
            if token.startswith(ISSUED_PREFIX):
                raise _refused("this session key is not live (its session has ended, which revokes it)")
        given, _, named = token.partition(":")
        if self.server_key is None:
            return (named or None), None
        # compare_digest on equal-length digests: no early exit on the first differing byte, no length leak
        if not hmac.compare_digest(hashlib.sha256(given.encode()).digest(),
                                   hashlib.sha256(self.server_key.encode()).digest()):
            raise _refused("invalid API key: send 'Authorization: Bearer <api_key>' (or '<api_key>:<session>')")
        return (named or None), None
