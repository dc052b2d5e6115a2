"""Which requests a local HTTP server of agentrl's accepts, whatever serves it: the gateway and the viewer (aiohttp,
through :mod:`agentrl.gateway.guard`) and ``agentrl envs serve`` (OpenEnv's ASGI server, through :class:`ASGIGuard`).

A server bound to loopback can be reached by every local process and by every web page the user's browser opens. A
page cannot read another origin's responses, but three tricks get around that, and these rules refuse them:

- **DNS rebinding.** A page on ``evil.example`` has its name re-resolved to 127.0.0.1; its requests are then
  same-origin to the browser, and they reach the server with ``Host: evil.example:PORT``. :class:`HostCheck`
  accepts only the names the server is meant to be reached by (default: the loopback names and the bound
  address; any name for a wildcard bind), on the bound port; anything else is 421 Misdirected Request.
- **Cross-site simple requests.** A POST with ``Content-Type: text/plain`` (or no body) is sent without a CORS
  preflight: its response is unreadable, but its side effects happen. :func:`site_problem` refuses POSTs whose
  body is not ``application/json`` (415; a browser must preflight that type) and requests carrying an ``Origin``
  that is not allowed (403, preflights included; non-browser clients send none).
- **Cross-site WebSockets.** A page may open a WebSocket to any origin, with no preflight, and read what comes
  back; the browser only says who it is, in ``Origin``. The same Origin rule refuses the handshake.

No dependency beyond the standard library: this sits below every layer that serves HTTP.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any, Awaitable, Callable, Collection, Iterable

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD = ("0.0.0.0", "::", "")


def default_hosts(bound: str) -> list[str] | None:
    """The Host names accepted by default for a server bound to ``bound``: the loopback names and the bound address;
    ``None`` (any) for a wildcard bind, whose names are not known here."""
    if bound in WILDCARD:
        return None
    return list(dict.fromkeys([*LOOPBACK_NAMES, bound.strip("[]").lower()]))


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` header -> ``(lower-case name without brackets, port or None)``; None when malformed."""
    value = value.strip()
    if not value or any(c in value for c in " /\\@\t\r\n"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, sep, port_text = value.rpartition(":")
        if not sep:
            name, port_text = value, None
        elif ":" in name:  # a bare IPv6 address is not a valid Host
            return None
    if port_text is None:
        return name.lower(), None
    if not port_text.isdigit() or len(port_text) > 5:
        return None
    return name.lower(), int(port_text)


class HostCheck:
    """Accepts ``Host`` headers naming one of ``names`` (case-insensitive; ``None`` or ``"*"``: any name) on
    ``port`` (a Host without a port means 80)."""

    def __init__(self, names: Iterable[str] | None, port: int):
        self.names = None if names is None else {n.strip("[]").lower() for n in names}
        if self.names is not None and "*" in self.names:
            self.names = None
        self.port = port

    def allows(self, header: str | None) -> bool:
        if self.names is None:
            return True
        parsed = split_host(header or "")
        if parsed is None:
            return False
        name, port = parsed
        return name in self.names and (port if port is not None else 80) == self.port


def origin_allowed(origin: str, allowed_origins: Collection[str]) -> bool:
    return origin in allowed_origins or "*" in allowed_origins


def site_problem(method: str, origin: str | None, content_type: str | None,
                 allowed_origins: Collection[str]) -> tuple[int, str, str] | None:
    """``(status, code, message)`` when a request may come from another site's page, else None. ``content_type``:
    the request's ``Content-Type`` header (None when it has none)."""
    if origin is not None and not origin_allowed(origin, allowed_origins):
        return 403, "origin_not_allowed", (f"requests from origin {origin[:100]!r} are not allowed (a web page on "
                                           f"another site); list it in allowed_origins to allow it")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if method == "POST" and media != "application/json":
        return 415, "unsupported_media_type", (f"POST bodies must be sent as 'Content-Type: application/json', got "
                                               f"{(content_type or 'none')[:100]!r}")
    return None


Message = dict[str, Any]
ASGIApp = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class ASGIGuard:
    """ASGI middleware applying :class:`HostCheck` and :func:`site_problem` to every HTTP request and WebSocket
    handshake before ``app`` sees it. A refused request gets its status and ``{"error": {"code", "message"}}``; a
    refused handshake gets its status as the handshake's HTTP answer (the ASGI WebSocket denial response, which
    uvicorn implements; a server without it answers 403)."""

    def __init__(self, app: ASGIApp, hosts: HostCheck, allowed_origins: Collection[str] = ()):
        self.app, self.hosts, self.allowed_origins = app, hosts, tuple(allowed_origins)

    def problem(self, scope: dict[str, Any]) -> tuple[int, str, str] | None:
        headers: dict[str, str] = {}
        hosts = 0
        for k, v in scope.get("headers") or []:
            name = k.decode("latin-1").lower()
            hosts += name == "host"
            headers.setdefault(name, v.decode("latin-1"))
        if hosts > 1 or not self.hosts.allows(headers.get("host")):  # two Host headers: which one is meant?
            return 421, "misdirected_request", (f"this server is not reached by the name "
                                                f"{headers.get('host', '')[:100]!r} (a rebound DNS name?); list it "
                                                f"in the allowed hosts to allow it")
        method = scope.get("method", "GET") if scope["type"] == "http" else "GET"
        return site_problem(method, headers.get("origin"), headers.get("content-type"), self.allowed_origins)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        found = self.problem(scope) if scope["type"] in ("http", "websocket") else None
        if found is None:
            return await self.app(scope, receive, send)
        status, code, message = found
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        head = {"status": status, "headers": [(b"content-type", b"application/json"),
                                              (b"content-length", str(len(body)).encode())]}
        if scope["type"] == "http":
            await send({"type": "http.response.start", **head})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in (scope.get("extensions") or {}):
            await send({"type": "websocket.http.response.start", **head})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})
