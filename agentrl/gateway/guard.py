"""What the gateway's and the viewer's aiohttp servers accept before any handler runs: Host, Origin, content type,
and how long a connection may take. Shared by both servers (the viewer imports it from here); the rules themselves
are :mod:`agentrl.netguard`'s, which ``agentrl envs serve`` applies to its ASGI server too.

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

from typing import Collection

from aiohttp import web

from agentrl.netguard import (LOOPBACK_NAMES, WILDCARD, HostCheck, default_hosts, is_loopback,  # noqa: F401
                              origin_allowed, site_problem, split_host)


def cross_site_problem(request: web.Request, allowed_origins: Collection[str]) -> tuple[int, str, str] | None:
    """``(status, code, message)`` when ``request`` may come from another site's page, else None."""
    headers = request.headers
    return site_problem(request.method, headers.get("Origin"), headers.get("Content-Type"), allowed_origins)


def app_runner(app: web.Application, idle_s: float, **kw) -> web.AppRunner:
    """An ``AppRunner`` whose connections close after ``idle_s`` without a complete request header (from the
    connection's start, and between keep-alive requests)."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=idle_s, **kw)
