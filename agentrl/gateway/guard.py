"""What the gateway's and the viewer's aiohttp servers accept before any handler runs. The Host and Origin rules
(DNS rebinding, cross-site requests) are :mod:`agentrl.netguard`'s, shared with ``agentrl envs serve``; this module
applies them to an aiohttp request (:func:`cross_site_problem`; the gateway also answers allowed origins'
preflights with CORS headers) and bounds how long a connection may take.

Slow clients: :func:`app_runner` sets aiohttp's keep-alive timer, which runs from the moment a connection opens
(3.14), so a connection that sends no complete request header within ``idle_s``, or sits idle between requests,
is closed; handlers bound their body reads themselves (the gateway answers 408).
"""

from __future__ import annotations

from typing import Collection

from aiohttp import web

from agentrl.netguard import site_problem


def cross_site_problem(request: web.Request, allowed_origins: Collection[str]) -> tuple[int, str, str] | None:
    """``(status, code, message)`` when ``request`` may come from another site's page, else None."""
    headers = request.headers
    return site_problem(request.method, headers.get("Origin"), headers.get("Content-Type"), allowed_origins)


def app_runner(app: web.Application, idle_s: float, **kw) -> web.AppRunner:
    """An ``AppRunner`` whose connections close after ``idle_s`` without a complete request header (from the
    connection's start, and between keep-alive requests)."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=idle_s, **kw)
