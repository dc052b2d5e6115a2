"""A stand-in NeMo Gym tool + ``/verify`` resources server, written from the nemo-gym 0.7.0 wheel (nemo-gym itself
needs Python >= 3.13.14, which this machine cannot run). It mirrors
``resources_servers/example_session_state_mgmt/app.py`` (``StatefulCounterResourcesServer``): a counter per session,
seeded by ``/seed_session`` from the row's ``initial_count``, two tools (``/increment_counter`` with ``{"count": int}``
answering ``{"success": true}``, ``/get_counter_value`` answering ``{"count": N}``), and ``/verify`` rewarding 1 when
the session's counter equals the row's ``expected_count``.

What it copies from the wheel besides: FastAPI request models (so a body outside the schema gets FastAPI's 422 with its
``detail`` list); the session as a signed cookie named ``<Class>___<config name>`` re-sent on every response
(``nemo_gym/server_utils.py``'s ``setup_session_middleware``: Starlette's ``SessionMiddleware``, whose ``itsdangerous``
is not installed here, so an HMAC of its own signs it); ``/verify``'s request validated as ``BaseVerifyRequest``
(``nemo_gym/base_resources_server.py``), whose ``response`` is OpenAI's ``Response`` with NeMo Gym's output items
(``nemo_gym/openai_utils.py``: ``message``, ``function_call``, and ``function_call_output`` without ``id`` / ``status``
as the simple agent writes it); the answer is ``BaseVerifyResponse``'s fields (the request's, ``reward``,
``mask_sample``, ``failure_kind``, ``failure_reason``).

Faults for the tests, chosen by a row field ``standin_fault`` (which ``/seed_session`` and ``/verify`` receive):
``hang_tool`` (tool calls sleep 600 s), ``huge_tool`` (tool calls answer 5 MiB), ``garbage_verify`` (``/verify`` answers HTML), ``no_reward`` (``/verify``
answers an object without ``reward``), ``mask`` (``/verify`` sets ``mask_sample``).

Usage: python nemo_gym_tools_standin.py PORT
"""

import asyncio
import hashlib
import hmac
import json
import sys
import uuid
from typing import Annotated, Any, Literal, Optional, Union

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from openai.types.responses import Response
from pydantic import BaseModel, ConfigDict, Field

COOKIE = "StatefulCounterResourcesServer___example_session_state_mgmt_resources_server"
SECRET = COOKIE.encode()  # NeMo Gym signs with the cookie's own name as the key
SESSION_ID_KEY = "session_id"
COUNTERS: dict[str, int] = {}
FAULTS: dict[str, str] = {}

app = FastAPI()


# -- session middleware (server_utils.setup_session_middleware) ---------------------------------------------------
def _sign(data: str) -> str:
    return hmac.new(SECRET, data.encode(), hashlib.sha256).hexdigest()[:32]


def _read_session(cookie: str | None) -> dict[str, Any]:
    if not cookie or "." not in cookie:
        return {}
    data, sig = cookie.rsplit(".", 1)
    if not hmac.compare_digest(sig, _sign(data)):
        return {}  # a tampered cookie is a fresh session, as Starlette's BadSignature
    return json.loads(bytes.fromhex(data))


@app.middleware("http")
async def session_middleware(request: Request, call_next):
    session = _read_session(request.cookies.get(COOKIE))
    session[SESSION_ID_KEY] = session.get(SESSION_ID_KEY, str(uuid.uuid4()))
    request.state.session = session
    response = await call_next(request)
    data = json.dumps(session).encode().hex()  # cookie-safe characters, no quoting
    response.set_cookie(COOKIE, f"{data}.{_sign(data)}", path="/", httponly=True, samesite="lax")
    return response


def _sid(request: Request) -> str:
    return request.state.session[SESSION_ID_KEY]


# -- request models (base_resources_server, openai_utils) ---------------------------------------------------------
class CreateParams(BaseModel):
    model_config = ConfigDict(extra="allow")
    input: Union[str, list[dict[str, Any]]]
    tools: list[dict[str, Any]] = Field(default_factory=list)


class OutputText(BaseModel):
    annotations: list[Any]
    text: str
    type: Literal["output_text"] = "output_text"


class OutputMessage(BaseModel):
    id: str
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    type: Literal["message"] = "message"


class FunctionToolCall(BaseModel):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class FunctionCallOutput(BaseModel):
    call_id: str
    output: str
    type: Literal["function_call_output"] = "function_call_output"
    id: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


OutputItem = Annotated[Union[OutputMessage, FunctionToolCall, FunctionCallOutput], Field(discriminator="type")]


class NeMoGymResponse(Response):
    output: list[OutputItem]  # type: ignore[assignment]


class BaseRunRequest(BaseModel):
    responses_create_params: CreateParams


class BaseVerifyRequest(BaseRunRequest):
    response: NeMoGymResponse


class BaseVerifyResponse(BaseVerifyRequest):
    reward: float
    mask_sample: bool = False
    failure_kind: Optional[str] = None
    failure_reason: Optional[str] = None


class StatefulCounterSeedSessionRequest(BaseModel):
    initial_count: int
    standin_fault: Optional[str] = None


class IncrementCounterRequest(BaseModel):
    count: int


class StatefulCounterVerifyRequest(BaseVerifyRequest):
    expected_count: int
    standin_fault: Optional[str] = None


# -- the server (example_session_state_mgmt/app.py) ---------------------------------------------------------------
@app.post("/seed_session")
async def seed_session(request: Request, body: StatefulCounterSeedSessionRequest) -> dict:
    COUNTERS.setdefault(_sid(request), body.initial_count)
    if body.standin_fault:
        FAULTS[_sid(request)] = body.standin_fault
    return {}


async def _tool_fault(request: Request) -> None:
    if FAULTS.get(_sid(request)) == "hang_tool":
        await asyncio.sleep(600)
    if FAULTS.get(_sid(request)) == "huge_tool":
        raise HugeReply


class HugeReply(Exception):
    pass


@app.exception_handler(HugeReply)
async def huge_reply(request: Request, exc: HugeReply):
    return JSONResponse({"count": 0, "padding": "x" * (5 << 20)})


@app.post("/increment_counter")
async def increment_counter(request: Request, body: IncrementCounterRequest) -> dict:
    await _tool_fault(request)
    sid = _sid(request)
    COUNTERS[sid] = COUNTERS.setdefault(sid, 0) + body.count
    return {"success": True}


@app.post("/get_counter_value")
async def get_counter_value(request: Request) -> dict:
    await _tool_fault(request)
    return {"count": COUNTERS.setdefault(_sid(request), 0)}


@app.post("/verify")
async def verify(request: Request, body: StatefulCounterVerifyRequest):
    if body.standin_fault == "garbage_verify":
        return HTMLResponse("<html>upstream error</html>")
    if body.standin_fault == "no_reward":
        return JSONResponse({"verdict": "fine"})
    sid = _sid(request)
    reward = float(body.expected_count == COUNTERS[sid]) if sid in COUNTERS else 0.0
    masked = body.standin_fault == "mask"
    out = BaseVerifyResponse(**body.model_dump(), reward=reward, mask_sample=masked,
                             failure_kind="resources_unavailable" if masked else None,
                             failure_reason="the counter store went away" if masked else None)
    return JSONResponse(out.model_dump(mode="json"))


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
