"""A headless Chromium driven over the DevTools protocol (a websocket, with aiohttp): for the viewer's tests,
benchmark and screenshots. No browser download: it runs the system's Chromium (Debian's ``chromium`` package, or
``$AGENTRL_CHROMIUM``).

    async with Chromium() as page:
        await page.navigate("http://127.0.0.1:8765/")
        await page.wait_for("document.body.dataset.listReady")
        png = await page.screenshot()

The browser runs with a throw-away profile and no background traffic (no sync, component updates or first-run
pages). ``exceptions``, ``console`` and ``requests`` collect the page's uncaught JS exceptions, console/log
entries (CSP violations show up there) and requested URLs, so a test can assert what did (not) happen.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import tempfile
from typing import Any

import aiohttp

from agentrl import proctemp

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
         "--no-default-browser-check", "--mute-audio", "--hide-scrollbars", "--disable-dev-shm-usage")


def needs_chromium() -> Any:
    """A pytest mark: skips a browser test where Chromium is missing, except on CI (``CI=true``), which installs it
    (.ci/sandbox-setup.sh), so that there a missing browser fails the test."""
    import pytest

    on_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return pytest.mark.skipif(find_chromium() is None and not on_ci,
                              reason="no Chromium on this machine (.ci/sandbox-setup.sh installs Debian's chromium)")


def find_chromium() -> str | None:
    """The Chromium binary: ``$AGENTRL_CHROMIUM``, else ``chromium``/``chromium-browser``/``google-chrome`` on PATH."""
    env = os.environ.get("AGENTRL_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    """Chromium could not start, a DevTools command failed, or a wait timed out."""


class Chromium:
    """One headless Chromium with one page. Use as an async context manager."""

    def __init__(self, *, width: int = 1400, height: int = 900, binary: str | None = None, start_timeout: float = 60):
        self.width, self.height = width, height
        self.binary = binary or find_chromium()
        self.start_timeout = start_timeout
        self.exceptions: list[str] = []
        self.console: list[dict[str, Any]] = []
        self.requests: list[str] = []  # every URL the page requested
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._events: dict[str, list[asyncio.Future]] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._profile: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None

    async def __aenter__(self) -> "Chromium":
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def start(self) -> None:
        if not self.binary:
            raise BrowserError("no Chromium found: install Debian's 'chromium' package or set AGENTRL_CHROMIUM")
        # its singleton lock socket goes under the profile: /org.chromium.Chromium.XXXXXX/SingletonSocket (46 bytes)
        self._profile = tempfile.mkdtemp(prefix="agentrl-chromium-", dir=proctemp.socket_parent(26 + 46))
        self._proc = await asyncio.create_subprocess_exec(
            self.binary, *FLAGS, f"--user-data-dir={self._profile}", "--remote-debugging-port=0",
            f"--window-size={self.width},{self.height}", "about:blank",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env=dict(os.environ, TMPDIR=self._profile))  # its singleton lock dir goes with the profile
        ws_url = None
        seen: list[str] = []

        async def read_banner() -> str:
            assert self._proc is not None and self._proc.stderr is not None
            while True:
                line = (await self._proc.stderr.readline()).decode(errors="replace")
                if not line:
                    raise BrowserError(f"Chromium exited before DevTools started: {''.join(seen[-20:])}")
                seen.append(line)
                m = re.search(r"DevTools listening on (ws://\S+)", line)
                if m:
                    return m.group(1)

        try:
            ws_url = await asyncio.wait_for(read_banner(), self.start_timeout)
        except asyncio.TimeoutError:
            raise BrowserError(f"Chromium did not start DevTools in {self.start_timeout}s") from None
        # Drain stderr from now on so that a chatty browser never blocks on a full pipe.
        self._drain = asyncio.ensure_future(self._drain_stderr())
        port = int(re.search(r":(\d+)/", ws_url).group(1))  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json()
        page = next((t for t in targets if t.get("type") == "page"), None)
        if page is None:
            raise BrowserError(f"no page target in {targets}")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.ensure_future(self._read())
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        await self.send("Log.enable")
        await self.send("Network.enable")
        await self.send("Emulation.setDeviceMetricsOverride",
                        {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})

    async def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while await self._proc.stderr.read(65536):
            pass

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    if "error" in data:
                        fut.set_exception(BrowserError(f"DevTools: {data['error']}"))
                    else:
                        fut.set_result(data.get("result", {}))
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = params.get("exceptionDetails", {})
                self.exceptions.append(str(d.get("exception", {}).get("description") or d.get("text")))
            elif method == "Network.requestWillBeSent":
                self.requests.append(params.get("request", {}).get("url", ""))
            elif method == "Log.entryAdded":
                self.console.append(params.get("entry", {}))
            elif method == "Runtime.consoleAPICalled":
                self.console.append({"level": params.get("type"), "text": " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params.get("args", []))})
            for fut in self._events.pop(method, []):
                if not fut.done():
                    fut.set_result(params)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(BrowserError("DevTools connection closed"))

    async def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        """Sends one DevTools command and returns its result."""
        if self._ws is None:
            raise BrowserError("not started")
        i = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[i] = fut
        await self._ws.send_str(json.dumps({"id": i, "method": method, "params": params or {}}))
        return await asyncio.wait_for(fut, timeout)

    def event(self, method: str) -> asyncio.Future:
        """A future for the next ``method`` event (create it before the command that triggers it)."""
        fut = asyncio.get_running_loop().create_future()
        self._events.setdefault(method, []).append(fut)
        return fut

    async def navigate(self, url: str, timeout: float = 60) -> None:
        """Loads ``url`` and waits for its load event."""
        loaded = self.event("Page.loadEventFired")
        res = await self.send("Page.navigate", {"url": url})
        if res.get("errorText"):
            raise BrowserError(f"navigation to {url} failed: {res['errorText']}")
        await asyncio.wait_for(loaded, timeout)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JS expression (promises awaited), or :class:`BrowserError` if it threw."""
        res = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                   "awaitPromise": True})
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression[:80]!r} threw: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    async def wait_for(self, expression: str, timeout: float = 30, interval: float = 0.02) -> Any:
        """Polls until ``expression`` is truthy; returns its value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if loop.time() > deadline:
                raise BrowserError(f"timed out after {timeout}s waiting for {expression!r}")
            await asyncio.sleep(interval)

    async def screenshot(self, path: str | os.PathLike | None = None, full_page: bool = False) -> bytes:
        """A PNG of the viewport (or the whole page), written to ``path`` if given."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = await self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": min(size[1], 8000), "scale": 1}
            params["captureBeyondViewport"] = True
        png = base64.b64decode((await self.send("Page.captureScreenshot", params))["data"])
        if path is not None:
            with open(path, "wb") as f:
                f.write(png)
        return png

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
        if self._session is not None:
            await self._session.close()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except asyncio.TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        drain = getattr(self, "_drain", None)
        if drain is not None:
            drain.cancel()
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
        self._ws = self._session = self._proc = None  # type: ignore[assignment]
