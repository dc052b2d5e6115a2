"""A stand-in NeMo Gym Gymnasium-style resources server, written from the protocol in the nemo-gym 0.7.0 wheel
(``resources_servers/gymnasium/base.py``, ``nemo_gym/server_utils.py``'s session middleware): nemo-gym itself needs
Python >= 3.13.14, which this machine cannot run. What it copies: ``POST /reset`` and ``/step`` bodies (the task row's
fields, ``responses_create_params`` required; ``/step``'s ``response`` validated like ``NeMoGymResponse``: 422 with
FastAPI's ``detail`` list otherwise), the session as a signed-in-spirit cookie named ``<Class>___<name>`` set on the
first request, session state dropped when an episode ends, ``observation`` null on the last step.

The game (the row's ``secret`` in 1..8): guess it with ``<action>N</action>``; 4 guesses; reward 1 when right.
Faults for the tests: an action containing ``HANG`` sleeps 600 s, ``GARBAGE`` answers plain text.

Usage: python nemo_gym_standin.py PORT
"""

import asyncio
import re
import sys
import uuid

from aiohttp import web

COOKIE = "GuessServer___guess_resources_server"
RESPONSE_FIELDS = ("id", "created_at", "model", "object", "output", "parallel_tool_calls", "tool_choice", "tools")
STATE: dict[str, dict] = {}


def _session(request: web.Request) -> tuple[str, bool]:
    sid = request.cookies.get(COOKIE)
    return (sid, False) if sid else (str(uuid.uuid4()), True)


def _reply(body: dict, sid: str, new: bool) -> web.Response:
    resp = web.json_response(body)
    if new:
        resp.set_cookie(COOKIE, sid, httponly=True, samesite="lax")
    return resp


def _missing(where: str, field: str) -> web.Response:
    return web.json_response({"detail": [{"type": "missing", "loc": ["body", *where.split(".")[1:], field],
                                          "msg": "Field required"}]}, status=422)


def _text(response: dict) -> str:
    parts = []
    for item in response["output"]:
        if item.get("type") == "message":
            content = item.get("content")
            parts.extend([content] if isinstance(content, str)
                         else [c["text"] for c in content if c.get("type") == "output_text"])
    return "".join(parts)


async def reset(request: web.Request) -> web.Response:
    body = await request.json()
    if "responses_create_params" not in body:
        return _missing("body", "responses_create_params")
    sid, new = _session(request)
    STATE[sid] = {"secret": int(body.get("secret", 5)), "left": 4}
    return _reply({"observation": "Guess my number in 1..8: answer <action>N</action>.", "info": {}}, sid, new)


async def step(request: web.Request) -> web.Response:
    body = await request.json()
    for field in ("responses_create_params", "response"):
        if field not in body:
            return _missing("body", field)
    for field in RESPONSE_FIELDS:
        if field not in body["response"]:
            return _missing("body.response", field)
    sid, new = _session(request)
    text = _text(body["response"])
    if "HANG" in text:
        await asyncio.sleep(600)
    if "GARBAGE" in text:
        return web.Response(text="<html>oops</html>", content_type="text/html")
    state = STATE.get(sid)
    if state is None:  # NeMo's servers read empty state for an unknown session
        state = {"secret": 0, "left": 1}
    m = re.search(r"<action>\s*(\d+)\s*</action>", text)
    state["left"] -= 1
    if m and int(m.group(1)) == state["secret"]:
        STATE.pop(sid, None)
        return _reply({"observation": None, "reward": 1.0, "terminated": True, "truncated": False,
                       "info": {"result": "win"}}, sid, new)
    if state["left"] <= 0:
        STATE.pop(sid, None)
        return _reply({"observation": None, "reward": 0.0, "terminated": False, "truncated": True,
                       "info": {"result": "out of guesses"}}, sid, new)
    hint = "invalid: answer <action>N</action>" if not m else ("higher" if int(m.group(1)) < state["secret"] else "lower")
    return _reply({"observation": f"{hint}; {state['left']} guesses left.", "reward": 0.0, "terminated": False,
                   "truncated": False, "info": {}}, sid, new)


async def aggregate_metrics(request: web.Request) -> web.Response:
    return web.json_response({"sessions_open": len(STATE)})


def main() -> None:
    app = web.Application()
    app.router.add_post("/reset", reset)
    app.router.add_post("/step", step)
    app.router.add_post("/aggregate_metrics", aggregate_metrics)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)


if __name__ == "__main__":
    main()
