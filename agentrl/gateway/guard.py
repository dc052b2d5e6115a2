"""What the gateway's and the viewer's HTTP servers accept before any handler runs: Host, Origin, content type,
and how long a connection may take. Shared by both servers (the viewer imports it from here).

Both bind loopback by default, which every local process and every web page the user's browser opens can reach.
A page cannot read another origin's responses, but two tricks get around that, and this module refuses both:

- **DNS rebinding.** A page on ``evil.example`` has its name re-resolved to 127.0.0.1; its requests are then
  same-origin to the browser, and they reach the server with ``Host: evil.example:PORT``. :class:`HostCheck`
  accepts only the names the server is meant to be reached by (default: the loopback names and the bound
  address; any name for a wildcard bind, where the gateway requires an API key anyway), on the bound port;
  anything else is 421 Misdirected Request.
- **Cross-site simple requests.** A POST with ``Content-Type: text/plain`` (or no body) is sent without a CORS
  preflight: its response is unreadable, but its side effects happen. :func:`cross_site_problem` refuses POSTs
  whose body is not ``application/json`` (415; a browser must preflight that type) and requests carrying an
  ``Origin`` that is not allowed (403, preflights included; non-browser clients send none). The gateway answers
  allowed origins' preflights and lets them read responses (CORS headers).

Slow clients: :func:`app_runner` sets aiohttp's keep-alive timer, which runs from the moment a connection opens
(3.14), so a connection that sends no complete request header within ``idle_s``, or sits idle between requests,
is closed; handlers bound their body reads themselves (the gateway answers 408).
"""

from __future__ import annotations

import ipaddress
from typing import Collection, Iterable

from aiohttp import web

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


def cross_site_problem(request: web.Request, allowed_origins: Collection[str]) -> tuple[int, str, str] | None:
    """``(status, code, message)`` when ``request`` may come from another site's page, else None."""
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin, allowed_origins):
        return 403, "origin_not_allowed", (f"requests from origin {origin[:100]!r} are not allowed (a web page on "
                                           f"another site); list it in allowed_origins to allow it")
    if request.method == "POST" and request.content_type != "application/json":
        return 415, "unsupported_media_type", (f"POST bodies must be sent as 'Content-Type: application/json', got "
                                               f"{request.headers.get('Content-Type', 'none')[:100]!r}")
    return None


def app_runner(app: web.Application, idle_s: float, **kw) -> web.AppRunner:
    """An ``AppRunner`` whose connections close after ``idle_s`` without a complete request header (from the
    connection's start, and between keep-alive requests)."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=idle_s, **kw)
