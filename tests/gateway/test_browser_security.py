"""The gateway against a real browser (issue 34): Debian's Chromium, headless, with ``evil.test`` resolved to
127.0.0.1 (``--host-resolver-rules``), as a DNS-rebinding attacker's page is once its name is rebound, and as a
page on another site is. Each test first gives a victim session a conversation, then runs the attacker's script in
the page and checks the server's state (what the script did) and what the script could read.
"""

from __future__ import annotations

import asyncio
import json
import stat
import sys
from pathlib import Path

from aiohttp import web

from agentrl.testing.browser import Chromium, find_chromium, needs_chromium

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
from test_gateway import post, serve, tiny_tok  # noqa: E402,F401

pytestmark = needs_chromium()

OK = {"model": "tiny", "messages": [{"role": "user", "content": "the victim's secret prompt"}]}


def mapped_chromium(tmp_path: Path) -> Chromium:
    """A Chromium that resolves evil.test to 127.0.0.1 (a wrapper adds the flag to the system's binary)."""
    wrapper = tmp_path / "chromium-evil"
    wrapper.write_text(f'#!/bin/sh\nexec {find_chromium()} --host-resolver-rules="MAP evil.test 127.0.0.1" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return Chromium(binary=str(wrapper))


async def victim(gw) -> None:
    st, _ = await post(gw, "/s/victim/v1/chat/completions", OK)
    assert st == 200 and "victim" in gw.store.sessions


async def test_a_rebound_page_cannot_read_or_end_sessions(tiny_tok, tmp_path):
    gw, eng = await serve(tiny_tok, ["the answer<eos>"])
    try:
        await victim(gw)
        async with mapped_chromium(tmp_path) as page:
            # The attacker's page, its name now rebound to the gateway: every request is same-origin to the browser.
            await page.navigate(f"http://evil.test:{gw.port}/health")
            got = await page.evaluate("""(async () => {
                const list = await fetch('/v1/sessions');
                const end = await fetch('/v1/sessions/victim/end', {method: 'POST',
                    headers: {'Content-Type': 'application/json'},
                    body: JSON.stringify({reward: 1, return_trajectory: true})});
                return JSON.stringify({list: [list.status, await list.text()], end: [end.status, await end.text()]});
            })()""")
        got = json.loads(got)
        assert got["list"][0] == 421 and got["end"][0] == 421
        assert "victim" not in got["list"][1] and "secret" not in got["end"][1]
        assert "victim" in gw.store.sessions  # not ended
    finally:
        await gw.stop()


async def test_a_page_on_another_site_cannot_post(tiny_tok, tmp_path):
    gw, eng = await serve(tiny_tok, ["the answer<eos>"])
    site = web.Application()

    async def attacker_page(request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>cat pictures</title>", content_type="text/html")

    site.router.add_get("/", attacker_page)
    runner = web.AppRunner(site)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    attacker_port = tcp._server.sockets[0].getsockname()[1]
    try:
        await victim(gw)
        calls = len(eng.calls)
        async with mapped_chromium(tmp_path) as page:
            await page.navigate(f"http://evil.test:{attacker_port}/")
            # CORS "simple" requests: sent without a preflight, their responses opaque, their effects real.
            sent = await page.evaluate(f"""(async () => {{
                const gw = 'http://127.0.0.1:{gw.port}';
                const out = [];
                for (const [path, body] of [
                        ['/s/attacker/v1/chat/completions', {json.dumps(OK)}],
                        ['/v1/sessions/victim/end', {{reward: 1e300}}]]) {{
                    try {{
                        await fetch(gw + path, {{method: 'POST', mode: 'no-cors',
                            headers: {{'Content-Type': 'text/plain'}}, body: JSON.stringify(body)}});
                        out.push('sent');
                    }} catch (e) {{ out.push('error ' + e); }}
                }}
                return out.join(',');
            }})()""")
        assert sent == "sent,sent"  # the browser did send them: the server refused them
        assert set(gw.store.sessions) == {"victim"} and len(eng.calls) == calls
        assert gw.errors == {"origin_not_allowed": 2}  # the browser sent its Origin; text/plain alone is 415 too
    finally:
        await runner.cleanup()
        await gw.stop()
